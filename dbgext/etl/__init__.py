"""A small reader of .etl trace files (tests/etl_writer.py writes them): WMI buffers, system /
classic / manifest event headers, and the kernel's StackWalk events.

    from dbgext.etl import EtlReader, iter_events
    for event in iter_events("trace.etl", provider=INTEL_PT_GUID, opcode=32):
        event.payload  # bytes after the event header

    with EtlReader("trace.etl") as reader:   # when the caller reports what was skipped:
        for event in reader.events(): ...
    reader.summary.note()                    # one line, or None; .as_dict() for JSON
"""

from .format import INTEL_PT_GUID, STACKWALK_GUID, looks_like_etl
from .reader import EtlReader, Event, ReadSummary, iter_events

__all__ = ["EtlReader", "Event", "ReadSummary", "iter_events", "looks_like_etl", "INTEL_PT_GUID",
           "STACKWALK_GUID"]
