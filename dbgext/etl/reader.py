"""Read .etl files: buffers, then events with their provider, opcode and payload.

Only the headers are interpreted (see ``format``); payloads are handed out as bytes.
Damage is reported, not raised: a buffer whose size is impossible ends the file
walk, an event whose header is unknown or whose size runs past the buffer ends
that buffer, and each such stop is recorded in ``EtlReader.problems``.
"""

import io
import mmap
import uuid

from ..errors import BadInput
from . import format as fmt


class Buffer(object):
    __slots__ = ("index", "file_offset", "size", "used", "timestamp", "sequence", "processor",
                 "logger_id", "flags", "buffer_type", "data")

    def __init__(self, index, file_offset, data):
        (self.size, saved_offset, current_offset, _refs, self.timestamp, self.sequence, _clock,
         self.processor, _alignment, self.logger_id, _state, offset, self.flags, self.buffer_type,
         _reserved) = fmt.BUFFER_HEADER.unpack_from(data)
        self.index = index
        self.file_offset = file_offset
        self.data = data
        self.used = self.size
        for candidate in (saved_offset, offset, current_offset):
            if fmt.BUFFER_HEADER_SIZE <= candidate <= self.size:
                self.used = candidate
                break


class Event(object):
    """One event: ``provider`` is a uuid.UUID when known (classic/manifest events
    carry it; system events get their group's GUID when the group is known)."""

    __slots__ = ("header_type", "provider", "group", "opcode", "event_id", "version", "thread_id",
                 "process_id", "timestamp", "pointer_size", "payload", "buffer_index", "offset",
                 "processor")

    def __init__(self, header_type, buffer, offset):
        self.header_type = header_type
        self.buffer_index = buffer.index
        self.processor = buffer.processor
        self.offset = offset
        self.pointer_size = fmt.POINTER_SIZE.get(header_type, 8)
        self.provider = None
        self.group = None
        self.opcode = 0
        self.event_id = None
        self.version = 0
        self.thread_id = self.process_id = 0
        self.timestamp = 0
        self.payload = b""

    @property
    def hook_id(self):
        return None if self.group is None else (self.group << 8) | self.opcode

    def __repr__(self):
        return "Event(%s, opcode=%d, %d bytes)" % (self.provider or "group 0x%x" % (self.group or 0),
                                                  self.opcode, len(self.payload))


