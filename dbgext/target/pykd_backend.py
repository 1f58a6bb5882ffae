"""The live-debugger backend: target memory, modules, symbols and types from pykd
inside WinDbg (a live session or the dump WinDbg has open).

pykd is imported lazily, only here, so dbgext imports and runs everywhere else.
Memory comes in whole pages through ``pykd.loadBytes``: one call per run of
pages, never a separate validity query (loadBytes checks the range itself); pykd
validates a block read as a whole, so a page that is partly invalid is unreadable
as a whole, and a run with a hole in it is split until the hole is found.

No memory map: :meth:`PykdBackend.mapped_ranges` is None, so
``Target.readable_ranges`` probes page by page.  That is fine over a bounded range
(a pool block, a stack, an image) but far too slow for a whole kernel address
space — finders running inside WinDbg must be given a range to search.
"""

import re

from ..errors import DbgextError
from ..layouts.arm64 import REGISTER_NAMES as ARM64_REGISTER_NAMES
from .base import PAGE_SIZE, Backend, Module, Target, Thread
from ..symbols.module import EXPORT_SYMBOLS, NO_SYMBOLS, PDB_SYMBOLS, ModuleSymbols
from ..symbols.table import SymbolTable

# One loadBytes call covers at most this many pages (pykd's count is 32-bit and a
# huge list of ints costs memory; 1 MiB runs keep calls few and lists modest).
MAX_PAGES_PER_CALL = 256
# A failed run shorter than this is read page by page instead of split again.
SPLIT_BELOW = 8

# info() lists at most this many threads of a user-mode process.
MAX_THREADS = 4096

REGISTERS = {
    "x64": ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12",
            "r13", "r14", "r15", "rip", "efl"),
    "x86": ("eax", "ebx", "ecx", "edx", "esi", "edi", "ebp", "esp", "eip", "efl"),
    # WinDbg's ARM64 names: x0-x28, fp (x29), lr (x30), sp, pc, cpsr.
    "arm64": ARM64_REGISTER_NAMES + ("cpsr",),
}

# pykd's findSymbol displacement ("nt!Foo+1a", "nt+1a", "nt!Foo-8") -> dbgext's "+0x1a".
_DISPLACEMENT = re.compile(r"([+-])([0-9a-fA-F]+)$")


def import_pykd():
    try:
        import pykd
    except ImportError:
        raise DbgextError("pykd is not available: run this inside WinDbg with pykd loaded "
                          "(!py), or open a dump file")
    return pykd


def session_arch(pykd):
    """The architecture of the code WinDbg's context is in: "arm64" when the
    effective processor mode (getCPUMode) is ARM64, else by the pointer size
    ("x64" or "x86": a WOW64 process in x86 mode is x86).  32-bit ARM is refused."""
    mode = pykd.getCPUMode()
    if mode == pykd.CPUType.ARM64:
        return "arm64"
    if mode == pykd.CPUType.ARM:
        raise DbgextError("the debugger's target is 32-bit ARM: dbgext reads x64, x86 and ARM64")
    return "x64" if pykd.ptrSize() == 8 else "x86"


