"""RTL_TRACE_DATABASE / _SEGMENT / _BLOCK layouts as data.

Offsets come from /work/shared/reference/rtl-trace-database.md (Windows' own
ntdll and ntoskrnl builds).  Field formats are struct characters: ``I`` is a ULONG,
``P`` a pointer-sized value (PVOID, SIZE_T) resolved per layout to ``Q`` or ``I``.
"""

import struct

DATABASE_MAGIC = 0xABCDCCCC
SEGMENT_MAGIC = 0xABCDBBBB
BLOCK_MAGIC = 0xABCDAAAA

MAX_FRAMES = 256             # Add refuses longer traces
MIN_BUCKETS = 16             # fewer divides by zero in HashCounter bookkeeping
MAX_BUCKETS = 0x100000       # Create refuses more
HASH_COUNTER_SLOTS = 16

DEFAULT_HASH_SYMBOLS = ("RtlStackTraceHashFunction", "RtlpTraceStandardHashFunction")

_SEGMENT_X64 = {
    "size": 0x38,
    "fields": {"Magic": (0x00, "I"), "Database": (0x08, "P"), "NextSegment": (0x10, "P"),
               "TotalSize": (0x18, "P"), "SegmentStart": (0x20, "P"), "SegmentEnd": (0x28, "P"),
               "SegmentFree": (0x30, "P")},
}

_BLOCK_X64 = {
    "size": 0x38,
    "fields": {"Magic": (0x00, "I"), "Count": (0x04, "I"), "Size": (0x08, "I"),
               "UserCount": (0x10, "P"), "UserSize": (0x18, "P"), "UserContext": (0x20, "P"),
               "Next": (0x28, "P"), "Trace": (0x30, "P")},
}

LAYOUTS = {
    "user-x64": {
        "arch": "x64",
        "mode": "user",
        "module": "ntdll",
        "create_flag": 1,           # Create ORs this into the caller's flags
        "segment_granularity": 0x10000,
        "database": {
            "size": 0xC0,
            "fields": {"Magic": (0x00, "I"), "Flags": (0x04, "I"), "Tag": (0x08, "I"),
                       "SegmentList": (0x10, "P"), "MaximumSize": (0x18, "P"),
                       "CurrentSize": (0x20, "P"), "Owner": (0x28, "P"),
                       "NoOfBuckets": (0x58, "I"), "Buckets": (0x60, "P"),
                       "HashFunction": (0x68, "P"), "NoOfTraces": (0x70, "P"),
                       "NoOfHits": (0x78, "P"), "HashCounter": (0x80, "16I")},
        },
        "segment": _SEGMENT_X64,
        "block": _BLOCK_X64,
    },
    "kernel-x64": {
        "arch": "x64",
        "mode": "kernel",
        "module": "nt",
        "create_flag": 2,
        "segment_granularity": 0x1000,
        "database": {
            "size": 0xD8,
            "fields": {"Magic": (0x00, "I"), "Flags": (0x04, "I"), "Tag": (0x08, "I"),
                       "SegmentList": (0x10, "P"), "MaximumSize": (0x18, "P"),
                       "CurrentSize": (0x20, "P"), "Owner": (0x30, "P"),
                       "NoOfBuckets": (0x70, "I"), "Buckets": (0x78, "P"),
                       "HashFunction": (0x80, "P"), "NoOfTraces": (0x88, "P"),
                       "NoOfHits": (0x90, "P"), "HashCounter": (0x98, "16I")},
        },
        "segment": _SEGMENT_X64,
        "block": _BLOCK_X64,
    },
    "user-x86": {
        "arch": "x86",
        "mode": "user",
        "module": "ntdll",
        "create_flag": 1,
        "segment_granularity": 0x10000,
        "database": {
            "size": 0x88,
            "fields": {"Magic": (0x00, "I"), "Flags": (0x04, "I"), "Tag": (0x08, "I"),
                       "SegmentList": (0x0C, "P"), "MaximumSize": (0x10, "P"),
                       "CurrentSize": (0x14, "P"), "Owner": (0x18, "P"),
                       "NoOfBuckets": (0x34, "I"), "Buckets": (0x38, "P"),
                       "HashFunction": (0x3C, "P"), "NoOfTraces": (0x40, "P"),
                       "NoOfHits": (0x44, "P"), "HashCounter": (0x48, "16I")},
        },
        "segment": {
            "size": 0x1C,
            "fields": {"Magic": (0x00, "I"), "Database": (0x04, "P"), "NextSegment": (0x08, "P"),
                       "TotalSize": (0x0C, "P"), "SegmentStart": (0x10, "P"),
                       "SegmentEnd": (0x14, "P"), "SegmentFree": (0x18, "P")},
        },
        "block": {
            "size": 0x20,
            "fields": {"Magic": (0x00, "I"), "Count": (0x04, "I"), "Size": (0x08, "I"),
                       "UserCount": (0x0C, "P"), "UserSize": (0x10, "P"),
                       "UserContext": (0x14, "P"), "Next": (0x18, "P"), "Trace": (0x1C, "P")},
        },
    },
}

