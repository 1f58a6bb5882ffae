"""``dbgext ipt packets|flow|event|scan``: Intel PT traces offline and inside WinDbg."""

import argparse
import os

from ..address import parse_hex
from ..command import Command
from ..errors import BadInput
from . import render, sources, views
from .flow import BlockCache, CodeImage, FlowDecoder, read_code_file
from .packets import decode_packets, packet_stats

SUBCOMMANDS = ("packets", "flow", "event", "scan")
SUSPICIOUS_FUNCTIONS = ("nt!KeBugCheckEx", "nt!KeBugCheck2", "nt!KeBugCheck")
FLOW_VIEWS = ("instructions", "path", "calltree", "functions")


def parse_number(text):
    try:
        return int(text.replace("`", ""), 0)
    except ValueError:
        raise BadInput("not a number: %r" % text)


def parse_image(text):
    path, separator, base = text.rpartition("@")
    if not separator or not path:
        raise BadInput("--image takes FILE@BASE, got %r" % text)
    return path, parse_hex(base)


def _add_buffer_options(parser, size_required_for_raw=True):
    parser.add_argument("--trace", metavar="FILE", help="trace file (raw packets unless --format says otherwise)")
    parser.add_argument("--address", metavar="ADDR", help="trace (or event) address in the target")
    parser.add_argument("--size", metavar="N", help="trace size in bytes (raw traces in the target)")
    parser.add_argument("--format", choices=("raw", "event", "process"), default="raw",
                        help="raw packets; an ETW IntelProcessorTrace event (header + trace); "
                        "ipt.sys IPT_TRACE_DATA (one trace per thread)")
    parser.add_argument("--position", metavar="P", help="ring buffer: the oldest data starts at offset P "
                        "(decode from the first PSB after P, across the wrap, back to P)")
    parser.add_argument("--stats", action="store_true", help="decode everything, print only totals")


def _add_framework_options(parser):
    """--dump/--symbols/--json after the subcommand too (``dbgext ipt flow --dump F``).
    SUPPRESS keeps a value given before the subcommand from being reset to None."""
    parser.add_argument("--dump", metavar="FILE", default=argparse.SUPPRESS,
                        help="kernel dump or minidump (inside WinDbg: the current target)")
    parser.add_argument("--symbols", metavar="PATH", action="append", default=argparse.SUPPRESS,
                        help="ISF symbol file or directory (repeatable)")
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print one JSON document")


def add_arguments(parser):
    sub = parser.add_subparsers(dest="ipt_command", metavar="SUBCOMMAND")
    packets = sub.add_parser("packets", help="list the packets of a trace")
    _add_buffer_options(packets)
    packets.add_argument("--max-packets", type=int, default=None, metavar="N", help="list at most N packets")
    flow = sub.add_parser("flow", help="reconstruct the executed instructions")
    _add_buffer_options(flow)
    flow.add_argument("--image", action="append", default=[], metavar="FILE@BASE",
                      help="code image file loaded at BASE (repeatable; default: code from the target)")
    flow.add_argument("--max-insns", type=int, default=1000000, metavar="N",
                      help="stop after N instructions (default 1000000)")
    flow.add_argument("--view", choices=FLOW_VIEWS, default="instructions",
                      help="instructions (default), path (one line per function entered), calltree, functions")
    event = sub.add_parser("event", help="an ETW IntelProcessorTrace event: header, IptOption, decoded path")
    event.add_argument("--address", metavar="ADDR", help="address of the event payload (its header) in the target")
    event.add_argument("--trace", metavar="FILE", help="a file holding the event payload (header + trace)")
    event.add_argument("--etl", metavar="FILE", help="take the event from this .etl file (with --index)")
    event.add_argument("--index", type=int, metavar="N", help="which event of the .etl (as ipt scan --etl lists)")
    event.add_argument("--position", metavar="P", help="override TracePosition: the oldest data starts at P")
    event.add_argument("--max-insns", type=int, default=100000, metavar="N")
    scan = sub.add_parser("scan", help="find IntelProcessorTrace events in target memory or an .etl file")
    scan.add_argument("--etl", metavar="FILE", help="scan this .etl file instead of target memory")
    scan.add_argument("--max-events", type=int, default=1000, metavar="N")
    scan.add_argument("--start", metavar="ADDR", help="scan from ADDR (needed in a live session)")
    scan.add_argument("--length", metavar="N", help="scan N bytes from --start")
    for subparser in (packets, flow, event, scan):
        _add_framework_options(subparser)


