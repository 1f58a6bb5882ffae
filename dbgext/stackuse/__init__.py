"""Stack usage: per-function frame sizes (unwind data and prologue analysis),
worst-case call chains, and a kf-like view of a thread's stack consumption.

Scripts use :func:`analyze`, :func:`chain` and :func:`hogs` (see
:mod:`dbgext.stackuse.analysis`); each returns a result with ``as_dict()`` and
``problems``."""

from .analysis import ChainResult, FunctionsResult, HogsResult, analyze, chain, hogs

__all__ = ["analyze", "chain", "hogs", "FunctionsResult", "ChainResult", "HogsResult"]
