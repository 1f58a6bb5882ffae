"""The one small error hierarchy every part of dbgext raises.

Commands turn any DbgextError into a one-line message and a non-zero exit code;
anything else escaping an analysis is a bug.
"""

from .hexaddr import hexaddr


class DbgextError(Exception):
    """Base class: a problem the user can act on, printed as one line."""


class UnreadableMemory(DbgextError):
    """Target memory at ``address`` could not be read."""

    def __init__(self, address, size=None, detail=None):
        self.address = address
        self.size = size
        text = "memory at %s is unreadable" % hexaddr(address)
        if detail:
            text += " (%s)" % detail
        super().__init__(text)


class BadInput(DbgextError):
    """A file, argument or structure is malformed (truncated dump, bad signature...)."""


class SymbolNotFound(DbgextError):
    """A symbol, type or field is not known to the target's symbol source."""


class WrongSignature(BadInput):
    """A structure's magic or signature does not match what the command expected:
    the address is probably wrong.  Analyses refuse to walk it unless forced (``force``)."""

    def __init__(self, what, address, found):
        self.what = what
        self.address = address
        self.found = found
        super().__init__("no %s at %s: found %s there (force=True walks it anyway)"
                         % (what, hexaddr(address), found))


class NeedsBiggerDump(BadInput):
    """The analysis scans or walks memory that this kind of dump does not hold
    (a small memory dump keeps one stack and a few pages)."""


class LayoutNotFound(BadInput):
    """No source (type information, the dump's debugger data, built-in tables) knows
    a structure's layout for this target."""


# Exit codes of every command (documented in README.md).
EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_PROBLEMS = 4        # the run worked and found problems (--validate, triage failures)
EXIT_INTERRUPTED = 130   # Ctrl-C: committed work is kept