def run(ctx, args):
    handlers = {"packets": run_packets, "flow": run_flow, "event": run_event, "scan": run_scan}
    if not getattr(args, "ipt_command", None):
        raise BadInput("choose one of: %s (see dbgext ipt -h)" % ", ".join(SUBCOMMANDS))
    return handlers[args.ipt_command](ctx, args)


# -- buffers --------------------------------------------------------------------------

def load_buffers(ctx, args):
    position = parse_number(args.position) if args.position is not None else None
    if args.trace:
        if args.format == "raw":
            return [sources.from_file(args.trace, position)]
        data = sources.from_file(args.trace).data
        if args.format == "event":
            return [sources.event_from_bytes(data, args.trace, position)]
        if position is not None:
            raise BadInput("--position does not apply to --format process: each thread's "
                           "RingBufferOffset says where its ring starts")
        return sources.process_trace_buffers(data, origin=os.path.basename(args.trace))
    if args.address:
        target = ctx.target
        address = parse_hex(args.address)
        if args.format == "event":
            return [sources.event_from_target(target, address, position)]
        if args.format == "process":
            if position is not None:
                raise BadInput("--position does not apply to --format process: each thread's "
                               "RingBufferOffset says where its ring starts")
            total = target.unpack("<HHI", address)[2]
            if total > sources.MAX_TRACE_SIZE:
                raise BadInput("IPT_TRACE_DATA at 0x%x: TraceSize %d is implausible" % (address, total))
            data = target.try_read(address, 8 + total).data
            return sources.process_trace_buffers(data, target.pointer_size, "process trace at 0x%x" % address)
        if args.size is None:
            raise BadInput("--address needs --size N for a raw trace")
        return [sources.from_target(target, address, parse_number(args.size), position)]
    raise BadInput("give --trace FILE, or --address ADDR (with --size N) and a target")


# -- packets --------------------------------------------------------------------------

def run_packets(ctx, args):
    buffers = load_buffers(ctx, args)
    documents = []
    for buffer in buffers:
        if args.stats:
            stats = packet_stats(buffer.data)
            document = {"source": buffer.describe(), "stats": stats.as_dict(),
                        "errors": views.error_rows(stats.errors, buffer)}
        else:
            limit = args.max_packets
            if limit is None and not args.json:
                limit = render.MAX_TEXT_ROWS  # a text listing stops there anyway
            decode = decode_packets(buffer.data, max_packets=limit)
            document = {"source": buffer.describe(), "packets": views.packet_rows(decode, buffer),
                        "errors": views.error_rows(decode.errors, buffer), "truncated": decode.truncated}
        documents.append((buffer, document))
    if args.json:
        ctx.out.json(_one_or_many(documents))
        return 0
    for buffer, document in documents:
        if args.stats:
            render.source_lines(ctx.out, buffer)
            render.stats(ctx.out, document["stats"])
            render.errors(ctx.out, document["errors"])
        else:
            render.packets(ctx.out, buffer, document["packets"], document["errors"], document["truncated"])
    return 0


def _one_or_many(documents):
    if len(documents) == 1:
        return documents[0][1]
    return {"buffers": [document for _, document in documents]}


# -- flow -------------------------------------------------------------------------------

def code_for(ctx, image_specs):
    """CodeImage from --image files and/or the target; plus the namer and suspicious addresses."""
    images = []
    named = []
    for spec in image_specs:
        path, base = parse_image(spec)
        data, exports = read_code_file(path)
        images.append((base, data))
        named.append((base, len(data), os.path.splitext(os.path.basename(path))[0], exports))
    target = ctx.target if ctx.has_target_source() else None
    if not images and target is None:
        raise BadInput("flow needs code: --image FILE@BASE, or a target (--dump FILE / inside WinDbg)")
    suspicious = {}
    if target is not None:
        for name in SUSPICIOUS_FUNCTIONS:
            try:
                address = target.symbol_address(name)
            except Exception:  # a symbol source that cannot answer is no reason to fail the decode
                address = None
            if address:
                suspicious[address] = name
    return CodeImage(target, images), views.Namer(target, named), suspicious, target


