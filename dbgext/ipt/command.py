"""``dbgext ipt packets|flow|event|scan``: parse the arguments, run the action's
function (dbgext.ipt.list_packets, reconstruct_flow, decode_event, scan_events),
print its result (text) or its ``as_dict()`` (--json)."""

from ..address import parse_number
from ..command import Command
from ..errors import BadInput
from . import render
from .analysis import (DECODERS, DEFAULT_MAX_EVENTS, DEFAULT_MAX_INSNS, DEFAULT_MAX_PACKETS, FLOW_VIEWS, FORMATS,
                       NotAnEvent, decode_event, list_packets, reconstruct_flow, scan_events)
from .errata import parse_cpu


def _add_source_options(parser):
    parser.add_argument("--trace", metavar="FILE", help="trace file (raw packets unless --format says otherwise)")
    parser.add_argument("--address", metavar="ADDR", help="trace (or event) address in the target")
    parser.add_argument("--size", metavar="N", help="trace size in bytes, hex by default (0n for decimal)")
    parser.add_argument("--format", choices=FORMATS, default="raw",
                        help="raw packets; an ETW IntelProcessorTrace event (header + trace); "
                        "ipt.sys IPT_TRACE_DATA (one trace per thread)")
    parser.add_argument("--position", metavar="P", help="ring buffer: the oldest data starts at offset P (hex) "
                        "(decode from the first PSB after P, across the wrap, back to P)")
    parser.add_argument("--stats", action="store_true", help="decode everything, print only totals")


def _add_cpu_option(parser, what):
    parser.add_argument("--cpu", metavar="F/M[/S]", help="the traced CPU's family/model/stepping, for libipt's "
                        "errata workarounds (e.g. 6/92/9): " + what)


def _cpu(args):
    return parse_cpu(args.cpu) if args.cpu else None


def add_arguments(parser):
    sub = parser.add_subparsers(dest="ipt_command", metavar="SUBCOMMAND")
    packets = sub.add_parser("packets", help="list the packets of a trace")
    _add_source_options(packets)
    packets.add_argument("--max-packets", metavar="N",
                         help="list at most N packets (hex; default 0n%d); totals count them all"
                         % DEFAULT_MAX_PACKETS)
    _add_cpu_option(packets, "the listing shows the packets the packet layer's errata hit as ptdump does "
                    "(SKD007: a CYC cut by an OVF is one ovf; SKZ84: a corrupted TMA and the byte after it are one "
                    "invalid packet); --stats counts the packets as encoded")
    flow = sub.add_parser("flow", help="reconstruct the executed instructions")
    _add_source_options(flow)
    flow.add_argument("--image", action="append", default=[], metavar="FILE@BASE",
                      help="code image file loaded at BASE (repeatable; default: code from the target)")
    flow.add_argument("--max-insns", metavar="N", help="list at most N instructions (hex; default 0n%d); "
                      "decoding, --stats and the other views always cover the whole trace" % DEFAULT_MAX_INSNS)
    flow.add_argument("--view", choices=FLOW_VIEWS, default="instructions",
                      help="instructions with disassembly (default), path (one line per function entered), "
                      "calltree, functions")
    _add_cpu_option(flow, "the flow applies all of them but SKL168 (timing only) and SKL014 (it needs address "
                    "filters, which the flow is not given)")
    flow.add_argument("--resync-on-error", action="store_true",
                      help="after an error go on at the next packet that names an IP (as ptxed's option), not at "
                      "the next PSB")
    flow.add_argument("--event-iflags", action="store_true",
                      help="report the interrupt flag tracing is enabled with, where no MODE.Exec said it before "
                      "(as ptxed's --event:iflags): for traces with event tracing; without it the IF bit always reads "
                      "clear")
    flow.add_argument("--decoder", choices=DECODERS, default="python",
                      help="python: dbgext's own decoder (default, the reference); libipt: Intel's libipt through "
                      "ctypes (libipt.so.2, or the library DBGEXT_LIBIPT names): a cross-check, slower than python "
                      "through ctypes")
    event = sub.add_parser("event", help="an ETW IntelProcessorTrace event: header, IptOption, decoded path")
    event.add_argument("--address", metavar="ADDR", help="address of the event payload (its header) in the target")
    event.add_argument("--trace", metavar="FILE", help="a file holding the event payload (header + trace)")
    event.add_argument("--etl", metavar="FILE", help="take the event from this .etl file (with --index)")
    event.add_argument("--index", metavar="N", help="which event of the .etl (as ipt scan --etl lists)")
    event.add_argument("--position", metavar="P", help="override TracePosition: the oldest data starts at P")
    event.add_argument("--force", action="store_true", help="decode a header that does not look like an event's")
    scan = sub.add_parser("scan", help="find IntelProcessorTrace events in target memory or an .etl file")
    scan.add_argument("--etl", metavar="FILE", help="scan this .etl file instead of target memory")
    scan.add_argument("--max-events", metavar="N", help="stop after N events (hex; default 0n%d)" % DEFAULT_MAX_EVENTS)
    scan.add_argument("--start", metavar="ADDR", help="scan from ADDR (needed in a live session)")
    scan.add_argument("--length", metavar="N", help="scan N bytes from --start (hex; default 100000)")


