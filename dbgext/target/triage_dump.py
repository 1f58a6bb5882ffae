"""Kernel small memory dumps (DumpType 4, "triage dumps": C:\\Windows\\Minidump\\*.dmp).

A small dump holds no physical memory.  After the DUMP_HEADER64 comes a
TRIAGE_DUMP64 whose fields are file offsets of the parts the kernel saved
(shared/reference/dump-formats.md §1.3a).  This backend maps into one virtual
address space:

- the current thread's stack copy, from ``TopOfStack`` (the stack pointer) up;
- the data page the bug check pointed at;
- every TRIAGE_DATA_BLOCK (pages around the faulting address, pool blocks, ...);
- the KDDEBUGGER_DATA64 copy, at the header's KdDebuggerDataBlock;
- the KPRCB, ETHREAD and EPROCESS copies, at the addresses the dump itself gives
  for them: the KPRCB through KiProcessorBlock[Prcb.Number] when a data block
  holds that array, the ETHREAD through Prcb.CurrentThread, the EPROCESS through
  Thread.ApcState.Process, sized by KDDEBUGGER_DATA64's SizePrcb, SizeEThread
  and SizeEProcess.

The data page, the debugger data and the data blocks are mapped only when the
header's MiniDumpFields has all of 0xFF and the part's own bit, as Microsoft's
debugger reads them.  Everything else is unreadable, at byte granularity: pages
partly covered are served with the uncovered bytes zero-filled and named by
``partial_pages``, which the Target honours as it does for minidumps.

Modules come from the driver list and its string pool, which holds full paths on
Windows 10 and 11 (``\\SystemRoot\\System32\\drivers\\amdppm.sys``): a module is
named as WinDbg names it (``amdppm``; ``nt`` for the kernel) and its image is the
file name.  The bug check and the crashing context come from the header;
TriageOptions 0xFFFFFFFF means "all options", not an overflow.  The DumpBlob
records after SizeOfDump are listed (tag and size).  A part that lies outside the
file, overlaps another with different bytes (real dumps repeat memory in several
data blocks) or names a string outside the pool is a reported problem; the rest
of the dump stays usable.

ARM64 small dumps (MachineImageType 0xAA64) have the same TRIAGE_DUMP64, driver
list, string pool and KDDEBUGGER_DATA64; only the context is CONTEXT_ARM64.
Checked on the real ARM64 small dump (Windows 11 22000): 245 drivers named from
the pool, the KPRCB/ETHREAD/EPROCESS copies placed through KDDEBUGGER_DATA64's
offsets, the stack copy from TopOfStack = the context's sp.
"""

import struct
import uuid
from bisect import bisect_right

from ..errors import BadInput
from ..layouts.dump_formats import (
    CONTEXTS, DUMP_BLOB_FILE_HEADER, DUMP_BLOB_HEADER, DUMP_DRIVER_ENTRY64, DUMP_MM_STORAGE64,
    DUMP_UNLOADED_DRIVERS64, EXCEPTION_RECORD64, KDDEBUGGER_DATA64_MAX_SIZE, MINIDUMP_FIELDS, TRIAGE_BASIC_FIELDS,
    TRIAGE_DATA_BLOCK, TRIAGE_DATA_BLOCK_SIZE, TRIAGE_DUMP64, TRIAGE_FORMAT, TRIAGE_OPTION_OVERFLOWED,
    TRIAGE_OPTIONS_ALL, TRIAGE_VALID)
from ..winpath import file_name
from .base import Module
from .filemap import FileMappedRanges, ReadsFileMappedRanges
from .kdump import KernelDumpBase, debugger_module_name, unpack_context, unpack_exception

TRIAGE_FIELDS = sorted((name for name in TRIAGE_DUMP64 if name not in ("offset", "size")),
                       key=lambda name: TRIAGE_DUMP64[name])
MAX_NAME_BYTES = 0x1000
MAX_UNLOADED_DRIVERS = 0x400
MAX_COPY_SIZE = 0x10000   # a KPRCB is ~0x8000 bytes, an ETHREAD/EPROCESS ~0x1000
MAX_BLOBS = 0x1000        # secondary data records read (the real x64 file has 20)
MINIDUMP_FIELD_BITS = dict((name, bit) for bit, name in MINIDUMP_FIELDS)
WHY_SMALL = ("a small memory dump holds only the crashing thread's stack, its KPRCB/ETHREAD/EPROCESS, "
             "the driver list and the few data blocks the kernel chose to save")


