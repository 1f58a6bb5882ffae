"""User-mode minidumps ('MDMP'), x64, x86 and ARM64 (SystemInfo's
ProcessorArchitecture 9, 0 and 12).

Our own reader; the ``minidump`` package is the independent oracle in the tests
(both must agree byte for byte).  The file is read with positioned reads
(:class:`~dbgext.target.dumpfile.DumpFile`), not mapped: a dump that shrinks
while it is read ends with one line naming the file and the offset, never SIGBUS.
Every RVA and size is checked against the file before it is believed, and lists
are bounded by what the file holds, not by the counts it claims.

Memory: both memory-list formats are read (Memory64List: data contiguous from
BaseRva; MemoryList: one RVA per range); when a dump has both, both are used.
Unreadable means unreadable at byte granularity: Windows captures 256-byte
windows around instruction pointers and partial stacks, so a page may be only
partly in the dump.  ``read_page`` serves such a page with the missing bytes
zero-filled (the Target works in whole pages) and :meth:`partial_pages` says
which bytes of it are real, so the Target reports the rest as unreadable.

Streams read besides memory and modules: the thread list with each thread's
CONTEXT (x64, x86 or CONTEXT_ARM64), ThreadInfoList (creation time, start address, flags),
thread names, the exception stream (with its own context, the one WinDbg's
``.ecxr`` shows), MemoryInfoList (regions and protections, for an
``!address``-like listing) and the unloaded-module list.

ARM64 was checked only on minidumps our writer makes (no real Windows ARM64
minidump was at hand): the TEB's NT_TIB and the PEB chain are taken to be the
x64 ones (``dump_formats.TEB_STACK`` / ``PROCESS_BLOCKS``).  Breakpad's own ARM64
number (0x8003, with a different context layout) is not read.
"""

import struct

from ..errors import BadInput
from ..layouts.dump_formats import (
    ARCH_OF_PROCESSOR, CONTEXTS, MEM_COMMIT, MEMORY_STATES, MEMORY_TYPES, MINIDUMP_DIRECTORY_ENTRY_SIZE,
    MINIDUMP_EXCEPTION_STREAM, MINIDUMP_HEADER_SIZE, MINIDUMP_MEMORY_INFO, MINIDUMP_MEMORY_INFO_LIST_HEADER,
    MINIDUMP_MODULE_SIZE, MINIDUMP_PLATFORMS, MINIDUMP_SIGNATURE, MINIDUMP_STREAM, MINIDUMP_SYSTEM_INFO,
    MINIDUMP_SYSTEM_INFO_SIZE, MINIDUMP_THREAD_INFO, MINIDUMP_THREAD_INFO_LIST_HEADER, MINIDUMP_THREAD_NAME,
    MINIDUMP_UNLOADED_MODULE, MINIDUMP_UNLOADED_MODULE_LIST_HEADER, PAGE_MODIFIERS, PAGE_PROTECTIONS,
    PRODUCT_TYPES, TEB_STACK, THREAD_INFO_FLAGS, WINDOWS_PLATFORM)
from ..winpath import file_name, file_stem
from .base import Backend, Module, Thread
from .dumpfile import DumpFile
from .filemap import FileMappedRanges, ReadsFileMappedRanges
from .kdump import unpack_context, unpack_exception

MAX_STREAMS = 0x10000
MAX_NAME_BYTES = 0x10000


def protection_name(value):
    """``PAGE_READWRITE``, ``PAGE_EXECUTE_READ|PAGE_GUARD``, or hex for unknown bits."""
    names = [PAGE_PROTECTIONS[value & 0xFF]] if value & 0xFF in PAGE_PROTECTIONS else []
    names += [name for bit, name in sorted(PAGE_MODIFIERS.items()) if value & bit]
    known = (0xFF if value & 0xFF in PAGE_PROTECTIONS else 0) | sum(bit for bit in PAGE_MODIFIERS if value & bit)
    if value & ~known or not names:
        names.append("0x%x" % (value & ~known))
    return "|".join(names)


