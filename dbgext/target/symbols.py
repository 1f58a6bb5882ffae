"""Symbols and types: address <-> ``module!symbol+0xoff``, type sizes, field offsets.

Offline dumps carry no PDBs, so dbgext reads volatility3's Intermediate Symbol
Format (ISF): one JSON file per module with module-relative symbol addresses and
user types with field offsets.  A file belongs to the module whose debugger name
equals the file's stem (``nt.json`` -> ``nt``) unless its metadata names the module
(``metadata.dbgext.module``).  The pykd backend answers the same questions from
the debugger instead; both present this :class:`SymbolTable` interface.
"""

import bisect
import io
import json
import lzma
import os

from ..errors import BadInput


class ModuleSymbols(object):
    """Symbols (name -> RVA) and user types of one module."""

    def __init__(self, module_name, symbols=None, types=None):
        self.module_name = module_name
        self.symbols = dict(symbols or {})
        # type name -> {"size": int, "fields": {name: {"offset": int, "type": {...}}}}
        self.types = dict(types or {})
        self._sorted = None

    def sorted_symbols(self):
        if self._sorted is None:
            pairs = sorted((rva, name) for name, rva in self.symbols.items())
            self._sorted = ([rva for rva, _ in pairs], [name for _, name in pairs])
        return self._sorted

    # -- ISF ----------------------------------------------------------------------

    @classmethod
    def from_isf(cls, document, module_name):
        try:
            symbols = {name: entry["address"] for name, entry in document.get("symbols", {}).items()
                       if isinstance(entry, dict) and "address" in entry}
            types = {}
            for name, entry in document.get("user_types", {}).items():
                fields = {}
                for field_name, field in entry.get("fields", {}).items():
                    fields[field_name] = {"offset": int(field["offset"]), "type": field.get("type", {})}
                types[name] = {"size": int(entry.get("size", 0)), "fields": fields}
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            raise BadInput("not an ISF symbol file for %s: %s" % (module_name, error))
        return cls(module_name, symbols, types)

    def to_isf(self):
        """An ISF document (volatility3 schema 6.x) describing this module."""
        user_types = {}
        for name, entry in self.types.items():
            fields = {}
            for field_name, field in entry["fields"].items():
                fields[field_name] = {"offset": field["offset"],
                                      "type": field.get("type") or {"kind": "base", "name": "unsigned char"}}
            user_types[name] = {"kind": "struct", "size": entry["size"], "fields": fields}
        return {
            "metadata": {
                "format": "6.2.0",
                "producer": {"name": "dbgext", "version": "0.1.0"},
                "dbgext": {"module": self.module_name},
            },
            "base_types": _BASE_TYPES,
            "user_types": user_types,
            "enums": {},
            "symbols": {name: {"address": rva} for name, rva in sorted(self.symbols.items())},
        }


_BASE_TYPES = {
    "unsigned char": {"kind": "char", "size": 1, "signed": False, "endian": "little"},
    "unsigned short": {"kind": "int", "size": 2, "signed": False, "endian": "little"},
    "unsigned long": {"kind": "int", "size": 4, "signed": False, "endian": "little"},
    "unsigned long long": {"kind": "int", "size": 8, "signed": False, "endian": "little"},
    "long": {"kind": "int", "size": 4, "signed": True, "endian": "little"},
    "pointer": {"kind": "int", "size": 8, "signed": False, "endian": "little"},
}


