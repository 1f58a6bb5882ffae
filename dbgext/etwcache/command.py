"""``etwstacks``: dump ETW stack cache state, resolve StackKeys, simulate and tune."""

from ..command import Command
from ..errors import EXIT_ERROR, EXIT_PROBLEMS, BadInput
from . import layouts, render
from .analysis import DEFAULT_BUCKET_COUNTS, DEFAULT_CACHE_SIZES, analyze, name_frames, shown_buckets, simulate
from .streams import load_etl_stream, load_rtltrace_stream, load_stack_file

DEFAULT_BUCKET_LIMIT = 64


def add_arguments(parser):
    where = parser.add_argument_group("which cache (addresses in WinDbg's syntax: fffff800`00001000, nt!X+10, @rcx)")
    where.add_argument("--logger-context", metavar="ADDR", help="a _WMI_LOGGER_CONTEXT address (skip discovery)")
    where.add_argument("--cache", metavar="ADDR", help="a stack cache address (skip discovery)")
    where.add_argument("--variant", choices=sorted(layouts.CACHE_VARIANTS),
                       help="cache header layout (default: detected from memory)")
    where.add_argument("--force", action="store_true", help="walk memory that no cache header variant fits")
    show = parser.add_argument_group("what to show (counts are hex by default, 0n for decimal)")
    show.add_argument("--buckets", action="store_true", help="each bucket's entries in MRU order")
    show.add_argument("--limit", metavar="N", help="buckets shown by --buckets (default 0n%d)" % DEFAULT_BUCKET_LIMIT)
    show.add_argument("--key", metavar="ADDR", help="the stack cached under this StackKey, symbolized")
    show.add_argument("--entries", action="store_true", help="every cached stack, symbolized")
    show.add_argument("--validate", action="store_true", help="full consistency check (exit code 4 when it "
                      "finds problems)")
    show.add_argument("--busy", action="store_true",
                      help="the logger was logging when captured: do not flag RefCount 2")
    sim = parser.add_argument_group("simulate (no target needed for --stacks/--etl)")
    sim.add_argument("--simulate", action="store_true", help="replay a stack stream through the algorithm")
    sim.add_argument("--stacks", metavar="FILE", help="JSON or text file of stacks (or an .etl file)")
    sim.add_argument("--etl", metavar="FILE", help=".etl file: its StackWalk events")
    sim.add_argument("--rtltrace", metavar="ADDR", help="RTL_TRACE_DATABASE in the target: traces by hit count")
    sim.add_argument("--bucket-count", metavar="N[,N...]", help="bucket counts to try (default %s)"
                     % ",".join("0n%d" % n for n in DEFAULT_BUCKET_COUNTS))
    sim.add_argument("--cache-size", metavar="SIZE[,SIZE...]", help="cache sizes in bytes to try (default %s)"
                     % ",".join("0x%x" % n for n in DEFAULT_CACHE_SIZES))
    sim.add_argument("--no-clamp", action="store_true",
                     help="do not clamp to Windows' ranges (0n256..0n4096 buckets, 3..50 MB)")


def _counts(ctx, text):
    return [ctx.count(part) for part in text.split(",") if part.strip()]


def run(ctx, args):
    if args.simulate:
        return run_simulation(ctx, args)
    limit = ctx.count(args.limit) if args.limit is not None else DEFAULT_BUCKET_LIMIT
    if limit <= 0:
        raise BadInput("--limit must be positive")
    result = analyze(ctx.target,
                     cache=ctx.address(args.cache) if args.cache else None,
                     logger_context=ctx.address(args.logger_context) if args.logger_context else None,
                     variant=args.variant, validate=args.validate, busy=args.busy,
                     key=ctx.address(args.key) if args.key else None, force=args.force)
    if result.key is not None:
        if args.json:
            ctx.out.json(result.key.as_dict())
        else:
            render.key_lookup(ctx.out, result.key)
        return 0 if result.key.found else EXIT_ERROR
    if args.json:
        ctx.out.json(result.as_dict())
        return EXIT_PROBLEMS if args.validate and result.problems.errors else 0
    if result.logger_layouts:
        render.layout_sources(ctx.out, result.logger_layouts)
    if not result.caches:
        ctx.out.line("no logger has stack caching enabled")
    for report in result.caches:
        render.summary(ctx.out, report, args.validate)
        if args.buckets and report.state.readable:
            shown, _ = shown_buckets(report.state, limit)
            name_frames(ctx.target, report, [entry for _, bucket in shown for entry in bucket], first_only=True)
            render.buckets(ctx.out, report, limit)
            ctx.out.line()
        if args.entries:
            name_frames(ctx.target, report, report.state.entries)
            for entry in report.state.entries:
                render.stack(ctx.out, entry, report.frame_names)
                ctx.out.line()
    return EXIT_PROBLEMS if args.validate and result.problems.errors else 0


def load_stream(ctx, args):
    sources = [name for name in ("stacks", "etl", "rtltrace") if getattr(args, name)]
    if len(sources) != 1:
        raise BadInput("--simulate needs exactly one of --stacks FILE, --etl FILE, --rtltrace ADDR")
    if args.stacks:
        return load_stack_file(args.stacks)
    if args.etl:
        return load_etl_stream(args.etl)
    return load_rtltrace_stream(ctx.target, ctx.address(args.rtltrace))


def run_simulation(ctx, args):
    report = simulate(load_stream(ctx, args),
                      _counts(ctx, args.bucket_count) if args.bucket_count else DEFAULT_BUCKET_COUNTS,
                      _counts(ctx, args.cache_size) if args.cache_size else DEFAULT_CACHE_SIZES,
                      clamp=not args.no_clamp)
    if args.json:
        ctx.out.json(report.as_dict())
    else:
        render.simulation(ctx.out, report)
    return 0


COMMAND = Command("etwstacks", "ETW stack cache: state, StackKey lookup, validation, simulation and tuning",
                  add_arguments, run)