class EtlReader(object):
    """``EtlReader(path_or_bytes)``; iterate :meth:`events` (or :meth:`buffers`)."""

    def __init__(self, source, max_buffers=1000000):
        if isinstance(source, (bytes, bytearray)):
            self._data = bytes(source)
            self.path = "<bytes>"
        else:
            # Traces run to gigabytes: map the file and copy one buffer at a time.
            self.path = source
            try:
                with io.open(source, "rb") as handle:
                    self._data = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as error:
                raise BadInput("cannot read %s: %s" % (source, getattr(error, "strerror", None) or error))
        self.max_buffers = max_buffers
        self.problems = []
        if len(self._data) < fmt.BUFFER_HEADER_SIZE:
            raise BadInput("%s is not an .etl file (%d bytes)" % (self.path, len(self._data)))
        first_size = fmt.BUFFER_HEADER.unpack_from(self._data)[0]
        if not fmt.BUFFER_HEADER_SIZE < first_size <= fmt.MAX_BUFFER_SIZE:
            raise BadInput("%s is not an .etl file (first buffer size %d)" % (self.path, first_size))

    def buffers(self):
        offset = 0
        index = 0
        data = self._data
        while offset + fmt.BUFFER_HEADER_SIZE <= len(data) and index < self.max_buffers:
            size = fmt.BUFFER_HEADER.unpack_from(data, offset)[0]
            if not fmt.BUFFER_HEADER_SIZE < size <= fmt.MAX_BUFFER_SIZE:
                self.problems.append((offset, "buffer %d: impossible BufferSize %d; stopped" % (index, size)))
                return
            if offset + size > len(data):
                self.problems.append((offset, "buffer %d: truncated (%d of %d bytes)"
                                      % (index, len(data) - offset, size)))
                return
            yield Buffer(index, offset, data[offset:offset + size])
            offset += size
            index += 1

    def events(self):
        for buffer in self.buffers():
            if buffer.flags & fmt.BUFFER_FLAG_COMPRESSED:
                self.problems.append((buffer.file_offset, "buffer %d is compressed; skipped" % buffer.index))
                continue
            for event in self._buffer_events(buffer):
                yield event

    def _buffer_events(self, buffer):
        data = buffer.data
        offset = fmt.BUFFER_HEADER_SIZE
        end = buffer.used
        while offset + 4 <= end:
            first = int.from_bytes(data[offset:offset + 4], "little")
            if first == fmt.PADDING_MARKER:
                return
            header_type = (first >> 16) & 0xFF
            if (first >> 24) & fmt.MARKER_FLAGS != fmt.MARKER_FLAGS:
                self._stop(buffer, offset, "no event marker (0x%08x)" % first)
                return
            event = Event(header_type, buffer, buffer.file_offset + offset)
            if header_type in fmt.SYSTEM_HEADER_SIZES:
                size = self._system(event, data, offset)
            elif header_type in (fmt.FULL_HEADER32, fmt.FULL_HEADER64, fmt.INSTANCE32, fmt.INSTANCE64):
                size = self._full(event, data, offset)
            elif header_type in (fmt.EVENT_HEADER32, fmt.EVENT_HEADER64):
                size = self._event_header(event, data, offset)
            else:
                self._stop(buffer, offset, "unknown header type %d" % header_type)
                return
            if size is None or offset + size > end:
                self._stop(buffer, offset, "event size runs past the buffer's used part")
                return
            yield event
            offset += (size + 7) & ~7

    def _stop(self, buffer, offset, why):
        self.problems.append((buffer.file_offset + offset, "buffer %d at +0x%x: %s; rest of buffer skipped"
                              % (buffer.index, offset, why)))

    @staticmethod
    def _system(event, data, offset):
        header_size = fmt.SYSTEM_HEADER_SIZES[event.header_type]
        if offset + header_size > len(data):
            return None
        event.version, _type, _flags, size, event.opcode, event.group = fmt.SYSTEM_PREFIX.unpack_from(data, offset)
        if size < header_size:
            return None
        if header_size == 0x10:
            event.timestamp = int.from_bytes(data[offset + 8:offset + 16], "little")
        else:
            event.thread_id, event.process_id, event.timestamp, _k, _u = fmt.SYSTEM_REST.unpack_from(
                data + bytes(8), offset + 8)
        event.provider = fmt.GROUP_GUIDS.get(event.group)
        event.payload = data[offset + header_size:offset + size]
        return size

    @staticmethod
    def _full(event, data, offset):
        if offset + fmt.FULL_HEADER_SIZE > len(data):
            return None
        (size, _type, _marker, event.opcode, _level, event.version, event.thread_id, event.process_id,
         event.timestamp, guid, _k, _u) = fmt.FULL_HEADER.unpack_from(data, offset)
        if size < fmt.FULL_HEADER_SIZE:
            return None
        event.provider = uuid.UUID(bytes_le=guid)
        event.payload = data[offset + fmt.FULL_HEADER_SIZE:offset + size]
        return size

    @staticmethod
    def _event_header(event, data, offset):
        if offset + fmt.EVENT_HEADER_SIZE > len(data):
            return None
        (size, _type, _marker, _flags, _property, event.thread_id, event.process_id, event.timestamp,
         guid, event.event_id, event.version, _channel, _level, event.opcode, _task, _keyword,
         _cpu, _activity) = fmt.EVENT_HEADER.unpack_from(data, offset)
        if size < fmt.EVENT_HEADER_SIZE:
            return None
        event.provider = uuid.UUID(bytes_le=guid)
        event.payload = data[offset + fmt.EVENT_HEADER_SIZE:offset + size]
        return size


def iter_events(source, provider=None, opcode=None):
    """Events of an .etl file (path or bytes), optionally only one provider
    (uuid.UUID or its string) and/or one opcode (event type)."""
    if provider is not None and not isinstance(provider, uuid.UUID):
        provider = uuid.UUID(str(provider))
    for event in EtlReader(source).events():
        if provider is not None and event.provider != provider:
            continue
        if opcode is not None and event.opcode != opcode:
            continue
        yield event
