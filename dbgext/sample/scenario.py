"""Scenario builder: lay out a target's virtual memory, modules, symbols and types,
then turn it into an in-memory Target or write it as a real-format dump file.

Analyses' fixture builders (trace databases, ETW caches, IPT buffers, driver
images) all place their bytes through one Scenario, so the same scenario can be
read through the in-memory backend, a kernel crash dump, or a minidump.

    s = Scenario(arch="x64", mode="kernel")
    nt = s.add_module("nt", 0xfffff80000000000, 0x200000, image="ntoskrnl.exe")
    s.add_symbol("nt", "KeBugCheckEx", 0x1000)
    addr = s.alloc(0x100)                     # pool-like allocation
    s.write(addr, b"...")
    target = s.target()                       # unit tests
    s.write_kernel_dump("x.dmp")              # real PAGEDU64 dump (kernel mode)
    s.write_symbols("symbols/")               # ISF, one file per module
"""

import struct

from ..target.base import PAGE_SIZE, Module, Target
from ..target.base import Thread as TargetThread
from ..target.image import ImageBackend
from ..symbols.module import ModuleSymbols, isf_file_path, write_isf_file
from ..symbols.table import SymbolTable
from .kdump_writer import KUSER_SHARED_DATA, write_kernel_dump

# Where allocations go by default, per (arch, mode): realistic pool / heap ranges.
HEAP_BASE = {
    ("x64", "kernel"): 0xFFFFC08000000000,
    ("x64", "user"): 0x000001D000000000,
    ("x86", "user"): 0x00A00000,
    ("arm64", "user"): 0x000001D000000000,
}

# _KLDR_DATA_TABLE_ENTRY (x64), as in the kernel's public symbols.
KLDR_X64 = {"size": 0xA0, "InLoadOrderLinks": 0x0, "DllBase": 0x30, "EntryPoint": 0x38,
            "SizeOfImage": 0x40, "FullDllName": 0x48, "BaseDllName": 0x58}


class Thread(object):
    """A thread the dump will describe: id, TEB (user) or KTHREAD (kernel), stack, registers."""

    def __init__(self, thread_id, teb=0, stack_base=0, stack_size=0, registers=None, kthread=0):
        self.thread_id = thread_id
        self.teb = teb
        self.kthread = kthread
        self.stack_base = stack_base  # lowest address of the captured stack range
        self.stack_size = stack_size
        self.registers = dict(registers or {})


