"""Structure layouts of the target, in one shape, from one lookup.

A :class:`Layout` is a structure's size and its fields as ``name -> (offset,
fmt)``, where ``fmt`` is a :mod:`struct` format (``"I"``, ``"Q"``, ``"16I"``; ``"P"``
is pointer-sized; ``None`` when only the offset is known), plus where it came from.

:func:`lookup_layout` is the one place that decides where a layout comes from, in
the order a WinDbg user trusts them:

1. the target's type information (PDB, ISF or the debugger's, through
   ``target.type_size`` / ``target.field_offset``);
2. the dump's own ``KDDEBUGGER_DATA64`` offsets (``Target.layout_hints``);
3. the built-in tables for the target's architecture and build.

Every result says which source answered, so the output can say it too.

ARM64 has no built-in kernel structure tables (its _KTHREAD, _KPRCB and trap
frame are not x64's), so without type information its offsets come from
KDDEBUGGER_DATA64, read with the field formats of a 64-bit row.  Verified on the
real ARM64 small dump: _KTHREAD's InitialStack, StackLimit and KernelStack from
its KDDEBUGGER_DATA64 bracket the context's sp (``stackuse thread``: 2320 bytes
used, 29856 left).  Tables of plain 64-bit data opt in to serving ARM64 with
their x64 rows (:class:`BuiltinLayouts` ``arm64_as_x64``).  Dump *file*
formats live in :mod:`dbgext.layouts.dump_formats`: they are not target types.
"""

import struct

from ..errors import LayoutNotFound


class Layout(object):
    __slots__ = ("name", "size", "fields", "source", "pointer_size")

    def __init__(self, name, size, fields, source, pointer_size=8):
        self.name = name
        self.size = size
        self.fields = dict(fields)
        self.source = source
        self.pointer_size = pointer_size

    def has(self, field):
        return field in self.fields

    def offset(self, field):
        entry = self.fields.get(field)
        return entry[0] if entry else None

    def format(self, field):
        """The field's struct format with ``P`` resolved for this layout's pointer size."""
        fmt = self.fields[field][1]
        if fmt is None:
            raise LayoutNotFound("%s.%s: only its offset is known (from %s)" % (self.name, field, self.source))
        return "<" + fmt.replace("P", "Q" if self.pointer_size == 8 else "I")

    def unpack(self, data, field, base=0):
        """The field's value(s) from ``data`` holding the structure at ``base``."""
        values = struct.unpack_from(self.format(field), data, base + self.fields[field][0])
        return values[0] if len(values) == 1 else values

    def read(self, target, address, field):
        """The field's value read from target memory (UnreadableMemory if it can't be)."""
        fmt = self.format(field)
        data = target.read(address + self.fields[field][0], struct.calcsize(fmt))
        values = struct.unpack(fmt, data)
        return values[0] if len(values) == 1 else values

    def as_dict(self):
        return {"name": self.name, "size": self.size, "source": self.source,
                "fields": {name: offset for name, (offset, _) in self.fields.items()}}

    def __repr__(self):
        return "Layout(%r, size=%r, %d fields, source=%r)" % (self.name, self.size, len(self.fields), self.source)


class BuiltinLayouts(object):
    """Built-in layouts as data: ``{type_name: [{"arch": "x64", "builds": (min, max),
    "size": n, "fields": {name: (offset, fmt)}}, ...]}``.  ``builds`` is inclusive;
    ``None`` (or a missing key) matches every build.  The first matching row wins,
    so list specific builds before general ones.

    With ``arm64_as_x64`` an ARM64 target with no row of its own takes the x64
    row: for tables of structures Windows declares once for every 64-bit
    machine (no CONTEXT, trap frame or per-processor fields inside), whose
    owners say in their docstrings whether that was checked on ARM64."""

    def __init__(self, table, arm64_as_x64=False):
        self.table = table
        self.arm64_as_x64 = arm64_as_x64

    def find(self, type_name, arch, build):
        row = self._find(type_name, arch, build)
        if row is None and arch == "arm64" and self.arm64_as_x64:
            row = self._find(type_name, "x64", build)
        return row

    def _find(self, type_name, arch, build):
        for row in self.table.get(type_name, ()):
            if row.get("arch", arch) != arch:
                continue
            builds = row.get("builds")
            if builds is not None and (build is None or not builds[0] <= build <= builds[1]):
                continue
            return row
        return None

    def types(self):
        return sorted(self.table)


def _description(row, build):
    builds = row.get("builds")
    if builds is None:
        return "built-in"
    return "built-in (build %s)" % (build if builds[0] != builds[1] else builds[0])


def pointer_size_of(arch):
    return 4 if arch == "x86" else 8


def _field_formats(row):
    return dict((name, fmt) for name, (_, fmt) in row["fields"].items()) if row else {}


def _same_width_row(builtin, type_name, pointer_size, build):
    """A built-in row of another architecture with the same pointer size: its
    field *formats* (a pointer, a UCHAR) hold on every such machine, so offsets
    from elsewhere (KDDEBUGGER_DATA64 on ARM64) can be read with them.  Its
    offsets are never used."""
    if builtin is None:
        return None
    for row in builtin.table.get(type_name, ()):
        arch = row.get("arch")
        if arch is not None and pointer_size_of(arch) == pointer_size:
            found = builtin.find(type_name, arch, build)
            if found is not None:
                return found
    return None


def lookup_layout(target, type_name, builtin=None, fields=None):
    """The layout of ``type_name`` (``nt!_KTHREAD`` or ``_KTHREAD``) on ``target``.

    ``builtin``: a :class:`BuiltinLayouts` (or None); ``fields``: the fields a
    source must know to be taken (default: every field of the built-in row, or any
    field at all for type information).  Raises :class:`LayoutNotFound`."""
    bare = type_name.split("!", 1)[-1]
    arch = target.arch
    row = builtin.find(bare, arch, target.build) if builtin is not None else None
    wanted = list(fields) if fields is not None else (list(row["fields"]) if row else [])
    formats = _field_formats(row or _same_width_row(builtin, bare, pointer_size_of(arch), target.build))
    pointer_size = target.pointer_size

    typed = target.type_layout(type_name)
    size = typed.size if typed is not None else target.type_size(type_name)
    if size is not None:
        known = {}
        for field in (wanted or (typed.fields if typed is not None else formats)):
            if typed is not None and field in typed.fields:
                offset, fmt = typed.fields[field]
            else:  # a dotted path into a nested structure, or type info without formats
                offset, fmt = target.field_offset(type_name, field), None
            if offset is not None:
                known[field] = (offset, fmt or formats.get(field))
        if all(field in known for field in wanted):
            source = typed.source if typed is not None else target.type_source(type_name)
            return Layout(bare, size, known, source, pointer_size)

    hints = target.layout_hints(bare)
    if hints:
        offsets = hints.get("fields", {})
        if all(field in offsets for field in wanted):
            known = dict((field, (offset, formats.get(field))) for field, offset in offsets.items())
            return Layout(bare, hints.get("size") or (row["size"] if row else None), known,
                          "KDDEBUGGER_DATA64", pointer_size)

    if row is not None and all(field in row["fields"] for field in wanted):
        return Layout(bare, row["size"], row["fields"], _description(row, target.build), pointer_size)

    raise LayoutNotFound("no layout for %s on this %s target (build %s): no type information, no debugger "
                         "data and no built-in table has %s" % (type_name, arch, target.build or "unknown",
                                                                ", ".join(wanted) or "it"))