def parse_image(ctx, text):
    path, separator, base = text.rpartition("@")
    if not separator or not path:
        raise BadInput("--image takes FILE@BASE, got %r" % text)
    return path, ctx.address(base)


def _number(text):
    return parse_number(text) if text is not None else None


def _source_options(ctx, args):
    return {"trace": args.trace, "address": ctx.address(args.address) if args.address else None,
            "size": _number(args.size), "format": args.format, "position": _number(args.position)}


def _target(ctx):
    return ctx.target if ctx.has_target_source() else None


def _progress(ctx):
    """Progress on stderr for long decodes, when stderr is a terminal."""
    stream = ctx.err.stream
    if ctx.windbg or not getattr(stream, "isatty", lambda: False)():
        return None

    def report(fraction, instructions):
        stream.write("\rdecoding: %3d%%, %d instructions" % (fraction * 100, instructions))
        stream.flush()
    return report


def _end_progress(ctx, progress):
    if progress is not None:
        ctx.err.stream.write("\r" + " " * 60 + "\r")


def _packets(ctx, args, progress):
    return list_packets(_target(ctx), stats=args.stats, max_packets=_number(args.max_packets) or DEFAULT_MAX_PACKETS,
                        cpu=_cpu(args), **_source_options(ctx, args))


def _flow(ctx, args, progress):
    return reconstruct_flow(_target(ctx), images=[parse_image(ctx, spec) for spec in args.image], view=args.view,
                            stats=args.stats, max_insns=_number(args.max_insns) or DEFAULT_MAX_INSNS,
                            cpu=_cpu(args), resync_on_error=args.resync_on_error, report_iflags=args.event_iflags,
                            progress=progress, decoder=args.decoder, **_source_options(ctx, args))


def _event(ctx, args, progress):
    try:
        return decode_event(_target(ctx), trace=args.trace,
                            address=ctx.address(args.address) if args.address else None, etl=args.etl,
                            index=_number(args.index), position=_number(args.position), force=args.force,
                            progress=progress)
    except NotAnEvent as error:   # the library names its parameter; a command user types the flag
        raise BadInput("%s is not an IntelProcessorTrace event: found %s (give --force to decode it anyway)"
                       % (error.where, error.found))


def _scan(ctx, args, progress):
    return scan_events(_target(ctx), etl=args.etl, start=ctx.address(args.start) if args.start else None,
                       length=_number(args.length), max_events=_number(args.max_events) or DEFAULT_MAX_EVENTS)


ACTIONS = {"packets": _packets, "flow": _flow, "event": _event, "scan": _scan}


def run(ctx, args):
    action = getattr(args, "ipt_command", None)
    if not action:
        raise BadInput("choose one of: packets, flow, event, scan (see dbgext ipt -h)")
    progress = _progress(ctx) if action in ("flow", "event") else None
    try:
        result = ACTIONS[action](ctx, args, progress)
    finally:
        _end_progress(ctx, progress)
    if args.json:
        ctx.out.json(result.as_dict())
    else:
        render.RENDERERS[action](ctx.out, result, ctx.windbg)
    return 0


COMMAND = Command("ipt", "Intel PT: decode packets and reconstruct execution against target memory "
                  "(packets, flow, event, scan)", add_arguments, run)
