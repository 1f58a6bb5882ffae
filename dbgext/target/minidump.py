"""User-mode minidumps ('MDMP'), x64 and x86.

Our own reader: the file is mmapped and reads are slices of it.  The issue asked
for the ``minidump`` package; it is kept as the independent oracle in the tests
(both must agree byte for byte) rather than used here, because it is a pure
Python object parser whose reads cannot cross memory ranges, that raises bare
``Exception``s, and that logs tracebacks on ordinary gaps — a small mmap reader
is faster, validates every RVA against the file, and reports a one-line
BadInput naming the file instead.

Both memory-list formats are read (Memory64List: data contiguous from BaseRva;
MemoryList: one RVA per range); when a dump has both, both are used.  Reads are
split at range boundaries.  A page only partly covered by the dump's ranges
(MemoryList ranges need not be page-aligned) is served with the uncovered bytes
zero-filled, because the Target works in whole pages; ``mapped_ranges`` reports
the exact byte ranges.
"""

import mmap
import os
import struct
from bisect import bisect_right

from ..errors import BadInput
from ..layouts.dump_formats import (
    CONTEXTS, EXCEPTION_RECORD64, MINIDUMP_DIRECTORY_ENTRY_SIZE, MINIDUMP_EXCEPTION_STREAM,
    MINIDUMP_HEADER_SIZE, MINIDUMP_MODULE_SIZE, MINIDUMP_SIGNATURE, MINIDUMP_STREAM,
    MINIDUMP_SYSTEM_INFO_SIZE, MINIDUMP_THREAD_SIZE, ARCH_OF_PROCESSOR)
from .base import PAGE_SIZE, Backend, Module
from .kdump import unpack_context

MAX_STREAMS = 0x10000
MAX_LIST_ENTRIES = 0x100000
MAX_NAME_BYTES = 0x10000


