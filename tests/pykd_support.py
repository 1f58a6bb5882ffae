"""Run ``commands/<name>.py`` exactly as WinDbg's ``!py`` does, over a fake pykd.

    text, fake = run_windbg_script("db", ["nt!KiSystemStartup", "L20"], scenario)

What WinDbg (pykd-ext bootstrapper) gives a script, reproduced here: a fresh
``__main__`` namespace with no ``__file__``, ``sys.argv = [full path, args...]``,
recursion limit 500, a ``sys.stdout`` that only takes ``str`` (``write``,
``writedml``, ``flush``, ``isatty``, ``encoding == "ascii"``, no ``.buffer``), and
``import pykd`` giving the debugger's module — here the fake.
"""

import os
import sys

from dbgext.testing.fake_pykd import make_fake_pykd

COMMANDS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "commands")


class DebuggerOutput(object):
    """WinDbg's stdout object.  ``chunks`` keeps (kind, text) in order; ``text``
    is everything written, DML included as markup."""

    encoding = "ascii"
    closed = False

    def __init__(self):
        self.chunks = []

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        self.chunks.append(("text", text))

    def writedml(self, text):
        if not isinstance(text, str):
            raise TypeError("writedml() argument must be str, not %s" % type(text).__name__)
        self.chunks.append(("dml", text))

    def flush(self):
        pass

    def isatty(self):
        return False

    @property
    def text(self):
        return "".join(text for _, text in self.chunks)


def run_windbg_script(name, args, target_or_scenario, **fake_options):
    """Run ``commands/<name>.py`` with ``args`` over a fake pykd backed by a
    Scenario, a Target or a dump path; returns (output text, the fake module).

    ``fake_options`` go to :func:`make_fake_pykd` (mode, dump, registers...).
    An exception escaping the script propagates (WinDbg would print its traceback;
    a test should see it)."""
    fake = make_fake_pykd(target_or_scenario, **fake_options)
    path = os.path.join(COMMANDS_DIR, name + ".py")
    with open(path, "r") as handle:
        source = handle.read()
    output = DebuggerOutput()
    saved = (sys.argv, sys.stdout, sys.stderr, sys.getrecursionlimit(), sys.modules.get("pykd"), list(sys.path))
    sys.argv = [path] + [str(arg) for arg in args]
    sys.stdout = sys.stderr = output
    sys.modules["pykd"] = fake
    sys.setrecursionlimit(500)
    try:
        exec(compile(source, path, "exec"), {"__name__": "__main__"})
    finally:
        sys.argv, sys.stdout, sys.stderr, limit, previous_pykd, sys.path[:] = saved
        sys.setrecursionlimit(limit)
        if previous_pykd is None:
            sys.modules.pop("pykd", None)
        else:
            sys.modules["pykd"] = previous_pykd
    return output.text, fake
