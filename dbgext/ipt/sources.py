"""Layer 2: where trace bytes come from.

* raw bytes (a file, or an address range in the target);
* an ETW IntelProcessorTrace event: a 32-byte header (EventTimeStamp, Process,
  Thread, IptOption, TraceSize, TracePosition) followed by the trace;
* ipt.sys's process trace (IPT_TRACE_DATA with one IPT_TRACE_HEADER per thread);
* wrapped ring buffers: when the buffer is full, the oldest data starts at the write
  position, so the buffer is read from there, across the wrap, back to it.

Every source yields :class:`TraceBuffer` objects; the decoders take ``buffer.data``
and report offsets into it, which ``buffer.original_offset`` maps back to offsets
in the buffer as it sits in memory or in the file.
"""

import collections
import re
import struct

from ..errors import BadInput, UnreadableMemory
from .packets import PSB

IPT_EVENT_TYPE = 32

EVENT_HEADER = struct.Struct("<QIIQII")  # EventTimeStamp, Process, Thread, IptOption, TraceSize, TracePosition
EVENT_HEADER_FIELDS = ("EventTimeStamp", "Process", "Thread", "IptOption", "TraceSize", "TracePosition")

# _IPT_OPTION bit fields: name -> (first bit, width), as ipt.sys's type information prints them.
IPT_OPTION_LAYOUT = (("TraceMode", 0, 4), ("TimeMode", 4, 4), ("MTCFreq", 8, 4), ("CycThresh", 12, 4),
                     ("BufferSize", 16, 4), ("TraceSessionMode", 20, 3), ("TraceChild", 23, 1),
                     ("TraceCodeMode", 24, 4), ("Reserved", 28, 36))
TIME_MODES = {0: "no timing packets", 1: "MTC + TSC", 2: "CYC + MTC + TSC"}
SESSION_MODES = {0: "any application", 1: "by image file name", 2: "any package", 3: "by package name"}
CODE_MODES = {0: "user", 1: "kernel", 2: "user + kernel", 3: "user (registry)", 4: "kernel (registry)",
              5: "user + kernel (registry)"}

MAX_TRACE_SIZE = 128 << 20   # the largest ToPA buffer _IPT_OPTION.BufferSize can ask for


def decode_ipt_option(value):
    """_IPT_OPTION field by field, plus readable meanings and the buffer size in bytes."""
    fields = {name: value >> shift & ((1 << width) - 1) for name, shift, width in IPT_OPTION_LAYOUT}
    fields["Value"] = value
    fields["BufferBytes"] = 4096 << fields["BufferSize"]
    fields["TimeModeText"] = TIME_MODES.get(fields["TimeMode"], "unknown")
    fields["TraceSessionModeText"] = SESSION_MODES.get(fields["TraceSessionMode"], "unknown")
    fields["TraceCodeModeText"] = CODE_MODES.get(fields["TraceCodeMode"], "unknown")
    return fields


def ipt_option_value(fields):
    """The inverse of decode_ipt_option for the named bit fields."""
    value = 0
    for name, shift, width in IPT_OPTION_LAYOUT:
        value |= (fields.get(name, 0) & ((1 << width) - 1)) << shift
    return value


def encode_event_header(event_time_stamp, process, thread, ipt_option, trace_size, trace_position):
    return EVENT_HEADER.pack(event_time_stamp, process, thread, ipt_option, trace_size, trace_position)


class TraceBuffer(object):
    """Trace bytes ready to decode, and where they came from.

    ``data`` is linear (a wrapped ring already unrolled).  ``ring_start`` is the
    offset in the stored buffer where ``data`` begins and ``ring_size`` its size, so
    stored offset = (offset + ring_start) % ring_size."""

    __slots__ = ("data", "origin", "address", "ring_start", "ring_size", "header", "notes")

    def __init__(self, data, origin, address=None, ring_start=0, ring_size=None, header=None):
        self.data = data
        self.origin = origin
        self.address = address
        self.ring_start = ring_start
        self.ring_size = ring_size if ring_size is not None else len(data)
        self.header = header
        self.notes = []

    def original_offset(self, offset):
        if not self.ring_size:
            return offset
        return (offset + self.ring_start) % self.ring_size if self.ring_start else offset

    def describe(self):
        document = {"origin": self.origin, "size": len(self.data)}
        if self.address is not None:
            document["address"] = self.address
        if self.ring_start:
            document["position"] = self.ring_start
        if self.header is not None:
            document["header"] = self.header
        if self.notes:
            document["notes"] = list(self.notes)
        return document


