"""The exact-match table: stackuse's frame sizes against the compilers' own
``-fstack-usage`` numbers, per build of one generated C corpus (MinGW-w64 i686 gcc
and clang ``--target=i686-pc-windows-msvc`` + lld-link, at -O0/-O1/-O2/-Os).

The analysis gets what a user would have: the MinGW DLLs keep a COFF symbol table,
the clang DLLs have no symbols at all (functions are found from exports, calls and
relocated pointers).  A function is *exact* when the frame size — or "dynamic" —
matches; *compiler low* when clang's figure is 4 bytes short of what the prologue
of a frame that realigns the stack provably moves ESP by (see
tests/stackuse_corpus.py); *unknown* when stackuse gives no number; *wrong* when
it gives another number; *missed* when it was never discovered.

    python scripts/stackuse_exact.py [--dir DIR] [--functions N] [--details]
"""

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from stackuse_corpus import (BUILDS, COMPILER_LOW, EXACT, FUNCTIONS, MISSED, UNKNOWN, WRONG, build,  # noqa: E402
                             compare, generate, missing_tools)

from dbgext.stackuse import analyze  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "dbgext-stackuse-corpus"),
                        help="build directory (builds are reused)")
    parser.add_argument("--functions", type=int, default=FUNCTIONS, help="corpus size (default %d)" % FUNCTIONS)
    parser.add_argument("--details", action="store_true", help="list every function that is not exact")
    args = parser.parse_args(argv)
    source = generate(args.functions)
    print("%-18s %9s %7s %8s %13s %8s %6s %7s %6s" % ("build", "functions", "exact", "exact %", "compiler low",
                                                       "agree %", "wrong", "unknown", "missed"))
    worst = worst_agreeing = 100.0
    for toolchain, level in BUILDS:
        missing = missing_tools(toolchain)
        if missing:
            print("%-18s skipped: %s not installed" % ("%s -%s" % (toolchain, level), ", ".join(missing)))
            continue
        built = build(toolchain, level, source, args.dir)
        verdicts = compare(built, analyze(pe=built.path))
        counts = dict((kind, 0) for kind in (EXACT, COMPILER_LOW, WRONG, UNKNOWN, MISSED))
        for verdict, _, _ in verdicts.values():
            counts[verdict] += 1
        percent = 100.0 * counts[EXACT] / max(len(verdicts), 1)
        agreeing = 100.0 * (counts[EXACT] + counts[COMPILER_LOW]) / max(len(verdicts), 1)
        worst, worst_agreeing = min(worst, percent), min(worst_agreeing, agreeing)
        print("%-18s %9d %7d %7.1f%% %13d %7.1f%% %6d %7d %6d" % (
            built.label, len(verdicts), counts[EXACT], percent, counts[COMPILER_LOW], agreeing, counts[WRONG],
            counts[UNKNOWN], counts[MISSED]))
        if args.details:
            for name, (verdict, ours, wanted) in sorted(verdicts.items()):
                if verdict != EXACT:
                    rva = built.locations[name]
                    print("    %-7s %-24s rva 0x%-6x ours %-8s compiler %s" % (verdict, name, rva, ours, wanted))
    print("lowest exact share: %.1f%%; lowest agreeing share (exact + compiler low): %.1f%%"
          % (worst, worst_agreeing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
