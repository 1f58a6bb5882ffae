"""Write a Scenario as a Windows x64 or ARM64 kernel crash dump (PAGEDU64).

The writer plays the part of the machine: it assigns physical pages to the
scenario's virtual pages, builds 4-level page tables for them (x64's, or with
``arch="arm64"`` ARM64 descriptors: 4 KiB granule, 48-bit VA, 2 MiB blocks, the
one root serving both halves as dbgext.target.kdump assumes), with a top-level
self-map entry and the root at a conventional physical address, so the
page-table scans of memory-forensics tools find it), and writes either a full
dump (DumpType 1: run table + pages) or a bitmap dump (DumpType 5/6: a
``_SUMMARY_DUMP64`` bitmap + pages).  Facts: shared/reference/dump-formats.md.

Every physical-memory type is written: 1 (run table), 2 (the older summary
bitmap), 5 and 6 (bitmap), 8, 9 and 10 (RDMP page ranges).  Small dumps (type 4)
have their own writer, in the tests (``tests/triage_writer.py``).

Two levels:
- :func:`write_kernel_dump` (what ``Scenario.write_kernel_dump`` calls);
- :func:`write_physical_dump`, which writes any physical memory image with any
  DTB — tests use it to hand-craft page tables (1 GiB pages, transition PTEs,
  broken tables) that a scenario cannot express.
"""

import struct

from ..layouts.dump_formats import (
    CONTEXT_X86, DUMP_HEADER32, EXCEPTION_RECORD32, MACHINE_I386, MAX_PHYSICAL_RUNS_X86,
    X86_DUMP_TYPES, DUMP_HEADER64, DUMP_TYPE_BITMAP, DUMP_TYPE_FULL, DUMP_TYPE_LIVE_BITMAP, DUMP_TYPE_RDMP_COMPLETE,
    DUMP_TYPE_RDMP_KERNEL, DUMP_TYPE_RDMP_KERNEL_USER, DUMP_TYPE_SUMMARY, EXCEPTION_RECORD64, KDBG_OWNER_TAG,
    KDDEBUGGER_DATA64, MACHINE_AMD64, MAX_PHYSICAL_RUNS, PAGE_SIZE, PTE_ACCESSED, PTE_DIRTY, PTE_LARGE,
    PAGING, PTE_PRESENT, PTE_USER, PTE_WRITE, RDMP_HEADER64, RDMP_MARKER, SUMMARY_DUMP64, SUMMARY_DUMP_OLD,
    CONTEXTS, MACHINE_ARM64, old_summary_layout)
from ..target import arm64_paging

# Where KUSER_SHARED_DATA is mapped: volatility's PML4 scan looks for it, so
# Scenario writes one and the writer checks it is there.
KUSER_SHARED_DATA = {"x64": 0xFFFFF78000000000}
DEFAULT_DTB = 0x1A0000              # where Windows' boot PML4 conventionally sits
PREFERRED_SELF_MAP_INDEX = 0x1ED    # the pre-1607 fixed self-map slot (0xFFFFF6FB7DBED000)
LARGE_PAGE = 0x200000
# Physical layout: page tables from the DTB up, then data pages in a few runs
# separated by one-page holes, so readers must honour the run table (the last
# run takes whatever is left, keeping within the header's 42 runs).
DATA_PHYSICAL_BASE = 0x1000000
PAGES_PER_DATA_RUN = 0x1000
MAX_DATA_RUN_HOLES = 16
TABLE_FLAGS = PTE_PRESENT | PTE_WRITE | PTE_ACCESSED | PTE_DIRTY
# The entry bits of each 64-bit paging mode: a table's, a 4 KiB page's and a large
# page's (2 MiB), and what a user page adds.
ENTRY_BITS = {
    "x64": {"table": TABLE_FLAGS, "page": TABLE_FLAGS, "large": TABLE_FLAGS | PTE_LARGE, "user": PTE_USER},
    "arm64": {"table": arm64_paging.DESCRIPTOR_VALID | arm64_paging.DESCRIPTOR_TABLE_OR_PAGE,
              "page": arm64_paging.DESCRIPTOR_VALID | arm64_paging.DESCRIPTOR_TABLE_OR_PAGE
              | arm64_paging.DESCRIPTOR_ACCESS_FLAG,
              "large": arm64_paging.DESCRIPTOR_VALID | arm64_paging.DESCRIPTOR_ACCESS_FLAG,   # a block
              "user": arm64_paging.DESCRIPTOR_AP_EL0},
}
MACHINES = {"x64": MACHINE_AMD64, "arm64": MACHINE_ARM64}
INSTRUCTION_POINTER = {"x64": "rip", "x86": "eip", "arm64": "pc"}
BREAKPOINT_EXCEPTION = 0x80000003


