"""Read .etl files: buffers, then events with their provider, opcode and payload.

Only the headers are interpreted (see ``format``); payloads are handed out as bytes.
Compressed buffers are decompressed on the way (``xpress``: plain LZ77 XPRESS,
what Windows' ETW compression and so PerfView's traces use, XPRESS Huffman and
LZNT1 (``lznt1``); ``format`` says how the algorithm is chosen).
Every decompression is bounded (``format.MAX_COMPRESSION_RATIO`` per buffer,
``MAX_DECOMPRESSED_BUFFER`` per buffer, ``max_decompressed`` per file), and a
buffer that decodes to one repeated byte is skipped as a bomb: such buffers are
counted, never decoded past the bounds.  Damage is reported, not raised: a
buffer whose size is impossible ends the file walk, an event whose header is
unknown or whose size runs past the buffer ends that buffer, and a buffer that
cannot be decoded is skipped.  What was read and what was not is in ``EtlReader.summary`` (a
:class:`ReadSummary`): commands show its one-line ``note()`` and put its
``as_dict()`` in their JSON, so skipped buffers are a count with one example,
never one line per buffer and never silence.

The file is read buffer by buffer with positioned reads, not mapped: a trace that
shrinks while it is read (a copy in progress) ends the walk with a problem naming
the file and the offset instead of killing the process with SIGBUS.
"""

import io
import os
import struct
import uuid

from ..errors import BadInput
from ..problems import Problem, ProblemLog
from . import format as fmt
from . import lznt1
from .xpress import decompress, decompress_plain, is_complete_code

# LogFileMode in the logfile header event that opens the first buffer.
_LOGFILE_MODE_OFFSET = fmt.BUFFER_HEADER_SIZE + fmt.SYSTEM_HEADER_SIZES[fmt.SYSTEM64] + fmt.LOGFILE_HEADER_MODE


class ReadSummary(object):
    """What one pass over an .etl file read and what it had to skip.

    Commands show ``note()`` (one line, or None when nothing was skipped) and put
    ``as_dict()`` in their JSON: ``{"buffers", "compressed_buffers",
    "undecodable_buffers", "undecodable_example": problem or null,
    "bomb_buffers", "bomb_example": problem or null, "decompressed_bytes",
    "problems": [problem]}``, where the skipped buffers appear in ``problems``
    once per kind (``etl_buffers_undecodable``, ``etl_decompression_bombs``)
    carrying the count and the example.  A caller that stops reading early calls
    ``finish()`` before using them."""

    def __init__(self, path):
        self.path = path
        self.buffers = 0              # buffers walked
        self.compressed = 0           # compressed buffers decoded
        self.undecodable = 0          # buffers skipped because they could not be decoded
        self.example = None           # the first of those, as a Problem
        self.bombs = 0                # buffers skipped by the decompression bounds
        self.bomb_example = None
        self.decompressed_bytes = 0   # output of every decompression so far (the per-file bound)
        self.problems = ProblemLog()  # damage: truncation, impossible sizes, corrupt events
        self._finished = False

    def skip_buffer(self, buffer, why):
        self.undecodable += 1
        if self.example is None:
            self.example = Problem("etl_buffer_undecodable", offset=buffer.file_offset,
                                   message="buffer %d: %s" % (buffer.index, why))

    def skip_bomb(self, buffer, why):
        self.bombs += 1
        if self.bomb_example is None:
            self.bomb_example = Problem("etl_decompression_bomb", offset=buffer.file_offset,
                                        message="buffer %d: %s" % (buffer.index, why))

    def _undecodable_note(self):
        return ("%d of %d buffers could not be decoded and were skipped (first: %s at offset 0x%x)"
                % (self.undecodable, self.buffers, self.example.message, self.example.offset))

    def _bomb_note(self):
        return ("%d of %d compressed buffers were skipped as decompression bombs (first: %s at offset 0x%x)"
                % (self.bombs, self.buffers, self.bomb_example.message, self.bomb_example.offset))

    def note(self):
        """One line about the skipped buffers, or None when every buffer was read."""
        parts = ([self._undecodable_note()] if self.undecodable else []) + ([self._bomb_note()] if self.bombs else [])
        return "%s: %s" % (self.path, "; ".join(parts)) if parts else None

    def finish(self):
        """Add the skipped buffers to ``problems``, one problem per kind (once); returns self."""
        if not self._finished:
            self._finished = True
            if self.undecodable:
                self.problems.append(Problem("etl_buffers_undecodable", offset=self.example.offset,
                                             message="%s: %s" % (self.path, self._undecodable_note())))
            if self.bombs:
                self.problems.append(Problem("etl_decompression_bombs", offset=self.bomb_example.offset,
                                             message="%s: %s" % (self.path, self._bomb_note())))
            self.problems.finish()
        return self

    def as_dict(self):
        return {"buffers": self.buffers, "compressed_buffers": self.compressed,
                "undecodable_buffers": self.undecodable,
                "undecodable_example": self.example.as_dict() if self.example else None,
                "bomb_buffers": self.bombs,
                "bomb_example": self.bomb_example.as_dict() if self.bomb_example else None,
                "decompressed_bytes": self.decompressed_bytes,
                "problems": self.problems.as_list()}


