"""Benchmark: stackuse over every function of a large MSVC-built x64 DLL.

Targets (issue 6): frame sizes for all functions under 5 s; the full call graph
with every function's worst case under 15 s.  Default input: unicorn.dll from the
unicorn win_amd64 wheel (MSVC-built — it has a Rich header —, 9.6 MB, 28,738
RUNTIME_FUNCTIONs), fetched with ``pip download --platform win_amd64``; any PE file
can be given instead (e.g. duckdb's 31 MB module: ``--wheel duckdb==1.1.3
--member .pyd``).  Wall-clock and CPU seconds are both printed: on a busy machine
the wall clock mostly measures the other processes.

    python scripts/bench_stackuse.py [PE_FILE] [--dir DIR] [--wheel SPEC] [--member NAME]
"""

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dbgext.stackuse.callgraph import CallGraph, Program  # noqa: E402
from dbgext.pe import PEImage  # noqa: E402

DEFAULT_WHEEL = "unicorn==2.1.4"
DEFAULT_MEMBER = "unicorn.dll"


def fetch(directory, wheel, member_suffix):
    subprocess.check_call([sys.executable, "-m", "pip", "download", "--quiet", "--platform", "win_amd64",
                           "--python-version", "3.11", "--only-binary=:all:", "--no-deps", "-d", directory, wheel])
    for path in glob.glob(os.path.join(directory, "*.whl")):
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.infolist() if m.filename.endswith(member_suffix)]
            if members:
                biggest = max(members, key=lambda m: m.file_size)
                target = os.path.join(directory, os.path.basename(biggest.filename))
                with open(target, "wb") as handle:
                    handle.write(archive.read(biggest))
                return target
    raise SystemExit("no %s member in %s" % (member_suffix, wheel))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pe", nargs="?", help="PE file (default: fetch unicorn's win_amd64 unicorn.dll)")
    parser.add_argument("--dir", help="download directory (default: a temporary one)")
    parser.add_argument("--wheel", default=DEFAULT_WHEEL)
    parser.add_argument("--member", default=DEFAULT_MEMBER, help="suffix of the wheel member to analyse")
    args = parser.parse_args(argv)
    path = args.pe or fetch(args.dir or tempfile.mkdtemp(prefix="stackuse-bench-"), args.wheel, args.member)
    print("input: %s (%.1f MB)" % (path, os.path.getsize(path) / 1e6))

    started, cpu = time.perf_counter(), time.process_time()
    image = PEImage.from_file(path)
    program = Program()
    module = program.add_image(image)
    module.compute_frames()
    frames_seconds = time.perf_counter() - started
    frames_cpu = time.process_time() - cpu
    known = len(module.functions)
    sized = sum(1 for f in module.functions.values() if f.frame_size is not None)
    both = sum(1 for f in module.functions.values() if f.source == "both")
    print("frame sizes: %d functions (%d sized, %d unwind+prologue agreeing) in %.2f s (cpu %.2f s)"
          % (known, sized, both, frames_seconds, frames_cpu))

    started, cpu = time.perf_counter(), time.process_time()
    graph = CallGraph(program)
    graph.analyse_all(module)
    bodies_seconds = time.perf_counter() - started
    bounds = [graph.bound(f) for f in list(module.functions.values())]
    graph_seconds = time.perf_counter() - started
    graph_cpu = time.process_time() - cpu
    sites = sum(len(f.call_sites) for f in module.functions.values())
    statuses = {}
    for bound in bounds:
        statuses[bound.status] = statuses.get(bound.status, 0) + 1
    print("call graph: %d functions (%d found by following calls), %d call sites; bodies %.2f s, "
          "with every worst case %.2f s (cpu %.2f s)" % (len(module.functions), len(module.functions) - known,
                                                        sites, bodies_seconds, graph_seconds, graph_cpu))
    print("worst-case bounds: %s" % ", ".join("%s %d" % item for item in sorted(statuses.items())))
    print("total (frames + call graph): %.2f s (cpu %.2f s)" % (frames_seconds + graph_seconds,
                                                              frames_cpu + graph_cpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
