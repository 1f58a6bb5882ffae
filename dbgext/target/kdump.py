"""Windows kernel crash dumps whose pages are physical memory.  x64 and ARM64
(PAGEDU64, told apart by MachineImageType 0x8664 / 0xAA64): full (DumpType 1),
summary (2), bitmap (5; 6 = live kernel dump) and the RDMP layouts of new dbgeng
(8 = ``.dump /k``, 9 = ``/ka``, 10 = ``/f``).  x86 (PAGEDUMP, a one-page
DUMP_HEADER32): full, summary and bitmap, with PAE or non-PAE page tables as the
header's PaeEnabled says.  Small memory dumps (DumpType 4, x64 and ARM64) hold
no physical memory: :mod:`dbgext.target.triage_dump`.  :func:`dbgext.target.open_kernel_dump`
picks the backend from the header (:func:`machine_arch` the architecture).

ARM64 differs from x64 in two places only: the CONTEXT at 0x348 is
CONTEXT_ARM64 (:mod:`dbgext.layouts.arm64`), and the page tables are ARM64
descriptors, walked with :func:`dbgext.target.arm64_paging.step` (4 KiB granule,
48-bit VA, 1 GiB and 2 MiB blocks).  The header's DirectoryTableBase is taken as
the root of *both* halves' walk: nothing in the reference says whether it holds
TTBR0 or TTBR1, and Windows on ARM gives the kernel half the x64 layout (kernel
addresses from 0xFFFF8000`00000000, user ones below 0x00008000`00000000, one
root whose upper 256 entries are the kernel's), so the walk and the canonical-
address rule are x64's.  This is an assumption, checked only on the dumps our
writer makes.  Windows' software PTEs of ARM64 (transition pages) are not read.


The reader is our own: pages are read from the file with positioned reads (see
:mod:`dbgext.target.dumpfile`: an mmap dies of SIGBUS when the file shrinks) and
virtual addresses are translated by walking the page tables (x64, x86 PAE or
not) from the header's DirectoryTableBase.  kdmp-parser reads the same files (except types 2
and 4), and the tests keep it as the independent oracle.

Validation happens before any page is touched: the run table, bitmap or RDMP
ranges, and RequiredDumpSpace, must fit in the file, otherwise BadInput names
the file.

Translation follows the hardware (4 KiB, 2 MiB and 1 GiB pages on x64; 4 KiB
and 2 MiB with PAE, 4 KiB and 4 MiB without; ``PAGING`` in the layouts) with one
addition that WinDbg also makes: a *transition* PTE (not present, Transition
bit 11 set, Prototype bit 10 clear) still names the physical page that holds
the data, so it is read like a valid one whenever the dump contains that page.
Page tables in a dump can be garbage, so every entry is checked the way the
processor checks it before it is believed: an entry whose frame lies beyond the
dump's physical memory, a large page with reserved bits set or a PS bit in a
PML4 entry is not present.  A walk of the whole address space
(``mapped_ranges``) visits at most a budget of page-table pages and maps at most
a budget of pages, so a corrupt dump costs bounded time; what was cut short is
reported in ``problems``.
"""

import copy
import re
import struct
from bisect import bisect_right

from ..errors import BadInput, DbgextError
from ..layouts.dump_formats import (
    CONTEXTS, DUMP_HEADER32, DUMP_HEADER64, DUMP_KIND, DUMP_TYPE_DESCRIPTION, DUMP_TYPE_FULL,
    DUMP_TYPE_RDMP_COMPLETE, DUMP_TYPE_RDMP_KERNEL, DUMP_TYPE_RDMP_KERNEL_USER, DUMP_TYPE_SUMMARY, DUMP_TYPE_TRIAGE,
    EXCEPTION_RECORD32, EXCEPTION_RECORD64, KDBG_OWNER_TAG, KDDEBUGGER_DATA64, KDDEBUGGER_DATA64_MAX_SIZE,
    KDDEBUGGER_LAYOUTS, KLDR_DATA_TABLE_ENTRY, MAX_PHYSICAL_RUNS, MAX_PHYSICAL_RUNS_X86,
    ARCH_OF_MACHINE64, MINIDUMP_FIELDS, PAGING, PTE_LARGE, PTE_PFN_MASK, PTE_PRESENT, PTE_PROTOTYPE, PTE_TRANSITION, RDMP_HEADER64,
    RDMP_MARKER, SUMMARY_DUMP64, UNSET_U32, UNSET_U64, X86_DUMP_TYPES, old_summary_layout)
from ..problems import ProblemLog
from ..winpath import file_name, file_stem
from . import arm64_paging
from .arm64_paging import TTBR_BASE_MASK
from .base import PAGE_SIZE, Backend, Module, Target, Thread, merge_ranges
from .dumpfile import DumpFile

MAX_MODULES = 4096
_ARM64_PAGE = arm64_paging.DESCRIPTOR_VALID | arm64_paging.DESCRIPTOR_TABLE_OR_PAGE
# Translations are cached per 2 MiB of virtual space; the bound keeps a scan of
# a huge dump from holding every page table in memory.
MAX_CACHED_REGIONS = 8192
MAX_CACHED_TABLES = 4096
BITMAP_CHUNK_BYTES = 64  # rank() prefix sums every 512 PFNs
MAX_RDMP_RANGES = 0x100000
# Budgets of one walk of the whole address space.  A clean dump needs about one
# page-table page per 512 mapped pages (times the levels the self-map adds);
# garbage tables can point every entry at another "table" or alias all of
# physical memory many times over.
MIN_TABLE_PAGE_BUDGET = 16384
MIN_MAPPED_PAGE_BUDGET = 256