def unwrap(data, position, origin, address=None, header=None):
    """A ring buffer whose oldest byte is at ``position``: unrolled from there, across the
    wrap, back to ``position``.  Decoding then starts at the first PSB, as libipt does."""
    size = len(data)
    if position is None or position == 0 or size == 0:
        return TraceBuffer(data, origin, address, header=header)
    if not 0 <= position < size:
        raise BadInput("position %d is outside the %d-byte buffer" % (position, size))
    buffer = TraceBuffer(data[position:] + data[:position], origin, address, position, size, header)
    return buffer


def from_bytes(data, origin="bytes", position=None):
    return unwrap(bytes(data), position, origin)


def from_file(path, position=None):
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise BadInput("cannot read %s: %s" % (path, error.strerror or error))
    return unwrap(data, position, path)


def from_target(target, address, size, position=None):
    """Raw trace in target memory; unreadable pages become zero bytes and a note."""
    if size <= 0 or size > MAX_TRACE_SIZE:
        raise BadInput("trace size %d is out of range (1..%d)" % (size, MAX_TRACE_SIZE))
    read = target.try_read(address, size)
    if read.holes and len(read.holes) == 1 and read.holes[0] == (address, address + size):
        raise UnreadableMemory(address, size)
    buffer = unwrap(read.data, position, "memory", address)
    for start, end in read.holes:
        buffer.notes.append("bytes %s..%s are unreadable (decoded as PAD/zero)"
                            % (target.format_address(start), target.format_address(end)))
    return buffer


def parse_event_header(raw):
    """The 32-byte IntelProcessorTrace event header as a dict (IptOption decoded)."""
    if len(raw) < EVENT_HEADER.size:
        raise BadInput("an IPT event header needs %d bytes, got %d" % (EVENT_HEADER.size, len(raw)))
    header = dict(zip(EVENT_HEADER_FIELDS, EVENT_HEADER.unpack_from(raw)))
    header["IptOptionFields"] = decode_ipt_option(header["IptOption"])
    return header


def event_buffer(header, trace, origin, address=None, position=None):
    """TraceBuffer for an event's trace, handling the wrapped case and bad sizes.

    ``trace`` holds the bytes present after the header (possibly fewer than TraceSize).
    A full buffer (TraceSize of at least IptOption's buffer size) with its write
    position inside the data has wrapped: it is unrolled from TracePosition.
    ``position`` (given by the user) overrides that: the trace present is a ring
    whose oldest byte is there."""
    if position is not None:
        header = dict(header, TracePosition=position, TraceSize=len(trace))
        header["IptOptionFields"] = dict(header["IptOptionFields"], BufferBytes=len(trace))
        if not 0 <= position < max(len(trace), 1):
            raise BadInput("position %d is outside the %d-byte trace" % (position, len(trace)))
    notes = []
    full = header["TraceSize"]
    position = header["TracePosition"]
    size = min(full, len(trace))
    if len(trace) < full:
        notes.append("TraceSize %d is larger than the %d bytes present; decoding those" % (full, len(trace)))
    trace = trace[:size]
    buffer_full = full >= header["IptOptionFields"]["BufferBytes"]
    if position > full:
        notes.append("TracePosition %d is beyond the trace; decoding from the start" % position)
    elif 0 < position < full and buffer_full and size == full:
        buffer = unwrap(trace, position, origin, address, header)
        buffer.notes.extend(notes + ["the buffer wrapped: oldest data at TracePosition %d" % position])
        return buffer
    elif 0 < position < full and buffer_full:
        notes.append("the ring wrapped at TracePosition %d but is incomplete; decoding it as stored" % position)
    elif 0 < position < full:
        notes.append("TracePosition %d is inside the data of a buffer that is not full; decoding as stored "
                     "(a position of %d unrolls it)" % (position, position))
    buffer = TraceBuffer(trace, origin, address, header=header)
    buffer.notes.extend(notes)
    return buffer


def event_from_bytes(data, origin="event", position=None):
    header = parse_event_header(data)
    return event_buffer(header, data[EVENT_HEADER.size:], origin, position=position)


def event_from_target(target, address, position=None):
    """An IntelProcessorTrace event (header + trace) at ``address`` in the target."""
    header = parse_event_header(target.read(address, EVENT_HEADER.size))
    size = header["TraceSize"]
    if size > MAX_TRACE_SIZE:
        raise BadInput("IPT event at %s: TraceSize %d is implausible" % (target.format_address(address), size))
    read = target.try_read(address + EVENT_HEADER.size, size)
    trace = read.data
    if read.holes:
        # Keep the readable prefix only: a hole in the middle would decode as PADs.
        trace = trace[:read.holes[0][0] - read.address]
    buffer = event_buffer(header, trace, "event", address + EVENT_HEADER.size, position)
    if read.holes:
        buffer.notes.append("trace bytes from %s are unreadable" % target.format_address(read.holes[0][0]))
    return buffer