def is_canonical(address):
    top = address >> 47
    return top == 0 or top == 0x1FFFF


def write_kernel_dump(scenario, path, bitmap=False, dump_type=None, large_pages=True, arch="x64", registers=None):
    """Write ``scenario`` (x64, kernel mode) as a kernel crash dump; returns ``path``.

    ``bitmap`` selects DumpType 5 over 1; ``dump_type`` may force any
    physical-memory type (1, 2, 5, 6, 8, 9, 10).  With ``large_pages``, every 2 MiB-aligned, fully mapped
    2 MiB of virtual memory is mapped by one large-page PDE (an ARM64 2 MiB block).
    ``arch="arm64"`` writes the scenario's memory as an ARM64 machine's (its
    64-bit structures are the same there), with ``registers`` the ARM64 context
    to store ({"pc": ..., "sp": ...}) in place of the scenario's x64 one."""
    if scenario.arch != "x64" or scenario.mode != "kernel":
        raise ValueError("kernel dumps need an x64 kernel-mode scenario, not %s/%s"
                         % (scenario.arch, scenario.mode))
    if dump_type is None:
        dump_type = DUMP_TYPE_BITMAP if bitmap else DUMP_TYPE_FULL
    if not scenario.ps_loaded_module_list and scenario.modules:
        scenario.build_loaded_module_list()
    if KUSER_SHARED_DATA["x64"] not in scenario.pages:
        scenario.map_kuser_shared_data()
    virtual_pages = {va: bytes(data) for va, data in scenario.pages.items()
                     if va not in scenario.excluded_pages}
    physical, dtb = build_physical_memory(virtual_pages, large_pages=large_pages, arch=arch)
    header = KernelDumpHeader(
        directory_table_base=dtb,
        build=scenario.build,
        bugcheck=scenario.bugcheck,
        registers=scenario.registers if registers is None else registers,
        system_time=scenario.system_time,
        ps_loaded_module_list=scenario.ps_loaded_module_list,
        kd_debugger_data_block=scenario.kd_debugger_data_block,
    )
    return write_physical_dump(path, physical, header, dump_type, arch=arch)


class KernelDumpHeader(object):
    """The DUMP_HEADER64 facts a writer fills in (everything else stays "PAGE")."""

    def __init__(self, directory_table_base=DEFAULT_DTB, build=19041, bugcheck=(0, 0, 0, 0, 0),
                 registers=None, system_time=0, ps_loaded_module_list=0, ps_active_process_head=0,
                 kd_debugger_data_block=0, processors=1, minidump_fields=0):
        self.directory_table_base = directory_table_base
        self.build = build
        self.bugcheck = tuple(bugcheck) + (0,) * (5 - len(bugcheck))
        self.registers = dict(registers or {})
        self.system_time = system_time
        self.ps_loaded_module_list = ps_loaded_module_list
        self.ps_active_process_head = ps_active_process_head
        self.kd_debugger_data_block = kd_debugger_data_block
        self.processors = processors
        self.minidump_fields = minidump_fields


# -- physical layout and page tables -------------------------------------------------


