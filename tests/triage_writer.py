"""Write kernel small memory dumps (DumpType 4, triage dumps).

No third-party Linux reader accepts small dumps (kdmp-parser rejects type 4), so
this writer and dbgext's reader agree only through the layout in
shared/reference/dump-formats.md §1.3a and the tables in
:mod:`dbgext.layouts.dump_formats`; the tests therefore check every field by
its file offset as well as through the reader.

:class:`SmallDump` collects the parts a small dump holds; :meth:`SmallDump.write`
lays them out after the DUMP_HEADER64 and the TRIAGE_DUMP64, each 8-byte
aligned, the string pool after the driver list, and the ``DGRT`` marker last.
It returns the file offsets it chose, so tests can corrupt exactly one field.

It writes what real Windows 10/11 small dumps hold (checked against
../shared/realworld/kernel/rizin__triage_x64.dmp): DUMP_STRING lengths in
characters, full paths in the string pool (``\\SystemRoot\\system32\\ntoskrnl.exe``),
unloaded-driver names whose Length is capped at the 24 bytes of DriverName, and
TriageOptions 0xFFFFFFFF ("all options").
"""

import struct

from dbgext.layouts.dump_formats import (
    CONTEXTS, DUMP_DRIVER_ENTRY64, DUMP_MM_STORAGE64, DUMP_TYPE_TRIAGE, DUMP_UNLOADED_DRIVERS64,
    MINIDUMP_FIELDS, TRIAGE_DATA_BLOCK, TRIAGE_DUMP64, TRIAGE_FORMAT, TRIAGE_OPTIONS_ALL, TRIAGE_VALID)
from dbgext.sample.kdump_writer import KernelDumpHeader, dump_header, exception_record, pack_context

FIELD_BITS = dict((name, bit) for bit, name in MINIDUMP_FIELDS)


