"""Write a user-mode Scenario (x64 or x86) as a minidump ('MDMP').

Streams written: SystemInfo, ModuleList, ThreadList (when the scenario has
threads), and when asked for: Exception, ThreadInfoList, thread names,
MemoryInfoList and UnloadedModuleList; then the memory as either a Memory64List
(all data contiguous at the end, as full-memory dumps do) or a MemoryList (one
RVA per range, as small dumps do).  Touching pages are merged into one range:
readers such as the ``minidump`` package never let a read cross two ranges.
``captured`` limits the memory to byte windows, as Windows' small dumps capture
256 bytes around an instruction pointer: pages then end up partly in the dump.

The ``minidump`` package follows TEB(first thread) -> PEB -> ProcessParameters
whenever a thread list exists and logs an error traceback when that chain is
not in memory, so the writer maps a minimal chain into the scenario when the
first thread lacks one.  Facts: shared/reference/dump-formats.md, section 3.
"""

import struct

from dbgext.layouts.dump_formats import (
    CONTEXTS, EXCEPTION_RECORD64, MINIDUMP_DIRECTORY_ENTRY_SIZE, MINIDUMP_EXCEPTION_STREAM,
    MINIDUMP_HEADER_SIZE, MINIDUMP_MEMORY_INFO, MINIDUMP_MEMORY_INFO_LIST_HEADER, MINIDUMP_MODULE_SIZE,
    MINIDUMP_SIGNATURE, MINIDUMP_STREAM, MINIDUMP_SYSTEM_INFO_SIZE, MINIDUMP_THREAD_INFO,
    MINIDUMP_THREAD_INFO_LIST_HEADER, MINIDUMP_THREAD_NAME, MINIDUMP_THREAD_SIZE, MINIDUMP_UNLOADED_MODULE,
    MINIDUMP_UNLOADED_MODULE_LIST_HEADER, MINIDUMP_VERSION, PAGE_SIZE, PROCESS_BLOCKS, PROCESSOR_ARCHITECTURE)
from dbgext.sample.kdump_writer import pack_context

MINIDUMP_WITH_FULL_MEMORY = 0x2
VS_FIXEDFILEINFO_SIGNATURE = 0xFEEF04BD
FILETIME_UNIX_EPOCH = 116444736000000000
MAX_RVA = 0xFFFFFFFF


def write_minidump(scenario, path, memory_list="memory64", exception=None, captured=None, thread_info=None,
                   thread_names=None, memory_info=None, unloaded_modules=None):
    """Write ``scenario`` (user mode) as a minidump; returns ``path``.

    ``memory_list``: "memory64" (Memory64List) or "memory" (MemoryList).
    ``exception``: optional {"thread_id", "code", "address", "flags", "parameters"}
    for an Exception stream (the thread must be one of ``scenario.threads``).
    ``captured``: optional [(address, size)] byte windows: only these bytes of the
    scenario's memory go into the dump (plus the first thread's TEB/PEB chain).
    ``thread_info``: optional {thread id: {"flags", "error", "exit_status",
    "create_time", "exit_time", "kernel_time", "user_time", "start_address",
    "affinity"}} (missing keys are 0) for a ThreadInfoList.
    ``thread_names``: optional {thread id: name}.
    ``memory_info``: optional [{"base", "size", "allocation_base",
    "allocation_protect", "state", "protect", "type"}] for a MemoryInfoList.
    ``unloaded_modules``: optional [{"name", "base", "size", "checksum",
    "time_date_stamp"}] for an UnloadedModuleList."""
    if scenario.mode != "user" or scenario.arch not in PROCESSOR_ARCHITECTURE:
        raise ValueError("minidumps need a user-mode x64, x86 or arm64 scenario, not %s/%s"
                         % (scenario.arch, scenario.mode))
    if memory_list not in ("memory64", "memory"):
        raise ValueError("memory_list must be 'memory64' or 'memory', not %r" % (memory_list,))
    blocks = ensure_process_blocks(scenario) if scenario.threads else []
    ranges = memory_ranges(scenario, None if captured is None else list(captured) + blocks)
    extra = {"thread_info": thread_info, "thread_names": thread_names, "memory_info": memory_info,
             "unloaded_modules": unloaded_modules}
    writer = _MinidumpLayout(scenario, ranges, memory_list, exception, extra)
    with open(path, "wb") as handle:
        handle.write(writer.build())
        for _, data in ranges:
            handle.write(data)
    return path


