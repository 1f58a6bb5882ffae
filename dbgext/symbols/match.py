"""A module's symbols: its PDB matched by CodeView record, else its exports.

The CodeView (RSDS) record is read from the image in target memory: the header
page, the debug directory, the record — three small reads, never the whole image.
"""

from ..errors import BadInput, DbgextError
from ..pe import (DEBUG_ENTRY, DEBUG_TYPE_CODEVIEW, DIRECTORY_DEBUG, DIRECTORY_EXPORT, MAX_DEBUG_ENTRIES,
                  MAX_RSDS, CodeView, PEImage, undecorate)
from .module import EXPORT_SYMBOLS, PDB_SYMBOLS, ModuleSymbols, SymbolEntry, entry_order
from .pdb import PdbError
from .types import pdb_type_view

HEADER_BYTES = 0x1000


def image_headers(target, module):
    """A PEImage of the module's header page only (sections unread), or None."""
    read = target.try_read(module.base, HEADER_BYTES)
    if not read.readable(module.base, 0x200):
        return None
    try:
        return PEImage.from_bytes(read.data, module.image)
    except BadInput:
        return None


def image_identity(target, module):
    """(TimeDateStamp, SizeOfImage) that name the module's image in a symbol store:
    from its headers in memory, else from the loader's list (a small dump's driver
    list, a minidump's module list); None when neither has them."""
    return _identity(module, image_headers(target, module))


def _identity(module, headers):
    """:func:`image_identity` from headers already read (None: unreadable)."""
    if headers is not None:
        return headers.timestamp, headers.size_of_image
    if module.timestamp is not None:
        return module.timestamp, module.size
    return None


def codeview_in_memory(target, module, headers):
    """The module's RSDS record (:class:`dbgext.pe.CodeView`) read from target
    memory through its debug directory (``headers``: :func:`image_headers`), or None."""
    rva, size = headers.directory(DIRECTORY_DEBUG)
    count = min(size // DEBUG_ENTRY.size, MAX_DEBUG_ENTRIES)
    if not rva or not count:
        return None
    entries = target.try_read(module.base + rva, count * DEBUG_ENTRY.size)
    for index in range(count):
        at = index * DEBUG_ENTRY.size
        if not entries.readable(module.base + rva + at, DEBUG_ENTRY.size):
            continue
        debug_type, data_size, data_rva = DEBUG_ENTRY.unpack_from(entries.data, at)[4:7]
        if debug_type != DEBUG_TYPE_CODEVIEW or data_size < 24 or not data_rva:
            continue
        record = target.try_read(module.base + data_rva, min(data_size, MAX_RSDS))
        codeview = CodeView.from_record(record.data) if record.readable(module.base + data_rva, 24) else None
        if codeview is not None:
            return codeview
    return None


class PdbModuleSymbols(ModuleSymbols):
    """A module's symbols and types from its matched PDB, read on first use.
    A PDB that turns out broken past its headers is reported once and then
    answers nothing."""

    status = PDB_SYMBOLS

    def __init__(self, module_name, pdb, report):
        self.module_name = module_name
        self.pdb = pdb
        self.path = pdb.path
        self._report = report
        self._symbols = None
        self._entries = None
        self._sorted = None
        self._views = {}
        self.pointer_size = self._guarded(lambda: pdb.pointer_size, 8)

    @property
    def source(self):
        return "pdb %s" % self.module_name

    def _guarded(self, read, default):
        try:
            return read()
        except PdbError as error:
            self._report("bad_symbol_file", str(error))
            return default

    @property
    def symbols(self):
        if self._symbols is None:
            self._symbols, self._entries = self._guarded(self._read_symbols, ({}, []))
        return self._symbols

    def entries(self):
        self.symbols
        return self._entries

    def _read_symbols(self):
        """({name: first rva}, every SymbolEntry): each procedure at its own address
        with its size, then variables, then publics not already named (undecorated
        on x86; a C++ decorated public at a named address adds nothing)."""
        pdb = self.pdb
        decorated = pdb.is_x86
        entries = [SymbolEntry(procedure.rva, procedure.name, procedure.size) for procedure in pdb.procedures()]
        entries.extend(SymbolEntry(data.rva, data.name, None) for data in pdb.data())
        seen = set((entry.name, entry.rva) for entry in entries)
        named = set(entry.rva for entry in entries)
        for public in pdb.publics():
            if public.name.startswith("?") and public.rva in named:
                continue
            name = undecorate(public.name) if decorated else public.name
            if (name, public.rva) not in seen:
                seen.add((name, public.rva))
                entries.append(SymbolEntry(public.rva, name, None))
        symbols = {}
        for entry in entries:
            symbols.setdefault(entry.name, entry.rva)
        entries.sort(key=entry_order)
        return symbols, entries

    def type_view(self, key):
        if key not in self._views:
            self._views[key] = self._guarded(lambda: self._view(key), None)
        return self._views[key]

    def _view(self, key):
        types = self.pdb.types
        record = types.strip(key) if isinstance(key, int) else types.find(key)
        if record is None or record.kind not in ("struct", "union", "class", "enum"):
            return None
        return pdb_type_view(types, record)

    def type_names(self):
        return self._guarded(lambda: self.pdb.types.names(), [])

    def variable_type(self, name):
        for data in self._guarded(self.pdb.data, []):
            if data.name == name:
                return data.type_index
        return None


class ExportSymbols(ModuleSymbols):
    """Names from the module's export table (what WinDbg calls export symbols),
    read from target memory on first use — knowing that a module has exports
    (for ``lm``) costs only its header page."""

    status = EXPORT_SYMBOLS

    def __init__(self, target, module, pointer_size):
        self.module_name = module.name
        self.types = {}
        self.base_types = {}
        self.path = None
        self.pointer_size = pointer_size
        self._target = target
        self._module = module
        self._symbols = None
        self._sorted = None

    @property
    def source(self):
        return "exports %s" % self.module_name

    @property
    def symbols(self):
        if self._symbols is None:
            try:
                exports = PEImage.from_target(self._target, self._module, directories=(DIRECTORY_EXPORT,)).exports
            except DbgextError:
                exports = {}
            self._symbols = dict((name, rva) for rva, name in exports.items())
        return self._symbols


def locate_module_symbols(target, module, locator, table):
    """The best symbols for ``module``: its matching PDB, else its exports, else None."""
    headers = image_headers(target, module)
    if locator is not None:
        codeview = (codeview_in_memory(target, module, headers) if headers is not None else None) or \
            _codeview_from_image_file(locator, module, _identity(module, headers), table.report)
        if codeview is not None:
            pdb = locator.find_pdb(codeview, table.report)
            if pdb is not None:
                return PdbModuleSymbols(module.name, pdb, table.report)
    if headers is None:
        return None
    rva, size = headers.directory(DIRECTORY_EXPORT)
    return ExportSymbols(target, module, headers.pointer_size) if rva and size else None


def _codeview_from_image_file(locator, module, identity, report):
    """The RSDS record from the module's image file in the symbol store, when the
    dump lost the pages holding it (paged out, a small dump)."""
    if identity is None:
        return None
    path = locator.find_image(module.image, identity[0], identity[1], report)
    if path is None:
        return None
    try:
        return PEImage.from_file(path).codeview
    except BadInput as error:
        report("bad_image_file", str(error))
        return None
