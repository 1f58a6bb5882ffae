"""Symbols and types: address <-> ``module!symbol+0xoff``, type sizes, field offsets,
layouts — from whichever source a module has.

Sources, per module, in the order a WinDbg user expects:

* an ISF file named for the module (volatility3's Intermediate Symbol Format, see
  :mod:`dbgext.symbols.isf`) given with ``--symbols`` or found beside the dump;
* the module's PDB, found through the symbol path (:mod:`dbgext.symbols.path`:
  directories, ``.pdb`` files, ``srv*CACHE*URL``) and matched to the module by the
  GUID and age of its CodeView record;
* the module's export table, read from target memory;
* nothing: ``module+0xoff``.

A module's source is looked for the first time the module is asked about, and
kept.  A source that cannot be used (a malformed file, a mismatched PDB) is
reported once, in :attr:`SymbolTable.problems` and as a warning line, and the
module goes on with the next source.  The pykd backend answers the same questions
from the debugger (:class:`dbgext.target.pykd_backend.PykdSymbols`).
"""

import bisect
import json
import os
import sys

from ..errors import BadInput, DbgextError
from ..problems import ProblemLog
from ..symbols.isf import is_isf_name, read_isf_file
from ..symbols.types import isf_type_view

PDB_SYMBOLS, ISF_SYMBOLS, EXPORT_SYMBOLS, NO_SYMBOLS = "pdb symbols", "isf symbols", "export symbols", "no symbols"

KERNEL_MODULE = "nt"
# Kernel dump header facts (Target.info() keys) that are addresses of nt globals.
HEADER_GLOBALS = {"ps_loaded_module_list": "PsLoadedModuleList", "ps_active_process_head": "PsActiveProcessHead",
                  "kd_debugger_data_block": "KdDebuggerDataBlock"}
# KDDEBUGGER_DATA64 fields that are not the address of a global of that name.
NOT_GLOBALS = ("KernBase", "OwnerTag", "Size", "ThCallbackStack", "NextCallback", "FramePointer", "PaeEnabled")


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

    def sorted_symbols(self):
        if self._sorted is None:
            pairs = sorted((rva, name) for name, rva in self.symbols.items())
            self._sorted = ([rva for rva, _ in pairs], [name for _, name in pairs])
        return self._sorted

    def sizes(self):
        """{rva: size} of the symbols whose extent is known (PDB procedures)."""
        return {}

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


def _warn_on_stderr(problem):
    sys.stderr.write("warning: %s\n" % problem.message)