def mapped_page_budget(physical_pages):
    """How many pages one walk may map: every frame the dump holds once, plus half
    again for what maps frames twice in a real kernel (the page-table self-map).
    Scans cost what they map, so garbage that aliases memory costs at most ~1.5x
    the clean dump."""
    return physical_pages + physical_pages // 2 + MIN_MAPPED_PAGE_BUDGET


_NONZERO_BYTES = re.compile(b"[^\\x00]+")


# The kernel image's file names (uniprocessor, multiprocessor, PAE, both): WinDbg calls it ``nt``.
KERNEL_IMAGE_NAMES = ("ntoskrnl", "ntkrnlmp", "ntkrnlpa", "ntkrpamp")


def debugger_module_name(path):
    """WinDbg's name for a kernel module: ``nt`` for the kernel image, else the
    file name without its extension (``\\SystemRoot\\System32\\drivers\\ACPI.sys``
    -> ``ACPI``)."""
    stem = file_stem(path)
    return "nt" if stem.lower() in KERNEL_IMAGE_NAMES else stem


def machine_arch(machine):
    """The architecture of a PAGEDU64 dump by its MachineImageType: "arm64" for
    0xAA64, else "x64" (what every PAGEDU64 dump was taken for before ARM64)."""
    return ARCH_OF_MACHINE64.get(machine, "x64")


class KernelDumpHeader(object):
    """The DUMP_HEADER64 (x64 and ARM64, "PAGEDU64") or DUMP_HEADER32 (x86,
    "PAGEDUMP") facts every kernel dump type shares."""

    def __init__(self, dump_file):
        path = dump_file.path
        magic = dump_file.read_within(0, 8)
        if magic[0:4] != b"PAGE":
            raise BadInput("%s is not a kernel dump (signature %r)" % (path, magic[0:4]))
        if magic[4:8] not in (b"DU64", b"DUMP"):
            raise BadInput("%s: bad kernel dump header (ValidDump %r)" % (path, magic[4:8]))
        wide = magic[4:8] == b"DU64"
        layout = self.layout = DUMP_HEADER64 if wide else DUMP_HEADER32
        self._pointer = "<Q" if wide else "<I"
        if dump_file.size < layout["size"]:
            raise BadInput("%s: truncated kernel dump (%d bytes, the header alone is %d)"
                           % (path, dump_file.size, layout["size"]))
        data = self.data = dump_file.read(0, layout["size"])
        self.arch = machine_arch(self.u32("MachineImageType")) if wide else "x86"
        self.dump_type = self.u32("DumpType")
        if self.dump_type not in DUMP_KIND or (self.arch == "x86" and self.dump_type not in X86_DUMP_TYPES):
            supported = sorted(DUMP_KIND) if wide else X86_DUMP_TYPES
            raise BadInput("%s: unsupported %s kernel dump type %d (types %s are supported)"
                           % (path, self.arch, self.dump_type, ", ".join(str(t) for t in supported)))
        self.kind = DUMP_KIND[self.dump_type]
        if wide:
            # ARM64: a TTBR's base address bits (the ASID above them and CnP in bit 0 dropped).
            self.paging = self.arch
            self.dtb = self.u64("DirectoryTableBase") & (PTE_PFN_MASK if self.arch == "x64" else TTBR_BASE_MASK)
        else:
            self.paging = "x86-pae" if data[layout["PaeEnabled"]] else "x86"
            # A PAE CR3 names a 32-byte aligned PDPT; a non-PAE one a page directory.
            self.dtb = self.u32("DirectoryTableBase") & (~0x1F if self.paging == "x86-pae" else ~0xFFF) & 0xFFFFFFFF
        self.build = self.u32("MinorVersion")
        context = CONTEXTS[self.arch]
        self.registers = unpack_context(context, data, layout["ContextRecord"])
        context_flags = struct.unpack_from("<I", data, layout["ContextRecord"] + context["ContextFlags"])[0]
        self.has_context = context_flags not in (0, UNSET_U32)

    def u32(self, name):
        return struct.unpack_from("<I", self.data, self.layout[name])[0]

    def u64(self, name):
        return struct.unpack_from("<Q", self.data, self.layout[name])[0]

    def pointer(self, name):
        """A header address, or None when the writer left it unset (0 or "PAGE")."""
        value = struct.unpack_from(self._pointer, self.data, self.layout[name])[0]
        return None if value in (0, UNSET_U64, UNSET_U32) else value

    def facts(self):
        """The header as ``info()`` reports it."""
        data, layout = self.data, self.layout
        fields = self.u32("MiniDumpFields")
        comment = data[layout["Comment"]:layout["Comment"] + 128].split(b"\0", 1)[0]
        parameters = struct.unpack_from("<4" + self._pointer[1], data, layout["BugCheckParameters"])
        facts = {
            "dump_type": self.dump_type,
            "dump_type_description": DUMP_TYPE_DESCRIPTION[self.dump_type],
            "build": self.build,
            "major_version": self.u32("MajorVersion"),
            "machine": self.u32("MachineImageType"),
            "processors": self.u32("NumberProcessors"),
            "bugcheck": [self.u32("BugCheckCode")] + list(parameters),
            "system_time": self.u64("SystemTime"),
            "system_uptime": self.u64("SystemUpTime"),
            "comment": comment.decode("latin-1") if comment != b"PAGE" * 32 else "",
            "registers": dict(self.registers),
            "exception": unpack_exception(data, layout["Exception"], self._pointer[1]),
            "directory_table_base": self.dtb,
            "paging": self.paging,
            "pfn_database": self.pointer("PfnDataBase"),
            "ps_loaded_module_list": self.pointer("PsLoadedModuleList"),
            "ps_active_process_head": self.pointer("PsActiveProcessHead"),
            "kd_debugger_data_block": self.pointer("KdDebuggerDataBlock"),
            "required_dump_space": self.u64("RequiredDumpSpace"),
            "minidump_fields": [name for bit, name in MINIDUMP_FIELDS if fields != UNSET_U32 and fields & bit],
        }
        return facts


