"""Windows x64 kernel crash dumps (PAGEDU64): full (DumpType 1) and bitmap
(DumpType 5, and 6 = live kernel dump) layouts.

The reader is our own: the file is mmapped and virtual addresses are translated
by walking the x64 page tables from the header's DirectoryTableBase.
kdmp-parser reads the same files, but its Python bindings convert every page to
a list of ints (~28 µs per page), which caps scans at ~150 MB/s; slicing the
mmap directly is two orders of magnitude faster.  The test suite keeps
kdmp-parser as the independent oracle: both readers must agree byte for byte.

Validation happens before any page is touched: the header's run table or
bitmap, and RequiredDumpSpace, must fit in the file, otherwise BadInput names
the file (kdmp-parser, which maps the file, dies of SIGBUS or SIGSEGV on such
a truncated file).

Translation follows the hardware (4 KiB, 2 MiB and 1 GiB pages) with one
addition that WinDbg also makes: a *transition* PTE (not present, Transition
bit 11 set, Prototype bit 10 clear) still names the physical page that holds
the data (a standby/modified page), so it is read like a valid one whenever
the dump contains that page.  kdmp-parser does not do this and reports such
addresses as unreadable.  Only leaf PTEs are resolved this way; not-present
upper-level entries are unmapped.
"""

import mmap
import os
import struct
from bisect import bisect_right

from ..errors import BadInput, DbgextError
from ..layouts.dump_formats import (
    CONTEXT_AMD64, DUMP_HEADER64, DUMP_KIND, DUMP_TYPE_FULL, EXCEPTION_RECORD64,
    KLDR_DATA_TABLE_ENTRY_X64, LARGE_1G_PFN_MASK, LARGE_2M_PFN_MASK, MAX_PHYSICAL_RUNS,
    PTE_LARGE, PTE_PFN_MASK, PTE_PRESENT, PTE_PROTOTYPE, PTE_TRANSITION, SUMMARY_DUMP64, UNSET_U64)
from .base import PAGE_SIZE, Backend, Module, Target

MAX_MODULES = 4096
# Translations are cached per 2 MiB of virtual space; the bound keeps a scan of
# a huge dump from holding every page table in memory.
MAX_CACHED_REGIONS = 8192
BITMAP_CHUNK_BYTES = 64  # rank() prefix sums every 512 PFNs
_U64 = struct.Struct("<Q")


def debugger_module_name(file_name):
    """WinDbg's name for a kernel module: ``nt`` for the kernel image, else the
    file name without its extension (``ACPI.sys`` -> ``ACPI``)."""
    lower = file_name.lower()
    if lower.endswith(".exe") and lower.startswith(("ntoskrnl", "ntkrnl", "ntkrpamp")):
        return "nt"
    stem, dot, _ = file_name.rpartition(".")
    return stem if dot else file_name


