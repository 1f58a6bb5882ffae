"""Benchmark: a full ``rtltrace --validate`` walk of a debug-heap-sized database.

User-x64 database, 6,263 buckets, 100,000 distinct traces (plus repeats), written
into a minidump.  Prints the wall time of the walk+validation (in memory and from
the minidump), of the whole ``dbgext rtltrace --dump ... --validate`` command, and
backend calls per 4 KiB page touched.  Targets: < 1 s, about one call per page.

    python scripts/bench_rtltrace.py [--traces 100000] [--adds 150000]
"""

import argparse
import io
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from dbgext.cli import main  # noqa: E402
from dbgext.rtltrace.fixtures import DEBUG_HEAP_BUCKETS, build_database  # noqa: E402
from dbgext.rtltrace import walk  # noqa: E402
from dbgext.target import open_dump  # noqa: E402
from dbgext.sample.scenario import Scenario  # noqa: E402
from minidump_writer import write_minidump

MODULES = [("ntdll", 0x7FFA10000000, 0x1F0000, "ntdll.dll"), ("kernel32", 0x7FFA0F000000, 0xC0000, "kernel32.dll"),
           ("app", 0x7FF6A0000000, 0x80000, "app.exe"), ("netio", 0x7FFA0E000000, 0x40000, "netio.dll")]


def build(traces, adds):
    scenario = Scenario("x64", "user")
    for name, base, size, image in MODULES:
        scenario.add_module(name, base, size, image=image)
    builder = build_database(scenario, "user-x64", traces, adds=adds, buckets=DEBUG_HEAP_BUCKETS,
                             modules=["ntdll", "app", "netio", "kernel32"])
    return scenario, builder


def measure(target, address):
    target.drop_cache()
    target.stats.reset()
    start, cpu_start = time.perf_counter(), time.process_time()
    db = walk(target, address)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    stats = target.stats
    return db, elapsed, cpu, stats.backend_calls, stats.backend_pages


def report(label, db, elapsed, cpu, calls, pages):
    # CPU time next to wall time: on a loaded machine the wall time mostly measures the neighbours.
    print("%-24s %6.3f s wall %6.3f s cpu  %5d backend calls  %5d pages touched  %.3f calls/page  "
          "%d blocks, %d problems" % (label, elapsed, cpu, calls, pages, float(calls) / max(pages, 1),
                                      len(db.blocks), len(db.problems)))


def main_bench():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=int, default=100000)
    parser.add_argument("--adds", type=int, default=150000)
    parser.add_argument("--repeat", type=int, default=3, help="best of N walks")
    args = parser.parse_args()

    start = time.perf_counter()
    scenario, builder = build(args.traces, args.adds)
    print("built %d traces (%d hits) in %d segments, %.1f MiB, in %.2f s"
          % (builder.traces, builder.hits, len(builder.segments), builder.current_size / 1048576.0,
             time.perf_counter() - start))

    memory_target = scenario.target()
    report("in memory (best of %d)" % args.repeat,
           *min((measure(memory_target, builder.address) for _ in range(args.repeat)), key=lambda r: r[1]))

    directory = tempfile.mkdtemp(prefix="bench_rtltrace_")
    try:
        path = os.path.join(directory, "heap.dmp")
        start = time.perf_counter()
        write_minidump(scenario, path)
        scenario.write_symbols(path + ".symbols")
        print("wrote %s (%.1f MiB) in %.2f s" % (path, os.path.getsize(path) / 1048576.0, time.perf_counter() - start))
        dump_target = open_dump(path)
        try:
            report("minidump (best of %d)" % args.repeat,
                   *min((measure(dump_target, builder.address) for _ in range(args.repeat)), key=lambda r: r[1]))
        finally:
            dump_target.close()
        # The first run also imports every command's modules (the CLI registry); the second does not.
        for label in ("rtltrace --validate", "  again (imports warm)"):
            start, cpu_start = time.perf_counter(), time.process_time()
            code = main(["rtltrace", "--dump", path, "0x%x" % builder.address, "--validate"], stream=io.StringIO())
            print("%-24s %6.3f s wall %6.3f s cpu  (exit %d; opens the dump, loads symbols, walks, validates, "
                  "renders)" % (label, time.perf_counter() - start, time.process_time() - cpu_start, code))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main_bench()