class KernelDumpBase(Backend):
    """What every kernel dump backend shares: the header, the crashing context,
    KDDEBUGGER_DATA64 and its structure offsets."""

    arch = "x64"

    def __init__(self, dump_file, header):
        self.path = dump_file.path
        self.file = dump_file
        self.header = header
        self.arch = header.arch
        self.dump_type = header.dump_type
        self.kind = header.kind
        self.problems = ProblemLog()  # what could not be read, with addresses
        self._modules = None
        self._debugger_data = None
        self._facts = None

    # -- KDDEBUGGER_DATA64 ----------------------------------------------------------------

    def _debugger_data_bytes(self):
        """(address, bytes) of this dump's KDDEBUGGER_DATA64 copy, or (address, None)."""
        raise NotImplementedError

    def debugger_data(self):
        """The decoded KDDEBUGGER_DATA64 fields {name: value} (empty when the dump
        has none or it does not carry the "KDBG" tag)."""
        if self._debugger_data is None:
            address, data = self._debugger_data_bytes()
            decoded = decode_debugger_data(data, address, self.problems)
            if self.arch == "x86":  # x86 stores its pointers sign-extended to 64 bits
                decoded = dict((name, value & 0xFFFFFFFF if isinstance(value, int) else value)
                               for name, value in decoded.items())
            self._debugger_data = decoded
        return self._debugger_data

    def layout_hints(self, type_name):
        """Offsets of ``type_name``'s fields that KDDEBUGGER_DATA64 publishes."""
        spec = KDDEBUGGER_LAYOUTS.get(type_name.split("!", 1)[-1])
        data = self.debugger_data()
        if spec is None or not data:
            return None
        fields = dict((field, data[source]) for field, source in spec["fields"].items() if data.get(source))
        if not fields:
            return None
        return {"size": data.get(spec["size"]) or None, "fields": fields}

    def _debugger_data_facts(self):
        data = self.debugger_data()
        address = self.header.pointer("KdDebuggerDataBlock")
        return {
            "address": address,
            "present": bool(data),
            "fields": dict(data),
            "kernel_base": data.get("KernBase"),
            "ps_loaded_module_list": data.get("PsLoadedModuleList"),
            "ps_active_process_head": data.get("PsActiveProcessHead"),
            "ki_processor_block": data.get("KiProcessorBlock"),
            "layouts": sorted(name for name in KDDEBUGGER_LAYOUTS if self.layout_hints(name)),
        }

    # -- threads -----------------------------------------------------------------------------

    def current_thread(self):
        """The crashing processor's context from the header."""
        return Thread(0, self.header.registers, kernel_thread=self._current_kernel_thread(),
                      name="crashing processor")

    def _current_kernel_thread(self):
        return None

    def threads(self):
        return [self.current_thread()]

    # -- facts -----------------------------------------------------------------------------------

    def info(self):
        """The dump's facts, gathered once (analyses ask often); the
        problems are current, since later walks (mapped_ranges) may add some."""
        if self._facts is None:
            self.modules()
            facts = self.header.facts()
            facts.update({
                "kind": self.kind,
                "arch": self.arch,
                "mode": "kernel",
                "file": self.path,
                "file_size": self.file.size,
                "debugger_data": self._debugger_data_facts(),
            })
            facts.update(self._contents())
            self._facts = facts
        facts = copy.deepcopy(self._facts)  # callers may change what they get
        facts["problems"] = self.problems.as_list()
        return facts

    def _contents(self):
        raise NotImplementedError

    def close(self):
        if not self.file.closed:
            self.file.close()


def decode_debugger_data(data, address, problems):
    """KDDEBUGGER_DATA64 ``data`` -> {field: value} for the fields its Header.Size
    covers; a missing tag or a bad size is reported in ``problems``, not raised."""
    if not data:
        return {}
    if len(data) < 0x18 or data[0x10:0x14] != KDBG_OWNER_TAG:
        problems.add("debugger_data_tag", address, "KDDEBUGGER_DATA64 has no KDBG tag (found %r): "
                     "structure offsets come from elsewhere" % bytes(data[0x10:0x14]), "warning")
        return {}
    size = struct.unpack_from("<I", data, 0x14)[0]
    if size > KDDEBUGGER_DATA64_MAX_SIZE:
        problems.add("debugger_data_size", address, "KDDEBUGGER_DATA64 claims 0x%x bytes; only the 0x%x "
                     "read are used" % (size, len(data)), "warning")
    end = min(size, len(data))
    decoded = {}
    for name, (offset, fmt) in KDDEBUGGER_DATA64.items():
        if offset + struct.calcsize("<" + fmt) <= end:
            decoded[name] = struct.unpack_from("<" + fmt, data, offset)[0]
    decoded["OwnerTag"] = KDBG_OWNER_TAG.decode()
    return decoded


