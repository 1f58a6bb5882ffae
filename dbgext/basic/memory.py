"""What ``db``/``dd``/``dq``/``dps``/``lm`` show, as plain data (rendering is in
:mod:`dbgext.basic.format`).  Each display is one bulk ``try_read`` through the
Target's page cache; units that touch an unreadable byte are ``None``."""

import fnmatch
import struct

# The most a display reads, so a huge length gives bounded output (4096 db lines).
MAX_DISPLAY_BYTES = 0x10000

UNIT_FORMATS = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


SCHEMA_VERSION = 1


class MemoryDisplay(object):
    """``count`` units of ``unit`` bytes from ``address``; ``values[i]`` is an int
    or None (unreadable).  ``requested`` is the count asked for when it was clamped."""

    def __init__(self, address, unit, values, requested=None):
        self.address = address
        self.unit = unit
        self.values = values
        self.requested = requested
        self.command = {1: "db", 4: "dd", 8: "dq"}.get(unit)

    @property
    def clamped(self):
        return self.requested is not None

    def as_dict(self):
        return {"schema_version": SCHEMA_VERSION, "command": self.command, "address": self.address,
                "unit": self.unit, "count": len(self.values), "values": self.values,
                "clamped_from": self.requested}


class PointerDisplay(object):
    """``dps``: :class:`PointerEntry` lines from ``address``."""

    def __init__(self, address, pointer_size, entries, requested=None):
        self.address = address
        self.pointer_size = pointer_size
        self.entries = entries
        self.requested = requested

    def as_dict(self):
        return {"schema_version": SCHEMA_VERSION, "command": "dps", "address": self.address,
                "pointer_size": self.pointer_size, "entries": [entry.as_dict() for entry in self.entries],
                "clamped_from": self.requested}


class PointerEntry(object):
    """One ``dps`` line: where, the pointer stored there (None if unreadable), and
    what it points into (``module!symbol+0xoff``, or None outside every module)."""

    def __init__(self, address, value, symbol):
        self.address = address
        self.value = value
        self.symbol = symbol

    def as_dict(self):
        return {"address": self.address, "value": self.value, "symbol": self.symbol}


class ModuleEntry(object):
    """One ``lm`` line; ``symbols`` is WinDbg's status (``pdb symbols``, ``export
    symbols``, ``no symbols``…) and ``symbol_file`` the file that gave them."""

    def __init__(self, name, start, end, image, symbols, symbol_file):
        self.name = name
        self.start = start
        self.end = end
        self.image = image
        self.symbols = symbols
        self.symbol_file = symbol_file

    def as_dict(self):
        return {"name": self.name, "start": self.start, "end": self.end, "size": self.end - self.start,
                "image": self.image, "symbols": self.symbols, "symbol_file": self.symbol_file}


class ModuleList(object):
    def __init__(self, modules):
        self.modules = modules

    def as_dict(self):
        return {"schema_version": SCHEMA_VERSION, "command": "lm",
                "modules": [module.as_dict() for module in self.modules]}


def clamp_count(count, unit):
    """(count to display, original count if it had to be clamped else None)."""
    limit = MAX_DISPLAY_BYTES // unit
    if count > limit:
        return limit, count
    return count, None


def read_units(target, address, unit, count):
    """A :class:`MemoryDisplay` of ``count`` little-endian units at ``address``."""
    count, requested = clamp_count(count, unit)
    span = count * unit
    end = min(address + span, target.address_mask + 1)
    count = min(count, (end - address) // unit)
    partial = target.try_read(address, count * unit)
    data = partial.data
    unpack = struct.Struct(UNIT_FORMATS[unit]).unpack_from
    values = []
    for index in range(count):
        offset = index * unit
        if partial.holes and not partial.readable(address + offset, unit):
            values.append(None)
        else:
            values.append(unpack(data, offset)[0])
    return MemoryDisplay(address, unit, values, requested)


def read_pointers(target, address, count):
    """``dps``: a :class:`PointerDisplay` of pointer-sized values with what they point into."""
    display = read_units(target, address, target.pointer_size, count)
    entries = []
    for index, value in enumerate(display.values):
        symbol = None
        if value is not None and target.module_at(value) is not None:
            symbol = target.symbolize(value)
        entries.append(PointerEntry(address + index * target.pointer_size, value, symbol))
    return PointerDisplay(address, target.pointer_size, entries, display.requested)


def list_modules(target, pattern=None):
    """A :class:`ModuleList` of the loaded modules in address order (optionally
    those whose name matches a wildcard), each with its symbol status."""
    symbols = target.symbols
    modules = []
    for module in target.modules():
        if pattern and not fnmatch.fnmatch(module.name.lower(), pattern.lower()):
            continue
        modules.append(ModuleEntry(module.name, module.base, module.end, module.image,
                                   symbols.status(module.name), symbols.symbol_file(module.name)))
    return ModuleList(modules)
