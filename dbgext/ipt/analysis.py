"""The ipt capability's public API: one function per action, with keyword arguments.

Every memory read, every decode and every derived fact happens here; the command
parses arguments and renders, nothing else.  Each function returns one result type
whose ``as_dict()`` is the ``--json`` document (docs/json-schema/ipt.md) and whose
``problems`` is a ProblemLog:

* :func:`list_packets` -> :class:`PacketsResult`: totals of every packet, and a
  listing (``ipt packets``);
* :func:`reconstruct_flow` -> :class:`FlowAnalysis`: the instruction flow decoded
  to the end of the trace, its events, a listing capped at ``max_insns`` and one
  view (``instructions``, ``path``, ``calltree``, ``functions``) over all of it
  (``ipt flow``);
* :func:`decode_event` -> :class:`EventResult`: an ETW IntelProcessorTrace event,
  its header, packets and (with code from the target) its path (``ipt event``);
* :func:`scan_events` -> :class:`ScanResult`: IntelProcessorTrace events found in
  target memory or in an .etl file (``ipt scan``).

``target`` is a dbgext Target (code and trace memory), or None when files give
everything.  Errors (BadInput) name these functions' parameters.
"""

import os

from ..errors import BadInput, WrongSignature
from ..problems import ProblemLog
from . import sources
from .errata import cpu_errata
from .flow import BlockCache, CodeImage, FlowDecoder, FlowResult, read_code_file
from .packets import decode_packets, packet_stats
from .views import Namer, event_row, make_view

SCHEMA_VERSION = 2
FORMATS = ("raw", "event", "process")
FLOW_VIEWS = ("instructions", "path", "calltree", "functions")
# Flow decoders: dbgext's own (the reference), or Intel's libipt where it is loadable (dbgext.ipt.libipt).
DECODERS = ("python", "libipt")
DEFAULT_MAX_INSNS = 100000
DEFAULT_MAX_PACKETS = 100000
DEFAULT_MAX_EVENTS = 1000
DEFAULT_SCAN_LENGTH = 0x100000
SUSPICIOUS_FUNCTIONS = ("nt!KeBugCheckEx", "nt!KeBugCheck2", "nt!KeBugCheck")
# Known file magics, to say what an input that is not an IPT event is.
FILE_MAGICS = ((b"\x02\x82\x02\x82", "a raw trace starting with a PSB (read it as a raw trace)"),
               (b"\x89PNG", "a PNG image"), (b"MZ", "a PE image"), (b"\x7fELF", "an ELF file"),
               (b"PAGEDU64", "a kernel dump"), (b"PAGEDUMP", "a kernel dump"), (b"MDMP", "a minidump"),
               (b"%PDF", "a PDF document"), (b"PK\x03\x04", "a ZIP archive"), (b"\xff\xd8\xff", "a JPEG image"))


NO_INTEL_PT_ON_ARM64 = "Intel PT does not exist on ARM64: this target has no IPT trace to decode"


def _check_arch(target):
    if target is not None and target.arch == "arm64":
        raise BadInput(NO_INTEL_PT_ON_ARM64)


def _document(action, body, problems, totals_only=False):
    """The JSON document; ``totals_only`` (stats): problems counted by kind, not listed."""
    document = {"schema_version": SCHEMA_VERSION, "action": action}
    document.update(body)
    if totals_only:
        document["problems_by_kind"] = problems_by_kind(problems)
    else:
        document["problems"] = problems.as_list()
    return document


def problems_by_kind(problems):
    """{kind: how many were reported} of a ProblemLog (listed or only counted)."""
    return {kind: problems.count(kind) for kind in sorted({problem.kind for problem in problems})
            if kind != "problems_truncated"}


def _collect(parts):
    """One ProblemLog of every part's problems; with several buffers each message
    names the buffer it is about."""
    log = ProblemLog()
    for buffer, problems in parts:
        for problem in problems:
            if len(parts) > 1:
                problem.message = "%s: %s" % (buffer.origin, problem.message)
            log.append(problem)
    return log.finish()


