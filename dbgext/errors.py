"""The one small error hierarchy every part of dbgext raises.

Commands turn any DbgextError into a one-line message and a non-zero exit code;
anything else escaping an analysis is a bug.
"""


class DbgextError(Exception):
    """Base class: a problem the user can act on, printed as one line."""


class UnreadableMemory(DbgextError):
    """Target memory at ``address`` could not be read."""

    def __init__(self, address, size=None, detail=None):
        self.address = address
        self.size = size
        text = "memory at 0x%x is unreadable" % address
        if detail:
            text += " (%s)" % detail
        super().__init__(text)


class BadInput(DbgextError):
    """A file, argument or structure is malformed (truncated dump, bad signature...)."""


class SymbolNotFound(DbgextError):
    """A symbol, type or field is not known to the target's symbol source."""
