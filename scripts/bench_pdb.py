"""Benchmark: dbgext's PDB reader on a PDB with 20,000 functions, side by side
with llvm-pdbutil reading the same records from the same file.

Target (issue 11): publics and procedures of a 20,000-function PDB in under 1 s.
The input is generated C (N functions, one in seven exported, plus kernel-shaped
structure types) built by clang for the MSVC target and lld-link /debug — the
same independent toolchain as the tests.  Also printed: load time and memory
(tracemalloc peak and RSS growth) for the whole PDB including every type, and how
many functions are named with the PDB versus from exports alone.

    python scripts/bench_pdb.py [--functions N] [--types N] [--dir DIR] [--repeat R]
"""

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dbgext.pe import PEImage  # noqa: E402
from dbgext.symbols.pdb import PdbFile  # noqa: E402
from dbgext.symbols.types import pdb_type_view  # noqa: E402


def generate(path, functions, types):
    lines = ["typedef struct _LIST_ENTRY { struct _LIST_ENTRY *Flink, *Blink; } LIST_ENTRY;"]
    for index in range(types):
        lines.append("typedef struct _OBJECT%d { LIST_ENTRY Links; union { unsigned long Flags; struct { "
                     "unsigned long Busy : 1, Kind : 7, Spare : 24; }; }; void *Context[%d]; struct _OBJECT%d *Next; "
                     "unsigned char Name[16]; } OBJECT%d;" % (index, 1 + index % 4, index, index))
        lines.append("OBJECT%d Instance%d;" % (index, index))
    for index in range(functions):
        export = "__declspec(dllexport) " if index % 7 == 0 else ("static " if index % 3 == 0 else "")
        callee = "Function%d(x + 1)" % (index - 1) if index else "x"
        lines.append("%sint __declspec(noinline) Function%d(int x) { volatile int local[4]; local[x & 3] = x; "
                     "return %s + local[(x + 1) & 3]; }" % (export, index, callee))
    lines.append("__declspec(dllexport) int Entry(int x) { return Function%d(x); }" % (functions - 1))
    with open(path, "w") as handle:
        handle.write("\n".join(lines) + "\n")


def build(directory, functions, types):
    source = os.path.join(directory, "generated.c")
    obj, dll, pdb = (os.path.join(directory, "generated." + ext) for ext in ("obj", "dll", "pdb"))
    if os.path.exists(pdb):
        return dll, pdb
    generate(source, functions, types)
    started = time.perf_counter()
    subprocess.check_call(["clang", "--target=x86_64-pc-windows-msvc", "-g", "-gcodeview", "-O1", "-c", source,
                           "-o", obj])
    subprocess.check_call(["lld-link", "/dll", "/debug", "/noentry", "/nodefaultlib", "/machine:x64",
                           "/pdb:" + pdb, "/out:" + dll, obj])
    print("built %s in %.1f s" % (pdb, time.perf_counter() - started))
    return dll, pdb


def best_of(repeat, work):
    times = []
    result = None
    for _ in range(repeat):
        started = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - started)
    return min(times), result


def read_functions(path):
    pdb = PdbFile(path)
    try:
        return len(pdb.publics()), len(pdb.procedures())
    finally:
        pdb.close()


def read_everything(path):
    pdb = PdbFile(path)
    try:
        pdb.publics()
        pdb.procedures()
        pdb.data()
        types = pdb.types
        views = [pdb_type_view(types, types.find(name)) for name in types.names()]
        return len(views), len(types.offsets)
    finally:
        pdb.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--functions", type=int, default=20000)
    parser.add_argument("--types", type=int, default=2000)
    parser.add_argument("--dir", help="build directory, kept between runs (default: a temporary one)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    for tool in ("clang", "lld-link", "llvm-pdbutil"):
        if shutil.which(tool) is None:
            raise SystemExit("bench_pdb needs %s (Debian packages clang, lld, llvm)" % tool)
    directory = args.dir or tempfile.mkdtemp(prefix="pdb-bench-")
    os.makedirs(directory, exist_ok=True)
    dll, pdb_path = build(directory, args.functions, args.types)
    print("input: %s (%.1f MB)" % (pdb_path, os.path.getsize(pdb_path) / 1e6))

    seconds, (publics, procedures) = best_of(args.repeat, lambda: read_functions(pdb_path))
    with open(os.devnull, "w") as null:
        anchor, _ = best_of(args.repeat, lambda: subprocess.check_call(
            ["llvm-pdbutil", "dump", "-publics", "-symbols", pdb_path], stdout=null))
    print("publics + procedures: %d + %d in %.3f s (target < 1 s); llvm-pdbutil dump -publics -symbols: %.3f s"
          % (publics, procedures, seconds, anchor))

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    seconds, (views, records) = best_of(1, lambda: read_everything(pdb_path))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    plain, _ = best_of(args.repeat, lambda: read_everything(pdb_path))
    with open(os.devnull, "w") as null:
        anchor, _ = best_of(args.repeat, lambda: subprocess.check_call(
            ["llvm-pdbutil", "dump", "-publics", "-symbols", "-types", pdb_path], stdout=null))
    print("whole PDB (symbols, %d type records, %d structure views): %.3f s, Python heap peak %.1f MB, "
          "RSS growth %.1f MB; llvm-pdbutil dump -publics -symbols -types: %.3f s"
          % (records, views, plain, peak / 1e6, rss_growth / 1e3, anchor))

    exports = PEImage.from_file(dll).exports
    pdb = PdbFile(pdb_path)
    functions = pdb.procedures()
    pdb.close()
    exported = sum(1 for procedure in functions if procedure.rva in exports)
    print("functions named: %d of %d with the PDB, %d from exports alone" % (len(functions), len(functions),
                                                                             exported))


if __name__ == "__main__":
    main()