def _stored_offsets(problems, buffer):
    """Trace offsets of ``problems`` as offsets in the buffer as stored (rings unrolled)."""
    for problem in problems:
        if problem.offset is not None:
            problem.offset = buffer.original_offset(problem.offset)
    return problems


def _need_target(target, what):
    if target is None:
        raise BadInput("%s needs a target (a dump, or the debugger session)" % what)


# -- trace buffers ---------------------------------------------------------------------

def load_buffers(target=None, *, trace=None, data=None, address=None, size=None, format="raw", position=None):
    """The TraceBuffers to decode: from the file ``trace``, the bytes ``data``, or
    target memory at ``address`` (``size`` bytes for a raw trace).  ``format``: raw
    packets, an ETW IntelProcessorTrace ``event`` (header + trace), or ipt.sys's
    ``process`` trace (one buffer per thread); ``position``: a ring buffer's oldest
    byte (decoding starts at the first PSB after it, across the wrap)."""
    if format not in FORMATS:
        raise BadInput("unknown trace format %r (one of: %s)" % (format, ", ".join(FORMATS)))
    if format == "process" and position is not None:
        raise BadInput("position does not apply to format 'process': each thread's "
                       "RingBufferOffset says where its ring starts")
    if trace is not None or data is not None:
        origin = trace if trace is not None else "bytes"
        raw = sources.from_file(trace).data if trace is not None else bytes(data)
        if format == "raw":
            return [sources.from_bytes(raw, origin, position)]
        if format == "event":
            return [sources.event_from_bytes(raw, origin, position)]
        return sources.process_trace_buffers(raw, origin=os.path.basename(origin))
    if address is not None:
        _need_target(target, "a trace at an address")
        if format == "event":
            return [sources.event_from_target(target, address, position)]
        if format == "process":
            return sources.process_trace_from_target(target, address)
        if size is None:
            raise BadInput("a raw trace at an address needs its size")
        return [sources.from_target(target, address, size, position)]
    raise BadInput("give a trace: trace (a file), data (bytes), or address (with size) and a target")


def _packet_rows(packets, buffer):
    rows = []
    for packet in packets:
        row = packet.as_dict()
        row["offset"] = buffer.original_offset(packet.offset)
        rows.append(row)
    return rows


# -- packets ---------------------------------------------------------------------------

class PacketBuffer(object):
    """One buffer's packets: ``stats`` (every packet counted), ``packets`` (the listing,
    None with stats only), ``listing_truncated``, ``problems``."""

    def __init__(self, source, stats, packets, listing_truncated):
        self.source = source
        self.stats = stats
        self.packets = packets
        self.listing_truncated = listing_truncated
        self.problems = _stored_offsets(stats.problems, source)

    def as_dict(self):
        document = {"source": self.source.describe(), "stats": self.stats.as_dict()}
        if self.packets is not None:
            document["packets"] = _packet_rows(self.packets, self.source)
            document["listing"] = {"listed": len(self.packets), "truncated": self.listing_truncated}
        return document


class PacketsResult(object):
    """``buffers`` (PacketBuffer), ``stats`` (totals only), ``cpu`` and its ``errata``, ``problems``."""

    def __init__(self, buffers, stats=False, cpu=None, errata=frozenset()):
        self.buffers = buffers
        self.stats = stats
        self.cpu = cpu
        self.errata = errata
        self.problems = _collect([(buffer.source, buffer.problems) for buffer in buffers])

    def as_dict(self):
        body = {"cpu": list(self.cpu) if self.cpu else None, "errata": sorted(self.errata),
                "buffers": [buffer.as_dict() for buffer in self.buffers]}
        return _document("packets", body, self.problems, self.stats)