class MemoryRegion(object):
    """One MINIDUMP_MEMORY_INFO: a region of the process's address space."""

    __slots__ = ("base", "allocation_base", "allocation_protect", "size", "state", "protect", "type")

    def __init__(self, base, allocation_base, allocation_protect, size, state, protect, type):
        self.base = base
        self.allocation_base = allocation_base
        self.allocation_protect = allocation_protect
        self.size = size
        self.state = state
        self.protect = protect
        self.type = type

    @property
    def end(self):
        return self.base + self.size

    @property
    def state_name(self):
        return MEMORY_STATES.get(self.state, "0x%x" % self.state)

    @property
    def type_name(self):
        # Free and reserved regions have no type; Windows leaves 0 there.
        return MEMORY_TYPES.get(self.type, "0x%x" % self.type) if self.type else ""

    @property
    def protect_name(self):
        # For reserved and free regions the Protect member is undefined.
        return protection_name(self.protect) if self.state == MEM_COMMIT else ""

    def as_dict(self):
        return {"base": self.base, "size": self.size, "allocation_base": self.allocation_base,
                "allocation_protect": self.allocation_protect, "state": self.state_name,
                "protect": self.protect_name, "protect_value": self.protect, "type": self.type_name}


class MinidumpBackend(ReadsFileMappedRanges, Backend):
    kind = "minidump"

    def __init__(self, path):
        self._file = DumpFile(path)
        self.path = self._file.path
        self.size = self._file.size
        try:
            if self.size < MINIDUMP_HEADER_SIZE:
                raise BadInput("%s: truncated minidump (%d bytes, the header alone is %d)"
                               % (path, self.size, MINIDUMP_HEADER_SIZE))
            self._parse()
        except BaseException:
            self._file.close()
            raise

    # -- structure ------------------------------------------------------------------

    def _bytes(self, rva, size, what):
        """File bytes [rva, rva+size) or BadInput naming the structure."""
        if rva < 0 or size < 0 or rva + size > self.size:
            raise BadInput("%s: %s at file offset 0x%x (+0x%x) lies past the end of the file (%d bytes)"
                           % (self.path, what, rva, size, self.size))
        return self._file.read(rva, size)

    def _parse(self):
        header = self._file.read(0, MINIDUMP_HEADER_SIZE)
        if header[0:4] != MINIDUMP_SIGNATURE:
            raise BadInput("%s is not a minidump (signature %r)" % (self.path, bytes(header[0:4])))
        stream_count, directory_rva = struct.unpack_from("<II", header, 8)
        self.time_date_stamp = struct.unpack_from("<I", header, 0x14)[0]
        if stream_count > MAX_STREAMS:
            raise BadInput("%s: corrupt minidump header (%d streams)" % (self.path, stream_count))
        directory = self._bytes(directory_rva, stream_count * MINIDUMP_DIRECTORY_ENTRY_SIZE, "the stream directory")
        self.streams = {}
        for index in range(stream_count):
            kind, size, rva = struct.unpack_from("<III", directory, index * MINIDUMP_DIRECTORY_ENTRY_SIZE)
            if kind == 0:  # UnusedStream
                continue
            self.streams.setdefault(kind, (size, rva))
        system_info = self._stream("SystemInfo", MINIDUMP_SYSTEM_INFO_SIZE)
        if system_info is None:
            raise BadInput("%s: minidump without a SystemInfo stream (architecture unknown)" % self.path)
        processor, = struct.unpack_from("<H", system_info, 0)
        if processor not in ARCH_OF_PROCESSOR:
            raise BadInput("%s: unsupported processor architecture %d (x64, x86 and ARM64 are supported)"
                           % (self.path, processor))
        self.arch = ARCH_OF_PROCESSOR[processor]
        self.build = struct.unpack_from("<I", system_info, 16)[0]
        self.system = self._system_facts(system_info)
        self._modules = self._parse_modules()
        self._parse_memory()
        self.exception = self._parse_exception()
        self.unloaded_modules = self._parse_unloaded_modules()
        self.memory_info = self._parse_memory_info()
        self._thread_rows = self._parse_threads()
        self._threads = None

    def _stream(self, name, minimum_size):
        entry = self.streams.get(MINIDUMP_STREAM[name])
        if entry is None:
            return None
        size, rva = entry
        if size < minimum_size:
            raise BadInput("%s: %s stream too small (%d bytes)" % (self.path, name, size))
        return self._bytes(rva, size, "the %s stream" % name)

    def _entries(self, name, entry_format, count_format="<I"):
        """The unpacked entries of a list stream that is a count then fixed entries."""
        data = self._stream(name, struct.calcsize(count_format))
        if data is None:
            return []
        head = struct.calcsize(count_format)
        return self._unpack_entries(name, data, head, struct.unpack_from(count_format, data)[0],
                                    struct.calcsize(entry_format), entry_format)

    def _sized_entries(self, name, header_format, entry_format):
        """The entries of a list stream whose header gives SizeOfHeader, SizeOfEntry
        and the count (ThreadInfoList, MemoryInfoList, UnloadedModuleList): entries are
        stepped by SizeOfEntry, which newer writers may make larger."""
        data = self._stream(name, struct.calcsize(header_format))
        if data is None:
            return []
        header_size, entry_size, count = struct.unpack_from(header_format, data)
        if entry_size < struct.calcsize(entry_format) or header_size < struct.calcsize(header_format):
            raise BadInput("%s: corrupt %s stream (header %d bytes, entries %d bytes, %d expected)"
                           % (self.path, name, header_size, entry_size, struct.calcsize(entry_format)))
        return self._unpack_entries(name, data, header_size, count, entry_size, entry_format)

    def _unpack_entries(self, name, data, first, count, entry_size, entry_format):
        if first + count * entry_size > len(data):
            raise BadInput("%s: %s stream holds %d bytes, too few for %d entries"
                           % (self.path, name, len(data), count))
        return [struct.unpack_from(entry_format, data, first + index * entry_size) for index in range(count)]

    def _string(self, rva):
        length = struct.unpack("<I", self._bytes(rva, 4, "a string"))[0]
        if length > MAX_NAME_BYTES:
            raise BadInput("%s: corrupt string at file offset 0x%x (%d bytes)" % (self.path, rva, length))
        return self._bytes(rva + 4, length, "a string").decode("utf-16-le", "replace")

    def _system_facts(self, system_info):
        """What the SystemInfo stream says about the machine and the system that
        wrote the dump: Windows, or (breakpad, crashpad) macOS, Linux, ..."""
        layout = MINIDUMP_SYSTEM_INFO
        values = dict(zip(layout["fields"], struct.unpack_from(layout["format"], system_info)))
        platform_id = values["PlatformId"]
        csd = ""
        if values["CSDVersionRva"]:
            try:
                csd = self._string(values["CSDVersionRva"]).rstrip("\0")
            except BadInput:
                csd = ""
        vendor = system_info[layout["VendorId"]:layout["VendorId"] + 12]
        return {
            "platform": MINIDUMP_PLATFORMS.get(platform_id, "unknown platform 0x%x" % platform_id),
            "platform_id": platform_id,
            "os_version": "%d.%d.%d" % (values["MajorVersion"], values["MinorVersion"], values["BuildNumber"]),
            "csd_version": csd,
            "product_type": PRODUCT_TYPES.get(values["ProductType"]) if platform_id == WINDOWS_PLATFORM else None,
            "processors": values["NumberOfProcessors"],
            "processor_level": values["ProcessorLevel"],
            "processor_revision": values["ProcessorRevision"],
            "cpu_vendor": vendor.decode("ascii") if vendor.isalnum() else None,
        }

    def _parse_modules(self):
        modules = []
        self._module_paths = []
        for base, size, checksum, timestamp, name_rva in self._entries("ModuleList",
                                                                       "<QIIII%dx" % (MINIDUMP_MODULE_SIZE - 24)):
            path = self._string(name_rva)
            modules.append(Module(file_stem(path), base, size, file_name(path), timestamp))
            self._module_paths.append((path, checksum))
        return modules

    def _context(self, size, rva):
        layout = CONTEXTS[self.arch]
        if not size:
            return {}
        if size < layout["size"]:
            raise BadInput("%s: thread context at file offset 0x%x is %d bytes, an %s CONTEXT is %d"
                           % (self.path, rva, size, self.arch, layout["size"]))
        return unpack_context(layout, self._bytes(rva, layout["size"], "a thread context"), 0)

    def _parse_threads(self):
        """One dict per MINIDUMP_THREAD, with its ThreadInfoList facts and name."""
        infos = {}
        for (thread_id, flags, error, exit_status, create_time, exit_time, kernel_time, user_time, start_address,
             affinity) in self._sized_entries("ThreadInfoList", MINIDUMP_THREAD_INFO_LIST_HEADER, MINIDUMP_THREAD_INFO):
            infos.setdefault(thread_id, {
                "dump_flags": [name for bit, name in sorted(THREAD_INFO_FLAGS.items()) if flags & bit],
                "dump_error": error, "exit_status": exit_status, "create_time": create_time, "exit_time": exit_time,
                "kernel_time": kernel_time, "user_time": user_time, "start_address": start_address,
                "affinity": affinity})
        names = {thread_id: self._string(rva) for thread_id, rva in self._entries("ThreadNames", MINIDUMP_THREAD_NAME)}
        rows = []
        for (thread_id, suspend_count, priority_class, priority, teb, stack_start, stack_size, _stack_rva,
             context_size, context_rva) in self._entries("ThreadList", "<IIIIQQIIII"):
            row = {"thread_id": thread_id, "teb": teb, "stack_start": stack_start, "stack_size": stack_size,
                   "suspend_count": suspend_count, "priority_class": priority_class, "priority": priority,
                   "name": names.get(thread_id) or None, "registers": self._context(context_size, context_rva)}
            row.update(infos.get(thread_id, {}))
            rows.append(row)
        return rows

    def _parse_exception(self):
        data = self._stream("Exception", MINIDUMP_EXCEPTION_STREAM["size"])
        if data is None:
            return None
        layout = MINIDUMP_EXCEPTION_STREAM
        thread_id = struct.unpack_from("<I", data, layout["ThreadId"])[0]
        context_size, context_rva = struct.unpack_from("<II", data, layout["ThreadContext"])
        exception = {"thread_id": thread_id}
        exception.update(unpack_exception(data, layout["ExceptionRecord"]))
        exception["registers"] = self._context(context_size, context_rva)
        return exception

    def _parse_unloaded_modules(self):
        return [{"name": self._string(name_rva), "base": base, "size": size, "checksum": checksum,
                 "time_date_stamp": time_date_stamp}
                for base, size, checksum, time_date_stamp, name_rva in self._sized_entries(
                    "UnloadedModuleList", MINIDUMP_UNLOADED_MODULE_LIST_HEADER, MINIDUMP_UNLOADED_MODULE)]

    def _parse_memory_info(self):
        """The MemoryInfoList as MemoryRegions, or None when the dump has none."""
        if MINIDUMP_STREAM["MemoryInfoList"] not in self.streams:
            return None
        return [MemoryRegion(base, allocation_base, allocation_protect, size, state, protect, kind)
                for base, allocation_base, allocation_protect, _, size, state, protect, kind, _ in self._sized_entries(
                    "MemoryInfoList", MINIDUMP_MEMORY_INFO_LIST_HEADER, MINIDUMP_MEMORY_INFO)]

    def _parse_memory(self):
        ranges = []  # (start, end, file offset)
        data = self._stream("Memory64List", 16)
        if data is not None:
            count, cursor = struct.unpack_from("<QQ", data)
            for start, size in self._unpack_entries("Memory64List", data, 16, count, 16, "<QQ"):
                self._check_range(start, size, cursor)
                ranges.append((start, start + size, cursor))
                cursor += size
        for start, size, rva in self._entries("MemoryList", "<QII"):
            self._check_range(start, size, rva)
            ranges.append((start, start + size, rva))
        self._memory_list = ranges
        self._memory = FileMappedRanges(self._file, ranges)

    def _check_range(self, start, size, rva):
        if rva + size > self.size:
            raise BadInput("%s: memory range 0x%x (+0x%x) at file offset 0x%x lies past the end of the file "
                           "(%d bytes)" % (self.path, start, size, rva, self.size))
        if start + size > 1 << 64:
            raise BadInput("%s: memory range 0x%x (+0x%x) runs past the end of the address space"
                           % (self.path, start, size))

    # -- threads ------------------------------------------------------------------------

    def threads(self):
        if self._threads is None:
            self._threads = [self._thread(row, row["registers"]) for row in self._thread_rows]
        return list(self._threads)

    def current_thread(self):
        """The exception thread with the exception's context (what ``.ecxr`` shows),
        else the first thread; None for a dump without threads."""
        if self.exception:
            for row in self._thread_rows:
                if row["thread_id"] == self.exception["thread_id"]:
                    return self._thread(row, self.exception["registers"] or row["registers"])
        return self._thread(self._thread_rows[0], self._thread_rows[0]["registers"]) if self._thread_rows else None

    def _thread(self, row, registers):
        """A Thread; its stack bounds from the TEB's NT_TIB when the dump holds it,
        else the captured stack range."""
        stack_base, stack_limit = row["stack_start"] + row["stack_size"], row["stack_start"]
        fields = TEB_STACK[self.arch]
        pair = "<2I" if self.arch == "x86" else "<2Q"
        tib = self._memory.read(row["teb"] + fields["StackBase"], struct.calcsize(pair)) if row["teb"] else None
        if tib is not None:
            base, limit = struct.unpack(pair, tib)
            if limit < base:
                stack_base, stack_limit = base, limit
        return Thread(row["thread_id"], registers, teb=row["teb"] or None, stack_base=stack_base,
                      stack_limit=stack_limit, name=row["name"])

    # -- facts ------------------------------------------------------------------------

    def modules(self):
        return list(self._modules)

    def memory_regions(self):
        """The MemoryInfoList (an ``!address`` listing) as MemoryRegions, or None."""
        return list(self.memory_info) if self.memory_info is not None else None

    def memory_info_summary(self):
        """Bytes by state, by type and by protection (committed memory), or None."""
        if self.memory_info is None:
            return None
        summary = {"regions": len(self.memory_info), "by_state": {}, "by_type": {}, "by_protection": {}}
        for region in self.memory_info:
            _add(summary["by_state"], region.state_name, region.size)
            if region.state == MEM_COMMIT:
                _add(summary["by_type"], region.type_name or "unknown", region.size)
                _add(summary["by_protection"], region.protect_name, region.size)
        return summary

    def info(self):
        current = self.current_thread()
        facts = dict(self.system)
        facts.update({
            "kind": self.kind,
            "arch": self.arch,
            "mode": "user",
            "file": self.path,
            "build": self.build,
            "time_date_stamp": self.time_date_stamp,
            "threads": [dict(row) for row in self._thread_rows],
            "thread_count": len(self._thread_rows),
            "current_thread_id": current.id if current else None,
            "exception": dict(self.exception) if self.exception else None,
            "registers": dict(current.registers) if current else {},
            "memory_ranges": len(self._memory_list),
            "captured_bytes": sum(end - start for start, end in self._memory.mapped_ranges()),
            "partial_pages": len(self._memory.partial_pages()),
            "memory_info": self.memory_info_summary(),
            "unloaded_modules": [dict(module) for module in self.unloaded_modules],
            "modules": [{"name": module.name, "base": module.base, "size": module.size, "timestamp": module.timestamp,
                         "checksum": checksum, "path": path}
                        for module, (path, checksum) in zip(self._modules, self._module_paths)],
        })
        return facts

    def close(self):
        if not self._file.closed:
            self._file.close()


def _add(totals, key, size):
    totals[key] = totals.get(key, 0) + size


