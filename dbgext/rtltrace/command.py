"""``rtltrace``: walk, validate and find RTL_TRACE_DATABASE stack-trace databases."""

import sys

from ..address import parse_hex
from ..command import Command
from ..errors import BadInput, UnreadableMemory
from .find import find_databases
from .layouts import DATABASE_MAGIC, LAYOUT_NAMES
from .render import (Links, candidates_document, database_document, render_block, render_bucket,
                     render_candidates, render_header, render_magic_checks, render_problems, render_summary,
                     render_traces)
from .validate import analyze
from .walk import read_block

SUMMARY_TOP = 10

SORT_KEYS = {
    "count": lambda block: (-block.count, block.address),
    "depth": lambda block: (-block.size, block.address),
    "address": lambda block: block.address,
}


def add_arguments(parser):
    parser.add_argument("address", nargs="?",
                        help="database address (hex, 0x..., fffff800`00001000) or a symbol; a symbol "
                        "naming a pointer to a database is followed")
    parser.add_argument("--layout", choices=LAYOUT_NAMES, help="structure layout (default: from type "
                        "information, else recognised from memory)")
    view = parser.add_mutually_exclusive_group()
    view.add_argument("--traces", action="store_true", help="list traces")
    view.add_argument("--trace", metavar="ADDR", help="one trace block in full")
    view.add_argument("--bucket", metavar="N", type=int, help="one bucket's chain")
    view.add_argument("--module", metavar="NAME", help="traces with a frame in module NAME")
    view.add_argument("--validate", action="store_true", help="check every invariant and list problems")
    view.add_argument("--find", action="store_true", help="scan readable memory for databases")
    parser.add_argument("--sort", choices=sorted(SORT_KEYS), default="count", help="trace order (default count)")
    parser.add_argument("--limit", metavar="N", type=int, help="at most N traces (the summary's top "
                        "traces: default %d)" % SUMMARY_TOP)
    parser.add_argument("--range", metavar=("START", "END"), nargs=2, help="--find only in [START, END)")


def parse_address(target, text):
    """(address, was_symbol): hex with or without 0x and WinDbg's backtick, or a symbol."""
    try:
        return parse_hex(text), False
    except BadInput:
        pass
    address = target.symbol_address(text.strip())
    if address is None:
        raise BadInput("%r is neither a hex address nor a known symbol" % text)
    return address, True


def resolve_database(target, text):
    """The database address for the user's argument, and a note when a symbol was
    followed (``driver!g_TraceDatabase`` holds a pointer to the database)."""
    address, was_symbol = parse_address(target, text)
    if not was_symbol:
        return address, None
    try:
        if target.u32(address) == DATABASE_MAGIC:
            return address, None
        pointed = target.pointer(address)
        if target.u32(pointed) == DATABASE_MAGIC:
            return pointed, "%s holds a pointer to the database at %s" % (text, target.format_address(pointed))
    except UnreadableMemory:
        pass
    return address, None


def _script(ctx):
    """The !py path of commands/rtltrace.py when running inside WinDbg."""
    if not ctx.windbg or not sys.argv or not sys.argv[0]:
        return None
    script = sys.argv[0]
    return '"%s"' % script if " " in script else script


def _limited(blocks, limit):
    return blocks if limit is None else blocks[:max(0, limit)]


def run_find(ctx, args):
    target = ctx.target
    start, end = 0, None
    if args.range:
        start = parse_address(target, args.range[0])[0]
        end = parse_address(target, args.range[1])[0]
        if end <= start:
            raise BadInput("--range END must be above START")
    candidates = find_databases(target, start, end)
    if args.json:
        ctx.out.json(candidates_document(candidates))
    else:
        render_candidates(ctx.out, target, candidates)
    return 0


def _selected_trace(target, db, text):
    address = parse_address(target, text)[0]
    for block in db.blocks:
        if address in (block.address, block.trace):
            return block
    try:
        return read_block(target, db.layout, address)
    except UnreadableMemory as error:
        raise BadInput("no trace block at 0x%x: memory at 0x%x is unreadable" % (address, error.address))


def run(ctx, args):
    if args.find:
        return run_find(ctx, args)
    if args.address is None:
        raise BadInput("give the database address (or --find to look for databases)")
    if args.range:
        raise BadInput("--range applies to --find only")
    target = ctx.target
    address, followed = resolve_database(target, args.address)
    db = analyze(target, address, args.layout)
    if followed:
        db.note(followed)
    links = Links(_script(ctx))
    out = ctx.out
    blocks = db.blocks
    selection = "all"
    if args.trace:
        blocks, selection = [_selected_trace(target, db, args.trace)], "trace"
    elif args.bucket is not None:
        if not 0 <= args.bucket < max(db.buckets_walked, 1) or not db.buckets_walked:
            raise BadInput("bucket %d is outside 0..%d" % (args.bucket, max(db.buckets_walked - 1, 0)))
        blocks, selection = [block for block in db.blocks if block.bucket == args.bucket], "bucket"
    elif args.module:
        module = target.module_named(args.module)
        if module is None:
            raise BadInput("no module named %r (known: %s)" % (
                args.module, ", ".join(m.name for m in target.modules()) or "none"))
        blocks = [block for block in blocks if any(module.contains(frame) for frame in block.frames or ())]
        selection = "module"
    if selection in ("all", "module") and (args.json or args.traces or args.module):
        blocks = sorted(blocks, key=SORT_KEYS[args.sort])
    blocks = _limited(blocks, args.limit)
    if args.json:
        out.json(database_document(db, blocks, selection))
        return 0
    if args.trace:
        render_block(out, target, db, blocks[0], links)
    elif args.bucket is not None:
        render_bucket(out, target, db, args.bucket, blocks, links)
    elif args.module:
        render_traces(out, target, db, blocks, links, "Traces with a frame in %s: %d" % (module.name, len(blocks)))
    elif args.traces:
        render_traces(out, target, db, blocks, links, "Traces (%d, by %s):" % (len(blocks), args.sort))
    elif args.validate:
        render_header(out, target, db)
        if db.header_read:
            render_magic_checks(out, db)
        render_problems(out, target, db)
    else:
        render_summary(out, target, db, links, top=SUMMARY_TOP if args.limit is None else args.limit)
    return 0


COMMAND = Command("rtltrace", "walk, validate and find RTL_TRACE_DATABASE stack-trace databases",
                  add_arguments, run)