# -- physical memory ---------------------------------------------------------------------------


class RunLayout(object):
    """Physical memory stored as runs of consecutive frames: type 1's run table,
    RDMP's ranges.  ``runs``: [(first PFN, page count, file offset)]."""

    def __init__(self, runs):
        runs = sorted(runs)
        self.runs = runs
        self.bases = [base for base, _, _ in runs]
        self.spans = [(base, base + count) for base, count, _ in runs]
        self.page_count = sum(count for _, count, _ in runs)
        self.highest_pfn = max([base + count - 1 for base, count, _ in runs] or [-1])

    def frame_offset(self, pfn):
        index = bisect_right(self.bases, pfn) - 1
        if index < 0:
            return None
        base, count, offset = self.runs[index]
        if pfn - base >= count:
            return None
        return offset + (pfn - base) * PAGE_SIZE

    def run_end(self, pfn):
        """The first PFN past the run holding ``pfn`` (whose frames follow each
        other in the file)."""
        base, count, _ = self.runs[bisect_right(self.bases, pfn) - 1]
        return base + count

    def present(self, first, count):
        """[(start PFN, end PFN)] of the frames in [first, first+count) the dump holds."""
        return _clip_runs(self.spans, first, first + count)

    def frames(self):
        for base, count, _ in self.runs:
            for pfn in range(base, base + count):
                yield pfn


class BitmapLayout(object):
    """Physical memory stored one page per set bit, in PFN order, from ``first_page``."""

    def __init__(self, bitmap, first_page):
        self.bitmap = bitmap
        self.first_page = first_page
        prefix = []
        present = 0
        for chunk in range(0, len(bitmap), BITMAP_CHUNK_BYTES):
            prefix.append(present)
            present += bin(int.from_bytes(bitmap[chunk:chunk + BITMAP_CHUNK_BYTES], "little")).count("1")
        self.prefix = prefix
        self.page_count = present
        self._runs = None
        last = len(bitmap.rstrip(b"\0"))
        self.highest_pfn = (last - 1) * 8 + bitmap[last - 1].bit_length() - 1 if last else -1

    def has(self, pfn):
        byte = pfn >> 3
        return byte < len(self.bitmap) and (self.bitmap[byte] >> (pfn & 7)) & 1 == 1

    def frame_offset(self, pfn):
        if not self.has(pfn):
            return None
        chunk = pfn >> 9
        start = chunk * BITMAP_CHUNK_BYTES
        below = int.from_bytes(self.bitmap[start:(pfn >> 3) + 1], "little") & ((1 << (pfn - (chunk << 9))) - 1)
        return self.first_page + (self.prefix[chunk] + bin(below).count("1")) * PAGE_SIZE

    def present(self, first, count):
        """[(start PFN, end PFN)] of the set bits in [first, first+count)."""
        return _clip_runs(self.runs(), first, first + count)

    def runs(self):
        """The set bits as sorted [(start PFN, end PFN)], found once: spans of
        non-zero bytes by a regular expression (in C), then bit by bit only in
        the bytes of a span that are not 0xFF."""
        if self._runs is None:
            runs = []
            bitmap = self.bitmap
            for match in _NONZERO_BYTES.finditer(bitmap):
                for index in range(match.start(), match.end()):
                    byte = bitmap[index]
                    if byte == 0xFF:
                        _append(runs, index * 8, index * 8 + 8)
                        continue
                    for bit in range(8):
                        if byte >> bit & 1:
                            _append(runs, index * 8 + bit, index * 8 + bit + 1)
            self._runs = runs
        return self._runs

    def frames(self):
        for byte_index, byte in enumerate(self.bitmap):
            if byte:
                for bit in range(8):
                    if byte >> bit & 1:
                        yield (byte_index << 3) + bit


