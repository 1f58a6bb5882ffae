"""RTL_TRACE_DATABASE / _SEGMENT / _BLOCK layouts, as data of the one layout shape
(:mod:`dbgext.layouts`), and how a database's layout is chosen.

Offsets come from shared/reference/rtl-trace-database.md (beside the repository) (Windows' own
ntdll and ntoskrnl builds).  User and kernel databases differ after CurrentSize,
so each mode has its own built-in table; :func:`choose_layouts` looks the types up
the one way (:func:`dbgext.layouts.lookup_layout`: type information first, else the
built-in table) and says which source it used.

ARM64 targets use the x64 tables (``arm64_as_x64``): the three structures are
plain 64-bit data (ULONGs, pointers, a lock of pointer size), declared once
for 64-bit Windows.  That is assumed, not verified: no ARM64 dump holding a
trace database was at hand.
"""

import struct

from ..errors import BadInput, LayoutNotFound, UnreadableMemory
from ..layouts import BuiltinLayouts, lookup_layout

DATABASE_MAGIC = 0xABCDCCCC
SEGMENT_MAGIC = 0xABCDBBBB
BLOCK_MAGIC = 0xABCDAAAA

MAX_FRAMES = 256             # Add refuses longer traces
MIN_BUCKETS = 16             # fewer divides by zero in HashCounter bookkeeping
MAX_BUCKETS = 0x100000       # Create refuses more
HASH_COUNTER_SLOTS = 16

DEFAULT_HASH_SYMBOLS = ("RtlStackTraceHashFunction", "RtlpTraceStandardHashFunction")

_MAGIC_NAMES = {DATABASE_MAGIC: "RTL_TRACE_DATABASE", SEGMENT_MAGIC: "RTL_TRACE_SEGMENT",
                BLOCK_MAGIC: "RTL_TRACE_BLOCK"}


def describe_magic(value):
    """What a ULONG found where a magic belongs says is there, for WrongSignature."""
    if value in _MAGIC_NAMES:
        return "the magic of an %s (0x%08x)" % (_MAGIC_NAMES[value], value)
    return "0x%08x" % value


DATABASE_TYPE = "_RTL_TRACE_DATABASE"
SEGMENT_TYPE = "_RTL_TRACE_SEGMENT"
BLOCK_TYPE = "_RTL_TRACE_BLOCK"

_SEGMENT_X64 = {"arch": "x64", "size": 0x38,
                "fields": {"Magic": (0x00, "I"), "Database": (0x08, "P"), "NextSegment": (0x10, "P"),
                           "TotalSize": (0x18, "P"), "SegmentStart": (0x20, "P"), "SegmentEnd": (0x28, "P"),
                           "SegmentFree": (0x30, "P")}}
_SEGMENT_X86 = {"arch": "x86", "size": 0x1C,
                "fields": {"Magic": (0x00, "I"), "Database": (0x04, "P"), "NextSegment": (0x08, "P"),
                           "TotalSize": (0x0C, "P"), "SegmentStart": (0x10, "P"), "SegmentEnd": (0x14, "P"),
                           "SegmentFree": (0x18, "P")}}
_BLOCK_X64 = {"arch": "x64", "size": 0x38,
              "fields": {"Magic": (0x00, "I"), "Count": (0x04, "I"), "Size": (0x08, "I"),
                         "UserCount": (0x10, "P"), "UserSize": (0x18, "P"), "UserContext": (0x20, "P"),
                         "Next": (0x28, "P"), "Trace": (0x30, "P")}}
_BLOCK_X86 = {"arch": "x86", "size": 0x20,
              "fields": {"Magic": (0x00, "I"), "Count": (0x04, "I"), "Size": (0x08, "I"),
                         "UserCount": (0x0C, "P"), "UserSize": (0x10, "P"), "UserContext": (0x14, "P"),
                         "Next": (0x18, "P"), "Trace": (0x1C, "P")}}