def list_packets(target=None, *, trace=None, data=None, address=None, size=None, format="raw", position=None,
                 stats=False, max_packets=DEFAULT_MAX_PACKETS, cpu=None):
    """The packets of a trace (``ipt packets``): every packet counted; listed up to
    ``max_packets`` unless ``stats`` (totals only).  ``cpu`` (family, model[, stepping]):
    the listing shows the packets its packet-layer errata hit as libipt reads them (the
    totals count the packets as encoded).  The trace comes as :func:`load_buffers` says.
    Returns a PacketsResult."""
    _check_arch(target)
    errata = cpu_errata(cpu)
    results = []
    for buffer in load_buffers(target, trace=trace, data=data, address=address, size=size, format=format,
                               position=position):
        totals = packet_stats(buffer.data)
        listing, truncated = None, False
        if not stats:
            decode = decode_packets(buffer.data, max_packets=max_packets, errata=errata)
            listing, truncated = decode.packets, decode.truncated
        results.append(PacketBuffer(buffer, totals, listing, truncated))
    return PacketsResult(results, stats, cpu, errata)


# -- flow ------------------------------------------------------------------------------

class Code(object):
    """Where code bytes and names come from: image files at bases and/or the target."""

    def __init__(self, target=None, images=()):
        files = []
        named = []
        for path, base in images:
            image, exports = read_code_file(path)
            files.append((base, image))
            size = image.size_of_image if hasattr(image, "size_of_image") else len(image)
            named.append((base, size, os.path.splitext(os.path.basename(path))[0], exports))
        if not files and target is None:
            raise BadInput("the flow needs code: images [(file, base)], or a target")
        self.target = target
        self.image = CodeImage(target, files)
        self.namer = Namer(target, named)
        self.suspicious = {}
        if target is not None:
            for name in SUSPICIOUS_FUNCTIONS:
                try:
                    address = target.symbol_address(name)
                except Exception:  # a symbol source that cannot answer is no reason to fail the decode
                    address = None
                if address:
                    self.suspicious[address] = name


class FlowBuffer(object):
    """One buffer's flow: ``decode`` (a flow.FlowResult: instruction count, listing,
    events, problems), ``view`` and its ``view_data``, ``listing_limit``; with
    ``stats`` (totals only) ``packet_stats``, the buffer's packets by type."""

    def __init__(self, source, decode, cache, namer, view, view_data, listing_limit, stats):
        self.source = source
        self.packet_stats = packet_stats(source.data) if stats else None
        self.decode = decode
        self.view = view
        self.view_data = view_data
        self.listing_limit = listing_limit
        self.stats = stats
        self.problems = _stored_offsets(decode.problems, source)
        self.events = [dict(event_row(event), offset=source.original_offset(event[2])) for event in decode.events]
        self.rows = []
        if view == "instructions" and not stats:
            self.rows = [{"index": index, "ip": ip, "symbol": namer.name(ip), "text": cache.disassemble(ip)}
                         for index, ip in enumerate(decode.instructions)]

    @property
    def instruction_count(self):
        return self.decode.instruction_count

    @property
    def events_by_kind(self):
        """{kind: how many} of every event of the flow (listed or not)."""
        return self.decode.event_kinds

    @property
    def listing(self):
        """View instructions: how much of the flow the listing holds."""
        return {"listed": len(self.rows), "limit": self.listing_limit, "truncated": self.decode.truncated}

    def as_dict(self):
        if self.stats:
            return {"source": self.source.describe(), "packets": self.packet_stats.as_dict(),
                    "instruction_count": self.decode.instruction_count, "blocks": self.decode.blocks_built,
                    "event_count": self.decode.event_count,
                    "events_by_kind": dict(sorted(self.events_by_kind.items())),
                    "problem_count": self.problems.count(), "problems_by_kind": problems_by_kind(self.problems)}
        document = {"source": self.source.describe(), "instruction_count": self.decode.instruction_count,
                    "blocks": self.decode.blocks_built, "events": self.events,
                    "event_count": self.decode.event_count, "problem_count": self.problems.count()}
        if self.view == "instructions":
            document["instructions"] = self.rows
            document["listing"] = self.listing
        else:
            document[self.view] = self.view_data
        return document