def flow_document(result, buffer, decoder, namer, view):
    document = {"source": buffer.describe(), "instructions": result.instructions,
                "errors": views.error_rows(result.errors, buffer), "warnings": list(result.warnings),
                "truncated": result.truncated}
    if view == "path":
        document["path"] = views.function_path(result.instructions, namer)
    elif view == "calltree":
        document["calltree"] = views.call_tree(result.instructions, views.branch_kinds(decoder.cache), namer)
    elif view == "functions":
        document["functions"] = views.function_counts(result.instructions, namer)
    return document


def run_flow(ctx, args):
    buffers = load_buffers(ctx, args)
    code, namer, suspicious, target = code_for(ctx, args.image)
    decoder = FlowDecoder(code, suspicious, BlockCache(code))
    documents = []
    for buffer in buffers:
        result = decoder.decode(buffer.data, max_insns=args.max_insns)
        if args.stats:
            document = {"source": buffer.describe(),
                        "stats": {"bytes": len(buffer.data), "instructions": len(result.instructions),
                                  "blocks": result.blocks_built, "errors": len(result.errors),
                                  "warnings": len(result.warnings)},
                        "errors": views.error_rows(result.errors, buffer), "warnings": list(result.warnings)}
        else:
            document = flow_document(result, buffer, decoder, namer, args.view)
        documents.append((buffer, document))
    if args.json:
        ctx.out.json(_one_or_many(documents))
        return 0
    format_address = target.format_address if target is not None else (lambda a: "%016x" % a)
    for buffer, document in documents:
        render.source_lines(ctx.out, buffer)
        if args.stats:
            render.stats(ctx.out, document["stats"])
        else:
            _render_flow(ctx, document, args.view, format_address, namer)
        render.errors(ctx.out, document["errors"])
        for warning in document["warnings"]:
            ctx.out.line("warning: %s" % warning)
    return 0


def _render_flow(ctx, document, view, format_address, namer):
    if view == "instructions":
        if document["truncated"]:
            ctx.out.line("(stopped at --max-insns)")
        render.instructions(ctx.out, views.instruction_rows(document["instructions"][:render.MAX_TEXT_ROWS], namer),
                            format_address)
    elif view == "path":
        render.path(ctx.out, document["path"], format_address)
    elif view == "calltree":
        render.call_tree(ctx.out, document["calltree"])
    else:
        render.function_counts(ctx.out, document["functions"])
    ctx.out.line("%d instructions" % len(document["instructions"]))


# -- event ----------------------------------------------------------------------------

def run_event(ctx, args):
    position = parse_number(args.position) if args.position is not None else None
    if args.address:
        address = parse_hex(args.address)
        buffer = sources.event_from_target(ctx.target, address, position)
    elif args.trace or args.etl:
        data = sources.from_file(args.trace).data if args.trace else _etl_event_payload(args.etl, args.index)
        buffer = sources.event_from_bytes(data, args.trace or "%s event %d" % (args.etl, args.index), position)
    else:
        raise BadInput("give --address ADDR (with a target), --trace FILE or --etl FILE --index N")
    stats = packet_stats(buffer.data)
    document = {"event": _header_document(buffer.header), "source": buffer.describe(),
                "packets": stats.as_dict(), "errors": views.error_rows(stats.errors, buffer)}
    flow = None
    if ctx.has_target_source():
        code, namer, suspicious, target = code_for(ctx, [])
        decoder = FlowDecoder(code, suspicious)
        result = decoder.decode(buffer.data, max_insns=args.max_insns)
        flow = {"instructions": len(result.instructions), "path": views.function_path(result.instructions, namer),
                "errors": views.error_rows(result.errors, buffer), "warnings": list(result.warnings)}
        document["flow"] = flow
    if args.json:
        ctx.out.json(document)
        return 0
    render.event_header(ctx.out, buffer.header)
    render.source_lines(ctx.out, buffer)
    render.stats(ctx.out, {"packets": stats.as_dict()["types"]})
    render.errors(ctx.out, document["errors"], "packet errors")
    if flow is not None:
        ctx.out.line("path (%d instructions):" % flow["instructions"])
        render.path(ctx.out, flow["path"], ctx.target.format_address)
        render.errors(ctx.out, flow["errors"], "flow errors")
        for warning in flow["warnings"]:
            ctx.out.line("warning: %s" % warning)
    return 0


