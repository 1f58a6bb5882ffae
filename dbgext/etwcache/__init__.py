"""ETW stack cache ("stack caching"): walk, validate, look up StackKeys, simulate.

Scripts use :func:`analyze` (the caches in a target: a StackCacheAnalysis) and
:func:`simulate` (a StackStream from :func:`load_stack_file`,
:func:`load_etl_stream` or :func:`load_rtltrace_stream`, replayed over a sweep of
configurations: a SimulationReport); :func:`name_frames` names the frames of the
cached stacks a script shows (``CacheReport.frame_names``)."""

from .analysis import (CacheReport, KeyLookup, SimulationReport, StackCacheAnalysis, analyze, name_frames,
                       simulate)
from .replay import StackStream
from .streams import load_etl_stream, load_rtltrace_stream, load_stack_file

__all__ = ["analyze", "simulate", "name_frames", "CacheReport", "KeyLookup", "SimulationReport", "StackCacheAnalysis",
           "StackStream", "load_etl_stream", "load_rtltrace_stream", "load_stack_file"]
