"""``dumpinfo``: what a dump is and what it holds, like WinDbg's ``.dumpdebug`` and
``vertarget``: the header, the dump type, the parts it contains, KDDEBUGGER_DATA64,
and where structure offsets come from.

Scripts call :func:`analyze` and read the :class:`DumpInfoResult` it returns."""

from .analyze import analyze
from .result import DumpInfoResult

__all__ = ["analyze", "DumpInfoResult"]