class SymbolTable(object):
    """All modules' symbols, bound to the modules' load addresses.

    ``locator`` (a :class:`dbgext.symbols.path.SymbolLocator`) finds a module's
    symbols on demand; ``report`` is called once per problem found with a symbol
    source (default: a warning line on stderr)."""

    def __init__(self, per_module=None, locator=None, report=None):
        self._per_module = {}  # lower-case module name -> ModuleSymbols given explicitly (ISF)
        for module_symbols in per_module or ():
            self.add(module_symbols)
        self._located = {}     # lower-case module name -> ModuleSymbols or None, found on demand
        self._dump_globals = None
        self.locator = locator
        self._target = None
        self._modules = []
        self._bases = []
        self.problems = ProblemLog()
        self._report = report or _warn_on_stderr

    def add(self, module_symbols):
        self._per_module[module_symbols.module_name.lower()] = module_symbols

    def bind(self, modules):
        """Attach load addresses (a list of Module objects)."""
        self._modules = sorted(modules, key=lambda m: m.base)
        self._bases = [m.base for m in self._modules]

    def attach(self, target):
        """The target whose memory holds the modules' headers (CodeView records, exports)."""
        self._target = target

    def report(self, kind, message, address=None):
        """Record a problem with a symbol source, once, and show it."""
        if any(problem.message == message for problem in self.problems):
            return
        self.problems.add(kind, address, message, "warning")
        self._report(self.problems[-1])

    @property
    def empty(self):
        """True when the table has no symbol source at all."""
        return not self._per_module and self.locator is None

    # -- which source a module has ------------------------------------------------------

    def module_symbols(self, module_name):
        """The module's ModuleSymbols (ISF, PDB or exports) or None."""
        table = self._per_module.get(module_name.lower())
        if table is not None:
            return table
        module = self._module_by_name(module_name)
        return self._table(module) if module is not None else None

    def _table(self, module):
        table = self._per_module.get(module.name.lower())
        if table is not None:
            return table
        key = module.name.lower()
        if key not in self._located:
            self._located[key] = None  # a failing source is tried once
            self._located[key] = self._locate(module)
        return self._located[key]

    def _locate(self, module):
        if self._target is None:
            return None
        from ..symbols.match import locate_module_symbols
        return locate_module_symbols(self._target, module, self.locator, self)

    def status(self, module_name):
        """``pdb symbols``, ``isf symbols``, ``export symbols`` or ``no symbols``."""
        table = self.module_symbols(module_name)
        return table.status if table is not None else NO_SYMBOLS

    def symbol_file(self, module_name):
        """The path of the file the module's symbols came from, or None."""
        table = self.module_symbols(module_name)
        return table.path if table is not None else None

    # -- modules ---------------------------------------------------------------------

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

    # -- names -------------------------------------------------------------------------

    def _modules_for_bare_names(self):
        """Where a name without ``module!`` is looked for: the kernel first, then every
        module — but when the symbol path may download, only the modules whose
        symbols are already known: one name never fetches every module's PDB."""
        ordered = sorted(self._modules, key=lambda module: module.name.lower() != KERNEL_MODULE)
        if self.locator is None or not self.locator.may_download:
            return ordered
        known = set(self._per_module) | set(key for key, table in self._located.items() if table is not None)
        return [module for module in ordered if module.name.lower() in known or module.name.lower() == KERNEL_MODULE]

    def address(self, name):
        if "!" in name:
            module_name, symbol = name.split("!", 1)
            candidates = [self._module_by_name(module_name)]
        else:
            symbol = name
            candidates = self._modules_for_bare_names()
        for module in candidates:
            if module is None:
                continue
            table = self._table(module)
            if table is not None and symbol in table.symbols:
                return module.base + table.symbols[symbol]
        if "!" not in name or name.split("!", 1)[0].lower() == KERNEL_MODULE:
            return self.dump_globals().get(symbol)
        return None

    def dump_globals(self):
        """{name: address} of kernel globals the dump itself records (its header
        and KDDEBUGGER_DATA64): ``nt!PsLoadedModuleList`` works without symbols."""
        if self._dump_globals is None:
            self._dump_globals = {}
            kernel = self._module_by_name(KERNEL_MODULE)
            if self._target is None or kernel is None:
                return self._dump_globals
            try:
                info = self._target.info()
            except DbgextError:
                return self._dump_globals
            found = {}
            debugger_data = info.get("debugger_data")
            if isinstance(debugger_data, dict) and isinstance(debugger_data.get("fields"), dict):
                # Offsets and sizes share the block with addresses: only addresses inside nt count.
                for field, value in debugger_data["fields"].items():
                    if field not in NOT_GLOBALS and isinstance(value, int) and kernel.contains(value):
                        found[field] = value
            for key, field in HEADER_GLOBALS.items():
                if isinstance(info.get(key), int) and info[key]:
                    found[field] = info[key]
            self._dump_globals = found
        return self._dump_globals

    def nearest(self, address):
        """(module, symbol name, rva of the symbol) at or below ``address``, with
        module None outside every module and name None without a symbol."""
        module = self._module_at(address)
        if module is None:
            return None, None, None
        table = self._table(module)
        if table is not None and table.symbols:
            rvas, names = table.sorted_symbols()
            index = bisect.bisect_right(rvas, address - module.base) - 1
            if index >= 0:
                return module, names[index], rvas[index]
        return module, None, None

    def describe(self, address):
        module, name, rva = self.nearest(address)
        if module is None:
            return "0x%x" % address
        if name is not None:
            displacement = address - module.base - rva
            if displacement == 0:
                return "%s!%s" % (module.name, name)
            return "%s!%s+0x%x" % (module.name, name, displacement)
        offset = address - module.base
        return "%s+0x%x" % (module.name, offset) if offset else module.name

    def function_of(self, address):
        """``module!symbol`` (no displacement) or ``module`` or None — for signatures."""
        module, name, _ = self.nearest(address)
        if module is None:
            return None
        return "%s!%s" % (module.name, name) if name is not None else module.name

    # -- types ---------------------------------------------------------------------------

    def type_owner(self, type_name):
        """(ModuleSymbols, bare type name) of the module that has the type, or (None, name).

        A bare name is looked up as :meth:`_modules_for_bare_names` says, then in
        ISF files of modules that are not loaded."""
        if "!" in type_name:
            module_name, bare = type_name.split("!", 1)
            table = self.module_symbols(module_name)
            return (table, bare) if table is not None and table.type_view(bare) is not None else (None, bare)
        tables = []
        for table in [self._table(module) for module in self._modules_for_bare_names()] + list(
                self._per_module.values()):
            if table is not None and table not in tables:
                tables.append(table)
        for table in tables:
            if table.type_view(type_name) is not None:
                return table, type_name
        return None, type_name

    def type_size(self, type_name):
        table, bare = self.type_owner(type_name)
        return table.type_size(bare) if table is not None else None

    def field_offset(self, type_name, field_path):
        table, bare = self.type_owner(type_name)
        return table.field_offset(bare, field_path) if table is not None else None

    def type_source(self, type_name):
        table, _ = self.type_owner(type_name)
        return table.source if table is not None else None

    def type_layout(self, type_name):
        """A :class:`dbgext.layouts.Layout` of the type from this table, or None."""
        table, bare = self.type_owner(type_name)
        found = table.layout(bare) if table is not None else None
        if found is None:
            return None
        from ..layouts import Layout
        size, fields = found
        return Layout(bare, size, fields, table.source, table.pointer_size)