class Scenario(object):
    def __init__(self, arch="x64", mode="kernel", build=19041):
        if (arch, mode) not in HEAP_BASE:
            raise ValueError("unsupported scenario %s/%s" % (arch, mode))
        self.arch = arch
        self.mode = mode
        self.build = build
        self.pointer_size = 4 if arch == "x86" else 8
        self.pages = {}  # page address -> bytearray(PAGE_SIZE)
        self.modules = []
        self.module_symbols = {}  # module name -> ModuleSymbols
        self._heap_cursor = HEAP_BASE[(arch, mode)]
        self.threads = []
        self.registers = {}  # the crash/current context (kernel dump header CONTEXT)
        self.bugcheck = (0, 0, 0, 0, 0)
        self.system_time = 0x01DB000000000000  # FILETIME
        self.ps_loaded_module_list = 0
        self.kd_debugger_data_block = 0
        self.excluded_pages = set()  # pages that exist in memory but are left out of dumps

    # -- memory -------------------------------------------------------------------

    def map(self, address, size):
        """Make [address, address+size) readable (zero-filled where new)."""
        page = address & ~(PAGE_SIZE - 1)
        while page < address + size:
            if page not in self.pages:
                self.pages[page] = bytearray(PAGE_SIZE)
            page += PAGE_SIZE

    def unmap(self, address, size):
        """Remove every page touching [address, address+size): a hole in the dump."""
        page = address & ~(PAGE_SIZE - 1)
        while page < address + size:
            self.pages.pop(page, None)
            page += PAGE_SIZE

    def write(self, address, data):
        data = bytes(data)
        self.map(address, len(data))
        offset = 0
        while offset < len(data):
            va = address + offset
            page = va & ~(PAGE_SIZE - 1)
            within = va - page
            span = min(PAGE_SIZE - within, len(data) - offset)
            self.pages[page][within:within + span] = data[offset:offset + span]
            offset += span

    def read(self, address, size):
        out = bytearray()
        while size > 0:
            page = address & ~(PAGE_SIZE - 1)
            within = address - page
            span = min(PAGE_SIZE - within, size)
            out += self.pages[page][within:within + span]
            address += span
            size -= span
        return bytes(out)

    def pack(self, address, fmt, *values):
        self.write(address, struct.pack(fmt, *values))

    def write_pointer(self, address, value):
        self.pack(address, "<Q" if self.pointer_size == 8 else "<I", value)

    def alloc(self, size, align=16):
        """Reserve and map ``size`` zeroed bytes from the scenario's heap/pool range."""
        if align & (align - 1):
            raise ValueError("alignment must be a power of two")
        address = (self._heap_cursor + align - 1) & ~(align - 1)
        self._heap_cursor = address + max(size, 1)
        self.map(address, size)
        return address

    def alloc_pages(self, size):
        """Page-aligned allocation, leaving a guard gap after it (like a fresh VA range)."""
        address = self.alloc(size, align=PAGE_SIZE)
        self._heap_cursor = ((self._heap_cursor + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1)) + PAGE_SIZE
        return address

    # -- modules, symbols, types --------------------------------------------------

    def add_module(self, name, base, size, image=None, content=None, timestamp=None):
        """Declare a loaded module (and map its pages); ``content`` bytes go at base;
        ``timestamp`` is the TimeDateStamp the loader's list records."""
        module = Module(name, base, size, image or name, timestamp)
        self.modules.append(module)
        self.module_symbols.setdefault(name, ModuleSymbols(name))
        self.map(base, size)
        if content:
            self.write(base, content)
        return module

    def module(self, name):
        for module in self.modules:
            if module.name == name:
                return module
        raise KeyError(name)

    def add_symbol(self, module_name, symbol, rva):
        self.module_symbols[module_name].symbols[symbol] = rva
        self.module_symbols[module_name]._sorted = None
        return self.module(module_name).base + rva

    def add_type(self, module_name, type_name, size, fields):
        """``fields``: {name: offset} or {name: (offset, subtype_name)}."""
        entry = {}
        for field, spec in fields.items():
            if isinstance(spec, tuple):
                offset, subtype = spec
                entry[field] = {"offset": offset, "type": {"kind": "struct", "name": subtype}}
            else:
                entry[field] = {"offset": spec, "type": {"kind": "base", "name": "unsigned long long"}}
        self.module_symbols[module_name].types[type_name] = {"size": size, "fields": entry}

    def symbol_table(self, with_types=True):
        table = SymbolTable()
        for module_symbols in self.module_symbols.values():
            table.add(module_symbols if with_types else ModuleSymbols(
                module_symbols.module_name, module_symbols.symbols))
        return table

    # -- system-level structures ----------------------------------------------------

    def build_loaded_module_list(self):
        """Lay out nt!PsLoadedModuleList as Windows does: a LIST_ENTRY head and one
        _KLDR_DATA_TABLE_ENTRY per module with its names as UNICODE_STRINGs."""
        if self.mode != "kernel":
            return 0
        head = self.alloc(16)
        entries = []
        for module in self.modules:
            entry = self.alloc(KLDR_X64["size"])
            full = ("\\SystemRoot\\system32\\" + module.image).encode("utf-16-le")
            base_name = module.image.encode("utf-16-le")
            full_buf = self.alloc(len(full) + 2)
            base_buf = self.alloc(len(base_name) + 2)
            self.write(full_buf, full)
            self.write(base_buf, base_name)
            self.pack(entry + KLDR_X64["DllBase"], "<Q", module.base)
            self.pack(entry + KLDR_X64["SizeOfImage"], "<I", module.size)
            self.pack(entry + KLDR_X64["FullDllName"], "<HHxxxxQ", len(full), len(full) + 2, full_buf)
            self.pack(entry + KLDR_X64["BaseDllName"], "<HHxxxxQ", len(base_name), len(base_name) + 2, base_buf)
            entries.append(entry)
        chain = [head] + entries
        for index, node in enumerate(chain):
            self.pack(node, "<QQ", chain[(index + 1) % len(chain)], chain[index - 1])
        self.ps_loaded_module_list = head
        if "nt" in self.module_symbols and self.modules:
            nt = self.module("nt")
            # The global lives inside nt's image in real Windows; here its LIST_ENTRY
            # head is a separate allocation and the symbol names that allocation.
            self.module_symbols["nt"].symbols["PsLoadedModuleList"] = head - nt.base
            self.module_symbols["nt"]._sorted = None
        return head

    def map_kuser_shared_data(self):
        """KUSER_SHARED_DATA with NtMajorVersion 10 (volatility's PML4 scan needs it)."""
        if self.arch != "x64" or self.mode != "kernel":
            return
        address = KUSER_SHARED_DATA["x64"]
        self.map(address, PAGE_SIZE)
        self.pack(address + 0x260, "<I", self.build)      # NtBuildNumber
        self.pack(address + 0x26C, "<II", 10, 0)          # NtMajorVersion, NtMinorVersion

    # -- outputs ------------------------------------------------------------------

    def info(self):
        return {
            "mode": self.mode,
            "build": self.build,
            "bugcheck": list(self.bugcheck),
            "registers": dict(self.registers),
        }

    def target(self, with_types=True):
        """An in-memory Target over a snapshot of the scenario's pages."""
        pages = {address: bytes(page) for address, page in self.pages.items()}
        backend = ImageBackend(pages, self.arch, self.modules, self.symbol_table(with_types), self.info(),
                               self.target_threads())
        return Target(backend)

    def target_threads(self):
        """The scenario's register contexts as target Threads: the crash/current
        context first (kernel mode), then every described thread."""
        threads = []
        if self.registers:
            threads.append(TargetThread(0, self.registers))
        for thread in self.threads:
            threads.append(TargetThread(thread.thread_id, thread.registers, kernel_thread=thread.kthread or None,
                                        teb=thread.teb or None, stack_base=thread.stack_base + thread.stack_size,
                                        stack_limit=thread.stack_base))
        return threads

    def write_symbols(self, directory, force=True, force_option="--force"):
        """One ISF file per module with symbols or types (replacing existing ones
        unless ``force`` is False; never through a link)."""
        import os
        os.makedirs(directory, exist_ok=True)
        return [write_isf_file(ms, directory, force, force_option) for ms in self._symbols_to_write()]

    def symbol_file_paths(self, directory):
        """The paths :meth:`write_symbols` writes into ``directory``."""
        return [isf_file_path(ms, directory) for ms in self._symbols_to_write()]

    def _symbols_to_write(self):
        return [ms for ms in self.module_symbols.values() if ms.symbols or ms.types]

    def write_kernel_dump(self, path, bitmap=False, dump_type=None):
        return write_kernel_dump(self, path, bitmap=bitmap, dump_type=dump_type)