def memory_ranges(scenario, captured=None):
    """[(start, bytes)] of the scenario's dumped memory, touching pieces merged:
    every page, or only the bytes of the ``captured`` (address, size) windows
    that lie in mapped pages."""
    pieces = []  # (start, end) within one page each
    for page in sorted(scenario.pages):
        if page in scenario.excluded_pages:
            continue
        if captured is None:
            pieces.append((page, page + PAGE_SIZE))
            continue
        for address, size in captured:
            lo, hi = max(address, page), min(address + size, page + PAGE_SIZE)
            if lo < hi:
                pieces.append((lo, hi))
    merged = []  # [start, end]
    for start, end in sorted(pieces):
        if merged and merged[-1][1] >= start:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, scenario.read(start, end - start)) for start, end in merged]


def ensure_process_blocks(scenario):
    """Give the first thread a mapped TEB -> PEB -> ProcessParameters chain (with an
    empty environment) unless it already has one; returns the chain's (address,
    size) blocks."""
    layout = PROCESS_BLOCKS[scenario.arch]
    pointer_format = "<Q" if scenario.pointer_size == 8 else "<I"
    thread = scenario.threads[0]
    if not thread.teb:
        thread.teb = scenario.alloc_pages(layout["teb_size"])
    scenario.map(thread.teb, layout["teb_size"])

    def pointer_at(address):
        return struct.unpack(pointer_format, scenario.read(address, scenario.pointer_size))[0]

    def mapped(address, size):
        page = address & ~(PAGE_SIZE - 1)
        while page < address + size:
            if page not in scenario.pages:
                return False
            page += PAGE_SIZE
        return True

    peb = pointer_at(thread.teb + layout["Teb.Peb"])
    if not peb or not mapped(peb, layout["peb_size"]):
        peb = scenario.alloc(layout["peb_size"], align=PAGE_SIZE)
        scenario.write_pointer(thread.teb + layout["Teb.Peb"], peb)
        if scenario.modules:
            scenario.write_pointer(peb + layout["Peb.ImageBaseAddress"], scenario.modules[0].base)
    params = pointer_at(peb + layout["Peb.ProcessParameters"])
    if not params or not mapped(params, layout["params_size"]):
        params = scenario.alloc(layout["params_size"], align=16)
        scenario.write_pointer(peb + layout["Peb.ProcessParameters"], params)
    environment = pointer_at(params + layout["Params.Environment"])
    if not environment or not mapped(environment, 4):
        environment = scenario.alloc(16)  # zeroed: an empty environment block
        scenario.write_pointer(params + layout["Params.Environment"], environment)
    return [(thread.teb, layout["teb_size"]), (peb, layout["peb_size"]), (params, layout["params_size"]),
            (environment, 16)]