def build_physical_memory(virtual_pages, large_pages=True, arch="x64"):
    """Assign physical pages to ``virtual_pages`` ({va: 4 KiB bytes}) and build the
    ``arch`` ("x64" or "arm64") page tables mapping them.  Returns ({pa: 4 KiB
    bytes}, dtb)."""
    for va in virtual_pages:
        if va & (PAGE_SIZE - 1) or not is_canonical(va):
            raise ValueError("virtual page 0x%x is not a canonical page address" % va)
    ordered = sorted(virtual_pages)
    large_regions = []
    if large_pages:
        large_regions = _fully_mapped_large_regions(ordered)
    in_large = set(large_regions)
    small = [va for va in ordered if (va & ~(LARGE_PAGE - 1)) not in in_large]

    physical = {}
    # Data: large pages first (2 MiB-aligned physical frames), then 4 KiB pages in
    # runs separated by a one-page hole.
    cursor = DATA_PHYSICAL_BASE
    leaf_of = {}  # va -> (pa, is_large)
    for region in large_regions:
        for i in range(0, LARGE_PAGE, PAGE_SIZE):
            physical[cursor + i] = virtual_pages[region + i]
        leaf_of[region] = (cursor, True)
        cursor += LARGE_PAGE
    for index, va in enumerate(small):
        if index and index % PAGES_PER_DATA_RUN == 0 and index // PAGES_PER_DATA_RUN <= MAX_DATA_RUN_HOLES:
            cursor += PAGE_SIZE
        physical[cursor] = virtual_pages[va]
        leaf_of[va] = (cursor, False)
        cursor += PAGE_SIZE

    used_pml4 = {(va >> 39) & 0x1FF for va in ordered}
    self_map = _self_map_index(used_pml4)
    tables = _PageTables(DEFAULT_DTB, data_floor=DATA_PHYSICAL_BASE, paging=arch)
    bits = ENTRY_BITS[arch]
    for va, (pa, is_large) in sorted(leaf_of.items()):
        user = bits["user"] if va >> 47 == 0 else 0
        tables.map(va, pa, bits["large" if is_large else "page"] | user, bits["table"] | user, large=is_large)
    tables.set_entry(DEFAULT_DTB, self_map, DEFAULT_DTB | bits["table"])
    for pa, table in tables.pages.items():
        physical[pa] = bytes(table)
    return physical, DEFAULT_DTB


