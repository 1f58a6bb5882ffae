"""Find trace databases in readable memory: the database magic followed by a
consistent first segment header (Database and SegmentStart pointing back)."""

import struct

from ..errors import BadInput, UnreadableMemory
from .layouts import DATABASE_MAGIC
from .layouts import recognise_layouts

MAX_CANDIDATES = 1000
MAX_SEGMENTS_COUNTED = 100000


class Candidate(object):
    __slots__ = ("address", "layout", "buckets", "traces", "hits", "segments", "current_size",
                 "segment_problem")

    def as_dict(self):
        return {"address": self.address, "layout": self.layout, "buckets": self.buckets,
                "traces": self.traces, "hits": self.hits, "segments": self.segments,
                "current_size": self.current_size, "segment_problem": self.segment_problem}


def find_databases(target, start=0, end=None, limit=MAX_CANDIDATES):
    """Candidates in [start, end), ascending.  A live session cannot enumerate its
    memory, so there a range is required (scanning 2^64 bytes page by page would
    never finish)."""
    if end is None and not target.can_list_memory():
        raise BadInput("this target cannot list its memory: give the range to search (start, end)")
    pattern = struct.pack("<I", DATABASE_MAGIC)
    candidates = []
    for address in target.scan(pattern, start, end, alignment=8 if target.pointer_size == 8 else 4):
        layout = recognise_layouts(target, address)
        if layout is None:
            continue
        try:
            header = layout.database.unpack(target.read(address, layout.database.span))
        except UnreadableMemory:
            continue
        candidate = Candidate()
        candidate.address = address
        candidate.layout = layout.name
        candidate.buckets = header["NoOfBuckets"]
        candidate.traces = header["NoOfTraces"]
        candidate.hits = header["NoOfHits"]
        candidate.current_size = header["CurrentSize"]
        candidate.segments, candidate.segment_problem = _count_segments(
            target, layout, header["SegmentList"])
        candidates.append(candidate)
        if len(candidates) >= limit:
            break
    return candidates


def _count_segments(target, layout, first):
    """(segments in the list, why counting stopped early or None)."""
    seen = set()
    address = first
    next_offset = layout.segment.offsets["NextSegment"]
    while address:
        if address in seen:
            return len(seen), "segment_cycle"
        if len(seen) >= MAX_SEGMENTS_COUNTED:
            return len(seen), "segment_limit"
        seen.add(address)
        try:
            address = target.pointer(address + next_offset)
        except UnreadableMemory:
            return len(seen), "unreadable"
    return len(seen), None