class FlowAnalysis(object):
    def __init__(self, buffers, view, stats, cpu, errata):
        self.buffers = buffers
        self.view = view
        self.stats = stats
        self.cpu = cpu
        self.errata = errata
        self.problems = _collect([(buffer.source, buffer.problems) for buffer in buffers])

    def as_dict(self):
        body = {"view": None if self.stats else self.view, "cpu": list(self.cpu) if self.cpu else None,
                "errata": sorted(self.errata), "buffers": [buffer.as_dict() for buffer in self.buffers]}
        return _document("flow", body, self.problems, self.stats)


def _decode_buffer(decoder, code, buffer, view, max_insns, stats, progress):
    """Decode one buffer to its end, feeding the view; returns a FlowBuffer."""
    result = FlowResult()
    consumer = None if stats else make_view(view, code.namer, decoder.cache, result)
    listing = max_insns if view == "instructions" and not stats else 0
    size = max(len(buffer.data), 1)

    def report(offset, instructions):
        progress(offset / size, instructions)

    decoder.decode(buffer.data, max_insns=listing, sink=consumer.feed if consumer else None,
                   progress=report if progress is not None else None, result=result)
    view_data = consumer.finish() if consumer is not None else None
    return FlowBuffer(buffer, result, decoder.cache, code.namer, view, view_data, listing, stats)


def reconstruct_flow(target=None, *, trace=None, data=None, address=None, size=None, format="raw", position=None,
                     images=(), view="instructions", stats=False, max_insns=DEFAULT_MAX_INSNS, cpu=None,
                     resync_on_error=False, report_iflags=False, progress=None, decoder="python"):
    """The executed instructions of a trace (``ipt flow``), decoded to its end.

    The trace comes as :func:`load_buffers` says.  Code comes from ``images``
    [(file path, base)] and else from the target's memory.  ``view``: one of
    FLOW_VIEWS over the whole flow; ``max_insns`` caps the instructions view's
    listing only; ``stats``: totals only.  ``cpu`` (family, model[, stepping])
    turns on libipt's errata workarounds for that CPU; ``resync_on_error`` goes on
    at the next packet naming an IP after an error, not at the next PSB;
    ``report_iflags`` reports the interrupt flag tracing is enabled with (FlowDecoder);
    ``progress(fraction, instructions)`` is called now and then.  ``decoder``:
    "python" (dbgext's, the reference) or "libipt" (Intel's library through ctypes,
    where it is loadable: dbgext.ipt.libipt; same result).  Returns a FlowAnalysis."""
    _check_arch(target)
    if view not in FLOW_VIEWS:
        raise BadInput("unknown view %r (one of: %s)" % (view, ", ".join(FLOW_VIEWS)))
    if decoder not in DECODERS:
        raise BadInput("unknown decoder %r (one of: %s)" % (decoder, ", ".join(DECODERS)))
    if decoder == "libipt" and resync_on_error:
        raise BadInput("resync_on_error needs the python decoder: libipt 2.0 resynchronises at the next PSB "
                       "only")
    if decoder == "libipt" and report_iflags:
        raise BadInput("report_iflags needs the python decoder: libipt 2.0 reports no interrupt flag events")
    buffers = load_buffers(target, trace=trace, data=data, address=address, size=size, format=format,
                           position=position)
    code = Code(target, images)
    errata = cpu_errata(cpu)
    if decoder == "libipt":
        from .libipt import LibiptFlowDecoder   # loads the library: never at import (WinDbg has none)
        flow_decoder = LibiptFlowDecoder(code.image, code.suspicious, BlockCache(code.image), cpu)
    else:
        flow_decoder = FlowDecoder(code.image, code.suspicious, BlockCache(code.image), errata, resync_on_error,
                                   report_iflags)
    results = [_decode_buffer(flow_decoder, code, buffer, view, max_insns, stats, progress) for buffer in buffers]
    return FlowAnalysis(results, view, stats, cpu, errata)


# -- event -----------------------------------------------------------------------------

def _what_is(raw):
    for magic, name in FILE_MAGICS:
        if raw.startswith(magic):
            return name
    return "bytes %s" % raw[:8].hex(" ")