class PykdBackend(Backend):
    kind = "pykd"

    def __init__(self, pykd=None):
        self.pykd = pykd or import_pykd()
        self.arch = session_arch(self.pykd)
        # pykd sign-extends 32-bit addresses (addr64); dbgext keeps them 32-bit.
        self.address_mask = 0xFFFFFFFF if self.arch == "x86" else 0xFFFFFFFFFFFFFFFF
        self._info = None

    def read_page(self, page_address):
        pykd = self.pykd
        try:
            return bytes(pykd.loadBytes(page_address, PAGE_SIZE))
        except pykd.MemoryException:
            return None

    def read_pages(self, page_address, count):
        pages = []
        while count > 0:
            run = min(count, MAX_PAGES_PER_CALL)
            pages.extend(self._read_run(page_address, run))
            page_address += run * PAGE_SIZE
            count -= run
        return pages

    def _read_run(self, page_address, count):
        """One loadBytes for the whole run.  pykd fails a run as a whole when any
        page of it is invalid (no validity query of our own: loadBytes makes one),
        so a failed run is split in halves until the holes are found: a hole in a
        run of n pages costs about 2*log2(n) calls, not n.  Runs of fewer than
        SPLIT_BELOW pages go page by page, which bounds the worst case (every
        other page missing) at about 1.25 calls per page."""
        if count == 1:
            return [self.read_page(page_address)]
        pykd = self.pykd
        try:
            data = bytes(pykd.loadBytes(page_address, count * PAGE_SIZE))
        except pykd.MemoryException:
            if count < SPLIT_BELOW:
                return [self.read_page(page_address + index * PAGE_SIZE) for index in range(count)]
            half = count // 2
            return self._read_run(page_address, half) + self._read_run(page_address + half * PAGE_SIZE,
                                                                        count - half)
        return [data[index * PAGE_SIZE:(index + 1) * PAGE_SIZE] for index in range(count)]

    def modules(self):
        pykd = self.pykd
        result = []
        for module in pykd.getModulesList():
            try:
                name = module.name()
                base, size = module.begin() & self.address_mask, module.size()
            except pykd.DbgException:
                continue  # an unloaded or half-described module: nothing to read in it
            try:
                image = module.image()
            except pykd.DbgException:
                image = name
            result.append(Module(name, base, size, image))
        return result

    def symbols(self):
        return PykdSymbols(self.pykd, self.address_mask)

    def info(self):
        """Asked for repeatedly by analyses; a Target lives for one command, during
        which the session does not move, so the answer is computed once."""
        if self._info is None:
            self._info = self._collect_info()
        return dict(self._info)

    def _collect_info(self):
        pykd = self.pykd
        kernel = bool(pykd.isKernelDebugging())
        dump = bool(pykd.isDumpAnalyzing())
        info = {"kind": self.kind, "arch": self.arch, "mode": "kernel" if kernel else "user",
                "source": "dump" if dump else "live"}
        try:
            info["build"] = pykd.getSystemVersion().buildNumber
        except pykd.DbgException:
            pass
        if kernel and dump:
            try:
                info["bugcheck"] = list(pykd.bugCheckData())
            except pykd.DbgException:
                pass
        try:
            # KTHREAD (kernel) or TEB (user) of the thread WinDbg's context is on.
            info["current_thread"] = pykd.getImplicitThread() & self.address_mask
            if kernel:
                # In kernel mode DbgEng's "threads" are the processors.
                info["processor"] = pykd.getCurrentThreadId()
            else:
                info["threads"] = self._user_threads()
        except pykd.DbgException:
            pass
        registers = {}
        for name in REGISTERS[self.arch]:
            try:
                registers[name] = pykd.reg(name)
            except pykd.DbgException:
                continue
        info["registers"] = registers
        return info

    def current_thread(self):
        """The thread WinDbg's register context is on (``r`` shows its registers);
        None when the session has no register context."""
        info = self.info()
        registers = dict((name.lower(), value) for name, value in (info.get("registers") or {}).items())
        if not any(registers.values()):
            return None
        current = info.get("current_thread") or None
        if info["mode"] == "kernel":
            return Thread(info.get("processor", 0), registers, kernel_thread=current, name="current thread")
        return Thread(info.get("processor", 0), registers, teb=current, name="current thread")

    def threads(self):
        # Other threads' registers would mean switching WinDbg's thread: a walk of
        # another thread starts from its KTHREAD (kernel) instead.
        thread = self.current_thread()
        return [thread] if thread is not None else []

    def _user_threads(self):
        pykd = self.pykd
        threads = []
        for index in range(min(pykd.getNumberThreads(), MAX_THREADS)):
            thread_id = pykd.getThreadId(index)
            threads.append({"thread_id": pykd.getThreadSystemID(thread_id),
                            "teb": pykd.getThreadOffset(thread_id) & self.address_mask})
        return threads


