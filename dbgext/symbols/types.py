"""One shape for a structure's members, whatever the type information came from
(a PDB's TPI records or an ISF file), so ``dt``, field offsets and layouts are
computed once.

A :class:`TypeView` is a named type with its size and members; a :class:`MemberView`
carries what ``dt`` prints (WinDbg's type text: ``Ptr64 Void``, ``Uint4B``,
``[16] Char``, ``Pos 3, 29 Bits``) and what reading a value needs (a struct format,
the bit position, the enumerator names, the nested type to recurse into).
"""

from .pdb import MAX_TYPE_DEPTH


class MemberView(object):
    __slots__ = ("name", "offset", "text", "fmt", "size", "bits", "nested", "enumerators", "is_pointer")

    def __init__(self, name, offset, text, fmt=None, size=None, bits=None, nested=None, enumerators=None,
                 is_pointer=False):
        self.name = name
        self.offset = offset
        self.text = text
        self.fmt = fmt                  # struct format of the value ("I", "P", "16B") or None
        self.size = size
        self.bits = bits                # (position, length) of a bit field
        self.nested = nested            # key of the member's structure type (for -r and dotted paths)
        self.enumerators = enumerators  # {value: name} of an enum member
        self.is_pointer = is_pointer

    def as_dict(self):
        return {"name": self.name, "offset": self.offset, "type": self.text, "size": self.size,
                "bit_position": self.bits[0] if self.bits else None,
                "bit_length": self.bits[1] if self.bits else None}


class TypeView(object):
    """``enumerators``: an enum's (name, value) pairs in declaration order."""

    __slots__ = ("name", "size", "kind", "members", "enumerators", "_by_name")

    def __init__(self, name, size, kind, members, enumerators=()):
        self.name = name
        self.size = size
        self.kind = kind
        self.members = members
        self.enumerators = list(enumerators)
        self._by_name = None

    def member(self, name):
        if self._by_name is None:
            self._by_name = {}
            for member in self.members:
                self._by_name.setdefault(member.name, member)
        return self._by_name.get(name)


# -- from a PDB --------------------------------------------------------------------------------

def pdb_type_view(types, record):
    """The TypeView of a PDB struct/union/class/enum record (forward refs resolved)."""
    record = types.resolve(record)
    if record.kind == "enum":
        return TypeView(record.name, record.size, "enum", [], types.enumerators(record))
    members = [pdb_member_view(types, member.name, member.offset, member.type_index)
               for member in types.members(record)]
    return TypeView(record.name, record.size, record.kind, members)


def pdb_member_view(types, name, offset, type_index):
    record = types.strip(type_index)
    text = pdb_type_text(types, type_index)
    if record.kind == "bitfield":
        base = types.strip(record.element)
        return MemberView(name, offset, text, None, base.size, (record.bit_position, record.bit_length))
    if record.kind in ("struct", "union", "class"):
        return MemberView(name, offset, text, None, record.size, nested=record.index)
    if record.kind == "enum":
        values = dict((value, label) for label, value in types.enumerators(record))
        return MemberView(name, offset, text, record.fmt, record.size, enumerators=values)
    if record.kind == "array":
        return MemberView(name, offset, text, _array_format(types, record), record.size)
    if record.kind == "pointer":
        return MemberView(name, offset, text, record.fmt, record.size, is_pointer=True)
    return MemberView(name, offset, text, record.fmt, record.size)