# -- ipt.sys process trace -----------------------------------------------------------

TRACE_DATA_HEADER = struct.Struct("<HHI")        # TraceVersion, ValidTrace, TraceSize


def thread_header_struct(pointer_size):
    # ThreadId (pointer-sized), TimingSettings, MtcFrequency, FrequencyToTscRatio, RingBufferOffset, TraceSize
    return struct.Struct("<QIIIII" if pointer_size == 8 else "<IIIIII")


def process_trace_buffers(data, pointer_size=8, origin="process trace"):
    """IPT_TRACE_DATA from ipt.sys: one TraceBuffer per thread (rings unrolled at
    RingBufferOffset).  Malformed headers stop the walk with a note on the last buffer
    (or a BadInput when nothing could be read)."""
    if len(data) < TRACE_DATA_HEADER.size:
        raise BadInput("IPT_TRACE_DATA needs %d bytes, got %d" % (TRACE_DATA_HEADER.size, len(data)))
    version, valid, total = TRACE_DATA_HEADER.unpack_from(data)
    if version != 1:
        raise BadInput("IPT_TRACE_DATA version %d is not 1" % version)
    end = TRACE_DATA_HEADER.size + total
    problems = []
    if end > len(data):
        problems.append("TraceSize %d is larger than the %d bytes present" % (total, len(data) - 8))
        end = len(data)
    thread_header = thread_header_struct(pointer_size)
    buffers = []
    offset = TRACE_DATA_HEADER.size
    while offset + thread_header.size <= end and len(buffers) < 4096:
        thread, timing, mtc, ratio, ring_offset, size = thread_header.unpack_from(data, offset)
        start = offset + thread_header.size
        if start + size > end:
            problems.append("thread 0x%x: TraceSize %d runs past the data at offset %d" % (thread, size, start))
            size = end - start
        trace = data[start:start + size]
        header = {"ThreadId": thread, "TimingSettings": timing, "MtcFrequency": mtc,
                  "FrequencyToTscRatio": ratio, "RingBufferOffset": ring_offset, "TraceSize": size}
        if ring_offset > size:
            buffer = TraceBuffer(trace, "%s thread 0x%x" % (origin, thread), header=header)
            buffer.notes.append("RingBufferOffset %d is beyond the trace" % ring_offset)
        else:
            buffer = unwrap(trace, ring_offset % size if size else 0, "%s thread 0x%x" % (origin, thread),
                            header=header)
        buffers.append(buffer)
        offset = start + size
    if not buffers:
        raise BadInput("IPT_TRACE_DATA holds no thread trace (%s)" % ("; ".join(problems) or "empty"))
    buffers[-1].notes.extend(problems)
    return buffers


def process_trace_from_target(target, address):
    """ipt.sys's IPT_TRACE_DATA at ``address`` in the target: one TraceBuffer per thread."""
    total = target.unpack("<HHI", address)[2]
    if total > MAX_TRACE_SIZE:
        raise BadInput("IPT_TRACE_DATA at %s: TraceSize %d is implausible" % (target.format_address(address), total))
    data = target.try_read(address, TRACE_DATA_HEADER.size + total).data
    return process_trace_buffers(data, target.pointer_size, "process trace at %s" % target.format_address(address))


# -- finding IPT events in memory ------------------------------------------------------

# The last 16 bytes of an event header pin it down: IptOption with TraceMode 1,
# TimeMode 0-2 and reserved bits zero, then TraceSize and TracePosition below 128 MiB.
# (Searching for them, not for the whole header, lets re skip fast: 6x faster.)
_HEADER_TAIL_RE = re.compile(
    b"(?s)[\x01\x11\x21].[\x00-\x0f][\x00-\x05]\x00\x00\x00\x00..[\x00-\x07]\x00..[\x00-\x07]\x00")
_HEADER_TAIL_OFFSET = 16

SCAN_CHUNK = 1 << 20

MemoryScan = collections.namedtuple("MemoryScan", "events notes bytes_searched ranges_searched")


def plausible_event(header):
    size = header["TraceSize"]
    return 16 <= size <= MAX_TRACE_SIZE and header["TracePosition"] <= size and \
        size <= header["IptOptionFields"]["BufferBytes"]


def looks_like_event(payload):
    """True when ``payload`` is a plausible IPT event header followed by a trace with a PSB."""
    if len(payload) < EVENT_HEADER.size + len(PSB) or not _HEADER_TAIL_RE.match(payload, _HEADER_TAIL_OFFSET):
        return False
    header = parse_event_header(payload)
    return plausible_event(header) and PSB in payload[EVENT_HEADER.size:EVENT_HEADER.size + header["TraceSize"]]


