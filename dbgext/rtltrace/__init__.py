"""RTL_TRACE_DATABASE stack-trace databases (ntdll's and ntoskrnl's): layouts,
walker, validator, finder, renderers, the ``rtltrace`` command and a fixture
builder that follows Windows' own Create/Add algorithm.

Scripts use :func:`walk` (one database: a :class:`TraceDatabase`) and
:func:`find` (the databases in memory, each walked with ``walk=True``: a
:class:`DatabaseSearch`); :func:`name_frames` names the frames of the traces a
script shows (``TraceDatabase.frame_names``, and ``symbols`` in ``as_dict()``)."""

from .analysis import find, name_frames, walk
from .result import DatabaseSearch, Selection, TraceDatabase

__all__ = ["find", "walk", "name_frames", "DatabaseSearch", "Selection", "TraceDatabase"]
