"""Benchmark: stackuse over a 45,000-function x64 DLL, side by side with the
classic approach (Linux's checkstack.pl: ``objdump -d`` piped through a regex for
``sub $N,%rsp``) on the same file.

The DLL is built from the stackuse test corpus generator (tests/stackuse_corpus.py:
locals of every size, __chkstk frames, calls, switch tables, callbacks, alloca)
through MinGW-w64 gcc for x86_64, 1,000 functions per translation unit, and cached.
Each measured command runs in its own process; its wall time and peak resident
memory (from wait4) are printed.  Goals (issue 15): ``stackuse functions`` under
5 s and 300 MB, no slower than the anchor; ``hogs`` and ``functions --depth``
under 8 s, within 2x of the anchor.

    python scripts/bench_stackuse.py [--functions N] [--dir DIR] [--pe FILE] [--dbgext DIR ...] [--repeat N]

``--dbgext DIR`` measures another checkout (e.g. the code before a change) with
the same input; given several times, each checkout is measured in turn, in the
same run as the anchor.
"""

import argparse
import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

from stackuse_corpus import generate  # noqa: E402

COMPILER = "x86_64-w64-mingw32-gcc"
OBJDUMPS = ["x86_64-w64-mingw32-objdump", "llvm-objdump"]
PER_UNIT = 1000

# checkstack.pl's x86_64 rule: a function header, then `sub $0x...,%rsp` in it.
FUNCTION_HEADER = re.compile(r"^[0-9a-f]+ <(.*)>:$")
STACK_SUB = re.compile(r"\tsub\s+\$(0x[0-9a-f]+),%rsp")


def build(directory, count):
    """The DLL for ``count`` functions, built once per corpus and compiler."""
    units = (count + PER_UNIT - 1) // PER_UNIT
    digest = hashlib.sha256(("%d/%d" % (count, PER_UNIT)).encode())
    digest.update(generate(10, x86=False).encode())
    digest.update(subprocess.run([COMPILER, "--version"], stdout=subprocess.PIPE).stdout)
    final = os.path.join(directory, "bench-x64-%d-%s" % (count, digest.hexdigest()[:12]))
    path = os.path.join(final, "bench.dll")
    if os.path.exists(path):
        return path
    os.makedirs(directory, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="build-", dir=directory)
    started = time.perf_counter()

    def compile_unit(index):
        source = os.path.join(scratch, "unit%03d.c" % index)
        with open(source, "w") as handle:
            handle.write(generate(min(PER_UNIT, count - index * PER_UNIT), seed=index, x86=False,
                                  prefix="u%d_" % index))
        subprocess.run([COMPILER, "-O1", "-w", "-c", source, "-o", source[:-2] + ".o"], check=True)
        return source[:-2] + ".o"

    with concurrent.futures.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as pool:
        objects = list(pool.map(compile_unit, range(units)))
    subprocess.run([COMPILER, "-shared", "-o", os.path.join(scratch, "bench.dll")] + objects, check=True)
    os.rename(scratch, final)
    print("built %s in %.0f s" % (path, time.perf_counter() - started))
    return path


def measure(argv):
    """Run ``argv``; (wall seconds, CPU seconds, peak RSS in MB)."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    error = process.stderr.read().decode(errors="replace").strip()
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - started
    process.stderr.close()
    if status:
        print("  %s failed (status %d): %s" % (" ".join(argv[-4:]), status, error[-300:]))
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0


def checkstack(path):
    """objdump -d | checkstack's regex, in one pipeline: (wall seconds, CPU seconds
    of objdump and the regex, frames found, peak MB of objdump, objdump's name)."""
    objdump = next((tool for tool in OBJDUMPS if shutil.which(tool)), None)
    if objdump is None:
        return None
    started, cpu = time.perf_counter(), time.process_time()
    process = subprocess.Popen([objdump, "-d", path], stdout=subprocess.PIPE)
    frames = 0
    function = None
    for raw in process.stdout:
        line = raw.decode("latin-1").rstrip("\n")
        header = FUNCTION_HEADER.match(line)
        if header:
            function = header.group(1)
            continue
        found = STACK_SUB.search(line)
        if found and function is not None:
            frames += 1
            function = None
    _, _, usage = os.wait4(process.pid, 0)
    return (time.perf_counter() - started, time.process_time() - cpu + usage.ru_utime + usage.ru_stime, frames,
            usage.ru_maxrss / 1024.0, objdump)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", type=int, default=45000)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "dbgext-stackuse-bench"))
    parser.add_argument("--pe", help="measure this PE file instead of building one")
    parser.add_argument("--dbgext", action="append", help="dbgext checkout to measure (default: this one; repeatable)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of measurements, the least CPU kept")
    args = parser.parse_args(argv)
    if args.pe is None and shutil.which(COMPILER) is None:
        raise SystemExit("%s is not installed (apt-get install gcc-mingw-w64-x86-64), or give --pe FILE" % COMPILER)
    path = args.pe or build(args.dir, args.functions)
    print("input: %s (%.1f MB)" % (path, os.path.getsize(path) / 1e6))
    # Wall time on a shared machine mostly measures the other processes: CPU
    # seconds (user + system) are printed beside it and compared.  With
    # --repeat, every measurement (the anchor's too) is taken once per round,
    # the rounds interleaved, and each keeps its round with the least CPU.
    runs = [("stackuse functions --json", ["functions", "--pe", path, "--json"]),
            ("stackuse functions --depth --json", ["functions", "--pe", path, "--depth", "--json"]),
            ("stackuse hogs", ["hogs", "--pe", path])]
    checkouts = args.dbgext or [ROOT]
    anchor, best = None, {}
    for _ in range(max(1, args.repeat)):
        measured = checkstack(path)
        if measured is not None and (anchor is None or measured[1] < anchor[1]):
            anchor = measured
        for checkout in checkouts:
            command = [sys.executable, "-c", "import sys; sys.path.insert(0, %r); from dbgext.cli import main; "
                       "sys.exit(main(sys.argv[1:]))" % os.path.abspath(checkout), "stackuse"]
            for label, extra in runs:
                result = measure(command + extra)
                if (checkout, label) not in best or result[1] < best[checkout, label][1]:
                    best[checkout, label] = result
    print("%-44s %8s %8s %8s" % ("", "wall s", "cpu s", "peak MB"))
    if anchor is not None:
        print("%-44s %8.2f %8.2f %8.0f  (%d frames from `sub $N,%%rsp`)" % (
            "anchor: %s -d | checkstack regex" % os.path.basename(anchor[4]), anchor[0], anchor[1], anchor[3],
            anchor[2]))
    for checkout in checkouts:
        if len(checkouts) > 1:
            print("dbgext: %s" % checkout)
        for label, _ in runs:
            seconds, cpu, peak = best[checkout, label]
            ratio = "  (%.2fx the anchor's wall, %.2fx its cpu)" % (seconds / anchor[0], cpu / anchor[1]) \
                if anchor else ""
            print("%-44s %8.2f %8.2f %8.0f%s" % (label, seconds, cpu, peak, ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main())