class KernelDumpBackend(KernelDumpBase):
    """A kernel dump of physical memory (every type but the small dump)."""

    def __init__(self, path_or_file, header=None):
        dump_file = path_or_file if isinstance(path_or_file, DumpFile) else DumpFile(path_or_file)
        try:
            header = header or KernelDumpHeader(dump_file)
            if header.dump_type == DUMP_TYPE_TRIAGE:
                raise BadInput("%s is a small memory dump: it holds no physical memory (open it with "
                               "dbgext.open)" % dump_file.path)
            KernelDumpBase.__init__(self, dump_file, header)
            self.dtb = header.dtb
            paging = PAGING[header.paging]
            self._levels = paging["levels"]
            self._entry = paging["entry"]
            self._pfn_mask = paging["pfn_mask"]
            self._large = paging["large"]
            if paging.get("descriptors") == "arm64":
                self._next_table, self._leaf_frame = self._next_table_arm64, self._leaf_frame_arm64
            self._ps_reserved = paging["ps_reserved"]
            self._region_shift = self._levels[-2][0]
            self._region_mask = (1 << self._region_shift) - 1
            self._leaf_index_mask = self._levels[-1][1] - 1
            self._after_header = header.layout["size"]  # where pages or a summary header start
            self._mapped_ranges = None
            self._regions = {}
            self._tables = {}
            self._table_pages = {}
            self.table_pages_read = 0  # page-table pages read from the file (tests count them)
            self._parse_layout(dump_file.size)
        except BaseException:
            dump_file.close()
            raise

    # -- physical layout ----------------------------------------------------------------------

    def _parse_layout(self, size):
        dump_type = self.dump_type
        if dump_type == DUMP_TYPE_FULL:
            self.layout = self._run_table()
            end = self._after_header + self.layout.page_count * PAGE_SIZE
        elif dump_type in (DUMP_TYPE_RDMP_KERNEL, DUMP_TYPE_RDMP_KERNEL_USER, DUMP_TYPE_RDMP_COMPLETE):
            self.layout, end = self._rdmp_ranges(size)
        elif dump_type == DUMP_TYPE_SUMMARY:
            self.layout = self._old_summary_bitmap(size)
            end = self.layout.first_page + self.layout.page_count * PAGE_SIZE
        else:
            self.layout = self._bitmap(size)
            end = self.layout.first_page + self.layout.page_count * PAGE_SIZE
        self.physical_pages = self.layout.page_count
        required = self.header.u64("RequiredDumpSpace")
        if required != UNSET_U64 and required > size:
            raise BadInput("%s: truncated kernel dump (%d bytes, the header says %d)" % (self.path, size, required))
        if end > size:
            raise BadInput("%s: truncated kernel dump (%d bytes, its pages need %d)" % (self.path, size, end))

    def _run_table(self):
        header = self.header
        run_count = header.u32("PhysicalMemoryBlock")
        if run_count > (MAX_PHYSICAL_RUNS if self.arch != "x86" else MAX_PHYSICAL_RUNS_X86):
            raise BadInput("%s: corrupt kernel dump header (%d physical memory runs)" % (self.path, run_count))
        pair = "<QQ" if self.arch != "x86" else "<II"
        start = header.layout["PhysicalMemoryRuns"]
        table = header.data[start:start + struct.calcsize(pair) * run_count]
        return self._runs_from(table, self._after_header, "run", pair)[0]

    def _runs_from(self, table, first_page, what, pair="<QQ", zero_ends=False):
        """RunLayout of {PFN, count} pairs (``pair``: their struct format) whose
        pages follow each other from ``first_page``, and the file offset past the
        last page.  With ``zero_ends`` a zero PFN ends the list (RDMP;
        kdmp-parser stops there too)."""
        runs = []
        offset = first_page
        size = struct.calcsize(pair)
        for index in range(len(table) // size):
            pfn, count = struct.unpack_from(pair, table, size * index)
            if pfn == 0 and zero_ends:
                break
            if count > (1 << 40) or pfn > (1 << 40):
                raise BadInput("%s: corrupt kernel dump header (%s %d: PFN 0x%x, %d pages)"
                               % (self.path, what, index, pfn, count))
            runs.append((pfn, count, offset))
            offset += count * PAGE_SIZE
        return RunLayout(runs), offset

    def _prologue(self, layout, length, signatures, what, size):
        """The ``length`` bytes of the ``layout`` header that follows the dump
        header, checked to hold one of ``signatures`` at ``layout["Signature"]``."""
        start = self._after_header
        if size < start + length:
            raise BadInput("%s: truncated kernel dump (%d bytes, no room for the %s header)" % (self.path, size, what))
        head = self.file.read(start, length)
        at = layout["Signature"]
        if head[at:at + 8] not in signatures:
            raise BadInput("%s: bad %s dump header (signature %r)" % (self.path, what, head[at:at + 8]))
        return head

    def _rdmp_ranges(self, size):
        layout = RDMP_HEADER64
        head = self._prologue(layout, layout["Ranges"], (b"RDMPDUMP",), "RDMP", size)
        marker, first_page = struct.unpack_from("<I", head, layout["Marker"])[0], struct.unpack_from(
            "<Q", head, layout["FirstPageOffset"])[0]
        ranges_start = self._after_header + layout["Ranges"]
        if marker != RDMP_MARKER or first_page < ranges_start or first_page > size:
            raise BadInput("%s: corrupt RDMP dump header (marker 0x%x, first page at 0x%x)"
                           % (self.path, marker, first_page))
        table = self.file.read(ranges_start, min(first_page - ranges_start, MAX_RDMP_RANGES * 16))
        return self._runs_from(table, first_page, "RDMP range", zero_ends=True)

    def _bitmap(self, size):
        layout = SUMMARY_DUMP64
        head = self._prologue(layout, layout["Bitmap"], (b"SDMPDUMP", b"FDMPDUMP"), "bitmap", size)
        first_page, _, bit_count = struct.unpack_from("<QQQ", head, layout["FirstPage"])
        return self._read_bitmap(self._after_header + layout["Bitmap"], bit_count, first_page, size)

    def _old_summary_bitmap(self, size):
        layout = old_summary_layout(self.arch)
        head = self._prologue(layout, layout["Bitmap"], (b"SDMPDUMP",), "summary", size)
        first_page, bit_count = struct.unpack_from("<II", head, layout["HeaderSize"])
        return self._read_bitmap(self._after_header + layout["Bitmap"], bit_count, first_page, size)

    def _read_bitmap(self, bitmap_start, bit_count, first_page, size):
        bitmap_end = bitmap_start + bit_count // 8
        if bitmap_end > size:
            raise BadInput("%s: truncated kernel dump (%d bytes, its bitmap of %d pages needs %d)"
                           % (self.path, size, bit_count, bitmap_end))
        if first_page < bitmap_end or first_page > size:
            raise BadInput("%s: corrupt bitmap dump header (first page at 0x%x)" % (self.path, first_page))
        return BitmapLayout(self.file.read(bitmap_start, bitmap_end - bitmap_start), first_page)

    def physical_frames(self):
        """Every physical page address in the dump, ascending."""
        for pfn in self.layout.frames():
            yield pfn << 12

    def read_physical_page(self, physical_address):
        offset = self.layout.frame_offset(physical_address >> 12)
        if offset is None:
            return None
        return self.file.read(offset, PAGE_SIZE)

    # -- virtual -> physical ----------------------------------------------------------------

    def _table(self, table_pa, level):
        """The entries of the level-``level`` table at ``table_pa`` (a page, or a
        PAE PDPT's 32 bytes), or None when the dump lacks its page."""
        key = (table_pa, level)
        table = self._tables.get(key, False)
        if table is False:
            page = self._table_pages.get(table_pa & ~0xFFF, False)
            if page is False:  # one read per distinct page, whatever levels it serves at
                page = self._table_pages[table_pa & ~0xFFF] = self.read_physical_page(table_pa & ~0xFFF)
                self.table_pages_read += 1
            table = None
            if page is not None:
                count = self._levels[level][1]
                table = struct.unpack_from("<%d%s" % (count, self._entry), page, table_pa & 0xFFF)
            if len(self._tables) >= MAX_CACHED_TABLES:
                self._tables.clear()
                self._table_pages.clear()
            self._tables[key] = table
        return table

    def _next_table(self, entry, level):
        """The physical address of the table a level-``level`` entry points at, the
        large page it maps (as ``(base, size)``), or None when the processor would
        fault: not present, reserved bits, or a frame beyond the dump's memory."""
        if not entry & PTE_PRESENT:
            return None
        if entry & PTE_LARGE:
            if level in self._ps_reserved:
                return None
            large = self._large.get(level)
            if large is not None:
                size, reserved = large
                base = entry & self._pfn_mask & ~(size - 1)
                if entry & reserved or base >> 12 > self.layout.highest_pfn:
                    return None
                return (base, size)
        pa = entry & self._pfn_mask
        if pa >> 12 > self.layout.highest_pfn:
            return None
        return pa

    def _next_table_arm64(self, entry, level):
        """:meth:`_next_table` for ARM64 descriptors (:func:`arm64_paging.step`)."""
        found = arm64_paging.step(entry, level)
        if found.__class__ is int:
            return found
        if found.__class__ is tuple and found[0] >> 12 <= self.layout.highest_pfn:
            return found
        return None

    def _leaf_frame_arm64(self, descriptor):
        """:meth:`_leaf_frame` for an ARM64 level-3 descriptor: a valid page's frame."""
        if descriptor & _ARM64_PAGE == _ARM64_PAGE:
            pfn = (descriptor & arm64_paging.OUTPUT_ADDRESS_MASK) >> 12
            if pfn <= self.layout.highest_pfn:
                return pfn
        return None

    def _region(self, region):
        """How the virtual region numbered ``region`` (va >> region shift: 2 MiB,
        4 MiB without PAE) is mapped: None, the physical base of a large page, or
        the leaf page table's entries."""
        try:
            return self._regions[region]
        except KeyError:
            pass
        mapping = self._walk_to_leaf(region << self._region_shift)
        if len(self._regions) >= MAX_CACHED_REGIONS:
            self._regions.clear()
        self._regions[region] = mapping
        return mapping

    def _walk_to_leaf(self, va):
        table_pa = self.dtb
        leaf = len(self._levels) - 1
        for level in range(leaf):
            table = self._table(table_pa, level)
            if table is None:
                return None
            shift, count = self._levels[level]
            target = self._next_table(table[(va >> shift) & (count - 1)], level)
            if target is None:
                return None
            if target.__class__ is tuple:
                base, size = target
                return base + (va & (size - 1) & ~self._region_mask)
            table_pa = target
        return self._table(table_pa, leaf)

    def _leaf_frame(self, pte):
        """The frame a PTE maps (present or transition), or None."""
        if pte & PTE_PRESENT or pte & (PTE_TRANSITION | PTE_PROTOTYPE) == PTE_TRANSITION:
            pfn = (pte & self._pfn_mask) >> 12
            if pfn <= self.layout.highest_pfn:
                return pfn
        return None

    def _region_of(self, virtual_address):
        """The region number of a virtual address, or -1 outside the address
        space (non-canonical on x64 and ARM64, above 4 GiB on x86)."""
        if self.arch != "x86":
            top = virtual_address >> 47
            if top != 0 and top != 0x1FFFF:
                return -1
            return (virtual_address >> 21) & 0x7FFFFFFFFFF
        return virtual_address >> self._region_shift if virtual_address >> 32 == 0 else -1

    def translate(self, virtual_address):
        """Physical address of ``virtual_address``, or None when it is not mapped
        (the dump may still lack that physical page)."""
        region = self._region_of(virtual_address)
        mapping = self._region(region) if region >= 0 else None
        if mapping is None:
            return None
        if mapping.__class__ is int:
            return mapping + (virtual_address & self._region_mask)
        pfn = self._leaf_frame(mapping[(virtual_address >> 12) & self._leaf_index_mask])
        return None if pfn is None else (pfn << 12) + (virtual_address & 0xFFF)

    def read_page(self, page_address):
        physical = self.translate(page_address)
        if physical is None:
            return None
        return self.read_physical_page(physical & ~0xFFF)

    def read_pages(self, page_address, count):
        # One translation per region of virtual space, then the frames in order.
        frames = []
        address = page_address
        end = page_address + count * PAGE_SIZE
        region_mask = self._region_mask
        while address < end:
            region_end = min(end, (address | region_mask) + 1)
            n = (region_end - address) >> 12
            region = self._region_of(address)
            mapping = self._region(region) if region >= 0 else None
            if mapping is None:
                frames.extend([None] * n)
            elif mapping.__class__ is int:
                first = (mapping + (address & region_mask)) >> 12
                frames.extend(range(first, first + n))
            else:
                index = (address >> 12) & self._leaf_index_mask
                frames.extend(self._leaf_frame(pte) for pte in mapping[index:index + n])
            address = region_end
        return self._read_frames(frames)

    def _read_frames(self, frames):
        """The page of each frame number (None: not mapped or not in the dump).
        Frames stored one after the other in the file are read with one call."""
        layout = self.layout
        runs = layout if isinstance(layout, RunLayout) else None
        offsets = []
        next_pfn = -1
        next_offset = run_end = 0
        for pfn in frames:
            if pfn is None:
                offsets.append(None)
                next_pfn = -1
                continue
            if pfn == next_pfn and (pfn < run_end if runs is not None else layout.has(pfn)):
                offset = next_offset
            else:
                offset = layout.frame_offset(pfn)
                if offset is None:
                    offsets.append(None)
                    next_pfn = -1
                    continue
                if runs is not None:
                    run_end = runs.run_end(pfn)
            offsets.append(offset)
            next_pfn, next_offset = pfn + 1, offset + PAGE_SIZE
        pages = [None] * len(offsets)
        index = 0
        while index < len(offsets):
            start = offsets[index]
            if start is None:
                index += 1
                continue
            stop = index + 1
            while stop < len(offsets) and offsets[stop] == start + (stop - index) * PAGE_SIZE:
                stop += 1
            data = self.file.read(start, (stop - index) * PAGE_SIZE)
            for k in range(index, stop):
                pages[k] = data[(k - index) * PAGE_SIZE:(k - index + 1) * PAGE_SIZE]
            index = stop
        return pages

    # -- the whole address space ------------------------------------------------------------

    def mapped_ranges(self):
        """Readable virtual ranges: the page tables walked once (within the
        budgets), merged, limited to pages whose frames the dump contains."""
        if self._mapped_ranges is None:
            self._mapped_ranges = self._walk_mapped_ranges()
        return list(self._mapped_ranges)

    def _walk_mapped_ranges(self):
        walk = _TableWalk(self)
        ranges = []
        canonical_hole = 1 << 47
        for start, end in walk.ranges(self.dtb, 0):
            if self.arch == "x86":
                ranges.append((start, end))
                continue
            # The PML4's lower and upper halves are the user and (sign-extended)
            # kernel halves of the address space: never one range.
            if start < canonical_hole < end:
                ranges.append((start, canonical_hole))
                start = canonical_hole
            if start >= canonical_hole:
                start, end = start | 0xFFFF000000000000, ((end - 1) | 0xFFFF000000000000) + 1
            ranges.append((start, end))
        if walk.tables_cut or walk.work_cut:
            self.problems.add("page_table_budget", None, "the page tables reach more than %d distinct table pages "
                              "or %d range pieces; the walk stopped there (corrupt tables?)"
                              % (walk.table_budget, walk.work_budget))
        page_budget = mapped_page_budget(self.physical_pages)
        kept, cut = _within_page_budget(merge_ranges(ranges), page_budget)
        if cut:
            self.problems.add("mapped_page_budget", None, "the page tables map more than %d pages of a dump holding "
                              "%d; %d more were left out (aliased or corrupt tables?)"
                              % (page_budget, self.physical_pages, cut))
        return kept

    # -- modules and facts -------------------------------------------------------------------

    def modules(self):
        if self._modules is None:
            self._modules = self._walk_loaded_modules()
        return list(self._modules)

    def _walk_loaded_modules(self):
        head = self.header.pointer("PsLoadedModuleList") or self.debugger_data().get("PsLoadedModuleList")
        if not head:
            return []
        memory = Target(self, cache_pages=256)
        walk = memory.walk_list(head, max_entries=MAX_MODULES)
        if walk.problem:
            self.problems.add("module_list_" + walk.problem, walk.problem_address,
                              "PsLoadedModuleList walk stopped (%s)" % walk.problem)
        layout = KLDR_DATA_TABLE_ENTRY[self.arch]
        found = []
        for entry in walk.entries:
            try:
                base = memory.pointer(entry + layout["DllBase"])
                size = memory.u32(entry + layout["SizeOfImage"])
                base_dll_name = memory.unicode_string(entry + layout["BaseDllName"], max_chars=260)
            except DbgextError as error:
                self.problems.add("module_entry_unreadable", entry, "loaded module entry: %s" % error)
                continue
            found.append(Module(debugger_module_name(base_dll_name), base, size, file_name(base_dll_name)))
        return found

    def _debugger_data_bytes(self):
        address = self.header.pointer("KdDebuggerDataBlock")
        if address is None:
            return None, None
        memory = Target(self, cache_pages=4)
        try:
            head = memory.read(address, 0x18)
        except DbgextError as error:
            self.problems.add("debugger_data_unreadable", address, "KDDEBUGGER_DATA64: %s" % error, "warning")
            return address, None
        size = min(max(struct.unpack_from("<I", head, 0x14)[0], 0x18), KDDEBUGGER_DATA64_MAX_SIZE)
        return address, memory.try_read(address, size).data

    def _contents(self):
        return {
            "physical_pages": self.physical_pages,
            "highest_pfn": self.layout.highest_pfn,
            "contents": ["physical memory: %d pages" % self.physical_pages, "page tables from the header's "
                         "DirectoryTableBase", "context and exception record of the crashing processor"],
        }


class _TableWalk(object):
    """One walk of the page tables over the whole address space, memoised per
    (table, level) and held to two budgets: distinct table pages visited, and
    pieces of ranges built (garbage tables can hang one table under every entry,
    which memoisation makes cheap to reach but not cheap to list)."""

    def __init__(self, backend):
        self.backend = backend
        self.table_budget = max(MIN_TABLE_PAGE_BUDGET, backend.physical_pages // 64)
        self.work_budget = 4 * mapped_page_budget(backend.physical_pages)
        self.memo = {}
        self.work = 0
        self.tables_cut = 0
        self.work_cut = False

    def _add(self, ranges, start, end):
        """Append [start, end) unless the work budget is spent (then False)."""
        if self.work >= self.work_budget:
            self.work_cut = True
            return False
        self.work += 1
        _append(ranges, start, end)
        return True

    def ranges(self, table_pa, level):
        """Readable ranges (relative to the table's span) mapped by one table.
        Memoised per (table, level): the self-map entry and corrupt dumps make the
        same table appear under many parents."""
        key = (table_pa, level)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = []  # a table reached again through itself maps nothing new
        if len(self.memo) > self.table_budget:
            self.tables_cut += 1
            return []
        backend = self.backend
        table = backend._table(table_pa, level)
        out = []
        if table is None:
            return out
        layout = backend.layout
        shift = backend._levels[level][0]
        leaf = level == len(backend._levels) - 1
        for index, entry in enumerate(table):
            if not entry:
                continue
            base = index << shift
            if leaf:
                pfn = backend._leaf_frame(entry)
                if pfn is not None and layout.frame_offset(pfn) is not None and not self._add(
                        out, base, base + PAGE_SIZE):
                    break
                continue
            target = backend._next_table(entry, level)
            if target is None:
                continue
            if target.__class__ is tuple:
                first = target[0] >> 12
                pieces = [((start - first) << 12, (end - first) << 12)
                          for start, end in layout.present(first, target[1] >> 12)]
            else:
                pieces = self.ranges(target, level + 1)
            if not all(self._add(out, base + start, base + end) for start, end in pieces):
                break
        self.memo[key] = out
        return out


def _within_page_budget(ranges, budget):
    """``ranges`` cut to their first ``budget`` pages, and the pages cut."""
    kept = []
    left = budget
    cut = 0
    for start, end in ranges:
        pages = (end - start) >> 12
        if pages <= left:
            kept.append((start, end))
            left -= pages
        else:
            if left:
                kept.append((start, start + (left << 12)))
            cut += pages - left
            left = 0
    return kept, cut


def unpack_exception(data, offset, pointer="Q"):
    """An EXCEPTION_RECORD64 (``pointer`` "Q") or EXCEPTION_RECORD32 ("I") at
    ``data[offset:]`` as a dict."""
    layout = EXCEPTION_RECORD64 if pointer == "Q" else EXCEPTION_RECORD32
    code, flags, _, address, parameter_count = struct.unpack_from("<II2%sI" % pointer, data, offset)
    parameters = struct.unpack_from("<15" + pointer, data, offset + layout["ExceptionInformation"])
    return {"code": code, "flags": flags, "address": address,
            "parameters": list(parameters[:min(parameter_count, 15)])}


def unpack_context(layout, data, offset):
    """Registers of a CONTEXT at ``data[offset:]`` as {name: value}."""
    registers = {}
    for name, (field_offset, size) in layout["registers"].items():
        start = offset + field_offset
        registers[name] = int.from_bytes(data[start:start + size], "little")
    return registers


def _clip_runs(runs, first, end):
    """The parts of sorted, disjoint [(start, end)] ``runs`` inside [first, end)."""
    index = max(bisect_right(runs, (first, first)) - 1, 0)
    out = []
    while index < len(runs) and runs[index][0] < end:
        lo, hi = max(runs[index][0], first), min(runs[index][1], end)
        if lo < hi:
            out.append((lo, hi))
        index += 1
    return out


def _append(ranges, start, end):
    if ranges and ranges[-1][1] == start:
        ranges[-1] = (ranges[-1][0], end)
    else:
        ranges.append((start, end))