# ntdll's databases (RtlTraceDatabaseCreate in user mode).
USER_LAYOUTS = BuiltinLayouts({
    DATABASE_TYPE: [
        {"arch": "x64", "size": 0xC0,
         "fields": {"Magic": (0x00, "I"), "Flags": (0x04, "I"), "Tag": (0x08, "I"), "SegmentList": (0x10, "P"),
                    "MaximumSize": (0x18, "P"), "CurrentSize": (0x20, "P"), "Owner": (0x28, "P"),
                    "NoOfBuckets": (0x58, "I"), "Buckets": (0x60, "P"), "HashFunction": (0x68, "P"),
                    "NoOfTraces": (0x70, "P"), "NoOfHits": (0x78, "P"), "HashCounter": (0x80, "16I")}},
        {"arch": "x86", "size": 0x88,
         "fields": {"Magic": (0x00, "I"), "Flags": (0x04, "I"), "Tag": (0x08, "I"), "SegmentList": (0x0C, "P"),
                    "MaximumSize": (0x10, "P"), "CurrentSize": (0x14, "P"), "Owner": (0x18, "P"),
                    "NoOfBuckets": (0x34, "I"), "Buckets": (0x38, "P"), "HashFunction": (0x3C, "P"),
                    "NoOfTraces": (0x40, "P"), "NoOfHits": (0x44, "P"), "HashCounter": (0x48, "16I")}},
    ],
    SEGMENT_TYPE: [_SEGMENT_X64, _SEGMENT_X86],
    BLOCK_TYPE: [_BLOCK_X64, _BLOCK_X86],
}, arm64_as_x64=True)

# ntoskrnl's databases: a different lock moves everything after CurrentSize.
KERNEL_LAYOUTS = BuiltinLayouts({
    DATABASE_TYPE: [
        {"arch": "x64", "size": 0xD8,
         "fields": {"Magic": (0x00, "I"), "Flags": (0x04, "I"), "Tag": (0x08, "I"), "SegmentList": (0x10, "P"),
                    "MaximumSize": (0x18, "P"), "CurrentSize": (0x20, "P"), "Owner": (0x30, "P"),
                    "NoOfBuckets": (0x70, "I"), "Buckets": (0x78, "P"), "HashFunction": (0x80, "P"),
                    "NoOfTraces": (0x88, "P"), "NoOfHits": (0x90, "P"), "HashCounter": (0x98, "16I")}},
    ],
    SEGMENT_TYPE: [_SEGMENT_X64],
    BLOCK_TYPE: [_BLOCK_X64],
}, arm64_as_x64=True)

# What differs between the modes besides the layouts.
MODES = {
    "user": {"module": "ntdll", "create_flag": 1, "segment_granularity": 0x10000, "builtin": USER_LAYOUTS},
    "kernel": {"module": "nt", "create_flag": 2, "segment_granularity": 0x1000, "builtin": KERNEL_LAYOUTS},
}

# The names --layout accepts: a mode's built-in table for one architecture.
LAYOUT_NAMES = sorted("%s-%s" % (mode, row["arch"]) for mode, facts in MODES.items()
                      for row in facts["builtin"].table[DATABASE_TYPE])


class StructDecoder(object):
    """One structure's :class:`dbgext.layouts.Layout` compiled into a single
    ``struct`` that reads every field from a buffer in one ``unpack_from``."""

    def __init__(self, layout):
        self.layout = layout
        self.size = layout.size
        self.offsets = {}
        names = []
        fmt = "<"
        cursor = 0
        for name, (offset, _) in sorted(layout.fields.items(), key=lambda item: item[1][0]):
            kind = layout.format(name)[1:]
            if offset < cursor:
                raise BadInput("%s: field %s at 0x%x overlaps the previous one (from %s)"
                               % (layout.name, name, offset, layout.source))
            fmt += "%dx" % (offset - cursor) if offset > cursor else ""
            fmt += kind
            cursor = offset + struct.calcsize("<" + kind)
            self.offsets[name] = offset
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