LAYOUT_NAMES = sorted(LAYOUTS)


class StructLayout(object):
    """One structure's fields with struct formats resolved for a pointer size; reads
    every field from a buffer in one ``unpack_from``."""

    def __init__(self, spec, pointer_size):
        pointer_char = "Q" if pointer_size == 8 else "I"
        self.size = spec["size"]
        self.offsets = {}
        self.formats = {}  # field -> struct format of the field alone
        names = []
        fmt = "<"
        cursor = 0
        for name, (offset, kind) in sorted(spec["fields"].items(), key=lambda item: item[1][0]):
            kind = kind.replace("P", pointer_char)
            if offset < cursor:
                raise ValueError("overlapping field %s at 0x%x" % (name, offset))
            fmt += "%dx" % (offset - cursor) if offset > cursor else ""
            fmt += kind
            cursor = offset + struct.calcsize("<" + kind)
            self.offsets[name] = offset
            self.formats[name] = "<" + kind
            names.append((name, int(kind[:-1]) if len(kind) > 1 else None))
        self._struct = struct.Struct(fmt)
        # The raw field values in offset order (the fast path for blocks).
        self.unpack_tuple = self._struct.unpack_from
        self._names = names
        self.span = cursor  # bytes the fields cover (<= size)

    def unpack(self, buffer, offset=0):
        """{field: value} (an array field becomes a list)."""
        values = self._struct.unpack_from(buffer, offset)
        result = {}
        index = 0
        for name, count in self._names:
            if count:
                result[name] = list(values[index:index + count])
                index += count
            else:
                result[name] = values[index]
                index += 1
        return result

    def field_order(self):
        return [name for name, _ in self._names]


class Layout(object):
    """A named set of the three structure layouts for one architecture."""

    def __init__(self, name, spec, reason):
        self.name = name
        self.reason = reason
        self.arch = spec["arch"]
        self.mode = spec["mode"]
        self.module = spec["module"]
        self.create_flag = spec["create_flag"]
        self.segment_granularity = spec["segment_granularity"]
        self.pointer_size = 8 if self.arch == "x64" else 4
        self.database = StructLayout(spec["database"], self.pointer_size)
        self.segment = StructLayout(spec["segment"], self.pointer_size)
        self.block = StructLayout(spec["block"], self.pointer_size)

    @property
    def first_segment_offset(self):
        """The first segment header sits right after the database header."""
        return self.database.size

    @property
    def hash_counter_offset(self):
        return self.database.offsets["HashCounter"]


def layout_named(name, reason="chosen with --layout"):
    if name not in LAYOUTS:
        raise KeyError(name)
    return Layout(name, LAYOUTS[name], reason)


def layout_from_types(name, database_size, database_offsets, reason):
    """A built-in layout with the database offsets replaced by those from the
    debugger's type information (``database_offsets``: {field: offset})."""
    spec = dict(LAYOUTS[name])
    base = spec["database"]
    fields = {}
    for field, (offset, kind) in base["fields"].items():
        fields[field] = (database_offsets.get(field, offset), kind)
    spec["database"] = {"size": database_size or base["size"], "fields": fields}
    return Layout(name, spec, reason)
