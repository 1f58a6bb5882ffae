"""RTL_TRACE_DATABASE stack-trace databases (ntdll's and ntoskrnl's): layouts,
walker, validator, finder, renderers, the ``rtltrace`` command and a fixture
builder that follows Windows' own Create/Add algorithm.

Scripts use :func:`analyze` (one database: a :class:`TraceDatabase`, or every
database in memory: a :class:`DatabaseSearch`) and :func:`find`."""

from .analysis import analyze, find
from .result import DatabaseSearch, Selection, TraceDatabase

__all__ = ["analyze", "find", "DatabaseSearch", "Selection", "TraceDatabase"]