class SmallDump(object):
    """The parts of one small dump of an ``arch`` ("x64" or "arm64") machine.
    ``header`` is a KernelDumpHeader (bug check, registers by ``arch``'s names,
    build, KdDebuggerDataBlock); the rest are set by the caller."""

    def __init__(self, header=None, arch="x64"):
        self.header = header or KernelDumpHeader()
        self.arch = arch
        self.stack = None            # (TopOfStack = the stack pointer, bytes from it upward)
        self.data_page = None        # (address, bytes)
        self.data_blocks = []        # [(address, bytes)]
        self.drivers = []            # [(file name or path, base, size, TimeDateStamp, CheckSum)]
        self.unloaded_drivers = []   # [(name, start, end)]
        self.mm = None               # {DUMP_MM_STORAGE64 field: value}
        self.prcb = self.thread = self.process = None   # structure copies (bytes)
        self.debugger_data = None    # KDDEBUGGER_DATA64 bytes (kdump_writer.pack_debugger_data)
        self.broken_driver = None    # index into drivers
        self.triage_options = TRIAGE_OPTIONS_ALL
        self.service_pack_build = 0

    def write(self, path):
        """Write the dump; returns {"TRIAGE_DUMP64 field": value} plus
        ``"string:<i>"`` (file offset of driver i's DUMP_STRING) and ``"size"``."""
        out = bytearray()
        base = TRIAGE_DUMP64["offset"] + TRIAGE_DUMP64["size"]
        fields = dict((name, 0) for name in TRIAGE_DUMP64 if name not in ("offset", "size"))
        present = set()

        def place(data, name=None):
            while (base + len(out)) % 8:
                out.append(0)
            offset = base + len(out)
            out.extend(data)
            if name:
                present.add(name)
            return offset

        # A small dump stores the crashing context twice: in the header and here.
        fields["ContextOffset"] = place(pack_context(CONTEXTS[self.arch], self.header.registers), "context")
        fields["ExceptionOffset"] = place(exception_record(self.header, self.arch), "exception")
        if self.mm is not None:
            fields["MmOffset"] = place(struct.pack(DUMP_MM_STORAGE64["format"], *[
                self.mm.get(name, 0) for name in DUMP_MM_STORAGE64["fields"]]), "mm_info")
        if self.unloaded_drivers:
            fields["UnloadedDriversOffset"] = place(_unloaded(self.unloaded_drivers))
        for part, field, name in ((self.prcb, "PrcbOffset", "prcb"), (self.process, "ProcessOffset", "process"),
                                  (self.thread, "ThreadOffset", "thread")):
            if part is not None:
                fields[field] = place(part, name)
        if self.stack is not None:
            fields["TopOfStack"] = self.stack[0]
            fields["CallStackOffset"] = place(self.stack[1], "stack")
            fields["SizeOfCallStack"] = len(self.stack[1])
        strings = {}
        if self.drivers:
            layout = DUMP_DRIVER_ENTRY64
            list_offset = place(bytes(layout["size"] * len(self.drivers)), "driver_list")
            pool_offset = place(b"")
            for index, (name, _, _, _, _) in enumerate(self.drivers):
                stored = driver_path(name)
                strings["string:%d" % index] = place(struct.pack("<I", len(stored)) + stored.encode("utf-16-le")
                                                     + b"\0\0")
            for index, (name, dll_base, size, timestamp, checksum) in enumerate(self.drivers):
                entry = list_offset - base + index * layout["size"]
                struct.pack_into("<I", out, entry + layout["DriverNameOffset"], strings["string:%d" % index])
                struct.pack_into("<Q", out, entry + layout["DllBase"], dll_base)
                struct.pack_into("<I", out, entry + layout["SizeOfImage"], size)
                struct.pack_into("<I", out, entry + layout["CheckSum"], checksum)
                struct.pack_into("<I", out, entry + layout["TimeDateStamp"], timestamp)
            fields.update(DriverListOffset=list_offset, DriverCount=len(self.drivers), StringPoolOffset=pool_offset,
                          StringPoolSize=base + len(out) - pool_offset)
            if self.broken_driver is not None:
                fields["BrokenDriverOffset"] = list_offset + self.broken_driver * layout["size"]
                present.add("broken_driver")
        if self.data_page is not None:
            fields["DataPageAddress"] = self.data_page[0]
            fields["DataPageOffset"] = place(self.data_page[1], "data_page")
            fields["DataPageSize"] = len(self.data_page[1])
        if self.debugger_data is not None:
            fields["DebuggerDataOffset"] = place(self.debugger_data, "debugger_data")
            fields["DebuggerDataSize"] = len(self.debugger_data)
        if self.data_blocks:
            offsets = [place(data) for _, data in self.data_blocks]
            table = b"".join(struct.pack(TRIAGE_DATA_BLOCK, address, offset, len(data))
                             for (address, data), offset in zip(self.data_blocks, offsets))
            fields["DataBlocksOffset"] = place(table, "data_blocks")
            fields["DataBlocksCount"] = len(self.data_blocks)
        fields["ValidOffset"] = place(TRIAGE_VALID)
        file_size = base + len(out)
        fields.update(ServicePackBuild=self.service_pack_build, SizeOfDump=file_size,
                      TriageOptions=self.triage_options)
        order = sorted(fields, key=lambda name: TRIAGE_DUMP64[name])
        values = [fields[name] if name != "ArchitectureSpecific" else bytes(16) for name in order]
        self.header.minidump_fields = sum(FIELD_BITS[name] for name in present)
        head = dump_header(self.header, [], 0, DUMP_TYPE_TRIAGE, file_size, self.arch)
        with open(path, "wb") as handle:
            handle.write(head)
            handle.write(struct.pack(TRIAGE_FORMAT, *values))
            handle.write(out)
        fields.update(strings)
        fields["size"] = file_size
        return fields


def driver_path(name):
    """The path the kernel stores for a driver: a bare file name goes where
    Windows keeps it (the kernel and its DLLs in system32, drivers in drivers)."""
    if "\\" in name:
        return name
    folder = "\\SystemRoot\\System32\\drivers\\" if name.lower().endswith(".sys") else "\\SystemRoot\\system32\\"
    return folder + name


def _unloaded(entries):
    layout = DUMP_UNLOADED_DRIVERS64
    out = bytearray(layout["Entries"] + layout["size"] * len(entries))
    struct.pack_into("<I", out, 0, len(entries))
    for index, (name, start, end) in enumerate(entries):
        entry = layout["Entries"] + index * layout["size"]
        short = name.encode("utf-16-le")[:2 * layout["DriverNameChars"]]
        struct.pack_into("<HHxxxxQ", out, entry + layout["Name"], len(short), len(short), 0)
        out[entry + layout["DriverName"]:entry + layout["DriverName"] + len(short)] = short
        struct.pack_into("<QQ", out, entry + layout["StartAddress"], start, end)
    return bytes(out)
