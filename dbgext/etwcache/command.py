"""``etwstacks``: dump ETW stack cache state, resolve StackKeys, simulate and tune."""

from ..address import parse_hex
from ..command import Command
from ..errors import BadInput
from ..problems import Problem
from . import discover, layouts, render, simulate, streams
from .validate import validate
from .walk import read_cache

DEFAULT_BUCKET_COUNTS = (256, 257, 1021, 2039, 4093)
DEFAULT_CACHE_SIZES = (0x300000, 0x800000, 0x1000000)


def parse_size(text):
    """``0x300000``, ``3145728``, ``3M``, ``512K``."""
    value = text.strip().upper().rstrip("B")
    scale = 1
    if value.endswith("K"):
        scale, value = 1024, value[:-1]
    elif value.endswith("M"):
        scale, value = 1024 * 1024, value[:-1]
    try:
        number = float(int(value, 0)) if value.startswith("0X") else float(value)
    except ValueError:
        raise BadInput("%r is not a size" % text)
    return int(number * scale)


def parse_list(text, parse):
    values = [parse(part) for part in text.split(",") if part.strip()]
    if not values or any(v <= 0 for v in values):
        raise BadInput("%r: expected a comma-separated list of positive numbers" % text)
    return values


def add_arguments(parser):
    where = parser.add_argument_group("which cache")
    where.add_argument("--logger-context", metavar="ADDR", help="a _WMI_LOGGER_CONTEXT address (skip discovery)")
    where.add_argument("--cache", metavar="ADDR", help="a stack cache address (skip discovery)")
    where.add_argument("--variant", choices=sorted(layouts.CACHE_VARIANTS),
                       help="cache header layout (default: detected from memory)")
    show = parser.add_argument_group("what to show")
    show.add_argument("--buckets", action="store_true", help="each bucket's entries in MRU order")
    show.add_argument("--limit", type=int, default=64, metavar="N", help="buckets shown by --buckets (64)")
    show.add_argument("--key", metavar="ADDR", help="the stack cached under this StackKey, symbolized")
    show.add_argument("--entries", action="store_true", help="every cached stack, symbolized")
    show.add_argument("--validate", action="store_true", help="full consistency check")
    show.add_argument("--busy", action="store_true",
                      help="the logger was logging when captured: do not flag RefCount 2")
    sim = parser.add_argument_group("simulate (no target needed for --stacks/--etl)")
    sim.add_argument("--simulate", action="store_true", help="replay a stack stream through the algorithm")
    sim.add_argument("--stacks", metavar="FILE", help="JSON or text file of stacks")
    sim.add_argument("--etl", metavar="FILE", help=".etl file: its StackWalk events")
    sim.add_argument("--rtltrace", metavar="ADDR", help="RTL_TRACE_DATABASE in the target: traces by hit count")
    sim.add_argument("--bucket-count", metavar="N[,N...]", help="bucket counts to try (default %s)"
                     % ",".join(str(n) for n in DEFAULT_BUCKET_COUNTS))
    sim.add_argument("--cache-size", metavar="SIZE[,SIZE...]", help="cache sizes to try, e.g. 3M,0x800000 "
                     "(default %s)" % ",".join("0x%x" % n for n in DEFAULT_CACHE_SIZES))
    sim.add_argument("--no-clamp", action="store_true",
                     help="do not clamp to Windows' ranges (256..4096 buckets, 3..50 MB)")