class TraceLayouts(object):
    """The three structure layouts of one database, the facts of its mode, and why
    they were chosen (``reason``, shown in output and JSON)."""

    def __init__(self, name, mode, database, segment, block, reason):
        facts = MODES[mode]
        self.name = name
        self.mode = mode
        self.arch = name.split("-", 1)[1]
        self.module = facts["module"]
        self.create_flag = facts["create_flag"]
        self.segment_granularity = facts["segment_granularity"]
        self.pointer_size = database.pointer_size
        self.database = StructDecoder(database)
        self.segment = StructDecoder(segment)
        self.block = StructDecoder(block)
        self.reason = reason

    @property
    def sources(self):
        """Where each structure's layout came from."""
        return {"database": self.database.layout.source, "segment": self.segment.layout.source,
                "block": self.block.layout.source}

    @property
    def first_segment_offset(self):
        """The first segment header sits right after the database header."""
        return self.database.size

    @property
    def hash_counter_offset(self):
        return self.database.offsets["HashCounter"]


def _lookup(target, mode, reason):
    """The mode's three layouts for ``target`` (type information of ntdll/nt when it
    has the types, else the mode's built-in table)."""
    facts = MODES[mode]
    found = [lookup_layout(target, "%s!%s" % (facts["module"], type_name), facts["builtin"])
             for type_name in (DATABASE_TYPE, SEGMENT_TYPE, BLOCK_TYPE)]
    return TraceLayouts("%s-%s" % (mode, target.arch), mode, found[0], found[1], found[2], reason)


class _BuiltinOnly(object):
    """A stand-in target with no type information, so :func:`lookup_layout` answers
    from the built-in tables: what ``--layout NAME`` asks for."""

    build = None

    def __init__(self, arch):
        self.arch = arch
        self.pointer_size = 4 if arch == "x86" else 8

    def type_layout(self, type_name):
        return None

    def type_size(self, type_name):
        return None

    def layout_hints(self, type_name):
        return None


def layout_named(name, reason="chosen by name"):
    """The built-in layouts ``--layout NAME`` stands for (``user-x64``, ``kernel-x64``, ``user-x86``)."""
    if name not in LAYOUT_NAMES:
        raise BadInput("unknown layout %r (known: %s)" % (name, ", ".join(LAYOUT_NAMES)))
    mode, arch = name.split("-", 1)
    return _lookup(_BuiltinOnly(arch), mode, reason)


def _modes_for(target):
    return [mode for mode in sorted(MODES) if MODES[mode]["builtin"].find(DATABASE_TYPE, target.arch, None)]


def choose_layouts(target, address, requested=None):
    """The layouts to read the database at ``address`` with, and why.

    Order: ``--layout``; the target's type information for ntdll's or nt's
    _RTL_TRACE_DATABASE; recognition from memory (the first segment header right
    after the database header points back to it); else the built-in layout of the
    target's mode, saying that it is an assumption."""
    if requested:
        return layout_named(requested)
    for mode in _modes_for(target):
        type_name = "%s!%s" % (MODES[mode]["module"], DATABASE_TYPE)
        fields = MODES[mode]["builtin"].find(DATABASE_TYPE, target.arch, None)["fields"]
        try:
            # Type information is taken only when it has every field the walk reads.
            source = lookup_layout(target, type_name, fields=fields).source
        except LayoutNotFound:
            continue
        return _lookup(target, mode, "type information for %s%s" % (type_name, " (%s)" % source if source else ""))
    recognised = recognise_layouts(target, address)
    if recognised is not None:
        return recognised
    info = target.info()
    mode = "kernel" if info.get("kind") == "kernel-dump" or info.get("mode") == "kernel" else "user"
    if mode not in _modes_for(target):
        mode = "user"
    name = "%s-%s" % (mode, target.arch)
    return _lookup(target, mode, "no type information and no first segment header recognised after the "
                                 "database; assuming %s (a layout given by name overrides this)" % name)


def recognise_layouts(target, address):
    """The layouts whose first segment header (right after the database header) has
    Database == address and SegmentStart == address, or None."""
    for mode in _modes_for(target):
        layouts = _lookup(target, mode, "")
        segment_address = address + layouts.first_segment_offset
        try:
            fields = layouts.segment.unpack(target.read(segment_address, layouts.segment.span))
        except UnreadableMemory:
            continue
        if fields["Database"] == address and fields["SegmentStart"] == address:
            layouts.reason = ("recognised from memory: the first segment header at +0x%x points back to the "
                              "database" % layouts.first_segment_offset)
            return layouts
    return None
