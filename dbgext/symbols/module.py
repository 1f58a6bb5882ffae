"""One module's symbols and types (:class:`ModuleSymbols`), the shape every source
fills: an ISF file, a PDB (:mod:`dbgext.symbols.match`), exports, the debugger;
and ISF files read into it and written from it."""

import json
import os
from collections import namedtuple

from ..outputs import write_text
from .isf import read_isf_file
from .types import isf_type_view

PDB_SYMBOLS, ISF_SYMBOLS, EXPORT_SYMBOLS, NO_SYMBOLS = "pdb symbols", "isf symbols", "export symbols", "no symbols"

SymbolEntry = namedtuple("SymbolEntry", "rva name size")


def entry_order(entry):
    """Sort key of entries: by address, procedures (sized) first."""
    return entry.rva, entry.size is None


class ModuleSymbols(object):
    """Symbols (name -> RVA) and types of one module: an ISF file's, or built in
    memory.  Subclasses (PDB, exports, the debugger) fill the same interface."""

    status = ISF_SYMBOLS
    pointer_size = 8

    def __init__(self, module_name, symbols=None, types=None, base_types=None, path=None):
        self.module_name = module_name
        self.symbols = dict(symbols or {})
        # type name -> {"size": int, "fields": {name: {"offset": int, "type": {...}}}}
        self.types = dict(types or {})
        self.base_types = dict(base_types or _BASE_TYPES)
        self.path = path
        self._sorted = None

    @property
    def source(self):
        """Short words for output that says where a name or layout came from."""
        return "isf %s" % self.module_name

    def entries(self):
        """Every :class:`SymbolEntry` of the module by address, procedures first at
        an address: a name may stand at several addresses (C++ overloads, template
        instances, same-named statics) and an address may have several names.
        ``symbols`` ({name: rva}) keeps one address per name, for lookups by name."""
        cached = getattr(self, "_entry_cache", None)
        if cached is None:
            cached = self._entry_cache = sorted((SymbolEntry(rva, name, None) for name, rva in self.symbols.items()),
                                                key=entry_order)
        return cached

    def sorted_symbols(self):
        """(rvas, names) of :meth:`entries`, for bisecting by address."""
        if self._sorted is None:
            entries = self.entries()
            self._sorted = ([entry.rva for entry in entries], [entry.name for entry in entries])
        return self._sorted

    def sizes(self):
        """{rva: size} of the symbols whose extent is known (PDB procedures)."""
        return dict((entry.rva, entry.size) for entry in self.entries() if entry.size is not None)

    def names_by_rva(self):
        """{rva: name}: the first name at each address (a procedure's when there is one)."""
        names = {}
        for entry in self.entries():
            names.setdefault(entry.rva, entry.name)
        return names

    # -- types: one shape (TypeView) for every source ----------------------------------

    def type_view(self, key):
        entry = self.types.get(key)
        return isf_type_view(key, entry, self.base_types, self.pointer_size) if entry else None

    def type_names(self):
        return sorted(self.types)

    def variable_type(self, name):
        """The type key of a global variable (for ``dt MODULE!variable``), or None."""
        return None

    def type_size(self, type_name):
        view = self.type_view(type_name)
        return view.size if view is not None else None

    def field_offset(self, type_name, field_path):
        view = self.type_view(type_name)
        total = 0
        parts = field_path.split(".")
        for index, part in enumerate(parts):
            member = view.member(part) if view is not None else None
            if member is None:
                return None
            total += member.offset
            if index + 1 < len(parts):
                view = self.type_view(member.nested) if member.nested is not None else None
        return total

    def layout(self, type_name):
        """(size, {field: (offset, fmt)}) of a type, or None."""
        view = self.type_view(type_name)
        if view is None:
            return None
        fields = {}
        for member in view.members:
            fields.setdefault(member.name, (member.offset, member.fmt))
        return view.size, fields

    # -- ISF -----------------------------------------------------------------------------

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


# -- ISF files -------------------------------------------------------------------------

def load_isf_file(path):
    """Read one ISF file (``.json`` or ``.json.xz``) into ModuleSymbols; BadInput
    naming the file (and the field) when it cannot be used."""
    parsed = read_isf_file(path)
    return ModuleSymbols(parsed.module_name, parsed.symbols, parsed.types, parsed.base_types or None, path)


def isf_file_path(module_symbols, directory):
    return os.path.join(directory, module_symbols.module_name + ".json")


def write_isf_file(module_symbols, directory, force=True, force_option="--force"):
    """``directory/<module>.json``, written as every output is (dbgext.outputs)."""
    return write_text(isf_file_path(module_symbols, directory),
                      json.dumps(module_symbols.to_isf(), indent=1, sort_keys=True), force, force_option)