class _MinidumpLayout(object):
    """Lays the file's metadata out in one bytearray: header, directory, stream
    bodies, strings and contexts; the memory data is written after it."""

    def __init__(self, scenario, ranges, memory_list, exception, extra):
        self.scenario = scenario
        self.ranges = ranges
        self.memory_list = memory_list
        self.exception = exception
        self.extra = extra
        self.out = bytearray()
        self.directory = []  # (stream type, size, rva)
        self.thread_entries = {}  # thread id -> (rva of its MINIDUMP_THREAD, thread)

    def _append(self, data, align=4):
        self.out += bytes(-len(self.out) % align)
        rva = len(self.out)
        self.out += data
        return rva

    def _string(self, text):
        encoded = text.encode("utf-16-le")
        return self._append(struct.pack("<I", len(encoded)) + encoded + b"\0\0")

    def _stream(self, name, body):
        rva = self._append(body, 8)
        self.directory.append((MINIDUMP_STREAM[name], len(body), rva))
        return rva

    def build(self):
        scenario = self.scenario
        extra = self.extra
        optional = [(self.exception, None), (extra["thread_info"], self._thread_info_list),
                    (extra["thread_names"], self._thread_names), (extra["memory_info"], self._memory_info_list),
                    (extra["unloaded_modules"], self._unloaded_module_list)]
        stream_count = 3 + bool(scenario.threads) + sum(1 for value, _ in optional if value is not None)
        self.out += bytes(MINIDUMP_HEADER_SIZE + MINIDUMP_DIRECTORY_ENTRY_SIZE * stream_count)
        self._system_info()
        self._module_list()
        contexts = self._thread_list() if scenario.threads else {}
        if self.exception:
            self._exception_stream(contexts)
        for value, write in optional[1:]:
            if value is not None:
                write(value)
        data_rvas = self._memory_list()
        self._point_stacks_at_memory(data_rvas)
        seconds = max(0, (scenario.system_time - FILETIME_UNIX_EPOCH) // 10000000)
        struct.pack_into("<4sIIIIIQ", self.out, 0, MINIDUMP_SIGNATURE, MINIDUMP_VERSION,
                         len(self.directory), MINIDUMP_HEADER_SIZE, 0, seconds & 0xFFFFFFFF,
                         MINIDUMP_WITH_FULL_MEMORY)
        for index, entry in enumerate(self.directory):
            struct.pack_into("<III", self.out, MINIDUMP_HEADER_SIZE + index * MINIDUMP_DIRECTORY_ENTRY_SIZE,
                             *entry)
        return bytes(self.out)  # the metadata; the memory data follows it

    def _system_info(self):
        empty_version = self._string("")
        body = struct.pack("<HHHBBIIIIIHH24s", PROCESSOR_ARCHITECTURE[self.scenario.arch], 6, 0, 1, 1,
                           10, 0, self.scenario.build, 2, empty_version, 0x100, 0, bytes(24))
        assert len(body) == MINIDUMP_SYSTEM_INFO_SIZE
        self._stream("SystemInfo", body)

    def _module_list(self):
        entries = []
        for module in self.scenario.modules:
            name_rva = self._string(module.image)
            version_info = struct.pack("<II", VS_FIXEDFILEINFO_SIGNATURE, 0x10000) + bytes(44)
            entry = struct.pack("<QIIII", module.base, module.size, 0, module.timestamp or 0, name_rva) + version_info + bytes(32)
            assert len(entry) == MINIDUMP_MODULE_SIZE
            entries.append(entry)
        self._stream("ModuleList", struct.pack("<I", len(entries)) + b"".join(entries))

    def _thread_list(self):
        """The ThreadList; returns {thread id: (context size, context rva)}.  Stack
        descriptors are filled in once the memory data has its place."""
        layout = CONTEXTS[self.scenario.arch]
        contexts = {}
        for thread in self.scenario.threads:
            context = pack_context(layout, thread.registers)
            contexts[thread.thread_id] = (len(context), self._append(context, 16))
        body = struct.pack("<I", len(self.scenario.threads))
        for thread in self.scenario.threads:
            size, rva = contexts[thread.thread_id]
            body += struct.pack("<IIIIQQIIII", thread.thread_id, 0, 0x20, 0, thread.teb,
                                thread.stack_base, 0, 0, size, rva)
        list_rva = self._stream("ThreadList", body)
        for index, thread in enumerate(self.scenario.threads):
            self.thread_entries[thread.thread_id] = (list_rva + 4 + index * MINIDUMP_THREAD_SIZE, thread)
        return contexts

    def _exception_stream(self, contexts):
        exception = self.exception
        thread_id = exception["thread_id"]
        if thread_id not in contexts:
            raise ValueError("exception thread %r is not one of the scenario's threads" % (thread_id,))
        parameters = list(exception.get("parameters", ()))[:15]
        record = bytearray(EXCEPTION_RECORD64["size"])
        struct.pack_into("<IIQQI", record, 0, exception["code"], exception.get("flags", 0), 0,
                         exception["address"], len(parameters))
        struct.pack_into("<%dQ" % len(parameters), record, EXCEPTION_RECORD64["ExceptionInformation"],
                         *parameters)
        size, rva = contexts[thread_id]
        body = struct.pack("<II", thread_id, 0) + bytes(record) + struct.pack("<II", size, rva)
        assert len(body) == MINIDUMP_EXCEPTION_STREAM["size"]
        self._stream("Exception", body)

    def _thread_info_list(self, facts):
        fields = ("flags", "error", "exit_status", "create_time", "exit_time", "kernel_time", "user_time",
                  "start_address", "affinity")
        entries = [struct.pack(MINIDUMP_THREAD_INFO, thread.thread_id,
                               *[facts.get(thread.thread_id, {}).get(name, 0) for name in fields])
                   for thread in self.scenario.threads]
        self._sized_list("ThreadInfoList", MINIDUMP_THREAD_INFO_LIST_HEADER, MINIDUMP_THREAD_INFO, entries)

    def _thread_names(self, names):
        entries = [struct.pack(MINIDUMP_THREAD_NAME, thread_id, self._string(name))
                   for thread_id, name in sorted(names.items())]
        self._stream("ThreadNames", struct.pack("<I", len(entries)) + b"".join(entries))

    def _memory_info_list(self, regions):
        entries = [struct.pack(MINIDUMP_MEMORY_INFO, region["base"], region.get("allocation_base", region["base"]),
                               region.get("allocation_protect", region.get("protect", 0)), 0, region["size"],
                               region["state"], region.get("protect", 0), region.get("type", 0), 0)
                   for region in regions]
        self._sized_list("MemoryInfoList", MINIDUMP_MEMORY_INFO_LIST_HEADER, MINIDUMP_MEMORY_INFO, entries)

    def _unloaded_module_list(self, modules):
        entries = [struct.pack(MINIDUMP_UNLOADED_MODULE, module["base"], module["size"], module.get("checksum", 0),
                               module.get("time_date_stamp", 0), self._string(module["name"]))
                   for module in modules]
        self._sized_list("UnloadedModuleList", MINIDUMP_UNLOADED_MODULE_LIST_HEADER, MINIDUMP_UNLOADED_MODULE,
                         entries)

    def _sized_list(self, name, header_format, entry_format, entries):
        """A list stream headed by SizeOfHeader, SizeOfEntry and the count."""
        header = struct.pack(header_format, struct.calcsize(header_format), struct.calcsize(entry_format),
                             len(entries))
        self._stream(name, header + b"".join(entries))

    def _memory_list(self):
        """The memory stream; returns each range's data RVA.  The data itself
        follows the metadata, page-aligned, in range order (contiguous, as a
        Memory64List requires; a MemoryList names each range's RVA)."""
        count = len(self.ranges)
        if self.memory_list == "memory64":
            list_rva = self._append(bytes(16 + 16 * count), 8)
        else:
            list_rva = self._append(bytes(4 + 16 * count), 8)
        self.out += bytes(-len(self.out) % PAGE_SIZE)
        data_rvas = []
        cursor = len(self.out)
        for _, data in self.ranges:
            data_rvas.append(cursor)
            cursor += len(data)
        if self.memory_list == "memory64":
            body = struct.pack("<QQ", count, len(self.out)) + b"".join(
                struct.pack("<QQ", start, len(data)) for start, data in self.ranges)
            stream = "Memory64List"
        else:
            if cursor > MAX_RVA + 1:
                raise ValueError("a MemoryList minidump cannot exceed 4 GiB; use memory64")
            body = struct.pack("<I", count) + b"".join(
                struct.pack("<QII", start, len(data), rva) for (start, data), rva in zip(self.ranges, data_rvas))
            stream = "MemoryList"
        self.out[list_rva:list_rva + len(body)] = body
        self.directory.append((MINIDUMP_STREAM[stream], len(body), list_rva))
        return data_rvas

    def _point_stacks_at_memory(self, data_rvas):
        """Each thread's Stack descriptor names its bytes inside the memory data."""
        for entry_rva, thread in self.thread_entries.values():
            if not thread.stack_size:
                continue
            for (start, data), rva in zip(self.ranges, data_rvas):
                stack_rva = rva + thread.stack_base - start
                if start <= thread.stack_base and thread.stack_base + thread.stack_size <= start + len(data) \
                        and stack_rva <= MAX_RVA:
                    struct.pack_into("<QII", self.out, entry_rva + 24, thread.stack_base,
                                     thread.stack_size, stack_rva)
                    break