class NotAnEvent(BadInput):
    """Bytes given as an IntelProcessorTrace event (a file, an .etl event) whose
    header is not one: ``where`` they are and what was ``found``."""

    def __init__(self, where, found):
        self.where = where
        self.found = found
        super().__init__("%s is not an IntelProcessorTrace event: found %s (force=True decodes it anyway)"
                         % (where, found))


def check_event_header(header, raw, where, address=None):
    """Refuse a header that is not an IntelProcessorTrace event's, naming what is there."""
    option = header["IptOptionFields"]
    wrong = []
    if option["TraceMode"] != 1:
        wrong.append("TraceMode %d" % option["TraceMode"])
    if option["TimeMode"] not in sources.TIME_MODES:
        wrong.append("TimeMode %d" % option["TimeMode"])
    if option["Reserved"]:
        wrong.append("reserved IptOption bits set")
    if not 0 < header["TraceSize"] <= sources.MAX_TRACE_SIZE:
        wrong.append("TraceSize %d" % header["TraceSize"])
    if not wrong:
        return
    found = "%s (%s)" % (_what_is(raw), ", ".join(wrong))
    if address is not None:
        raise WrongSignature("IntelProcessorTrace event header", address, found)
    raise NotAnEvent(where, found)


class EventResult(object):
    """An IntelProcessorTrace event: ``header`` (fields and IptOption decoded),
    ``source`` (TraceBuffer), ``stats`` (packet totals), ``flow`` (FlowBuffer of
    the path view, None without code), ``problems``."""

    def __init__(self, source, stats, flow):
        self.source = source
        self.header = source.header
        self.stats = stats
        self.flow = flow
        self.problems = ProblemLog(_stored_offsets(stats.problems, source))
        if flow is not None:
            self.problems.extend(flow.problems)
        self.problems.finish()

    def as_dict(self):
        header = {key: self.header[key] for key in sources.EVENT_HEADER_FIELDS}
        header["IptOptionFields"] = self.header["IptOptionFields"]
        body = {"event": header, "source": self.source.describe(), "packets": self.stats.as_dict(),
                "flow": self.flow.as_dict() if self.flow is not None else None}
        return _document("event", body, self.problems)


def decode_event(target=None, *, trace=None, address=None, etl=None, index=None, position=None, force=False,
                 progress=None):
    """An ETW IntelProcessorTrace event (``ipt event``): its header, packets and,
    with a target, the path it traced.  The event is at ``address`` in the target,
    in the file ``trace`` (header + trace), or event ``index`` of the .etl file
    ``etl``; ``position`` overrides its TracePosition; ``force`` decodes a header
    that does not look like one.  Returns an EventResult."""
    _check_arch(target)
    if address is not None:
        _need_target(target, "an event at an address")
        raw = target.read(address, sources.EVENT_HEADER.size)
        if not force:
            check_event_header(sources.parse_event_header(raw), raw, None, address)
        buffer = sources.event_from_target(target, address, position)
    elif trace is not None or etl is not None:
        if trace is not None:
            raw, where = sources.from_file(trace).data, trace
        else:
            raw, where = etl_event_payload(etl, index), "%s event %d" % (etl, index)
        if not force:
            check_event_header(sources.parse_event_header(raw), raw, where)
        buffer = sources.event_from_bytes(raw, where, position)
    else:
        raise BadInput("give an event: address (with a target), trace (a file), or etl (a file) with index")
    stats = packet_stats(buffer.data)
    flow = None
    if target is not None:
        code = Code(target)
        decoder = FlowDecoder(code.image, code.suspicious)
        flow = _decode_buffer(decoder, code, buffer, "path", 0, False, progress)
    return EventResult(buffer, stats, flow)


# -- scan ------------------------------------------------------------------------------