def triage_overflowed(options):
    """Whether the kernel dropped data to fit the dump: TRIAGE_OPTION_OVERFLOWED,
    unless TriageOptions is all ones, which real writers store to mean "every
    option" rather than a set of flags."""
    return options != TRIAGE_OPTIONS_ALL and bool(options & TRIAGE_OPTION_OVERFLOWED)


class TriageDumpBackend(ReadsFileMappedRanges, KernelDumpBase):
    """A small memory dump, mapped as described in the module docstring."""

    # Why commands that scan memory (trace databases, ETW buffers, IPT buffers)
    # cannot work here: they should say this in one line instead of finding nothing.
    limitation = WHY_SMALL

    def __init__(self, dump_file, header):
        KernelDumpBase.__init__(self, dump_file, header)
        size = dump_file.size
        start = TRIAGE_DUMP64["offset"]
        if size < start + TRIAGE_DUMP64["size"]:
            raise BadInput("%s: truncated small memory dump (%d bytes, its TRIAGE_DUMP64 header needs %d)"
                           % (self.path, size, start + TRIAGE_DUMP64["size"]))
        values = struct.unpack(TRIAGE_FORMAT, dump_file.read(start, TRIAGE_DUMP64["size"]))
        self.triage = dict(zip(TRIAGE_FIELDS, values))
        self._starts = []
        self._regions = []   # sorted, non-overlapping [start, end, file offset, part name]
        self.parts = []      # what was mapped (or why not), for dumpinfo
        self._drivers = None
        self._current_context = None
        self._debugger_data_allowed = None
        self._secondary_data = None
        self._check_end_marker()
        self._map_parts()

    # -- the file ------------------------------------------------------------------------

    def _check_end_marker(self):
        triage = self.triage
        valid = triage["ValidOffset"]
        if valid + 4 > self.file.size:
            self.problems.add("triage_valid_offset", None, "ValidOffset 0x%x lies past the end of the file "
                              "(%d bytes): the dump was cut short" % (valid, self.file.size), offset=valid)
        else:
            marker = self.file.read(valid, 4)
            if marker != TRIAGE_VALID:
                self.problems.add("triage_valid_marker", None, "no DGRT end marker at ValidOffset 0x%x (found %r)"
                                  % (valid, marker), offset=valid)
        if triage["SizeOfDump"] > self.file.size:
            self.problems.add("triage_size_of_dump", None, "SizeOfDump says %d bytes, the file has %d"
                              % (triage["SizeOfDump"], self.file.size), "warning")

    def _file_range(self, what, offset, size):
        """(offset, size) of a part within the file, cut at its end and reported;
        None when the part is absent (offset or size 0) or outside the file."""
        if not offset or not size:
            return None
        if offset >= self.file.size:
            self.problems.add("triage_part_outside_file", None, "%s at file offset 0x%x lies past the end of "
                              "the file (%d bytes)" % (what, offset, self.file.size), offset=offset)
            return None
        if offset + size > self.file.size:
            self.problems.add("triage_part_truncated", None, "%s (0x%x bytes at file offset 0x%x) is cut short "
                              "by the end of the file; 0x%x bytes kept" % (what, size, offset,
                                                                         self.file.size - offset), offset=offset)
            size = self.file.size - offset
        return offset, size

    def _part_bytes(self, what, offset, size):
        found = self._file_range(what, offset, size)
        return self.file.read(*found) if found else b""

    # -- the address space ---------------------------------------------------------------

    def _map(self, what, address, offset, size):
        """Map file bytes [offset, offset+size) at ``address``; bytes already mapped
        by an earlier part keep that part's contents and the overlap is reported."""
        found = self._file_range(what, offset, size)
        part = {"what": what, "address": address, "size": size, "offset": offset, "mapped": 0}
        self.parts.append(part)
        if found is None:
            return
        offset, size = found
        if address is None or address + size > 1 << 64:
            self.problems.add("triage_part_address", address, "%s: no usable virtual address" % what, "warning")
            return
        cursor, end = address, address + size
        index = max(bisect_right(self._starts, address) - 1, 0)
        pieces = []
        while cursor < end:
            while index < len(self._regions) and self._regions[index][1] <= cursor:
                index += 1
            if index < len(self._regions) and self._regions[index][0] < end:
                region = self._regions[index]
                if region[0] > cursor:
                    pieces.append((cursor, region[0]))
                self._check_overlap(what, address, offset, region, max(cursor, region[0]), min(end, region[1]))
                cursor = region[1]
            else:
                pieces.append((cursor, end))
                cursor = end
        for lo, hi in pieces:
            at = bisect_right(self._starts, lo)
            self._starts.insert(at, lo)
            self._regions.insert(at, [lo, hi, offset + (lo - address), what])
            part["mapped"] += hi - lo

    def _check_overlap(self, what, address, offset, region, start, end):
        """Report bytes [start, end) that ``what`` (mapped from file ``offset`` at
        ``address``) and an earlier ``region`` both hold, unless they agree: real
        dumps save the same memory in several data blocks."""
        earlier = self.file.read(region[2] + (start - region[0]), end - start)
        if earlier == self.file.read(offset + (start - address), end - start):
            return
        self.problems.add("triage_parts_overlap", start, "%s overlaps %s with different bytes; the bytes of %s "
                          "are kept" % (what, region[3], region[3]),
                          "warning" if region[3].startswith("data block") and what.startswith("data block")
                          else "note")

    def _build_memory(self):
        """The parts mapped so far as the memory that reads serve."""
        self._memory = FileMappedRanges(self.file, [(start, end, offset) for start, end, offset, _ in self._regions])

    def _announced(self, what, bit, offset):
        """Whether the header's MiniDumpFields lets a reader use a part: Microsoft's
        debugger reads the data page, the debugger data and the data blocks only
        when all of the basic parts (0xFF) and the part's own bit are set.  A part
        that is in the file but not announced is left out with a note."""
        fields = self.header.u32("MiniDumpFields")
        if (fields & TRIAGE_BASIC_FIELDS) == TRIAGE_BASIC_FIELDS and fields & bit:
            return True
        if offset:
            self.problems.add("triage_part_not_announced", None, "%s at file offset 0x%x is not read: MiniDumpFields "
                              "0x%x lacks 0x%x" % (what, offset, fields, (TRIAGE_BASIC_FIELDS | bit) & ~fields),
                              "note", offset=offset)
        return False

    def _map_parts(self):
        triage = self.triage
        self._map("stack", triage["TopOfStack"], triage["CallStackOffset"], triage["SizeOfCallStack"])
        if self._announced("the data page", MINIDUMP_FIELD_BITS["data_page"], triage["DataPageOffset"]):
            self._map("data page", triage["DataPageAddress"], triage["DataPageOffset"], triage["DataPageSize"])
        if self._announced("the data block table", MINIDUMP_FIELD_BITS["data_blocks"], triage["DataBlocksOffset"]):
            self._map_data_blocks()
        if self._debugger_data_announced():
            self._map("KDDEBUGGER_DATA64", self.header.pointer("KdDebuggerDataBlock"), triage["DebuggerDataOffset"],
                      min(triage["DebuggerDataSize"], KDDEBUGGER_DATA64_MAX_SIZE))
        self._build_memory()  # KiProcessorBlock is read through the parts mapped so far
        data = self.debugger_data()
        prcb = self._copy_address("KPRCB", triage["PrcbOffset"], self._prcb_address(data))
        self._map_copy("KPRCB", prcb, triage["PrcbOffset"], data.get("SizePrcb"))
        thread = self._pointer_in_copy(triage["PrcbOffset"], data.get("OffsetPrcbCurrentThread"))
        self.thread_address = self._copy_address("ETHREAD", triage["ThreadOffset"], thread)
        self._map_copy("ETHREAD", self.thread_address, triage["ThreadOffset"], data.get("SizeEThread"))
        process = self._pointer_in_copy(triage["ThreadOffset"], data.get("OffsetKThreadApcProcess"))
        process = self._copy_address("EPROCESS", triage["ProcessOffset"], process)
        self._map_copy("EPROCESS", process, triage["ProcessOffset"], data.get("SizeEProcess"))
        self._build_memory()

    def _map_data_blocks(self):
        triage = self.triage
        count, offset = triage["DataBlocksCount"], triage["DataBlocksOffset"]
        table = self._part_bytes("the data block table", offset, count * TRIAGE_DATA_BLOCK_SIZE)
        if len(table) < count * TRIAGE_DATA_BLOCK_SIZE:
            self.problems.add("triage_data_blocks_cut", None, "%d data blocks announced, the file holds %d entries"
                              % (count, len(table) // TRIAGE_DATA_BLOCK_SIZE), offset=offset)
        for index in range(len(table) // TRIAGE_DATA_BLOCK_SIZE):
            address, block_offset, size = struct.unpack_from(TRIAGE_DATA_BLOCK, table,
                                                             index * TRIAGE_DATA_BLOCK_SIZE)
            self._map("data block %d" % index, address, block_offset, size)

    def _copy_address(self, what, offset, address):
        if offset and address is None:
            self.problems.add("triage_copy_unplaced", None, "the %s copy is in the dump but its address is not: "
                              "it stays unmapped" % what, "note", offset=offset)
        return address

    def _map_copy(self, what, address, offset, size):
        if not offset or address is None:
            return
        if not size:
            self.problems.add("triage_copy_unsized", address, "the %s copy's size is unknown (no %s in "
                              "KDDEBUGGER_DATA64): it stays unmapped" % (what, what), "note", offset=offset)
            return
        self._map(what, address, offset, min(size, MAX_COPY_SIZE))

    def _pointer_in_copy(self, copy_offset, field_offset):
        """A pointer field of a structure copy in the file, or None."""
        if not copy_offset or not field_offset:
            return None
        data = self.file.read_within(copy_offset + field_offset, 8)
        if len(data) != 8:
            return None
        return struct.unpack("<Q", data)[0] or None

    def _prcb_address(self, data):
        """KiProcessorBlock[Prcb.Number], read through the parts mapped so far."""
        block, number_offset = data.get("KiProcessorBlock"), data.get("OffsetPrcbNumber")
        if not block or not self.triage["PrcbOffset"] or number_offset is None:
            return None
        number = self.file.read_within(self.triage["PrcbOffset"] + number_offset, 2)
        if len(number) != 2:
            return None
        entry = self._memory.read(block + 8 * struct.unpack("<H", number)[0], 8)
        if entry is None:
            return None
        return struct.unpack("<Q", entry)[0] or None

    # -- what the dump says ------------------------------------------------------------

    def _debugger_data_announced(self):
        if self._debugger_data_allowed is None:
            self._debugger_data_allowed = self._announced("KDDEBUGGER_DATA64", MINIDUMP_FIELD_BITS["debugger_data"],
                                                          self.triage["DebuggerDataOffset"])
        return self._debugger_data_allowed

    def _debugger_data_bytes(self):
        triage = self.triage
        if not self._debugger_data_announced():
            return self.header.pointer("KdDebuggerDataBlock"), b""
        size = min(triage["DebuggerDataSize"], KDDEBUGGER_DATA64_MAX_SIZE)
        return self.header.pointer("KdDebuggerDataBlock"), self._part_bytes(
            "KDDEBUGGER_DATA64", triage["DebuggerDataOffset"], size)

    def _current_kernel_thread(self):
        return self.thread_address

    def current_thread(self):
        """The header's context; the TRIAGE_DUMP64's copy when the header has none."""
        thread = KernelDumpBase.current_thread(self)
        if self._current_context is None:  # read once: a cut-short part is reported once
            layout = CONTEXTS[self.arch]
            context = self._part_bytes("the context", self.triage["ContextOffset"], layout["size"])
            copied = not self.header.has_context and len(context) == layout["size"]
            data = self.debugger_data()
            copy = self.triage["ThreadOffset"]
            self._current_context = (unpack_context(layout, context, 0) if copied else None,
                                     self._pointer_in_copy(copy, data.get("OffsetKThreadInitialStack")),
                                     self._pointer_in_copy(copy, data.get("OffsetKThreadStackLimit")))
        registers, thread.stack_base, thread.stack_limit = self._current_context
        if registers is not None:
            thread.registers = dict(registers)
        return thread

    def modules(self):
        if self._modules is None:
            self._modules = [Module(driver["module"], driver["base"], driver["size"],
                                    file_name(driver["name"]), driver.get("timestamp"))
                             for driver in self.drivers()]
        return list(self._modules)

    def drivers(self):
        """The driver list: name, base, size, TimeDateStamp, CheckSum (what a symbol
        store lookup needs: ``name/<TimeDateStamp:08X><SizeOfImage:X>/name``)."""
        if self._drivers is None:
            self._drivers = self._read_driver_list()
        return self._drivers

    def _read_driver_list(self):
        triage = self.triage
        layout = DUMP_DRIVER_ENTRY64
        count, offset = triage["DriverCount"], triage["DriverListOffset"]
        table = self._part_bytes("the driver list", offset, count * layout["size"])
        if len(table) < count * layout["size"]:
            self.problems.add("triage_driver_list_cut", None, "%d drivers announced, the file holds %d entries"
                              % (count, len(table) // layout["size"]), offset=offset)
        drivers = []
        for index in range(len(table) // layout["size"]):
            entry = index * layout["size"]

            def field(name, fmt):
                return struct.unpack_from(fmt, table, entry + layout[name])[0]
            base = field("DllBase", "<Q")
            name = self._pool_string(field("DriverNameOffset", "<I"), "driver %d" % index, base)
            drivers.append({"name": name, "module": debugger_module_name(name), "base": base,
                            "size": field("SizeOfImage", "<I"),
                            "timestamp": field("TimeDateStamp", "<I"), "checksum": field("CheckSum", "<I"),
                            "entry_offset": offset + entry})
        return drivers

    def _pool_string(self, offset, what, base):
        """A DUMP_STRING of the string pool: u32 Length in characters (the kernel
        writes Length / 2 whatever ntiodump.h's comment says), the UTF-16 text
        (a full path on Windows 10 and 11), a NUL.  The first NUL ends it too.  A
        string that does not lie in the pool is reported and named after the
        module's base."""
        pool = self.triage["StringPoolOffset"]
        pool_end = pool + self.triage["StringPoolSize"]
        if not pool <= offset <= pool_end - 4:
            self.problems.add("driver_name_outside_pool", base, "%s's name at file offset 0x%x is outside the "
                              "string pool [0x%x, 0x%x)" % (what, offset, pool, pool_end), offset=offset)
            return "Unknown_Module_%016x" % base
        length = struct.unpack("<I", self.file.read_within(offset, 4).ljust(4, b"\0"))[0]
        text = self.file.read_within(offset + 4, min(2 * length, pool_end - offset - 4, MAX_NAME_BYTES))
        end = next((i for i in range(0, len(text) - 1, 2) if text[i:i + 2] == b"\0\0"), None)
        if end is None and len(text) < 2 * length:
            self.problems.add("driver_name_outside_pool", base, "%s's name (%d characters at file offset 0x%x) "
                              "runs past the end of the string pool" % (what, length, offset), offset=offset)
        return text[:end if end is not None else len(text) & ~1].decode("utf-16-le", "replace")

    def unloaded_drivers(self):
        layout = DUMP_UNLOADED_DRIVERS64
        offset = self.triage["UnloadedDriversOffset"]
        head = self._part_bytes("the unloaded driver list", offset, 4)
        if len(head) < 4:
            return []
        count = struct.unpack("<I", head)[0]
        if count > MAX_UNLOADED_DRIVERS:
            self.problems.add("triage_unloaded_count", None, "%d unloaded drivers announced; the first %d are read"
                              % (count, MAX_UNLOADED_DRIVERS), offset=offset)
            count = MAX_UNLOADED_DRIVERS
        data = self._part_bytes("the unloaded driver list", offset + layout["Entries"], count * layout["size"])
        found = []
        for index in range(len(data) // layout["size"]):
            entry = data[index * layout["size"]:(index + 1) * layout["size"]]
            length = struct.unpack_from("<H", entry, layout["Name"])[0]
            chars = min(length // 2, layout["DriverNameChars"])
            name = entry[layout["DriverName"]:layout["DriverName"] + 2 * chars].decode("utf-16-le", "replace")
            start, end = struct.unpack_from("<QQ", entry, layout["StartAddress"])
            found.append({"name": name, "start": start, "end": end})
        return found

    def secondary_data(self):
        """The DumpBlob records after SizeOfDump: [{"tag": GUID, "size", "offset"}].
        A DUMP_BLOB_FILE_HEADER ("DumpBlob", HeaderSize, BuildNumber) is followed
        by records of DUMP_BLOB_HEADER (HeaderSize, GUID Tag, DataSize, PrePad,
        PostPad) and their data; the tag says what the data is (components of
        Windows register their own)."""
        if self._secondary_data is None:
            self._secondary_data = self._read_secondary_data()
        return self._secondary_data

    def _read_secondary_data(self):
        offset, file_size = self.triage["SizeOfDump"], self.file.size
        head = self.file.read_within(offset, DUMP_BLOB_FILE_HEADER["size"]) if offset < file_size else b""
        if len(head) < DUMP_BLOB_FILE_HEADER["size"]:
            return []
        if head[:8] != DUMP_BLOB_FILE_HEADER["signature"]:
            self.problems.add("secondary_data_unknown", None, "0x%x bytes after SizeOfDump (file offset 0x%x) are "
                              "not DumpBlob records (found %r)" % (file_size - offset, offset, head[:8]), "note",
                              offset=offset)
            return []
        offset += max(struct.unpack_from("<I", head, DUMP_BLOB_FILE_HEADER["HeaderSize"])[0],
                      DUMP_BLOB_FILE_HEADER["size"])
        layout, blobs = DUMP_BLOB_HEADER, []
        while offset + layout["size"] <= file_size and len(blobs) < MAX_BLOBS:
            record = self.file.read(offset, layout["size"])
            header_size, tag, data_size, pre_pad, post_pad = struct.unpack(layout["format"], record)
            data_offset = offset + max(header_size, layout["size"]) + pre_pad
            if data_offset + data_size > file_size:
                self.problems.add("secondary_data_cut", None, "DumpBlob %s at file offset 0x%x: 0x%x bytes announced, "
                                  "the file ends first" % (uuid.UUID(bytes_le=tag), offset, data_size), offset=offset)
                break
            blobs.append({"tag": str(uuid.UUID(bytes_le=tag)), "size": data_size, "offset": data_offset})
            offset = data_offset + data_size + post_pad
        if len(blobs) == MAX_BLOBS and offset + layout["size"] <= file_size:
            self.problems.add("secondary_data_cut", None, "the first %d DumpBlob records are listed; the rest, from "
                              "file offset 0x%x, are not" % (MAX_BLOBS, offset), "note", offset=offset)
        return blobs

    def mm_information(self):
        layout = DUMP_MM_STORAGE64
        data = self._part_bytes("the Mm information", self.triage["MmOffset"], struct.calcsize(layout["format"]))
        if len(data) < struct.calcsize(layout["format"]):
            return None
        return dict(zip(layout["fields"], struct.unpack(layout["format"], data)))

    def _broken_driver(self):
        offset = self.triage["BrokenDriverOffset"]
        for driver in self.drivers():
            if offset and driver["entry_offset"] == offset:
                return file_name(driver["name"])
        return None

    def _contents(self):
        triage = self.triage
        exception = self._part_bytes("the exception record", triage["ExceptionOffset"], EXCEPTION_RECORD64["size"])
        facts = {"exception": unpack_exception(exception, 0)} if len(exception) == EXCEPTION_RECORD64["size"] else {}
        facts.update({
            "triage": dict((name, value) for name, value in triage.items() if name != "ArchitectureSpecific"),
            "triage_overflowed": triage_overflowed(triage["TriageOptions"]),
            "parts": [dict(part) for part in self.parts],
            "secondary_data": [dict(blob) for blob in self.secondary_data()],
            "drivers": [dict(driver) for driver in self.drivers()],
            "broken_driver": self._broken_driver(),
            "unloaded_drivers": self.unloaded_drivers(),
            "registers": dict(self.current_thread().registers),
            "mm": self.mm_information(),
            "current_thread": self.thread_address,
            "contents": ["%s: %d bytes at %s" % (part["what"], part["mapped"], "0x%x" % part["address"]
                                                 if part["address"] is not None else "an unknown address")
                         for part in self.parts if part["mapped"]],
            "limitation": self.limitation,
        })
        return facts
