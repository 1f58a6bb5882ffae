"""``stackuse``: frame sizes, worst-case call chains, thread stack consumption.

    dbgext stackuse functions (--pe FILE | --dump FILE --module NAME) [--jsonl] [--depth] [--symbols PATH | --pdb FILE]
    dbgext stackuse chain FUNCTION|ADDRESS (--pe FILE | --dump FILE [--module NAME])
    dbgext stackuse thread [KTHREAD] --dump FILE [--threshold BYTES]
    dbgext stackuse hogs [--top N] [--budget BYTES] (--pe FILE | --dump FILE --module NAME)

The command parses, calls :mod:`dbgext.stackuse.analysis`, and renders the result.
"""

import argparse

from ..address import parse_number
from ..command import Command
from ..errors import BadInput, SymbolNotFound
from ..pe import PEImage
from ..symbols.table import pe_file_symbols
from . import analysis
from .callgraph import CallGraph, Program
from .render import render_chain, render_functions, render_hogs, render_problems, render_thread
from .thread import walk_thread


def add_arguments(parser):
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    functions = actions.add_parser("functions", help="every function's frame size (and worst-case depth)")
    _code_options(functions)
    functions.add_argument("--jsonl", action="store_true", help="one JSON object per line")
    functions.add_argument("--depth", action="store_true", help="add the worst-case depth of each function")
    chain = actions.add_parser("chain", help="the deepest call chain from one function")
    chain.add_argument("subject", nargs="?", metavar="FUNCTION",
                       help="a function name (module!name) or an address expression")
    _code_options(chain)
    thread = actions.add_parser("thread", help="a kernel thread's stack consumption, frame by frame")
    thread.add_argument("subject", nargs="?", metavar="KTHREAD", help="KTHREAD address (default: the current one)")
    thread.add_argument("--pe", metavar="FILE", help=argparse.SUPPRESS)  # refused with a reason
    thread.add_argument("--threshold", metavar="BYTES", help="flag frames using at least this many bytes (hex)")
    hogs = actions.add_parser("hogs", help="the largest frames and the call chains over a stack budget")
    _code_options(hogs)
    hogs.add_argument("--top", default="0n20", metavar="N",
                      help="how many largest frames and over-budget chains to list (hex; default 0n20)")
    hogs.add_argument("--budget", metavar="BYTES",
                      help="stack budget (hex; default 24 KiB on x64 and ARM64, 12 KiB on x86)")


def _code_options(parser):
    parser.add_argument("--pe", metavar="FILE", help="analyse a PE file on disk instead of a target module")
    parser.add_argument("--module", metavar="NAME", help="module of the target to analyse")
    parser.add_argument("--pdb", metavar="FILE", help="name functions from this PDB (its procedures; shorthand "
                        "for a --symbols path holding only it, refused unless its GUID and age match)")


def run(ctx, args):
    if args.action == "thread":
        return _thread(ctx, args)
    pe = PEImage.from_file(args.pe) if args.pe else None
    symbols = _symbols(ctx, args, pe)
    target = None
    if not args.pe:
        if not ctx.has_target_source():
            raise BadInput("give --pe FILE, or --dump FILE with --module NAME")
        target = ctx.target
    if args.action == "functions":
        result = analysis.analyze(target, pe, args.module, symbols, args.pdb, depth=args.depth)
        render_functions(ctx.out, result, jsonl=args.jsonl, as_json=args.json)
    elif args.action == "chain":
        result = analysis.chain(_subject(ctx, args), target, pe, args.module, symbols, args.pdb)
        render_chain(ctx.out, result, as_json=args.json)
    else:
        budget = parse_number(args.budget) if args.budget is not None else None
        result = analysis.hogs(target, pe, args.module, symbols, args.pdb, top=parse_number(args.top),
                               budget=budget)
        render_hogs(ctx.out, result, as_json=args.json)
    if not (args.json or getattr(args, "jsonl", False)):
        render_problems(ctx.err, result.problems)
    return 0


def _subject(ctx, args):
    """An address expression (WinDbg's grammar, evaluated on the target) or a
    function name looked up in the analysed module's exports and symbols."""
    text = args.subject
    if not text:
        raise BadInput("chain needs a function name or an address")
    if args.pe:
        try:
            return parse_number(text)
        except BadInput:
            return text
    try:
        return ctx.address(text)
    except (BadInput, SymbolNotFound):
        return text


def _symbols(ctx, args, pe):
    """Function names ({rva: name}) for a PE file on disk from the symbol path
    (``--symbols``, else ``_NT_SYMBOL_PATH``): the ISF file named after the image,
    else its PDB matched by GUID and age.  A target's modules get theirs from the
    target; ``--pdb FILE`` names one PDB directly."""
    if pe is None or args.pdb:
        return None
    table = pe_file_symbols(pe, args.symbols, args.no_download, diagnostics=ctx.err)
    return table.names_by_rva() if table is not None else None


def _thread(ctx, args):
    if args.pe:
        raise BadInput("thread needs a target (--dump FILE or WinDbg), not --pe")
    if not ctx.has_target_source():
        raise BadInput("thread needs --dump FILE (or WinDbg)")
    target = ctx.target
    thread = ctx.address(args.subject) if args.subject else None
    threshold = parse_number(args.threshold) if args.threshold is not None else None
    program = Program(target)
    stack = walk_thread(target, program, CallGraph(program), thread=thread, threshold=threshold)
    render_thread(ctx.out, stack, target.format_address, as_json=args.json)
    if not args.json:
        render_problems(ctx.err, stack.problems)
    return 0


COMMAND = Command("stackuse", "frame sizes, worst-case call chains and thread stack consumption",
                  add_arguments, run)
