"""stackuse's x86 frames against execution on real MSVC-built code: the DLLs of
pywin32's win32 wheel (see tests/test_stackuse_msvc.py for where it is cached),
a sample of each one's functions executed by the emulator referee
(tests/stackuse_referee.py).  No symbols and no compiler figures: the referee
is the only other opinion.

A function is left unmeasured when its first call goes to an import (the stub
cannot say what the import reads or pops) or the emulation fails (it reads data
the loader would have set up).  A function that calls nothing before it returns
is measured on the path its arguments took, which may be shallower than its
deepest path: those differences are listed apart ("one path").

    python scripts/stackuse_msvc_referee.py [--sample N] [DLL ...]
"""

import argparse
import collections
import os
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from stackuse_referee import Referee  # noqa: E402

from dbgext.pe import PEImage  # noqa: E402
from dbgext.stackuse import analyze  # noqa: E402

WHEEL = "pywin32-306-cp38-cp38-win32.whl"
DIRECTORY = os.environ.get("DBGEXT_WIN32_WHEELS", os.path.join(os.path.expanduser("~"), ".cache", "dbgext-wheels"))
DEFAULT_DLLS = ["pywintypes38.dll", "pythoncom38.dll", "win32api.pyd", "win32gui.pyd", "shell.pyd", "win32ui.pyd"]


def extract(names, directory):
    paths = []
    with zipfile.ZipFile(os.path.join(DIRECTORY, WHEEL)) as archive:
        for name in names:
            member = [item for item in archive.namelist() if item.endswith("/" + name)][0]
            target = os.path.join(directory, name)
            with open(target, "wb") as handle:
                handle.write(archive.read(member))
            paths.append(target)
    return paths


def measure(path, sample, counts, examples):
    image = PEImage.from_file(path)
    functions = analyze(pe=path).functions
    referee = Referee(image, entries=[image.image_base + function.rva for function in functions])
    for function in functions[::max(1, len(functions) // sample)]:
        ours = "dynamic" if function.dynamic else (function.frame_size, None if function.frame_size is None
                                                   else function.frame_size + function.padding)
        measured = referee.measure(image.image_base + function.rva)
        if measured.problem:
            counts["unmeasured (import first)" if "import" in measured.problem else "unmeasured (emulation)"] += 1
            continue
        counts["measured"] += 1
        value = "dynamic" if measured.dynamic else (measured.minimum, measured.maximum)
        if value == ours:
            counts["exact"] += 1
            continue
        kind = "one path" if value != "dynamic" and ours != "dynamic" and ours[0] is not None and (
            value[1] < ours[0] and not measured.at_call) else "different"
        counts[kind] += 1
        examples[kind].append("%s+0x%x (%s): stackuse %s, executed %s" % (
            os.path.basename(path), function.rva, function.origin, ours, value))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dlls", nargs="*", help="DLLs to measure (default: six of the wheel's)")
    parser.add_argument("--sample", type=int, default=150, help="functions per DLL (default 150)")
    args = parser.parse_args(argv)
    paths = args.dlls
    if not paths:
        if not os.path.exists(os.path.join(DIRECTORY, WHEEL)):
            print("%s not in %s (see tests/test_stackuse_msvc.py)" % (WHEEL, DIRECTORY))
            return 1
        paths = extract(DEFAULT_DLLS, tempfile.mkdtemp(prefix="stackuse-msvc-referee-"))
    counts = collections.Counter()
    examples = collections.defaultdict(list)
    for path in paths:
        measure(path, args.sample, counts, examples)
    for kind in ("measured", "exact", "one path", "different", "unmeasured (import first)", "unmeasured (emulation)"):
        print("%-26s %5d" % (kind, counts[kind]))
    print("exact share of the measured: %.1f%%; of those measured on every path they have: %.1f%%" % (
        100.0 * counts["exact"] / max(counts["measured"], 1),
        100.0 * counts["exact"] / max(counts["measured"] - counts["one path"], 1)))
    for kind in ("different", "one path"):
        for line in examples[kind][:12]:
            print("    %-9s %s" % (kind, line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