def _header_document(header):
    document = {key: header[key] for key in sources.EVENT_HEADER_FIELDS}
    document["IptOptionFields"] = header["IptOptionFields"]
    return document


# -- scan -----------------------------------------------------------------------------

def run_scan(ctx, args):
    if args.etl:
        rows, notes = _scan_etl(args.etl, args.max_events)
    else:
        start, end = 0, None
        if args.start is not None:
            start = parse_hex(args.start)
            end = start + parse_number(args.length or "0x100000")
        events, notes = sources.scan_target(ctx.target, start, end, max_events=args.max_events)
        rows = [{"address": event["address"], "trace_address": event["trace_address"],
                 "process": event["header"]["Process"], "thread": event["header"]["Thread"],
                 "trace_size": event["header"]["TraceSize"], "trace_position": event["header"]["TracePosition"],
                 "psb_at_start": event["psb_at_start"]} for event in events]
    if args.json:
        ctx.out.json({"events": rows, "notes": notes})
        return 0
    if args.etl:
        table = [("%d" % row["index"], "%d" % row["process"], "%d" % row["thread"], "%d" % row["trace_size"],
                  "%d" % row["trace_position"], "%d" % row["packets"], "%d" % row["errors"]) for row in rows]
        ctx.out.table(table, headers=("event", "process", "thread", "trace size", "position", "packets", "errors"))
    else:
        table = []
        links = {}
        for index, row in enumerate(rows):
            address = ctx.target.format_address(row["address"])
            table.append((address, "%d" % row["process"], "%d" % row["thread"], "%d" % row["trace_size"],
                          "%d" % row["trace_position"], "yes" if row["psb_at_start"] else "no"))
            links[(index, 0)] = "!py ipt.py event --address %s" % address
        ctx.out.table(table, headers=("event", "process", "thread", "trace size", "position", "PSB first"),
                      links=links)
    for note in notes:
        ctx.out.line("note: %s" % note)
    return 0


def _etl_ipt_events(path):
    """(index, event) of the IntelProcessorTrace events in an .etl file; index counts
    every event of the file, so it names one event for ``ipt event --etl --index``."""
    try:
        from ..etl import INTEL_PT_GUID, iter_events
    except ImportError:
        raise BadInput("this build has no .etl reader (dbgext.etl)")
    for index, event in enumerate(iter_events(path)):
        if event.provider == INTEL_PT_GUID and event.opcode == sources.IPT_EVENT_TYPE:
            yield index, event
        elif event.provider is None and sources.looks_like_event(event.payload):
            # a system-logger event whose group the reader cannot name: judged by its payload
            yield index, event


def _etl_event_payload(path, wanted):
    if wanted is None:
        raise BadInput("--etl needs --index N (ipt scan --etl FILE lists the events)")
    for index, event in _etl_ipt_events(path):
        if index == wanted:
            return event.payload
    raise BadInput("%s has no IntelProcessorTrace event with index %d" % (path, wanted))


def _scan_etl(path, max_events):
    rows = []
    notes = []
    for index, event in _etl_ipt_events(path):
        if len(rows) >= max_events:
            notes.append("stopped after %d events" % max_events)
            break
        try:
            buffer = sources.event_from_bytes(event.payload, "%s event %d" % (path, index))
        except BadInput as error:
            notes.append("event %d: %s" % (index, error))
            continue
        stats = packet_stats(buffer.data)
        header = buffer.header
        rows.append({"index": index, "process": header["Process"], "thread": header["Thread"],
                     "trace_size": header["TraceSize"], "trace_position": header["TracePosition"],
                     "packets": stats.packets, "errors": len(stats.errors), "notes": list(buffer.notes)})
    return rows, notes


COMMAND = Command("ipt", "Intel PT: decode packets and reconstruct execution against target memory "
                  "(packets, flow, event, scan)", add_arguments, run)