class SymbolTable(object):
    """All modules' symbols, bound to the modules' load addresses."""

    def __init__(self, per_module=None):
        self._per_module = {}  # lower-case module name -> ModuleSymbols
        for module_symbols in per_module or ():
            self.add(module_symbols)
        self._modules = []
        self._bases = []

    def add(self, module_symbols):
        self._per_module[module_symbols.module_name.lower()] = module_symbols

    def bind(self, modules):
        """Attach load addresses (a list of Module objects)."""
        self._modules = sorted(modules, key=lambda m: m.base)
        self._bases = [m.base for m in self._modules]

    def module_symbols(self, module_name):
        return self._per_module.get(module_name.lower())

    @property
    def empty(self):
        return not self._per_module

    def _module_by_name(self, name):
        wanted = name.lower()
        for module in self._modules:
            if module.name.lower() == wanted or module.image.lower() == wanted:
                return module
        return None

    def _module_at(self, address):
        index = bisect.bisect_right(self._bases, address) - 1
        if index >= 0 and self._modules[index].contains(address):
            return self._modules[index]
        return None

    def address(self, name):
        if "!" in name:
            module_name, symbol = name.split("!", 1)
            candidates = [self._module_by_name(module_name)]
        else:
            symbol = name
            candidates = self._modules
        for module in candidates:
            if module is None:
                continue
            table = self._per_module.get(module.name.lower())
            if table is not None and symbol in table.symbols:
                return module.base + table.symbols[symbol]
        return None

    def describe(self, address):
        module = self._module_at(address)
        if module is None:
            return "0x%x" % address
        table = self._per_module.get(module.name.lower())
        if table is not None and table.symbols:
            rvas, names = table.sorted_symbols()
            rva = address - module.base
            index = bisect.bisect_right(rvas, rva) - 1
            if index >= 0:
                displacement = rva - rvas[index]
                if displacement == 0:
                    return "%s!%s" % (module.name, names[index])
                return "%s!%s+0x%x" % (module.name, names[index], displacement)
        offset = address - module.base
        return "%s+0x%x" % (module.name, offset) if offset else module.name

    def function_of(self, address):
        """``module!symbol`` (no displacement) or ``module`` or None — for signatures."""
        module = self._module_at(address)
        if module is None:
            return None
        table = self._per_module.get(module.name.lower())
        if table is not None and table.symbols:
            rvas, names = table.sorted_symbols()
            index = bisect.bisect_right(rvas, address - module.base) - 1
            if index >= 0:
                return "%s!%s" % (module.name, names[index])
        return module.name

    def _find_type(self, type_name):
        if "!" in type_name:
            module_name, bare = type_name.split("!", 1)
            table = self._per_module.get(module_name.lower())
            if table is None:
                module = self._module_by_name(module_name)
                table = self._per_module.get(module.name.lower()) if module else None
            return table.types.get(bare) if table else None
        for table in self._per_module.values():
            if type_name in table.types:
                return table.types[type_name]
        return None

    def type_size(self, type_name):
        entry = self._find_type(type_name)
        return entry["size"] if entry else None

    def field_offset(self, type_name, field_path):
        entry = self._find_type(type_name)
        if entry is None:
            return None
        total = 0
        module_prefix = type_name.split("!", 1)[0] + "!" if "!" in type_name else ""
        parts = field_path.split(".")
        for index, part in enumerate(parts):
            field = entry["fields"].get(part)
            if field is None:
                return None
            total += field["offset"]
            if index + 1 < len(parts):
                subtype = field.get("type", {}).get("name")
                entry = self._find_type(module_prefix + subtype) if subtype else None
                if entry is None:
                    return None
        return total


def load_isf_file(path):
    """Read one ISF file (``.json`` or ``.json.xz``) into ModuleSymbols."""
    base = os.path.basename(path)
    stem = base.split(".json")[0]
    try:
        if path.endswith(".xz"):
            with lzma.open(path, "rt", encoding="utf-8") as handle:
                document = json.load(handle)
        else:
            with io.open(path, "r", encoding="utf-8") as handle:
                document = json.load(handle)
    except (OSError, ValueError, lzma.LZMAError) as error:
        raise BadInput("cannot read symbol file %s: %s" % (path, error))
    if not isinstance(document, dict):
        raise BadInput("cannot read symbol file %s: not a JSON object" % path)
    module_name = document.get("metadata", {}).get("dbgext", {}).get("module", stem)
    return ModuleSymbols.from_isf(document, module_name)


def load_isf_directory(paths):
    """A SymbolTable from ISF files and/or directories of them."""
    table = SymbolTable()
    for path in paths:
        if os.path.isdir(path):
            for name in sorted(os.listdir(path)):
                if name.endswith(".json") or name.endswith(".json.xz"):
                    table.add(load_isf_file(os.path.join(path, name)))
        else:
            table.add(load_isf_file(path))
    return table


def write_isf_file(module_symbols, directory):
    path = os.path.join(directory, module_symbols.module_name + ".json")
    with io.open(path, "w", encoding="utf-8") as handle:
        json.dump(module_symbols.to_isf(), handle, indent=1, sort_keys=True)
    return path