def run(ctx, args):
    if args.simulate:
        return run_simulation(ctx, args)
    if args.limit <= 0:
        raise BadInput("--limit must be positive")
    target = ctx.target
    if target.arch != "x64":
        raise BadInput("ETW stack cache layouts are known for x64 kernels only (target is %s)" % target.arch)
    targets = caches_to_read(target, args)
    if not targets:
        if args.json:
            ctx.out.json({"loggers": []})
        else:
            ctx.out.line("no logger has stack caching enabled")
        return 0
    results = []
    for logger, cache in targets:
        state = read_cache(target, cache, variant=args.variant,
                           logger_context=logger.context if logger else None,
                           logger_id=logger.logger_id if logger else None)
        problems = [Problem(*problem) for problem in (logger.problems if logger else [])]
        problems.extend(state.problems)
        if args.validate:
            problems.extend(validate(state, idle=not args.busy))
        results.append((logger, state, problems))
    if args.key:
        return show_key(ctx, target, results, parse_hex(args.key))
    if args.json:
        ctx.out.json({"loggers": [render.logger_document(logger, state, problems)
                                  for logger, state, problems in results]})
        return 0
    for logger, state, problems in results:
        render.summary(ctx.out, target, logger, state, problems, args.validate)
        if args.buckets and state.readable:
            render.buckets(ctx.out, target, state, args.limit)
            ctx.out.line()
        if args.entries:
            for entry in state.entries:
                render.stack(ctx.out, target, entry)
                ctx.out.line()
    return 0


def caches_to_read(target, args):
    """[(LoggerInfo or None, cache address)] from the options or from discovery."""
    logger = None
    if args.logger_context:
        offsets = discover.field_offsets(target)
        logger = discover.read_logger(target, parse_hex(args.logger_context), offsets)
        for kind, address, detail in logger.problems:
            if kind == "unreadable" and not args.cache:
                raise BadInput("logger context 0x%x: %s" % (address, detail))
    if args.cache:
        return [(logger, parse_hex(args.cache))]
    if logger is not None:
        return [(logger, logger.stack_cache)] if logger.stack_cache else []
    loggers, _offsets = discover.discover_loggers(target)
    return [(info, info.stack_cache) for info in loggers if info.stack_cache]


def show_key(ctx, target, results, key):
    for logger, state, _problems in results:
        entry = state.find(key)
        if entry is None:
            continue
        if ctx.args.json:
            document = entry.as_dict()
            document["symbols"] = [target.symbolize(frame) for frame in entry.frames]
            ctx.out.json({"key": key, "found": True, "logger_id": logger.logger_id if logger else None,
                          "cache": state.address, "entry": document})
        else:
            ctx.out.line(render.logger_label(logger))
            render.stack(ctx.out, target, entry)
        return 0
    free = any(key in set(state.free_pieces) for _, state, _ in results)
    why = "it is on the free list (evicted; look for its Delete Definition event)" if free else \
        "it is not the first piece of any cached stack"
    if ctx.args.json:
        ctx.out.json({"key": key, "found": False, "entry": None, "detail": why})
    else:
        ctx.out.line("StackKey 0x%x is not cached: %s" % (key, why))
    return 1


def load_stream(ctx, args):
    sources = [name for name in ("stacks", "etl", "rtltrace") if getattr(args, name)]
    if len(sources) != 1:
        raise BadInput("--simulate needs exactly one of --stacks FILE, --etl FILE, --rtltrace ADDR")
    if args.stacks:
        return streams.load_stack_file(args.stacks)
    if args.etl:
        return streams.load_etl_stream(args.etl)
    return streams.load_rtltrace_stream(ctx.target, parse_hex(args.rtltrace))


def run_simulation(ctx, args):
    stream = load_stream(ctx, args)
    if not len(stream):
        raise BadInput("the stack stream is empty (%s)" % "; ".join(stream.notes or [stream.source]))
    bucket_counts = parse_list(args.bucket_count, lambda t: int(t, 0)) if args.bucket_count \
        else list(DEFAULT_BUCKET_COUNTS)
    cache_sizes = parse_list(args.cache_size, parse_size) if args.cache_size else list(DEFAULT_CACHE_SIZES)
    if any(size < layouts.PIECE_SIZE for size in cache_sizes):
        raise BadInput("a cache size below one piece (0x%x bytes) holds nothing" % layouts.PIECE_SIZE)
    results, notes = simulate.sweep(stream, bucket_counts, cache_sizes, clamp=not args.no_clamp)
    recommendation = simulate.recommend(results)
    if args.json:
        ctx.out.json(render.simulation_document(stream, results, recommendation, notes))
    else:
        render.simulation(ctx.out, stream, results, recommendation, notes)
    return 0


COMMAND = Command("etwstacks", "ETW stack cache: state, StackKey lookup, validation, simulation and tuning",
                  add_arguments, run)