class KernelDumpBackend(Backend):
    arch = "x64"

    def __init__(self, path):
        self.path = path
        self.problems = []  # what could not be read, with addresses (module list walk)
        self._modules = None
        self._mapped_ranges = None
        self._regions = {}
        try:
            handle = open(path, "rb")
        except OSError as error:
            raise BadInput("cannot open %s: %s" % (path, error.strerror or error))
        try:
            size = os.fstat(handle.fileno()).st_size
            if size < DUMP_HEADER64["size"]:
                raise BadInput("%s: truncated kernel dump (%d bytes, the header alone is %d)"
                               % (path, size, DUMP_HEADER64["size"]))
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        finally:
            handle.close()
        try:
            self._parse_header(size)
        except BaseException:
            self._map.close()
            raise

    # -- header and physical layout --------------------------------------------------

    def _field(self, fmt, name):
        return struct.unpack_from(fmt, self._map, DUMP_HEADER64[name])[0]

    def _parse_header(self, size):
        path, data = self.path, self._map
        if data[0:4] != b"PAGE":
            raise BadInput("%s is not a kernel dump (signature %r)" % (path, bytes(data[0:4])))
        if data[4:8] == b"DUMP":
            raise BadInput("%s is a 32-bit kernel dump; only x64 (DU64) dumps are supported" % path)
        if data[4:8] != b"DU64":
            raise BadInput("%s: bad kernel dump header (ValidDump %r)" % (path, bytes(data[4:8])))
        self.dump_type = self._field("<I", "DumpType")
        if self.dump_type not in DUMP_KIND:
            raise BadInput("%s: unsupported kernel dump type %d (full, bitmap and live dumps are "
                           "supported)" % (path, self.dump_type))
        self.kind = DUMP_KIND[self.dump_type]
        self.dtb = self._field("<Q", "DirectoryTableBase") & PTE_PFN_MASK
        if self.dump_type == DUMP_TYPE_FULL:
            end = self._parse_runs(size)
        else:
            end = self._parse_bitmap(size)
        required = self._field("<Q", "RequiredDumpSpace")
        if required != UNSET_U64 and required > size:
            raise BadInput("%s: truncated kernel dump (%d bytes, the header says %d)"
                           % (path, size, required))
        if end > size:
            raise BadInput("%s: truncated kernel dump (%d bytes, its pages need %d)"
                           % (path, size, end))

    def _parse_runs(self, size):
        run_count = self._field("<I", "PhysicalMemoryBlock")
        if run_count > MAX_PHYSICAL_RUNS:
            raise BadInput("%s: corrupt kernel dump header (%d physical memory runs)"
                           % (self.path, run_count))
        offset = DUMP_HEADER64["size"]
        runs = []
        for index in range(run_count):
            base, count = struct.unpack_from("<QQ", self._map, DUMP_HEADER64["PhysicalMemoryRuns"] + 16 * index)
            if count > (1 << 40) or base > (1 << 40):
                raise BadInput("%s: corrupt kernel dump header (run %d: PFN 0x%x, %d pages)"
                               % (self.path, index, base, count))
            runs.append((base, count, offset))
            offset += count * PAGE_SIZE
        runs.sort()
        self._run_bases = [base for base, _, _ in runs]
        self._runs = runs
        self._bitmap = None
        self.physical_pages = sum(count for _, count, _ in runs)
        return offset

    def _parse_bitmap(self, size):
        layout = SUMMARY_DUMP64
        start = layout["offset"]
        if size < start + layout["Bitmap"]:
            raise BadInput("%s: truncated kernel dump (%d bytes, no room for the bitmap header)"
                           % (self.path, size))
        signature = bytes(self._map[start:start + 8])
        if signature not in (b"SDMPDUMP", b"FDMPDUMP"):
            raise BadInput("%s: bad bitmap dump header (signature %r)" % (self.path, signature))
        first_page, _, bit_count = struct.unpack_from("<QQQ", self._map, start + layout["FirstPage"])
        bitmap_start = start + layout["Bitmap"]
        bitmap_end = bitmap_start + bit_count // 8
        if bitmap_end > size:
            raise BadInput("%s: truncated kernel dump (%d bytes, its bitmap of %d pages needs %d)"
                           % (self.path, size, bit_count, bitmap_end))
        if first_page < bitmap_end or first_page > size:
            raise BadInput("%s: corrupt bitmap dump header (first page at 0x%x)" % (self.path, first_page))
        bitmap = bytes(self._map[bitmap_start:bitmap_end])
        prefix = []
        present = 0
        for chunk in range(0, len(bitmap), BITMAP_CHUNK_BYTES):
            prefix.append(present)
            present += bin(int.from_bytes(bitmap[chunk:chunk + BITMAP_CHUNK_BYTES], "little")).count("1")
        self._bitmap = bitmap
        self._bitmap_prefix = prefix
        self._first_page = first_page
        self._runs = None
        self.physical_pages = present
        return first_page + present * PAGE_SIZE

    def _frame_offset(self, pfn):
        """File offset of physical frame ``pfn``, or None when the dump lacks it."""
        bitmap = self._bitmap
        if bitmap is None:
            index = bisect_right(self._run_bases, pfn) - 1
            if index < 0:
                return None
            base, count, offset = self._runs[index]
            if pfn - base >= count:
                return None
            return offset + (pfn - base) * PAGE_SIZE
        byte = pfn >> 3
        if byte >= len(bitmap) or not (bitmap[byte] >> (pfn & 7)) & 1:
            return None
        chunk = pfn >> 9
        start = chunk * BITMAP_CHUNK_BYTES
        below = int.from_bytes(bitmap[start:byte + 1], "little") & ((1 << (pfn - (chunk << 9))) - 1)
        return self._first_page + (self._bitmap_prefix[chunk] + bin(below).count("1")) * PAGE_SIZE

    def physical_frames(self):
        """Every physical page address in the dump, ascending."""
        if self._bitmap is None:
            for base, count, _ in self._runs:
                for pfn in range(base, base + count):
                    yield pfn << 12
            return
        for byte_index, byte in enumerate(self._bitmap):
            if byte:
                for bit in range(8):
                    if byte >> bit & 1:
                        yield ((byte_index << 3) + bit) << 12

    def read_physical_page(self, physical_address):
        offset = self._frame_offset(physical_address >> 12)
        if offset is None:
            return None
        return self._map[offset:offset + PAGE_SIZE]

    def _physical_u64(self, physical_address):
        offset = self._frame_offset(physical_address >> 12)
        if offset is None:
            return None
        return _U64.unpack_from(self._map, offset + (physical_address & 0xFFF))[0]

    # -- virtual -> physical -----------------------------------------------------------

    def _region(self, region):
        """How the 2 MiB of virtual space numbered ``region`` (va >> 21) is mapped:
        None, the physical base of a large page, or the leaf page table's bytes."""
        try:
            return self._regions[region]
        except KeyError:
            pass
        va = region << 21
        mapping = None
        top = va >> 47
        if top == 0 or top == 0x1FFFF:
            mapping = self._walk_to_leaf(va)
        if len(self._regions) >= MAX_CACHED_REGIONS:
            self._regions.clear()
        self._regions[region] = mapping
        return mapping

    def _walk_to_leaf(self, va):
        pml4e = self._physical_u64(self.dtb + ((va >> 39) & 0x1FF) * 8)
        if pml4e is None or not pml4e & PTE_PRESENT:
            return None
        pdpte = self._physical_u64((pml4e & PTE_PFN_MASK) + ((va >> 30) & 0x1FF) * 8)
        if pdpte is None or not pdpte & PTE_PRESENT:
            return None
        if pdpte & PTE_LARGE:
            return (pdpte & LARGE_1G_PFN_MASK) + (va & 0x3FE00000)
        pde = self._physical_u64((pdpte & PTE_PFN_MASK) + ((va >> 21) & 0x1FF) * 8)
        if pde is None or not pde & PTE_PRESENT:
            return None
        if pde & PTE_LARGE:
            return pde & LARGE_2M_PFN_MASK
        return self.read_physical_page(pde & PTE_PFN_MASK)

    def translate(self, virtual_address):
        """Physical address of ``virtual_address``, or None when it is not mapped
        (the dump may still lack that physical page)."""
        mapping = self._region((virtual_address >> 21) & 0x7FFFFFFFFFF)
        if mapping is None:
            return None
        if mapping.__class__ is int:
            return mapping + (virtual_address & 0x1FFFFF)
        pte = _U64.unpack_from(mapping, ((virtual_address >> 12) & 0x1FF) * 8)[0]
        if pte & PTE_PRESENT or pte & (PTE_TRANSITION | PTE_PROTOTYPE) == PTE_TRANSITION:
            return (pte & PTE_PFN_MASK) + (virtual_address & 0xFFF)
        return None

    def read_page(self, page_address):
        physical = self.translate(page_address)
        if physical is None:
            return None
        offset = self._frame_offset(physical >> 12)
        if offset is None:
            return None
        return self._map[offset:offset + PAGE_SIZE]

    def read_pages(self, page_address, count):
        # One translation per 2 MiB of virtual space, then the frames in order.
        pages = []
        address = page_address
        end = page_address + count * PAGE_SIZE
        while address < end:
            region_end = min(end, (address | 0x1FFFFF) + 1)
            n = (region_end - address) >> 12
            mapping = self._region((address >> 21) & 0x7FFFFFFFFFF)
            if mapping is None:
                pages.extend([None] * n)
            elif mapping.__class__ is int:
                first = (mapping + (address & 0x1FFFFF)) >> 12
                self._append_frames(pages, range(first, first + n))
            else:
                ptes = struct.unpack_from("<%dQ" % n, mapping, ((address >> 12) & 0x1FF) * 8)
                self._append_frames(pages, [
                    (pte & PTE_PFN_MASK) >> 12
                    if pte & PTE_PRESENT or pte & (PTE_TRANSITION | PTE_PROTOTYPE) == PTE_TRANSITION else None
                    for pte in ptes])
            address = region_end
        return pages

    def _append_frames(self, pages, frames):
        """Append the page of each frame number (None: not mapped) to ``pages``.
        Consecutive frames usually sit one after the other in the file; then the
        next offset is the previous one plus a page, without a lookup."""
        data, bitmap = self._map, self._bitmap
        next_pfn = -1
        next_offset = run_end = 0
        for pfn in frames:
            if pfn is None:
                pages.append(None)
                next_pfn = -1
                continue
            if pfn == next_pfn and (pfn < run_end if bitmap is None else
                                    (pfn >> 3) < len(bitmap) and (bitmap[pfn >> 3] >> (pfn & 7)) & 1):
                offset = next_offset
            else:
                offset = self._frame_offset(pfn)
                if offset is None:
                    pages.append(None)
                    next_pfn = -1
                    continue
                if bitmap is None:
                    base, run_count, _ = self._runs[bisect_right(self._run_bases, pfn) - 1]
                    run_end = base + run_count
            pages.append(data[offset:offset + PAGE_SIZE])
            next_pfn, next_offset = pfn + 1, offset + PAGE_SIZE

    def mapped_ranges(self):
        """Readable virtual ranges: the page tables walked once, merged, limited to
        pages whose frames the dump contains."""
        if self._mapped_ranges is None:
            self._mapped_ranges = self._walk_mapped_ranges()
        return list(self._mapped_ranges)

    def _walk_mapped_ranges(self):
        ranges = []
        canonical_hole = 1 << 47
        for start, end in self._table_ranges(self.dtb, 4, {}):
            # The PML4's lower and upper halves are the user and (sign-extended)
            # kernel halves of the address space: never one range.
            if start < canonical_hole < end:
                ranges.append((start, canonical_hole))
                start = canonical_hole
            if start >= canonical_hole:
                start, end = start | 0xFFFF000000000000, ((end - 1) | 0xFFFF000000000000) + 1
            ranges.append((start, end))
        merged = []
        for start, end in sorted(ranges):
            if merged and merged[-1][1] == start:
                merged[-1][1] = end
            else:
                merged.append([start, end])
        return [(start, end) for start, end in merged]

    def _table_ranges(self, table_pa, level, memo):
        """Readable ranges (relative to the table's span) mapped by one table.
        Memoised per (table, level): the self-map entry and corrupt dumps make the
        same table appear under many parents."""
        key = (table_pa, level)
        if key in memo:
            return memo[key]
        memo[key] = []  # a table reached again through itself maps nothing new
        table = self.read_physical_page(table_pa)
        ranges = []
        if table is not None:
            shift = 12 + 9 * (level - 1)
            entries = struct.unpack("<512Q", table)
            for index, entry in enumerate(entries):
                if not entry:
                    continue
                base = index << shift
                if level == 1:
                    if entry & PTE_PRESENT or entry & (PTE_TRANSITION | PTE_PROTOTYPE) == PTE_TRANSITION:
                        if self._frame_offset((entry & PTE_PFN_MASK) >> 12) is not None:
                            _append(ranges, base, base + PAGE_SIZE)
                    continue
                if not entry & PTE_PRESENT:
                    continue
                if level in (2, 3) and entry & PTE_LARGE:
                    mask = LARGE_2M_PFN_MASK if level == 2 else LARGE_1G_PFN_MASK
                    first = (entry & mask) >> 12
                    for start, end in self._present_frames(first, 1 << (shift - 12)):
                        _append(ranges, base + ((start - first) << 12), base + ((end - first) << 12))
                    continue
                for start, end in self._table_ranges(entry & PTE_PFN_MASK, level - 1, memo):
                    _append(ranges, base + start, base + end)
        memo[key] = ranges
        return ranges

    def _present_frames(self, first, count):
        """[(start PFN, end PFN)] of the frames in [first, first+count) the dump holds."""
        out = []
        if self._bitmap is None:
            for base, run_count, _ in self._runs:
                lo, hi = max(base, first), min(base + run_count, first + count)
                if lo < hi:
                    out.append((lo, hi))
            return out
        bitmap = self._bitmap
        for pfn in range(first, first + count):
            byte = pfn >> 3
            if byte < len(bitmap) and (bitmap[byte] >> (pfn & 7)) & 1:
                if out and out[-1][1] == pfn:
                    out[-1] = (out[-1][0], pfn + 1)
                else:
                    out.append((pfn, pfn + 1))
        return out

    # -- modules and facts -------------------------------------------------------------

    def modules(self):
        if self._modules is None:
            self._modules = self._walk_loaded_modules()
        return list(self._modules)

    def _walk_loaded_modules(self):
        head = self._field("<Q", "PsLoadedModuleList")
        if head in (0, UNSET_U64):
            return []
        memory = Target(self, cache_pages=256)
        walk = memory.walk_list(head, max_entries=MAX_MODULES)
        if walk.problem:
            self.problems.append("PsLoadedModuleList walk stopped (%s) at 0x%x"
                                 % (walk.problem, walk.problem_address))
        layout = KLDR_DATA_TABLE_ENTRY_X64
        found = []
        for entry in walk.entries:
            try:
                base = memory.u64(entry + layout["DllBase"])
                size = memory.u32(entry + layout["SizeOfImage"])
                file_name = memory.unicode_string(entry + layout["BaseDllName"], max_chars=260)
            except DbgextError as error:
                self.problems.append("loaded module entry at 0x%x: %s" % (entry, error))
                continue
            found.append(Module(debugger_module_name(file_name), base, size, file_name))
        return found

    def info(self):
        bugcheck = [self._field("<I", "BugCheckCode")] + list(
            struct.unpack_from("<4Q", self._map, DUMP_HEADER64["BugCheckParameters"]))
        context = DUMP_HEADER64["ContextRecord"]
        exception = DUMP_HEADER64["Exception"]
        code, flags, _, address, parameter_count = struct.unpack_from("<IIQQI", self._map, exception)
        parameters = struct.unpack_from("<15Q", self._map, exception + EXCEPTION_RECORD64["ExceptionInformation"])
        self.modules()
        return {
            "kind": self.kind,
            "arch": self.arch,
            "mode": "kernel",
            "file": self.path,
            "dump_type": self.dump_type,
            "build": self._field("<I", "MinorVersion"),
            "major_version": self._field("<I", "MajorVersion"),
            "processors": self._field("<I", "NumberProcessors"),
            "bugcheck": bugcheck,
            "system_time": self._field("<Q", "SystemTime"),
            "registers": unpack_context(CONTEXT_AMD64, self._map, context),
            "exception": {"code": code, "flags": flags, "address": address,
                          "parameters": list(parameters[:min(parameter_count, 15)])},
            "directory_table_base": self.dtb,
            "ps_loaded_module_list": self._field("<Q", "PsLoadedModuleList"),
            "ps_active_process_head": self._field("<Q", "PsActiveProcessHead"),
            "kd_debugger_data_block": self._field("<Q", "KdDebuggerDataBlock"),
            "physical_pages": self.physical_pages,
            "problems": list(self.problems),
        }

    def close(self):
        if not self._map.closed:
            self._map.close()


def unpack_context(layout, data, offset):
    """Registers of a CONTEXT at ``data[offset:]`` as {name: value}."""
    registers = {}
    for name, (field_offset, size) in layout["registers"].items():
        start = offset + field_offset
        registers[name] = int.from_bytes(data[start:start + size], "little")
    return registers


def _append(ranges, start, end):
    if ranges and ranges[-1][1] == start:
        ranges[-1] = (ranges[-1][0], end)
    else:
        ranges.append((start, end))