class PykdSymbols(SymbolTable):
    """The :class:`dbgext.symbols.table.SymbolTable` interface answered by the
    debugger's own symbols (findSymbol, getOffset, typeInfo), with every answer
    cached — inside WinDbg the same address or type is asked about many times.
    Module binding and lookup by address are SymbolTable's."""

    # Bound on the address cache: a dps over a huge range must not grow it forever.
    MAX_CACHED_ADDRESSES = 100000

    def __init__(self, pykd, address_mask=0xFFFFFFFFFFFFFFFF):
        super().__init__()
        self.pykd = pykd
        self._address_mask = address_mask
        self._addresses = {}
        self._descriptions = {}
        self._functions = {}
        self._type_sizes = {}
        self._field_offsets = {}

    @property
    def empty(self):
        return False

    def _locate(self, module):
        """The module's symbols as the debugger has them (its PDB, or exports), from
        one ``enumSymbols`` per module, kept: stackuse, ln and x then name the
        functions WinDbg names, not only the exported ones."""
        pykd = self.pykd
        try:
            handle = pykd.module(module.name)
            entries = handle.enumSymbols("*")
        except pykd.DbgException:
            return None
        symbols = {}
        for name, address in entries:
            rva = (address & self._address_mask) - module.base
            if 0 <= rva < module.size:
                symbols.setdefault(name, rva)
        table = ModuleSymbols(module.name, symbols)
        table.path = self._symbol_file(handle)
        table.status = debugger_status(table.path, symbols)
        return table

    def _symbol_file(self, handle):
        try:
            return handle.symfile() or None
        except self.pykd.DbgException:
            return None

    def type_owner(self, type_name):
        """Types come from the debugger (type_size, field_offset), not from tables."""
        return None, type_name

    def type_source(self, type_name):
        return "debugger"

    def address(self, name):
        if name not in self._addresses:
            pykd = self.pykd
            try:
                self._addresses[name] = pykd.getOffset(name) & self._address_mask
            except pykd.DbgException:
                self._addresses[name] = None
        return self._addresses[name]

    def describe(self, address):
        cached = self._descriptions.get(address)
        if cached is None:
            if self._module_at(address) is None:
                cached = "0x%x" % address
            else:
                cached = _with_hex_prefix(self.pykd.findSymbol(address))
            self._remember(self._descriptions, address, cached)
        return cached

    def function_of(self, address):
        if address not in self._functions:
            if self._module_at(address) is None:
                found = None
            else:
                found = self.pykd.findSymbol(address, False)
            self._remember(self._functions, address, found)
        return self._functions[address]

    def _remember(self, cache, key, value):
        if len(cache) >= self.MAX_CACHED_ADDRESSES:
            cache.clear()
        cache[key] = value

    def type_size(self, type_name):
        if type_name not in self._type_sizes:
            pykd = self.pykd
            try:
                self._type_sizes[type_name] = pykd.typeInfo(type_name).size()
            except pykd.DbgException:
                self._type_sizes[type_name] = None
        return self._type_sizes[type_name]

    def field_offset(self, type_name, field_path):
        key = (type_name, field_path)
        if key not in self._field_offsets:
            pykd = self.pykd
            try:
                self._field_offsets[key] = pykd.typeInfo(type_name).fieldOffset(field_path)
            except (pykd.DbgException, AttributeError, KeyError):
                self._field_offsets[key] = None
        return self._field_offsets[key]


def debugger_status(symbol_file, symbols):
    """WinDbg's lm column for a module the debugger loaded symbols for."""
    if symbol_file and symbol_file.lower().endswith(".pdb"):
        return PDB_SYMBOLS
    return EXPORT_SYMBOLS if symbols else NO_SYMBOLS


def _with_hex_prefix(text):
    return _DISPLACEMENT.sub(lambda match: "%s0x%s" % (match.group(1), match.group(2).lower()), text)


def open_pykd_target(pykd=None, cache_pages=8192):
    """The Target of the session WinDbg is debugging (used by ``dbgext.cli``)."""
    backend = PykdBackend(pykd)
    return Target(backend, cache_pages=cache_pages)
