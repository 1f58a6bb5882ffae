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
reported once, in :attr:`SymbolTable.problems` and to ``logging`` (the CLI
shows it as a warning line), and the
module goes on with the next source.  The pykd backend answers the same questions
from the debugger (:class:`dbgext.target.pykd_backend.PykdSymbols`).
"""

import bisect
import logging
import os

from ..errors import BadInput, DbgextError
from ..layouts import Layout
from ..problems import ProblemLog
from .isf import is_isf_name
from .match import PdbModuleSymbols, locate_module_symbols
from .module import NO_SYMBOLS, load_isf_file
from .download import ProgressBar
from .path import SymbolLocator, symbol_path_elements

LOG = logging.getLogger("dbgext.symbols")
LOG.addHandler(logging.NullHandler())  # a script that configures no logging hears nothing (no "last resort")

KERNEL_MODULE = "nt"
# Kernel dump header facts (Target.info() keys) that are addresses of nt globals.
HEADER_GLOBALS = {"ps_loaded_module_list": "PsLoadedModuleList", "ps_active_process_head": "PsActiveProcessHead",
                  "kd_debugger_data_block": "KdDebuggerDataBlock"}
# KDDEBUGGER_DATA64 fields that are not the address of a global of that name.
NOT_GLOBALS = ("KernBase", "OwnerTag", "Size", "ThCallbackStack", "NextCallback", "FramePointer", "PaeEnabled")


def _log(problem):
    LOG.warning("%s", problem.message)


class SymbolTable(object):
    """All modules' symbols, bound to the modules' load addresses.

    ``locator`` (a :class:`dbgext.symbols.path.SymbolLocator`) finds a module's
    symbols on demand; ``report`` is called once per problem found with a symbol
    source (default: a warning to ``logging``; the library never prints)."""

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
        self._report = report or _log

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
                # Of the names at that address, the first: the procedure's when there is one.
                index = bisect.bisect_left(rvas, rvas[index])
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
        size, fields = found
        return Layout(bare, size, fields, table.source, table.pointer_size)


# -- ISF files -------------------------------------------------------------------------

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


def open_symbol_table(option_paths, beside=(), no_download=False, environ=None, diagnostics=None):
    """The SymbolTable of a run over a dump: ISF files and PDBs along the symbol
    path (``--symbols`` values, else ``beside`` then ``_NT_SYMBOL_PATH``).
    ``diagnostics``: the CLI's Output for warnings and a download progress bar; without
    it, problems go to ``logging`` and downloads are silent."""
    report = (lambda problem: diagnostics.line("warning: %s" % problem.message)) if diagnostics else None
    locator = SymbolLocator(symbol_path_elements(option_paths, beside, environ), no_download,
                            progress=ProgressBar(diagnostics.stream) if diagnostics else None)
    return load_isf_directory(locator.isf_paths, SymbolTable(locator=locator, report=report))


def pe_file_symbols(image, option_paths, no_download=False, diagnostics=None):
    """Symbols for a PE read from disk (``stackuse --pe FILE --symbols PATH``): the
    ISF file named for it, else its PDB matched by the file's CodeView record;
    None when the symbol path has neither.  ``option_paths``: ``--symbols`` values
    (None: ``_NT_SYMBOL_PATH``)."""
    table = open_symbol_table(option_paths, (), no_download, diagnostics=diagnostics)
    stem = image.name.rsplit(".", 1)[0]
    isf = table.module_symbols(stem) or table.module_symbols(image.name)
    if isf is not None:
        return isf
    codeview = image.codeview
    pdb = table.locator.find_pdb(codeview, table.report) if codeview is not None else None
    return PdbModuleSymbols(stem, pdb, table.report) if pdb is not None else None