def _fully_mapped_large_regions(ordered_pages):
    counts = {}
    for va in ordered_pages:
        region = va & ~(LARGE_PAGE - 1)
        counts[region] = counts.get(region, 0) + 1
    return sorted(region for region, count in counts.items() if count == LARGE_PAGE // PAGE_SIZE)


def _self_map_index(used_pml4):
    if PREFERRED_SELF_MAP_INDEX not in used_pml4:
        return PREFERRED_SELF_MAP_INDEX
    for index in range(0x1FF, 0x100, -1):
        if index not in used_pml4:
            return index
    raise ValueError("no free kernel PML4 slot for the page-table self-map")


class _PageTables(object):
    """Page tables of one paging mode (``PAGING``: x64, x86-pae, x86) allocated
    upward from the DTB, which holds the top-level table."""

    def __init__(self, dtb, data_floor, paging="x64"):
        mode = PAGING[paging]
        self.dtb = dtb
        self.levels = mode["levels"]
        self.entry = struct.Struct("<" + mode["entry"])
        self.pfn_mask = mode["pfn_mask"]
        # A PAE PDPT entry may hold only Present (and cache bits): R/W and U/S are reserved.
        self.top_flags = PTE_PRESENT if paging == "x86-pae" else None
        self.pages = {dtb: bytearray(PAGE_SIZE)}
        self._next = dtb + PAGE_SIZE
        self._floor = data_floor

    def _allocate(self):
        if self._next >= self._floor:
            raise ValueError("too many page tables for the physical layout")
        pa = self._next
        self._next += PAGE_SIZE
        self.pages[pa] = bytearray(PAGE_SIZE)
        return pa

    def set_entry(self, table_pa, index, value):
        self.entry.pack_into(self.pages[table_pa], index * self.entry.size, value)

    def _index(self, va, level):
        shift, count = self.levels[level]
        return (va >> shift) & (count - 1)

    def _child(self, table_pa, index, flags):
        entry = self.entry.unpack_from(self.pages[table_pa], index * self.entry.size)[0]
        if entry & PTE_PRESENT:
            return entry & self.pfn_mask
        child = self._allocate()
        self.set_entry(table_pa, index, child | flags)
        return child

    def _table_at(self, va, level, flags):
        """The level-``level`` table on the way to ``va``, made as needed."""
        table = self.dtb
        for above in range(level):
            table = self._child(table, self._index(va, above),
                                self.top_flags if above == 0 and self.top_flags else flags)
        return table

    def map(self, va, pa, entry_bits, table_bits, large=False):
        """Map ``va`` to ``pa`` by an entry with ``entry_bits`` (a 4 KiB page, or
        with ``large`` a large page one level up), making the tables on the way
        with ``table_bits``."""
        level = len(self.levels) - (2 if large else 1)
        self.set_entry(self._table_at(va, level, table_bits), self._index(va, level), pa | entry_bits)

    def map_page(self, va, pa, flags):
        self.map(va, pa, flags, flags)


def build_physical_memory_x86(virtual_pages, pae=True):
    """x86 page tables (PAE or not, 4 KiB pages) mapping ``virtual_pages``
    ({va below 4 GiB: 4 KiB bytes}).  Returns ({pa: 4 KiB bytes}, dtb)."""
    paging = "x86-pae" if pae else "x86"
    physical = {}
    tables = _PageTables(DEFAULT_DTB, data_floor=DATA_PHYSICAL_BASE, paging=paging)
    cursor = DATA_PHYSICAL_BASE
    for index, va in enumerate(sorted(virtual_pages)):
        if va & (PAGE_SIZE - 1) or va >> 32:
            raise ValueError("virtual page 0x%x is not an x86 page address" % va)
        if index and index % PAGES_PER_DATA_RUN == 0:
            cursor += PAGE_SIZE  # a hole between runs, as on the x64 side
        physical[cursor] = virtual_pages[va]
        tables.map_page(va, cursor, TABLE_FLAGS | (PTE_USER if va < 0x80000000 else 0))
        cursor += PAGE_SIZE
    for pa, table in tables.pages.items():
        physical[pa] = bytes(table)
    return physical, DEFAULT_DTB


# -- the file ------------------------------------------------------------------------------


def physical_runs(page_addresses):
    """Sorted page addresses -> [(first PFN, page count)] of contiguous frames."""
    runs = []
    for pa in sorted(page_addresses):
        pfn = pa >> 12
        if runs and runs[-1][0] + runs[-1][1] == pfn:
            runs[-1][1] += 1
        else:
            runs.append([pfn, 1])
    return [tuple(run) for run in runs]


PHYSICAL_DUMP_TYPES = (DUMP_TYPE_FULL, DUMP_TYPE_SUMMARY, DUMP_TYPE_BITMAP, DUMP_TYPE_LIVE_BITMAP,
                       DUMP_TYPE_RDMP_KERNEL, DUMP_TYPE_RDMP_KERNEL_USER, DUMP_TYPE_RDMP_COMPLETE)


def write_physical_dump(path, physical, header, dump_type=DUMP_TYPE_FULL, arch="x64", pae=True):
    """Write {pa: 4 KiB bytes} as a kernel dump of ``dump_type``; returns path.
    ``arch="x86"`` writes a 32-bit PAGEDUMP (types 1, 2 and 5) whose header
    says whether the tables are PAE ones."""
    if dump_type not in (PHYSICAL_DUMP_TYPES if arch != "x86" else X86_DUMP_TYPES):
        raise ValueError("cannot write an %s DumpType %r" % (arch, dump_type))
    for pa, data in physical.items():
        if pa & (PAGE_SIZE - 1) or len(data) != PAGE_SIZE:
            raise ValueError("physical page 0x%x must be page-aligned and 4 KiB long" % pa)
    runs = physical_runs(physical)
    most = MAX_PHYSICAL_RUNS if arch != "x86" else MAX_PHYSICAL_RUNS_X86
    if len(runs) > most:
        raise ValueError("%d physical runs; a dump header holds at most %d" % (len(runs), most))
    ordered = sorted(physical)
    header_size = (DUMP_HEADER64 if arch != "x86" else DUMP_HEADER32)["size"]
    if dump_type == DUMP_TYPE_FULL:
        prologue = b""
    elif dump_type == DUMP_TYPE_SUMMARY:
        prologue = _old_summary_dump(ordered, header_size, arch)
    elif dump_type in (DUMP_TYPE_BITMAP, DUMP_TYPE_LIVE_BITMAP):
        prologue = _summary_dump(ordered, header_size)
    else:
        prologue = _rdmp_header(runs, len(ordered), dump_type)
    first_page = header_size + len(prologue)
    file_size = first_page + PAGE_SIZE * len(ordered)
    if arch != "x86":
        head = dump_header(header, runs, len(ordered), dump_type, file_size, arch)
    else:
        head = dump_header32(header, runs, len(ordered), dump_type, file_size, pae)
    with open(path, "wb") as handle:
        handle.write(head)
        handle.write(prologue)
        for pa in ordered:
            handle.write(physical[pa])
    return path


def _bitmap_bytes(ordered_pages):
    """The page bitmap (a multiple of 64 bits: both parsers agree only on those)."""
    highest = (ordered_pages[-1] >> 12) + 1 if ordered_pages else 0
    bit_count = (highest + 63) // 64 * 64
    bitmap = bytearray(bit_count // 8)
    for pa in ordered_pages:
        pfn = pa >> 12
        bitmap[pfn >> 3] |= 1 << (pfn & 7)
    return bytes(bitmap)


def _padded(fixed, start):
    """``fixed`` zero-padded so that what follows it starts page-aligned, and that offset."""
    unpadded = start + len(fixed)
    first_page = (unpadded + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1)
    return fixed + bytes(first_page - unpadded), first_page


def _summary_dump(ordered_pages, start):
    """_SUMMARY_DUMP64 + bitmap (DumpType 5 and 6; x86 bitmap dumps use it too)."""
    return _bitmap_prologue(SUMMARY_DUMP64, ordered_pages, start, lambda fixed, first_page, bits: struct.pack_into(
        "<QQQ", fixed, SUMMARY_DUMP64["FirstPage"], first_page, len(ordered_pages), bits))


def _old_summary_dump(ordered_pages, start, arch):
    """The DumpType 2 summary header (u32 fields, RTL_BITMAP) + bitmap."""
    return _bitmap_prologue(old_summary_layout(arch), ordered_pages, start,
                            lambda fixed, first_page, bits: struct.pack_into(
                                "<IIII", fixed, SUMMARY_DUMP_OLD["HeaderSize"], first_page, bits, len(ordered_pages),
                                bits))


def _bitmap_prologue(layout, ordered_pages, start, fill):
    """A summary header of ``layout`` at file offset ``start`` + the page bitmap,
    zero-padded so the first page is page-aligned; ``fill(header, first page
    offset, bit count)`` sets the layout's own fields."""
    bitmap = _bitmap_bytes(ordered_pages)
    fixed = bytearray(layout["Bitmap"])
    fixed[layout["Signature"]:layout["Signature"] + 8] = b"SDMPDUMP"
    body, first_page = _padded(bytes(fixed) + bitmap, start)
    body = bytearray(body)
    fill(body, first_page, len(bitmap) * 8)
    return bytes(body)


def _rdmp_header(runs, page_count, dump_type):
    """The RDMP header, the {PFN, count} ranges, then zeros up to the first page
    (at least one zero entry: kdmp-parser reads entries until a zero PFN, over
    MetadataSize = FirstPageOffset - 0x2020 bytes)."""
    if runs and runs[0][0] == 0:
        raise ValueError("an RDMP range cannot start at PFN 0 (a zero PFN ends the list)")
    layout = RDMP_HEADER64
    ranges = b"".join(struct.pack("<QQ", base, count) for base, count in runs) + bytes(16)
    body, first_page = _padded(bytes(layout["Ranges"]) + ranges, layout["offset"])
    fixed = bytearray(body)
    struct.pack_into("<I4s4sIQQ", fixed, 0, RDMP_MARKER, b"RDMP", b"DUMP", 0,
                     first_page - layout["offset"] - 0x20, first_page)
    if dump_type == DUMP_TYPE_RDMP_COMPLETE:
        struct.pack_into("<IHHQ", fixed, layout["NumberOfRanges"], len(runs), 0, 0, page_count)
    return bytes(fixed)


def pack_debugger_data(values, size=0x380):
    """A KDDEBUGGER_DATA64 block ({field: value}, the rest zero) with its KDBG tag."""
    out = bytearray(size)
    struct.pack_into("<4sI", out, 0x10, KDBG_OWNER_TAG, size)
    for name, value in values.items():
        offset, fmt = KDDEBUGGER_DATA64[name]
        struct.pack_into("<" + fmt, out, offset, value)
    return bytes(out)


def dump_header(header, runs, page_count, dump_type, file_size, arch="x64"):
    """The 0x2000-byte DUMP_HEADER64 of an ``arch`` ("x64" or "arm64") machine
    (every unset byte "PAGE")."""
    h = DUMP_HEADER64
    out = bytearray(b"PAGE" * (h["size"] // 4))
    out[h["ValidDump"]:h["ValidDump"] + 4] = b"DU64"
    struct.pack_into("<II", out, h["MajorVersion"], 0xF, header.build)
    struct.pack_into("<QQQQ", out, h["DirectoryTableBase"], header.directory_table_base, 0,
                     header.ps_loaded_module_list, header.ps_active_process_head)
    struct.pack_into("<IIII", out, h["MachineImageType"], MACHINES[arch], header.processors,
                     header.bugcheck[0], 0)
    struct.pack_into("<4Q", out, h["BugCheckParameters"], *header.bugcheck[1:5])
    out[h["VersionUser"]:h["VersionUser"] + 32] = bytes(32)
    struct.pack_into("<Q", out, h["KdDebuggerDataBlock"], header.kd_debugger_data_block)
    struct.pack_into("<IIQ", out, h["PhysicalMemoryBlock"], len(runs), 0, page_count)
    for index, (base, count) in enumerate(runs):
        struct.pack_into("<QQ", out, h["PhysicalMemoryRuns"] + 16 * index, base, count)
    context = pack_context(CONTEXTS[arch], header.registers)
    out[h["ContextRecord"]:h["ContextRecord"] + len(context)] = context
    exception = exception_record(header, arch)
    out[h["Exception"]:h["Exception"] + len(exception)] = exception
    struct.pack_into("<IIQQ", out, h["DumpType"], dump_type, 0, file_size, header.system_time)
    out[h["Comment"]:h["Comment"] + 128] = bytes(128)
    struct.pack_into("<QIIIII", out, h["SystemUpTime"], 0, header.minidump_fields, 0, 1, 0x110, 0)
    struct.pack_into("<BBHII", out, h["Unused1"], 0, 0, 0, 0, 0)
    return bytes(out)


def dump_header32(header, runs, page_count, dump_type, file_size, pae):
    """The 0x1000-byte x86 DUMP_HEADER32 (every unset byte "PAGE")."""
    h = DUMP_HEADER32
    out = bytearray(b"PAGE" * (h["size"] // 4))
    out[h["ValidDump"]:h["ValidDump"] + 4] = b"DUMP"
    struct.pack_into("<IIIIII", out, h["MajorVersion"], 0xF, header.build, header.directory_table_base, 0,
                     header.ps_loaded_module_list, header.ps_active_process_head)
    struct.pack_into("<III", out, h["MachineImageType"], MACHINE_I386, header.processors, header.bugcheck[0])
    struct.pack_into("<4I", out, h["BugCheckParameters"], *header.bugcheck[1:5])
    out[h["VersionUser"]:h["VersionUser"] + 32] = bytes(32)
    struct.pack_into("<BBxxI", out, h["PaeEnabled"], 1 if pae else 0, 0, header.kd_debugger_data_block)
    struct.pack_into("<II", out, h["PhysicalMemoryBlock"], len(runs), page_count)
    for index, (base, count) in enumerate(runs):
        struct.pack_into("<II", out, h["PhysicalMemoryRuns"] + 8 * index, base, count)
    context = pack_context(CONTEXT_X86, header.registers)
    out[h["ContextRecord"]:h["ContextRecord"] + len(context)] = context
    exception = bytearray(EXCEPTION_RECORD32["size"])
    struct.pack_into(EXCEPTION_RECORD32["format"], exception, 0, BREAKPOINT_EXCEPTION, 0, 0,
                     header.registers.get("eip", 0), 0)
    out[h["Exception"]:h["Exception"] + len(exception)] = exception
    out[h["Comment"]:h["Comment"] + 128] = bytes(128)
    struct.pack_into("<IIIIII", out, h["DumpType"], dump_type, header.minidump_fields, 0, 1, 0x110, 0)
    struct.pack_into("<Q", out, h["RequiredDumpSpace"], file_size)
    struct.pack_into("<QQ", out, h["SystemUpTime"], 0, header.system_time)
    return bytes(out)


def exception_record(header, arch="x64"):
    """The EXCEPTION_RECORD64 the writers store: a breakpoint at the context's
    instruction pointer."""
    exception = bytearray(EXCEPTION_RECORD64["size"])
    struct.pack_into("<IIQQI", exception, 0, BREAKPOINT_EXCEPTION, 0, 0,
                     header.registers.get(INSTRUCTION_POINTER[arch], 0), 0)
    return bytes(exception)


def pack_context(layout, registers):
    """A CONTEXT (``CONTEXT_AMD64``, ``CONTEXT_X86`` or ``CONTEXT_ARM64`` layout) holding ``registers``
    ({"rip": ..., "rsp": ...}); unknown register names are an error."""
    out = bytearray(layout["size"])
    struct.pack_into("<I", out, layout["ContextFlags"], layout["flags"])
    if "MxCsr" in layout:
        # kdmp-parser rejects a CONTEXT whose two MxCsr copies differ.
        struct.pack_into("<I", out, layout["MxCsr"], 0x1F80)
        struct.pack_into("<I", out, layout["FltSave.MxCsr"], 0x1F80)
    values = dict(layout["defaults"])
    values.update((name.lower(), value) for name, value in registers.items())
    for name, value in values.items():
        if name not in layout["registers"]:
            raise ValueError("unknown register %r for this CONTEXT" % name)
        offset, size = layout["registers"][name]
        out[offset:offset + size] = (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
    return bytes(out)
