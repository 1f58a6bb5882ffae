"""A small reader (and, for tests, writer) of .etl trace files: WMI buffers, system /
classic / manifest event headers, and the kernel's StackWalk events.

    from dbgext.etl import EtlReader, iter_events
    for event in iter_events("trace.etl", provider=INTEL_PT_GUID, opcode=32):
        event.payload  # bytes after the event header
"""

from .format import INTEL_PT_GUID, STACKWALK_GUID
from .reader import EtlReader, Event, iter_events
from .writer import EtlWriter

__all__ = ["EtlReader", "EtlWriter", "Event", "iter_events", "INTEL_PT_GUID", "STACKWALK_GUID"]