def _array_format(types, record):
    """``"8I"`` for ``[4] [2] Uint4B``: nested arrays read as one run of their scalars."""
    element = types.strip(record.element)
    for _ in range(MAX_TYPE_DEPTH):
        if element.kind != "array":
            break
        element = types.strip(element.element)
    if element.fmt is None or not element.size:
        return None
    return "%d%s" % (record.size // element.size, element.fmt)


def pdb_type_text(types, index, depth=0):
    """WinDbg's ``dt`` text for a type: ``Ptr64 _LIST_ENTRY``, ``[4] [2] Uint4B``..."""
    if depth > MAX_TYPE_DEPTH:
        return "..."
    record = types.resolve(types.get(index))
    kind = record.kind
    if kind == "base":
        return record.name
    if kind == "pointer":
        pointee = types.resolve(types.get(record.element))
        if pointee.kind == "procedure":
            return "Ptr%d     %s" % (record.size * 8, pdb_type_text(types, pointee.element, depth + 1))
        return "Ptr%d %s" % (record.size * 8, pdb_type_text(types, record.element, depth + 1))
    if kind == "modifier":
        return pdb_type_text(types, record.element, depth + 1)
    if kind == "array":
        element = types.strip(record.element)
        count = record.size // element.size if element.size else 0
        return "[%d] %s" % (count, pdb_type_text(types, record.element, depth + 1))
    if kind == "bitfield":
        return "Pos %d, %d Bit%s" % (record.bit_position, record.bit_length, "" if record.bit_length == 1 else "s")
    if kind == "procedure":
        return pdb_type_text(types, record.element, depth + 1)
    return record.name or "<%s>" % kind


# -- from an ISF file ------------------------------------------------------------------------

ISF_BASE_FORMATS = {(1, False): "B", (1, True): "b", (2, False): "H", (2, True): "h",
                    (4, False): "I", (4, True): "i", (8, False): "Q", (8, True): "q"}
ISF_WINDBG_NAMES = {(1, False): "UChar", (1, True): "Char", (2, False): "Uint2B", (2, True): "Int2B",
                    (4, False): "Uint4B", (4, True): "Int4B", (8, False): "Uint8B", (8, True): "Int8B"}


def isf_type_view(name, entry, base_types, pointer_size):
    """The TypeView of a validated ISF user type (see :mod:`dbgext.symbols.isf`)."""
    members = []
    for field_name, field in sorted(entry["fields"].items(), key=lambda item: item[1]["offset"]):
        members.append(_isf_member(field_name, field["offset"], field.get("type") or {}, base_types, pointer_size))
    return TypeView(name, entry["size"], entry.get("kind", "struct"), members)


def _isf_member(name, offset, spec, base_types, pointer_size, depth=0):
    """A member from an ISF type description; the description is unchecked JSON,
    so anything of the wrong type reads as unknown rather than failing."""
    spec = spec if isinstance(spec, dict) and depth < MAX_TYPE_DEPTH else {}
    kind = spec.get("kind")
    if kind == "pointer":
        return MemberView(name, offset, "Ptr%d %s" % (pointer_size * 8, _isf_text(_dict(spec.get("subtype")))),
                          "P", pointer_size, is_pointer=True)
    if kind in ("struct", "union", "class"):
        nested = spec.get("name") if isinstance(spec.get("name"), str) else None
        return MemberView(name, offset, _isf_text(spec), nested=nested)
    if kind == "bitfield":
        base = _isf_member(name, offset, spec.get("type"), base_types, pointer_size, depth + 1)
        position, length = _count(spec.get("bit_position")), _count(spec.get("bit_length"))
        return MemberView(name, offset, "Pos %d, %d Bit%s" % (position, length, "" if length == 1 else "s"),
                          None, base.size, (position, length))
    if kind == "array":
        element = _isf_member(name, offset, spec.get("subtype"), base_types, pointer_size, depth + 1)
        count = _count(spec.get("count"))
        fmt = "%d%s" % (count, element.fmt) if element.fmt and len(element.fmt) == 1 else None
        return MemberView(name, offset, "[%d] %s" % (count, element.text), fmt,
                          element.size * count if element.size else None)
    base = base_types.get(spec.get("name")) if kind == "base" and isinstance(spec.get("name"), str) else None
    if base is not None:
        key = (base.get("size"), bool(base.get("signed")))
        return MemberView(name, offset, ISF_WINDBG_NAMES.get(key, spec["name"]), ISF_BASE_FORMATS.get(key),
                          base.get("size"))
    return MemberView(name, offset, _isf_text(spec))


def _dict(value):
    return value if isinstance(value, dict) else {}


def _count(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32 else 0


def _isf_text(spec):
    for key in ("name", "kind"):
        if isinstance(spec.get(key), str) and spec[key]:
            return spec[key]
    return "?"
