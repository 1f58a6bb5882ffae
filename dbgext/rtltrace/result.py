"""What ``dbgext.rtltrace.walk`` returns: plain data read from one database plus
every fact the analysis derived (validation, statistics, the selected traces, the
names of the frames a caller shows), and the JSON document of it
(docs/json-schema/rtltrace.md); what ``find`` returns."""

from ..problems import ProblemLog
from ..hexaddr import hexaddr
from .layouts import DATABASE_MAGIC

SCHEMA_VERSION = 1


class Segment(object):
    """One RTL_TRACE_SEGMENT header, plus where its blocks may lie."""

    __slots__ = ("address", "magic", "database", "next", "total_size", "start", "end", "free",
                 "payload_start", "extent_end")

    def __init__(self, address, fields):
        self.address = address
        self.magic = fields["Magic"]
        self.database = fields["Database"]
        self.next = fields["NextSegment"]
        self.total_size = fields["TotalSize"]
        self.start = fields["SegmentStart"]
        self.end = fields["SegmentEnd"]
        self.free = fields["SegmentFree"]
        self.payload_start = self.start  # where blocks may begin (set by the walker)
        self.extent_end = self.end        # end of the allocation (first segment: rounded up)

    @property
    def used(self):
        return max(0, self.free - self.payload_start)

    def as_dict(self):
        return {"address": self.address, "magic": self.magic, "database": self.database,
                "next": self.next, "start": self.start, "end": self.end, "free": self.free,
                "total_size": self.total_size, "used": self.used}


class TraceBlock(object):
    """One stored stack trace; ``bucket`` is the bucket whose chain reached it and
    ``hash`` the default hash of its frames (None when the frames were not read).

    ``frames`` (a tuple of return addresses, or None when unreadable) is decoded
    on first use: validation needs only the hash, which the walk computes from
    the raw bytes, and decoding 100,000 frame arrays up front would be a third
    of a full walk."""

    __slots__ = ("address", "magic", "count", "size", "user_count", "user_size", "user_context",
                 "next", "trace", "bucket", "hash", "_frames", "_frame_buffer", "_frame_offset",
                 "_frame_decoder")

    def __init__(self, address, bucket, fields):
        """``fields``: the header in offset order (Magic, Count, Size, UserCount,
        UserSize, UserContext, Next, Trace)."""
        self.address = address
        self.bucket = bucket
        (self.magic, self.count, self.size, self.user_count, self.user_size, self.user_context,
         self.next, self.trace) = fields
        self.hash = None
        self._frames = None
        self._frame_decoder = None

    @property
    def frames(self):
        if self._frame_decoder is not None:
            self._frames = self._frame_decoder.unpack_from(self._frame_buffer, self._frame_offset)
            self._frame_decoder = self._frame_buffer = None
        return self._frames

    @frames.setter
    def frames(self, value):
        self._frames = value
        self._frame_decoder = self._frame_buffer = None

    def defer_frames(self, buffer, offset, decoder):
        """Frames to decode later with ``decoder`` (a struct.Struct) at ``offset``
        (three slots rather than one tuple: 100,000 fewer objects to allocate and
        for the garbage collector to track)."""
        self._frame_buffer = buffer
        self._frame_offset = offset
        self._frame_decoder = decoder

    @property
    def frames_read(self):
        return self._frames is not None or self._frame_decoder is not None

    def as_dict(self, names=None):
        """``names``: {frame: name} (the database's ``frame_names``) for ``symbols``."""
        frames = list(self.frames or ())
        names = names or {}
        return {"address": self.address, "bucket": self.bucket, "count": self.count,
                "depth": self.size, "frames": frames, "symbols": [names.get(frame) for frame in frames]}