# -- ISF files -------------------------------------------------------------------------

def load_isf_file(path):
    """Read one ISF file (``.json`` or ``.json.xz``) into ModuleSymbols; BadInput
    naming the file (and the field) when it cannot be used."""
    parsed = read_isf_file(path)
    return ModuleSymbols(parsed.module_name, parsed.symbols, parsed.types, parsed.base_types or None, path)


def load_isf_directory(paths, table=None):
    """A SymbolTable from ISF files and/or directories of them.  A file that cannot
    be used is reported (once, naming the file and the field) and left out."""
    table = table if table is not None else SymbolTable()
    for path in paths:
        if os.path.isdir(path):
            files = [os.path.join(path, name) for name in sorted(os.listdir(path)) if is_isf_name(name)]
        else:
            files = [path]
        for name in files:
            try:
                table.add(load_isf_file(name))
            except BadInput as error:
                table.report("bad_symbol_file", str(error))
    return table


def isf_file_path(module_symbols, directory):
    return os.path.join(directory, module_symbols.module_name + ".json")


def write_isf_file(module_symbols, directory, force=True, force_option="--force"):
    """``directory/<module>.json``, written as every output is (dbgext.outputs)."""
    from ..outputs import write_text
    return write_text(isf_file_path(module_symbols, directory),
                      json.dumps(module_symbols.to_isf(), indent=1, sort_keys=True), force, force_option)


def open_symbol_table(option_paths, beside=(), no_download=False, environ=None, diagnostics=None):
    """The SymbolTable of a run over a dump: ISF files and PDBs along the symbol
    path (``--symbols`` values, else ``beside`` then ``_NT_SYMBOL_PATH``).
    ``diagnostics``: an Output for warnings and download progress (default: stderr)."""
    from ..symbols.path import SymbolLocator, symbol_path_elements
    report = (lambda problem: diagnostics.line("warning: %s" % problem.message)) if diagnostics else None
    locator = SymbolLocator(symbol_path_elements(option_paths, beside, environ), no_download,
                            progress=diagnostics.stream if diagnostics else None)
    return load_isf_directory(locator.isf_paths, SymbolTable(locator=locator, report=report))