class DecompressionBomb(BadInput):
    """A buffer the decompression bounds refuse (the message says which bound)."""


def buffer_algorithm(payload):
    """The COMPRESSION_FORMAT_* of a compressed payload whose file announces none
    (``format``, rule 2): XPRESS Huffman when it opens with a complete Huffman
    code-length table, else plain XPRESS."""
    if len(payload) > 256 and is_complete_code(payload[:256]):
        return fmt.COMPRESSION_FORMAT_XPRESS_HUFF
    return fmt.COMPRESSION_FORMAT_XPRESS


class Buffer(object):
    __slots__ = ("index", "file_offset", "size", "used", "timestamp", "sequence", "processor",
                 "logger_id", "flags", "buffer_type", "data", "saved_offset")

    def __init__(self, index, file_offset, data):
        (self.size, self.saved_offset, current_offset, _refs, self.timestamp, self.sequence, _clock,
         self.processor, _alignment, self.logger_id, _state, offset, self.flags, self.buffer_type,
         _reserved) = fmt.BUFFER_HEADER.unpack_from(data)
        self.index = index
        self.file_offset = file_offset
        self.data = data
        self.used = self.size
        for candidate in (self.saved_offset, offset, current_offset):
            if fmt.BUFFER_HEADER_SIZE <= candidate <= self.size:
                self.used = candidate
                break

    @property
    def compressed(self):
        return bool(self.flags & fmt.BUFFER_FLAG_COMPRESSED)

    def decompressed(self, compression_format, budget=fmt.MAX_DECOMPRESSED_FILE):
        """This buffer with its payload decompressed (``used`` = SavedOffset), or
        XpressError/BadInput saying why it cannot be, or DecompressionBomb when
        the bounds refuse it: more than MAX_COMPRESSION_RATIO times the
        compressed payload, more than MAX_DECOMPRESSED_BUFFER or ``budget`` (what
        the file may still decompress to), or one repeated byte.
        ``compression_format`` is the file's announced format, or None (then
        the buffer decides: ``buffer_algorithm``)."""
        size = self.saved_offset
        if not fmt.BUFFER_HEADER_SIZE <= size <= fmt.MAX_BUFFER_SIZE:
            raise BadInput("impossible decompressed size %d (SavedOffset)" % size)
        compressed = self.data[fmt.BUFFER_HEADER_SIZE:]
        wanted = size - fmt.BUFFER_HEADER_SIZE
        if wanted > fmt.MAX_COMPRESSION_RATIO * max(len(compressed), 1):
            raise DecompressionBomb("%d bytes would decode to %d (more than %d times)"
                                    % (len(compressed), wanted, fmt.MAX_COMPRESSION_RATIO))
        if wanted > min(fmt.MAX_DECOMPRESSED_BUFFER, budget):
            raise DecompressionBomb("would decode to %d bytes, past the %s bound of %d"
                                    % (wanted, "per-buffer" if wanted > fmt.MAX_DECOMPRESSED_BUFFER else "per-file",
                                       min(fmt.MAX_DECOMPRESSED_BUFFER, budget)))
        algorithm = compression_format if compression_format is not None else buffer_algorithm(compressed)
        where = "buffer %d at offset 0x%x" % (self.index, self.file_offset)
        if algorithm == fmt.COMPRESSION_FORMAT_XPRESS:
            payload = decompress_plain(compressed, wanted, where)
        elif algorithm == fmt.COMPRESSION_FORMAT_XPRESS_HUFF:
            payload = decompress(compressed, wanted, where)
        else:
            payload = lznt1.decompress(compressed, wanted, where)
        if payload and not payload.strip(payload[:1]):
            raise DecompressionBomb("decodes to %d copies of byte 0x%02x" % (len(payload), payload[0]))
        buffer = Buffer(self.index, self.file_offset, self.data[:fmt.BUFFER_HEADER_SIZE] + payload)
        buffer.size = buffer.used = size
        return buffer


