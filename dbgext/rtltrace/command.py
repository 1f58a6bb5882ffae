"""``rtltrace``: walk, validate and find RTL_TRACE_DATABASE stack-trace databases."""

import sys

from ..command import Command
from ..errors import EXIT_PROBLEMS, BadInput
from .analysis import find, name_frames, walk
from .layouts import LAYOUT_NAMES
from .render import SORTS, TOP_TRACES, Links, render, render_candidates, render_notes, shown_traces, top_traces


def add_arguments(parser):
    parser.add_argument("address", nargs="?",
                        help="database address in WinDbg's syntax (fffff800`00001000, nt!X+10, @rcx); a "
                        "location holding a pointer to a database is followed")
    parser.add_argument("--layout", choices=LAYOUT_NAMES, help="built-in structure layout (default: from type "
                        "information, else recognised from memory)")
    parser.add_argument("--force", action="store_true", help="walk the address even if the database magic "
                        "is not there")
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--traces", action="store_true", help="list traces")
    view.add_argument("--trace", metavar="ADDR", help="one trace block in full")
    view.add_argument("--bucket", metavar="N", help="one bucket's chain (N: hex, or 0n decimal)")
    view.add_argument("--module", metavar="NAME", help="traces with a frame in module NAME")
    view.add_argument("--validate", action="store_true", help="check every invariant and list problems "
                      "(exit code 4 when there are any)")
    view.add_argument("--find", action="store_true", help="scan readable memory for databases")
    parser.add_argument("--sort", choices=sorted(SORTS), default="count", help="trace order (default count)")
    parser.add_argument("--limit", metavar="N", help="at most N traces (the summary's top traces: default "
                        "0n%d)" % TOP_TRACES)
    parser.add_argument("--range", metavar=("START", "END"), nargs=2, help="--find only in [START, END)")


def _script(ctx):
    """The !py path of commands/rtltrace.py when running inside WinDbg."""
    if not ctx.windbg or not sys.argv or not sys.argv[0]:
        return None
    script = sys.argv[0]
    return '"%s"' % script if " " in script else script


def run_find(ctx, args):
    start, end = (ctx.address(args.range[0]), ctx.address(args.range[1])) if args.range else (0, None)
    if end is None and not ctx.target.can_list_memory():
        raise BadInput("this target cannot list its memory: give --find --range START END")
    search = find(ctx.target, start, end)
    if args.json:
        ctx.out.json(search.as_dict())
    else:
        render_candidates(ctx.out, ctx.target.format_address, search)
    return 0


def run(ctx, args):
    if args.find:
        return run_find(ctx, args)
    if args.address is None:
        raise BadInput("give the database address (or --find to look for databases)")
    if args.range:
        raise BadInput("--range applies to --find only")
    limit = ctx.count(args.limit) if args.limit is not None else None
    target = ctx.target
    db = walk(target, ctx.address(args.address), layout=args.layout, force=args.force,
              trace=ctx.address(args.trace) if args.trace else None,
              bucket=ctx.count(args.bucket) if args.bucket is not None else None, module=args.module)
    view = "json" if args.json else "validate" if args.validate else "traces" if args.traces else "summary"
    # Sorted only where shown: a whole database's summary lists just its top traces.
    lists_traces = view in ("json", "traces") or db.selection.kind != "all"
    shown = shown_traces(db, args.sort, limit) if lists_traces else []
    top = top_traces(db, TOP_TRACES if limit is None else limit) if view == "summary" and not lists_traces else []
    if view == "json":
        name_frames(target, db, shown)
        ctx.out.json(db.as_dict(traces=shown))
    else:
        if view != "validate":
            name_frames(target, db, shown if lists_traces else top)
        render(ctx.out, target.format_address, db, Links(_script(ctx)), view, shown, top, args.sort)
        render_notes(ctx.err, db)
    return EXIT_PROBLEMS if args.validate and db.problems.errors else 0


COMMAND = Command("rtltrace", "walk, validate and find RTL_TRACE_DATABASE stack-trace databases",
                  add_arguments, run)