class TraceDatabase(object):
    """Everything read from one database, what the validator found, the statistics
    and the traces the caller selected (``selection``); ``frame_names`` holds the
    names of the frames a caller asked for (:func:`dbgext.rtltrace.name_frames`)."""

    def __init__(self, address, layout):
        self.problems = ProblemLog()
        self.address = address
        self.layout = layout
        self.header = {}
        self.header_read = False
        self.segments = []
        self.segment_list_complete = True  # False when the list walk stopped early
        self.blocks = []
        self.chain_lengths = []       # per walked bucket
        self.buckets_walked = 0
        self.complete = True          # False when anything stopped the walk early
        self.notes = []
        # Filled by the validator:
        self.hash_function = {}
        self.hash_counter_expected = None
        self.overflow_traces = 0      # m: new traces whose HashCounter slot was 16
        self.external_finds = None    # F
        self.statistics = {}
        self.segment_magic = {}       # segment address -> "ok", "ok (+m HashCounter overflow)", "BAD ..."
        self.flag_names = []
        # Filled by the selection (dbgext.rtltrace.analysis):
        self.selection = Selection("all", [])
        self.frame_names = {}

    @property
    def arch(self):
        return self.layout.arch

    @property
    def magic_ok(self):
        return self.header_read and self.field("Magic") == DATABASE_MAGIC

    def field(self, name, default=0):
        return self.header.get(name, default)

    def hexaddr(self, address):
        """``address`` as WinDbg shows it on this database's architecture (for messages)."""
        return hexaddr(address, self.layout.pointer_size)

    def note(self, text):
        self.notes.append(text)

    def as_dict(self, traces=None):
        """The --json document (docs/json-schema/rtltrace.md); ``trace_list`` lists
        ``traces`` (default: the selection), each frame with its name when named."""
        return {
            "schema_version": SCHEMA_VERSION,
            "address": self.address,
            "arch": self.arch,
            "layout": self.layout.name,
            "layout_reason": self.layout.reason,
            "layout_sources": self.layout.sources,
            "magic_ok": self.magic_ok,
            "magic": self.field("Magic") if self.header_read else None,
            "flags": self.field("Flags"),
            "tag": self.field("Tag"),
            "buckets": self.field("NoOfBuckets"),
            "buckets_address": self.field("Buckets"),
            "traces": self.field("NoOfTraces"),
            "hits": self.field("NoOfHits"),
            "current_size": self.field("CurrentSize"),
            "maximum_size": self.field("MaximumSize"),
            "owner": self.field("Owner"),
            "hash_function": dict(self.hash_function),
            "hash_counter": list(self.field("HashCounter", [])),
            "hash_counter_expected": self.hash_counter_expected,
            "hash_counter_overflow": self.overflow_traces,
            "external_finds": self.external_finds,
            "segments": [dict(segment.as_dict(), magic_status=self.segment_magic.get(segment.address))
                         for segment in self.segments],
            "blocks_found": len(self.blocks),
            "statistics": self.statistics,
            "complete": self.complete,
            "selection": self.selection.kind,
            "trace_list": [block.as_dict(self.frame_names)
                           for block in (self.selection.blocks if traces is None else traces)],
            "problems": self.problems.as_list(),
            "notes": list(self.notes),
        }




class Selection(object):
    """The traces asked for: ``kind`` is ``all``, ``trace``, ``bucket`` or
    ``module``; ``blocks`` in walk order."""

    __slots__ = ("kind", "bucket", "module", "blocks")

    def __init__(self, kind, blocks, bucket=None, module=None):
        self.kind = kind
        self.bucket = bucket
        self.module = module
        self.blocks = blocks


class DatabaseSearch(object):
    """What ``find`` found: candidates in
    ascending address order and, when asked to walk them, each one analyzed."""

    def __init__(self, candidates, databases=(), problems=()):
        self.candidates = candidates
        self.databases = list(databases)
        self.problems = ProblemLog(problems)

    def as_dict(self):
        return {"schema_version": SCHEMA_VERSION,
                "candidates": [candidate.as_dict() for candidate in self.candidates],
                "databases": [database.as_dict() for database in self.databases],
                "problems": self.problems.as_list()}