class _PsbSearch(object):
    """The first PSB of a trace in target memory, for candidates at rising addresses.

    Candidate headers can sit every few bytes (a buffer of copies, or data that looks
    like headers), each with a trace of up to MAX_TRACE_SIZE bytes; searching each
    trace anew would cost their sizes multiplied.  So the search remembers how far it
    has read and what it found: memory from ``start`` to ``searched`` is readable and
    holds no PSB before ``psb`` (None: none at all; ``hole``: ``searched`` is where
    reading stopped at unreadable memory), and every byte is read about once."""

    def __init__(self, target):
        self.target = target
        self.start = self.searched = 0
        self.psb = None
        self.hole = False

    def first(self, address, size):
        """Address of the first PSB wholly inside the readable start of ``[address,
        address + size)``, or None."""
        end = address + size
        if not self.start <= address <= self.searched:
            self.start = self.searched = address
            self.psb, self.hole = None, False
        if self.psb is not None and self.psb >= address:
            return self.psb if self.psb + len(PSB) <= end else None
        # Nothing from address to self.searched (a PSB there would be self.psb):
        # read on, from where a PSB cut by the last read would start.
        while not self.hole and self.searched < end:
            at = max(address, self.searched - len(PSB) + 1)
            probe = self.target.try_read(at, min(SCAN_CHUNK, end - at))
            data = probe.data
            if probe.holes:
                data = data[:probe.holes[0][0] - at]
                self.hole = True
            found = data.find(PSB)
            self.searched = at + len(data)
            if found >= 0:
                self.psb = at + found
                self.searched = self.psb + len(PSB)
                self.hole = False
                return self.psb
        return None


def scan_target(target, start=0, end=None, max_events=1000, max_bytes=1 << 30):
    """Find IntelProcessorTrace events in readable target memory.

    A candidate is a plausible header whose trace holds a PSB (at its start, or
    anywhere for a wrapped buffer).  Returns a MemoryScan: ``events`` are dicts with
    the event address, header and trace address; ``notes`` say where the scan
    stopped; ``bytes_searched`` and ``ranges_searched`` say how much it read."""
    if end is None and not target.can_list_memory():
        # A live session cannot list its memory; probing 2^64 bytes page by page never ends.
        raise BadInput("this target cannot enumerate its memory: give a range to scan (start, length)")
    events = []
    notes = []
    scanned = ranges = 0
    psb_search = _PsbSearch(target)
    for lo, hi in target.readable_ranges(start, end):
        ranges += 1
        cursor = lo
        while cursor < hi:
            span = min(SCAN_CHUNK, hi - cursor)
            # headers that start in [cursor, cursor + span) and may end past it
            window = max(lo, cursor - _HEADER_TAIL_OFFSET)
            window_end = min(hi, cursor + span + EVENT_HEADER.size)
            data = target.try_read(window, window_end - window).data
            for match in _HEADER_TAIL_RE.finditer(data):
                offset = match.start() - _HEADER_TAIL_OFFSET
                address = window + offset
                if offset < 0 or not cursor <= address < cursor + span:
                    continue
                header = parse_event_header(data[offset:offset + EVENT_HEADER.size])
                if not plausible_event(header):
                    continue
                trace_address = address + EVENT_HEADER.size
                psb = psb_search.first(trace_address, header["TraceSize"])
                if psb is None:
                    continue
                events.append({"address": address, "trace_address": trace_address, "header": header,
                               "psb_at_start": psb == trace_address})
                if len(events) >= max_events:
                    notes.append("stopped after %d events" % max_events)
                    return MemoryScan(events, notes, scanned, ranges)
            scanned += span
            cursor += span
            if scanned >= max_bytes:
                notes.append("stopped after scanning %d bytes (at %s)" % (scanned, target.format_address(cursor)))
                return MemoryScan(events, notes, scanned, ranges)
    return MemoryScan(events, notes, scanned, ranges)


def why_none(target, scan):
    """One line on why ``scan`` found nothing: how much memory it could read, and
    what a minidump lacks (ETW keeps IntelProcessorTrace events in kernel buffers)."""
    text = "no IntelProcessorTrace event in the 0x%x readable bytes searched (%d ranges)" % (
        scan.bytes_searched, scan.ranges_searched)
    if target.kind == "minidump":
        text += ("; a minidump holds one process's memory, and ETW keeps these events in kernel buffers "
                 "(a kernel, full or active memory dump holds them)")
    return text
