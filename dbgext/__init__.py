"""dbgext: Windows kernel/driver debugging analyses for WinDbg (pykd) and offline dumps."""

from .errors import BadInput, DbgextError, SymbolNotFound, UnreadableMemory
from .target import Target, open_dump

__version__ = "0.1.0"


def open(path, symbols=None):  # noqa: A001 - the package's front door, like io.open
    """Open a kernel crash dump, live dump or minidump as a :class:`Target`."""
    return open_dump(path, symbols=symbols)


__all__ = ["open", "Target", "DbgextError", "UnreadableMemory", "BadInput", "SymbolNotFound"]