class ScanResult(object):
    """``events``: one row per IntelProcessorTrace event found (address or .etl
    index, process, thread, sizes...); ``problems``: notes on where the scan stopped
    and events that could not be read."""

    def __init__(self, source, events, problems):
        self.source = source
        self.events = events
        self.problems = problems.finish()

    def as_dict(self):
        return _document("scan", {"source": self.source, "events": self.events}, self.problems)


def scan_events(target=None, *, etl=None, start=None, length=None, max_events=DEFAULT_MAX_EVENTS):
    """IntelProcessorTrace events (``ipt scan``) in the .etl file ``etl``, else in
    the target's memory: all it can list, or ``length`` bytes (default
    DEFAULT_SCAN_LENGTH) from ``start``.  Stops after ``max_events``.  Returns a
    ScanResult."""
    _check_arch(target)
    problems = ProblemLog()
    if etl is not None:
        return ScanResult(etl, _scan_etl(etl, max_events, problems), problems)
    _need_target(target, "a scan of memory")
    target.require_full_memory("scanning memory for IntelProcessorTrace events")
    end = None
    if start is not None:
        end = start + (length if length is not None else DEFAULT_SCAN_LENGTH)
    scan = sources.scan_target(target, start or 0, end, max_events=max_events)
    for note in scan.notes:
        problems.add("ipt_scan_stopped", None, note, "note")
    if not scan.events:
        problems.add("ipt_scan_empty", None, sources.why_none(target, scan), "note")
    rows = [{"address": event["address"], "trace_address": event["trace_address"],
             "process": event["header"]["Process"], "thread": event["header"]["Thread"],
             "trace_size": event["header"]["TraceSize"], "trace_position": event["header"]["TracePosition"],
             "psb_at_start": event["psb_at_start"]} for event in scan.events]
    return ScanResult("memory", rows, problems)


def _etl_ipt_events(reader):
    """(index, event) of the IntelProcessorTrace events of an EtlReader; index counts
    every event of the file, so it names one event for decode_event's ``index``."""
    from ..etl import INTEL_PT_GUID, iter_events
    for index, event in enumerate(iter_events(reader)):
        if event.provider == INTEL_PT_GUID and event.opcode == sources.IPT_EVENT_TYPE:
            yield index, event
        elif event.provider is None and sources.looks_like_event(event.payload):
            # a system-logger event whose group the reader cannot name: judged by its payload
            yield index, event


def etl_event_payload(path, wanted):
    from ..etl import EtlReader
    if wanted is None:
        raise BadInput("an event of an .etl file needs its index (a scan of the file lists the events)")
    with EtlReader(path) as reader:
        for index, event in _etl_ipt_events(reader):
            if index == wanted:
                return event.payload
    skipped = reader.summary.finish().note()
    raise BadInput("%s has no IntelProcessorTrace event with index %d%s"
                   % (path, wanted, " (%s)" % skipped if skipped else ""))


def _scan_etl(path, max_events, problems):
    """The IntelProcessorTrace events of an .etl file; buffers the reader could not
    decode become one problem with their count and an example."""
    from ..etl import EtlReader
    rows = []
    with EtlReader(path) as reader:
        for index, event in _etl_ipt_events(reader):
            if len(rows) >= max_events:
                problems.add("ipt_scan_stopped", None, "stopped after %d events" % max_events, "note")
                break
            try:
                buffer = sources.event_from_bytes(event.payload, "%s event %d" % (path, index))
            except BadInput as error:
                problems.add("ipt_event_unreadable", None, "event %d: %s" % (index, error), "warning")
                continue
            stats = packet_stats(buffer.data)
            header = buffer.header
            rows.append({"index": index, "process": header["Process"], "thread": header["Thread"],
                         "trace_size": header["TraceSize"], "trace_position": header["TracePosition"],
                         "packets": stats.packets, "errors": stats.problems.count(),
                         "notes": list(buffer.notes)})
    summary = reader.summary.finish()
    if not rows:
        problems.add("ipt_scan_empty", None, "no IntelProcessorTrace events in the %d buffers searched (%d of them "
                     "decompressed)" % (summary.buffers, summary.compressed), "note")
    problems.extend(summary.problems)
    return rows


