"""Write small, valid .etl files (for tests and fixtures): buffers with
WMI_BUFFER_HEADERs, a logfile-header event first, then system, classic
(EVENT_TRACE_HEADER) or manifest (EVENT_HEADER) events, 8-byte aligned, with the
unused tail of each buffer filled with 0xFF as Windows leaves it."""

import io
import struct
import uuid

from dbgext.etl import format as fmt


class EtlWriter(object):
    def __init__(self, buffer_size=0x10000, pointer_size=8, logger_id=0x11, start_time=0x01DB000000000000):
        if buffer_size < 0x400 or buffer_size % 8:
            raise ValueError("buffer size must be a multiple of 8 and at least 0x400")
        self.buffer_size = buffer_size
        self.pointer_size = pointer_size
        self.logger_id = logger_id
        self.timestamp = start_time
        self._buffers = []
        self._current = bytearray()
        self._header_event()

    def _header_event(self):
        # Group 0 / type 0: the logfile header; consumers read BufferSize and version from it.
        payload = struct.pack("<IIII", self.buffer_size, 0x0501000A, 0, 1) + bytes(0x100)
        self.add_system_event(fmt.EVENT_TRACE_GROUP, 0, payload)

    def _next_timestamp(self, timestamp):
        if timestamp is None:
            self.timestamp += 10
            return self.timestamp
        return timestamp

    def _append(self, record):
        aligned = (len(record) + 7) & ~7
        if aligned > self.buffer_size - fmt.BUFFER_HEADER_SIZE:
            raise ValueError("event of %d bytes does not fit a 0x%x buffer" % (len(record), self.buffer_size))
        if fmt.BUFFER_HEADER_SIZE + len(self._current) + aligned > self.buffer_size:
            self._flush()
        self._current += record + b"\0" * (aligned - len(record))

    def _flush(self):
        used = fmt.BUFFER_HEADER_SIZE + len(self._current)
        header = fmt.BUFFER_HEADER.pack(self.buffer_size, used, used, 0, self.timestamp, len(self._buffers),
                                        0, 0, 0, self.logger_id, 2, used, 0, 0, bytes(16))
        self._buffers.append(header + bytes(self._current) + b"\xFF" * (self.buffer_size - used))
        self._current = bytearray()

    def add_system_event(self, group, opcode, payload, thread_id=0, process_id=0, timestamp=None,
                         header="system"):
        """A kernel event with a SYSTEM_TRACE_HEADER ("system"), its compact form
        ("compact") or a PERFINFO_TRACE_HEADER ("perfinfo")."""
        wide = self.pointer_size == 8
        header_type, size = {
            "system": (fmt.SYSTEM64 if wide else fmt.SYSTEM32, 0x20),
            "compact": (fmt.COMPACT64 if wide else fmt.COMPACT32, 0x18),
            "perfinfo": (fmt.PERFINFO64 if wide else fmt.PERFINFO32, 0x10),
        }[header]
        timestamp = self._next_timestamp(timestamp)
        total = size + len(payload)
        if total > 0xFFFF:
            raise ValueError("event too large")
        record = fmt.SYSTEM_PREFIX.pack(2, header_type, fmt.MARKER_FLAGS, total, opcode, group)
        if size == 0x10:
            record += struct.pack("<Q", timestamp)
        else:
            record += fmt.SYSTEM_REST.pack(thread_id, process_id, timestamp, 0, 0)[:size - 8]
        self._append(record + bytes(payload))

    def add_classic_event(self, provider, opcode, payload, thread_id=0, process_id=0, timestamp=None,
                          version=0, level=4):
        """An event with an EVENT_TRACE_HEADER naming ``provider`` (a GUID)."""
        guid = provider if isinstance(provider, uuid.UUID) else uuid.UUID(str(provider))
        header_type = fmt.FULL_HEADER64 if self.pointer_size == 8 else fmt.FULL_HEADER32
        total = fmt.FULL_HEADER_SIZE + len(payload)
        record = fmt.FULL_HEADER.pack(total, header_type, fmt.MARKER_FLAGS, opcode, level, version, thread_id,
                                      process_id, self._next_timestamp(timestamp), guid.bytes_le, 0, 0)
        self._append(record + bytes(payload))

    def add_manifest_event(self, provider, event_id, payload, opcode=0, thread_id=0, process_id=0,
                           timestamp=None, version=0, level=4, task=0, keyword=0):
        """An event with an EVENT_HEADER (manifest / TraceLogging providers)."""
        guid = provider if isinstance(provider, uuid.UUID) else uuid.UUID(str(provider))
        header_type = fmt.EVENT_HEADER64 if self.pointer_size == 8 else fmt.EVENT_HEADER32
        total = fmt.EVENT_HEADER_SIZE + len(payload)
        record = fmt.EVENT_HEADER.pack(total, header_type, fmt.MARKER_FLAGS, 0, 0, thread_id, process_id,
                                       self._next_timestamp(timestamp), guid.bytes_le, event_id, version, 0,
                                       level, opcode, task, keyword, 0, bytes(16))
        self._append(record + bytes(payload))

    # -- StackWalk helpers ------------------------------------------------------------

    def _pointers(self, values):
        return struct.pack("<%d%s" % (len(values), "Q" if self.pointer_size == 8 else "I"), *values)

    def add_stack_walk(self, frames, process_id=4, thread_id=8, timestamp=None, header="system"):
        timestamp = self._next_timestamp(timestamp)
        payload = struct.pack("<QII", timestamp, process_id, thread_id) + self._pointers(frames)
        self.add_system_event(fmt.STACKWALK_GROUP, fmt.STACK_WALK, payload, thread_id, process_id,
                              timestamp, header)

    def add_stack_key(self, key, user=False, process_id=4, thread_id=8, timestamp=None, header="system"):
        timestamp = self._next_timestamp(timestamp)
        payload = struct.pack("<QII", timestamp, process_id, thread_id) + self._pointers([key])
        self.add_system_event(fmt.STACKWALK_GROUP, fmt.STACK_KEY_USER if user else fmt.STACK_KEY_KERNEL,
                              payload, thread_id, process_id, timestamp, header)

    def add_stack_definition(self, key, frames, rundown=False, header="system"):
        opcode = fmt.STACK_RUNDOWN_DEFINITION if rundown else fmt.STACK_DELETE_DEFINITION
        self.add_system_event(fmt.STACKWALK_GROUP, opcode, self._pointers([key] + list(frames)), header=header)

    # -- output -----------------------------------------------------------------------

    def to_bytes(self):
        """The file's bytes (pending events are flushed into a last buffer)."""
        if self._current:
            self._flush()
        return b"".join(self._buffers)

    def write(self, path):
        data = self.to_bytes()
        with io.open(path, "wb") as handle:
            handle.write(data)
        return path
