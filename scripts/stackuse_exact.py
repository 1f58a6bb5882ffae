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

The referee columns come from executing every function in an emulator
(tests/stackuse_referee.py): *measured* functions gave a frame (minimum and maximum
over the four incoming stack alignments, or dynamic); *stackuse = measured* is
how many of them stackuse reports exactly, its realignment padding giving the
maximum; *.su below* is how many the compiler's own figure puts below the
measured minimum (with the shortfalls seen).

    python scripts/stackuse_exact.py [--dir DIR] [--functions N] [--details]
"""

import argparse
import collections
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from stackuse_corpus import (BUILDS, COMPILER_LOW, EXACT, FUNCTIONS, MEASURED_EXACT, MISSED, UNKNOWN,  # noqa: E402
                             UNMEASURED, WRONG, build, compare, generate, missing_tools, referee_verdicts)

from dbgext.stackuse import analyze  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "dbgext-stackuse-corpus"),
                        help="build directory (builds are reused)")
    parser.add_argument("--functions", type=int, default=FUNCTIONS, help="corpus size (default %d)" % FUNCTIONS)
    parser.add_argument("--details", action="store_true", help="list every function that is not exact")
    parser.add_argument("--no-referee", action="store_true", help="skip executing the functions")
    args = parser.parse_args(argv)
    source = generate(args.functions)
    print("%-18s %9s %7s %8s %13s %8s %6s %7s %6s | %8s %17s %s" % (
        "build", "functions", "exact", "exact %", "compiler low", "agree %", "wrong", "unknown", "missed",
        "measured", "stackuse=measured", ".su below measured"))
    worst = worst_agreeing = worst_measured = 100.0
    for toolchain, level in BUILDS:
        missing = missing_tools(toolchain)
        if missing:
            print("%-18s skipped: %s not installed" % ("%s -%s" % (toolchain, level), ", ".join(missing)))
            continue
        built = build(toolchain, level, source, args.dir)
        analysed = analyze(pe=built.path)
        verdicts = compare(built, analysed)
        counts = dict((kind, 0) for kind in (EXACT, COMPILER_LOW, WRONG, UNKNOWN, MISSED))
        for verdict, _, _ in verdicts.values():
            counts[verdict] += 1
        percent = 100.0 * counts[EXACT] / max(len(verdicts), 1)
        agreeing = 100.0 * (counts[EXACT] + counts[COMPILER_LOW]) / max(len(verdicts), 1)
        worst, worst_agreeing = min(worst, percent), min(worst_agreeing, agreeing)
        referee = ""
        if not args.no_referee:
            referee, measured_share = _referee_columns(built, analysed, verdicts)
            worst_measured = min(worst_measured, measured_share)
        print("%-18s %9d %7d %7.1f%% %13d %7.1f%% %6d %7d %6d%s" % (
            built.label, len(verdicts), counts[EXACT], percent, counts[COMPILER_LOW], agreeing, counts[WRONG],
            counts[UNKNOWN], counts[MISSED], referee))
        if args.details:
            for name, (verdict, ours, wanted) in sorted(verdicts.items()):
                if verdict != EXACT:
                    rva = built.locations[name]
                    print("    %-7s %-24s rva 0x%-6x ours %-8s compiler %s" % (verdict, name, rva, ours, wanted))
            for name, (verdict, ours, measured) in sorted(_last_referee.items()):
                if verdict != MEASURED_EXACT:
                    print("    %-7s %-24s rva 0x%-6x ours %-14s measured %s" % (
                        verdict, name, built.locations[name], ours, measured))
    print("lowest exact share: %.1f%%; lowest agreeing share (exact + compiler low): %.1f%%"
          % (worst, worst_agreeing))
    if not args.no_referee:
        print("lowest share of measured frames stackuse reports exactly as executed: %.1f%%" % worst_measured)
    return 0


_last_referee = {}


def _referee_columns(built, analysed, verdicts):
    """The referee's columns for one build: measured functions, how many stackuse
    reports exactly, how many the compiler's figure puts below the measured minimum."""
    measured = referee_verdicts(built, analysed, names=list(verdicts))
    _last_referee.clear()
    _last_referee.update(measured)
    frames = {name: value for name, (verdict, _, value) in measured.items() if verdict != UNMEASURED}
    exact = sum(1 for verdict, _, _ in measured.values() if verdict == MEASURED_EXACT)
    shortfalls = collections.Counter(
        value[0] - built.expected[name][0] for name, value in frames.items()
        if value != "dynamic" and not built.expected[name][1] and built.expected[name][0] < value[0])
    below = sum(shortfalls.values())
    detail = ", ".join("%d by %d" % (count, amount) for amount, count in sorted(shortfalls.items()))
    share = 100.0 * exact / max(len(frames), 1)
    return " | %8d %9d (%5.1f%%) %4d%s" % (len(frames), exact, share, below, " (%s)" % detail if detail else ""), share


if __name__ == "__main__":
    sys.exit(main())
