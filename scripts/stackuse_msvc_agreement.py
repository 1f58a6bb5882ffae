"""Agreement of stackuse's prologue analysis with the unwind data on real
Microsoft-built x64 DLLs.

Fetches the ``msvc-runtime`` wheel (the VC++ runtime DLLs) for win_amd64 with
``pip download``, unpacks its DLLs and, for every primary (non-chained)
RUNTIME_FUNCTION, compares the frame size found by scanning the prologue with the
one the unwind codes give.  Chained fragments are counted separately: their frame
is the parent's and a scan starting at the fragment cannot see it.  It also checks
what the x64 analysis assumes (every call is made at the full frame depth): SP
tracked instruction by instruction at each direct or indirect call must equal the
unwind frame size.

    python scripts/stackuse_msvc_agreement.py [--dir DIR] [--wheel NAME] [DLL ...]
"""

import argparse
import collections
import glob
import os
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dbgext.stackuse.callgraph import CallGraph, Program, depths_in  # noqa: E402
from dbgext.pe import PEImage  # noqa: E402


def fetch_dlls(directory, wheels):
    for wheel in wheels:
        subprocess.check_call([sys.executable, "-m", "pip", "download", "--quiet", "--platform", "win_amd64",
                               "--only-binary=:all:", "--no-deps", "-d", directory, wheel])
    dlls = {}
    for path in glob.glob(os.path.join(directory, "*.whl")):
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                name = os.path.basename(member)
                if name.lower().endswith(".dll") and name not in dlls:
                    target = os.path.join(directory, name)
                    with open(target, "wb") as handle:
                        handle.write(archive.read(member))
                    dlls[name] = target
    return [dlls[name] for name in sorted(dlls)]


def measure(path):
    program = Program()
    module = program.add_image(PEImage.from_file(path))
    counts = collections.Counter()
    examples = collections.defaultdict(list)
    for function in module.functions.values():
        if function.origin != "pdata":
            continue
        if function.fragment_of is not None:
            counts["chained"] += 1
            continue
        counts["primary"] += 1
        module.compute_frame(function)
        if function.unwind_size is None:
            counts["unwind unreadable"] += 1
        elif function.dynamic:
            counts["dynamic per prologue"] += 1
        elif function.prologue_size == function.unwind_size:
            counts["agree"] += 1
        else:
            kind = "prologue undecodable" if function.prologue_size is None else (
                "prologue smaller" if function.prologue_size < function.unwind_size else "prologue larger")
            counts[kind] += 1
            if len(examples[kind]) < 3:
                examples[kind].append("%s+0x%x: prologue %s, unwind %d" % (
                    module.name, function.rva, function.prologue_size, function.unwind_size))
    CallGraph(program).analyse_all(module)
    for function in list(module.functions.values()):
        if function.unwind_size is None or function.fragment_of is not None or function.dynamic:
            continue
        # The analysis takes every x64 call to be made at the full frame depth;
        # follow SP instruction by instruction to check that.
        depths = depths_in(program, function)
        for site in function.call_sites:
            if site.kind in ("call", "indirect") and site.address in depths:
                counts["call sites"] += 1
                if depths[site.address] == function.unwind_size:
                    counts["call sites at the unwind depth"] += 1
                elif len(examples["call site depth"]) < 3:
                    examples["call site depth"].append("%s+0x%x: call at 0x%x tracked %d, unwind %d" % (
                        module.name, function.rva, site.address, depths[site.address], function.unwind_size))
    return counts, examples


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dlls", nargs="*", help="DLLs to measure (default: the msvc-runtime wheel's)")
    parser.add_argument("--dir", help="download directory (default: a temporary one)")
    parser.add_argument("--wheel", action="append", help="wheel(s) to fetch (default: msvc-runtime)")
    args = parser.parse_args(argv)
    directory = args.dir or tempfile.mkdtemp(prefix="stackuse-msvc-")
    paths = args.dlls or fetch_dlls(directory, args.wheel or ["msvc-runtime"])
    total = collections.Counter()
    print("%-28s %8s %8s %8s %8s" % ("dll", "primary", "chained", "agree", "agree%"))
    for path in paths:
        try:
            counts, examples = measure(path)
        except Exception as error:  # one bad file must not stop the survey
            print("%-28s error: %s" % (os.path.basename(path), error))
            continue
        total.update(counts)
        primary = counts["primary"] or 1
        print("%-28s %8d %8d %8d %7.1f%%" % (os.path.basename(path)[:28], counts["primary"], counts["chained"],
                                             counts["agree"], 100.0 * counts["agree"] / primary))
        for kind, lines in sorted(examples.items()):
            for line in lines:
                print("    %-22s %s" % (kind, line))
    primary = total["primary"] or 1
    entries = (total["primary"] + total["chained"]) or 1
    print()
    print("RUNTIME_FUNCTIONs: %d (%d primary, %d chained = %.1f%%)" % (
        total["primary"] + total["chained"], total["primary"], total["chained"], 100.0 * total["chained"] / entries))
    for kind in ("agree", "prologue smaller", "prologue larger", "prologue undecodable", "dynamic per prologue",
                 "unwind unreadable"):
        print("  %-22s %7d  %5.1f%% of primary" % (kind, total[kind], 100.0 * total[kind] / primary))
    print("call sites (direct and indirect) in functions with unwind data: %d, tracked SP equal to the "
          "unwind frame at %d (%.2f%%)" % (total["call sites"], total["call sites at the unwind depth"],
                                           100.0 * total["call sites at the unwind depth"] / (total["call sites"] or 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