class Event(object):
    """One event: ``provider`` is a uuid.UUID when known (classic/manifest events
    carry it; system events get their group's GUID when the group is known).
    ``offset`` is the buffer's file offset plus the event's offset in the buffer
    as decoded (for a compressed buffer, in its decompressed bytes)."""

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


class _FileBytes(object):
    """Positioned reads of a file; a read past what is there comes back short."""

    def __init__(self, path):
        try:
            self._handle = io.open(path, "rb")
            self.size = os.fstat(self._handle.fileno()).st_size
        except OSError as error:
            raise BadInput("cannot read %s: %s" % (path, error.strerror or error))

    def read(self, offset, size):
        try:
            if hasattr(os, "pread"):
                return os.pread(self._handle.fileno(), size, offset)
            self._handle.seek(offset)
            return self._handle.read(size)
        except OSError:
            return b""

    def close(self):
        self._handle.close()


class _MemoryBytes(object):
    def __init__(self, data):
        self._data = bytes(data)
        self.size = len(self._data)

    def read(self, offset, size):
        return self._data[offset:offset + size]

    def close(self):
        pass


class EtlReader(object):
    """``EtlReader(path_or_bytes)``; iterate :meth:`events` (or :meth:`buffers`);
    ``summary`` says what was read and skipped.  A context manager: leaving it
    closes the file."""

    def __init__(self, source, max_buffers=1000000, max_decompressed=fmt.MAX_DECOMPRESSED_FILE):
        if isinstance(source, (bytes, bytearray)):
            self._file = _MemoryBytes(source)
            self.path = "<bytes>"
        else:
            self._file = _FileBytes(source)
            self.path = source
        self.max_buffers = max_buffers
        self.max_decompressed = max_decompressed
        self.summary = ReadSummary(self.path)
        head = self._file.read(0, _LOGFILE_MODE_OFFSET + 4)
        try:
            if len(head) < fmt.BUFFER_HEADER_SIZE:
                raise BadInput("%s is not an .etl file (%d bytes)" % (self.path, self._file.size))
            first_size = fmt.BUFFER_HEADER.unpack_from(head)[0]
            if not fmt.BUFFER_HEADER_SIZE < first_size <= fmt.MAX_BUFFER_SIZE:
                raise BadInput("%s is not an .etl file (first buffer size %d)" % (self.path, first_size))
        except BadInput:
            self.close()
            raise
        self.compression_format = self._compression_format(head)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    @property
    def problems(self):
        return self.summary.problems

    @staticmethod
    def _compression_format(head):
        """The COMPRESSION_FORMAT_* the logfile header announces (``format``, rule
        1), or None when it announces none it knows: each buffer decides then."""
        if fmt.looks_like_etl(head) and len(head) >= _LOGFILE_MODE_OFFSET + 4:
            mode = struct.unpack_from("<I", head, _LOGFILE_MODE_OFFSET)[0]
            if mode & fmt.EVENT_TRACE_COMPRESSED_MODE:
                announced = struct.unpack_from("<H", head, fmt.BUFFER_STATE_OFFSET)[0]
                if announced in fmt.COMPRESSION_FORMAT_NAMES:
                    return announced
        return None

    def buffers(self):
        """The file's buffers as stored (compressed ones still compressed)."""
        offset = 0
        index = 0
        summary = self.summary
        file_size = self._file.size
        while offset + fmt.BUFFER_HEADER_SIZE <= file_size and index < self.max_buffers:
            header = self._file.read(offset, fmt.BUFFER_HEADER_SIZE)
            if len(header) < fmt.BUFFER_HEADER_SIZE:
                self._changed(offset)
                break
            size = fmt.BUFFER_HEADER.unpack_from(header)[0]
            if not fmt.BUFFER_HEADER_SIZE < size <= fmt.MAX_BUFFER_SIZE:
                summary.problems.add("etl_buffer_size", offset=offset, message="buffer %d: impossible BufferSize %d; "
                                     "stopped" % (index, size))
                break
            if offset + size > file_size:
                summary.problems.add("etl_truncated", offset=offset, message="buffer %d: truncated (%d of %d bytes)"
                                     % (index, file_size - offset, size))
                break
            data = self._file.read(offset, size)
            if len(data) < size:
                self._changed(offset)
                break
            summary.buffers += 1
            yield Buffer(index, offset, data)
            offset += size
            index += 1
        summary.finish()

    def _changed(self, offset):
        self.summary.problems.add("etl_file_changed", offset=offset,
                                  message="%s changed while being read: the buffer at offset 0x%x is no longer "
                                  "in the file" % (self.path, offset))

    def decoded_buffers(self):
        """The file's buffers with compressed ones decompressed (within the bounds);
        those that cannot be are counted in ``summary`` and left out."""
        summary = self.summary
        for buffer in self.buffers():
            if buffer.compressed:
                try:
                    buffer = buffer.decompressed(self.compression_format,
                                                 self.max_decompressed - summary.decompressed_bytes)
                except DecompressionBomb as error:
                    summary.skip_bomb(buffer, str(error))
                    continue
                except BadInput as error:
                    summary.skip_buffer(buffer, str(error))
                    continue
                summary.compressed += 1
                summary.decompressed_bytes += buffer.size - fmt.BUFFER_HEADER_SIZE
            yield buffer

    def events(self):
        for buffer in self.decoded_buffers():
            for event in self._buffer_events(buffer):
                yield event

    def close(self):
        self._file.close()

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
        self.summary.problems.add("etl_event_corrupt", offset=buffer.file_offset + offset,
                                  message="buffer %d at +0x%x: %s; rest of buffer skipped" % (buffer.index, offset, why))

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
            # A compact header lacks the last 8 bytes: pad this event's bytes, never
            # the whole buffer (a copy per event is quadratic in the buffer).
            rest = bytes(data[offset + 8:offset + 8 + fmt.SYSTEM_REST.size])
            event.thread_id, event.process_id, event.timestamp, _k, _u = fmt.SYSTEM_REST.unpack(
                rest.ljust(fmt.SYSTEM_REST.size, b"\0"))
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
    """Events of an .etl file (path, bytes, or an EtlReader whose ``summary`` the
    caller reports), optionally only one provider (uuid.UUID or its string) and/or
    one opcode (event type)."""
    if provider is not None and not isinstance(provider, uuid.UUID):
        provider = uuid.UUID(str(provider))
    owned = None if isinstance(source, EtlReader) else EtlReader(source)
    reader = source if owned is None else owned
    try:
        for event in reader.events():
            if provider is not None and event.provider != provider:
                continue
            if opcode is not None and event.opcode != opcode:
                continue
            yield event
    finally:
        if owned is not None:
            owned.close()