class MinidumpBackend(Backend):
    kind = "minidump"

    def __init__(self, path):
        self.path = path
        try:
            handle = open(path, "rb")
        except OSError as error:
            raise BadInput("cannot open %s: %s" % (path, error.strerror or error))
        try:
            self.size = os.fstat(handle.fileno()).st_size
            if self.size < MINIDUMP_HEADER_SIZE:
                raise BadInput("%s: truncated minidump (%d bytes, the header alone is %d)"
                               % (path, self.size, MINIDUMP_HEADER_SIZE))
            self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        finally:
            handle.close()
        try:
            self._parse()
        except BaseException:
            self._map.close()
            raise

    # -- structure ------------------------------------------------------------------

    def _check(self, rva, size, what):
        """BadInput naming the structure unless [rva, rva+size) lies in the file."""
        if rva < 0 or size < 0 or rva + size > self.size:
            raise BadInput("%s: %s at file offset 0x%x (+0x%x) lies past the end of the file (%d bytes)"
                           % (self.path, what, rva, size, self.size))

    def _bytes(self, rva, size, what):
        """File bytes [rva, rva+size) or BadInput naming the structure."""
        self._check(rva, size, what)
        return self._map[rva:rva + size]

    def _parse(self):
        if self._map[0:4] != MINIDUMP_SIGNATURE:
            raise BadInput("%s is not a minidump (signature %r)" % (self.path, bytes(self._map[0:4])))
        stream_count, directory_rva = struct.unpack_from("<II", self._map, 8)
        self.time_date_stamp = struct.unpack_from("<I", self._map, 0x14)[0]
        if stream_count > MAX_STREAMS:
            raise BadInput("%s: corrupt minidump header (%d streams)" % (self.path, stream_count))
        directory = self._bytes(directory_rva, stream_count * MINIDUMP_DIRECTORY_ENTRY_SIZE,
                                "the stream directory")
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
            raise BadInput("%s: unsupported processor architecture %d (x64 and x86 are supported)"
                           % (self.path, processor))
        self.arch = ARCH_OF_PROCESSOR[processor]
        self.build = struct.unpack_from("<I", system_info, 16)[0]
        self._modules = self._parse_modules()
        self.threads = self._parse_threads()
        self.exception = self._parse_exception()
        self._parse_memory()

    def _stream(self, name, minimum_size):
        entry = self.streams.get(MINIDUMP_STREAM[name])
        if entry is None:
            return None
        size, rva = entry
        if size < minimum_size:
            raise BadInput("%s: %s stream too small (%d bytes)" % (self.path, name, size))
        return self._bytes(rva, size, "the %s stream" % name)

    def _list(self, name, count_format, entry_size, header=None):
        """(count, stream bytes, first entry offset) of a counted list stream whose
        entries follow a ``header``-byte head starting with the count."""
        if header is None:
            header = struct.calcsize(count_format)
        data = self._stream(name, header)
        if data is None:
            return 0, b"", 0
        count = struct.unpack_from(count_format, data, 0)[0]
        if count > MAX_LIST_ENTRIES or header + count * entry_size > len(data):
            raise BadInput("%s: %s stream holds %d bytes, too few for %d entries"
                           % (self.path, name, len(data), count))
        return count, data, header

    def _string(self, rva):
        length = struct.unpack("<I", self._bytes(rva, 4, "a string"))[0]
        if length > MAX_NAME_BYTES:
            raise BadInput("%s: corrupt string at file offset 0x%x (%d bytes)" % (self.path, rva, length))
        return self._bytes(rva + 4, length, "a string").decode("utf-16-le", "replace")

    def _parse_modules(self):
        count, data, offset = self._list("ModuleList", "<I", MINIDUMP_MODULE_SIZE)
        modules = []
        for index in range(count):
            base, size, _, _, name_rva = struct.unpack_from("<QIIII", data, offset + index * MINIDUMP_MODULE_SIZE)
            path = self._string(name_rva)
            file_name = path.replace("/", "\\").rpartition("\\")[2]
            stem, dot, _ = file_name.rpartition(".")
            modules.append(Module(stem if dot else file_name, base, size, file_name))
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
        count, data, offset = self._list("ThreadList", "<I", MINIDUMP_THREAD_SIZE)
        threads = []
        for index in range(count):
            (thread_id, _, _, _, teb, stack_start, stack_size, _, context_size,
             context_rva) = struct.unpack_from("<IIIIQQIIII", data, offset + index * MINIDUMP_THREAD_SIZE)
            threads.append({"thread_id": thread_id, "teb": teb, "stack_start": stack_start,
                            "stack_size": stack_size, "registers": self._context(context_size, context_rva)})
        return threads

    def _parse_exception(self):
        data = self._stream("Exception", MINIDUMP_EXCEPTION_STREAM["size"])
        if data is None:
            return None
        layout = MINIDUMP_EXCEPTION_STREAM
        thread_id = struct.unpack_from("<I", data, layout["ThreadId"])[0]
        record = layout["ExceptionRecord"]
        code, flags, _, address, parameter_count = struct.unpack_from("<IIQQI", data, record)
        parameters = struct.unpack_from("<15Q", data, record + EXCEPTION_RECORD64["ExceptionInformation"])
        context_size, context_rva = struct.unpack_from("<II", data, layout["ThreadContext"])
        return {"thread_id": thread_id, "code": code, "flags": flags, "address": address,
                "parameters": list(parameters[:min(parameter_count, 15)]),
                "registers": self._context(context_size, context_rva)}

    def _parse_memory(self):
        ranges = []  # (start, end, file offset)
        count, data, offset = self._list("Memory64List", "<Q", 16, header=16)
        if count:
            cursor = struct.unpack_from("<Q", data, 8)[0]
            for index in range(count):
                start, size = struct.unpack_from("<QQ", data, offset + 16 * index)
                self._check(cursor, size, "memory range 0x%x" % start)
                ranges.append((start, start + size, cursor))
                cursor += size
        count, data, offset = self._list("MemoryList", "<I", 16)
        for index in range(count):
            start, size, rva = struct.unpack_from("<QII", data, offset + 16 * index)
            self._check(rva, size, "memory range 0x%x" % start)
            ranges.append((start, start + size, rva))
        ranges = [r for r in ranges if r[1] > r[0]]
        ranges.sort()
        self._ranges = ranges
        self._starts = [start for start, _, _ in ranges]

    # -- memory -----------------------------------------------------------------------

    def read_page(self, page_address):
        starts, ranges = self._starts, self._ranges
        index = bisect_right(starts, page_address) - 1
        if index >= 0:
            start, end, offset = ranges[index]
            if end >= page_address + PAGE_SIZE:
                position = offset + page_address - start
                return self._map[position:position + PAGE_SIZE]
        return self._assemble_page(page_address, max(index, 0))

    def _assemble_page(self, page_address, index):
        """A page put together from several ranges (or none: None)."""
        page = None
        page_end = page_address + PAGE_SIZE
        ranges = self._ranges
        while index < len(ranges) and ranges[index][0] < page_end:
            start, end, offset = ranges[index]
            lo, hi = max(start, page_address), min(end, page_end)
            if lo < hi:
                if page is None:
                    page = bytearray(PAGE_SIZE)
                page[lo - page_address:hi - page_address] = self._map[offset + lo - start:offset + hi - start]
            index += 1
        return bytes(page) if page is not None else None

    def read_pages(self, page_address, count):
        pages = []
        data, starts, ranges = self._map, self._starts, self._ranges
        address = page_address
        end_address = page_address + count * PAGE_SIZE
        while address < end_address:
            index = bisect_right(starts, address) - 1
            if index >= 0 and ranges[index][1] >= address + PAGE_SIZE:
                # Serve every whole page this range covers in one go.
                start, end, offset = ranges[index]
                stop = min(end_address, address + (end - address) // PAGE_SIZE * PAGE_SIZE)
                position = offset + address - start
                for _ in range((stop - address) // PAGE_SIZE):
                    pages.append(data[position:position + PAGE_SIZE])
                    position += PAGE_SIZE
                address = stop
            else:
                pages.append(self._assemble_page(address, max(index, 0)))
                address += PAGE_SIZE
        return pages

    def mapped_ranges(self):
        merged = []
        for start, end, _ in self._ranges:
            if merged and merged[-1][1] >= start:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        return [(start, end) for start, end in merged]

    # -- facts ------------------------------------------------------------------------

    def modules(self):
        return list(self._modules)

    def info(self):
        registers = {}
        if self.exception and self.exception["registers"]:
            registers = self.exception["registers"]
        elif self.threads:
            registers = self.threads[0]["registers"]
        return {
            "kind": self.kind,
            "arch": self.arch,
            "mode": "user",
            "file": self.path,
            "build": self.build,
            "time_date_stamp": self.time_date_stamp,
            "threads": [dict(thread) for thread in self.threads],
            "exception": dict(self.exception) if self.exception else None,
            "registers": dict(registers),
            "memory_ranges": len(self._ranges),
        }

    def close(self):
        if not self._map.closed:
            self._map.close()
