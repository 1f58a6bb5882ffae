"""``stackuse``: frame sizes, worst-case call chains, thread stack consumption.

    dbgext stackuse functions --pe FILE | --dump FILE --module NAME [--jsonl] [--depth]
    dbgext stackuse chain FUNCTION|ADDRESS [--pe FILE | --dump FILE [--module NAME]]
    dbgext stackuse thread [KTHREAD] --dump FILE [--threshold BYTES]
    dbgext stackuse hogs [--top N] [--budget BYTES] (--pe FILE | --module NAME)
"""

import argparse

from ..command import Command
from ..errors import BadInput
from ..target.symbols import load_isf_directory
from .callgraph import SEVERITY, UNBOUNDED, UNKNOWN, CallGraph, Program
from .layouts import DEFAULT_BUDGET
from ..pe import PEImage
from .render import render_chain, render_functions, render_hogs, render_thread
from .thread import walk_thread

ACTIONS = ("functions", "chain", "thread", "hogs")


def add_arguments(parser):
    parser.add_argument("action", choices=ACTIONS, help="what to show")
    parser.add_argument("subject", nargs="?",
                        help="chain: function name (module!name) or address; thread: KTHREAD address")
    parser.add_argument("--pe", metavar="FILE", help="analyse a PE file on disk instead of a target module")
    parser.add_argument("--module", metavar="NAME", help="module of the target to analyse")
    parser.add_argument("--jsonl", action="store_true", help="functions: one JSON object per line")
    parser.add_argument("--depth", action="store_true", help="functions: add the worst-case depth of each")
    parser.add_argument("--threshold", type=_number, metavar="BYTES",
                        help="thread: flag frames using at least this many bytes")
    parser.add_argument("--top", type=int, default=20, metavar="N",
                        help="hogs: how many largest frames and over-budget chains to list")
    parser.add_argument("--budget", type=_number, metavar="BYTES",
                        help="hogs: stack budget (default 24 KiB on x64, 12 KiB on x86)")


def _number(text):
    """argparse type for byte counts: decimal or 0x-hex."""
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number: %r" % text)


def run(ctx, args):
    if args.action == "thread":
        return _thread(ctx, args)
    program, module = _open(ctx, args, need_module=args.action != "chain")
    graph = CallGraph(program)
    if args.action == "functions":
        return _functions(ctx, args, module, graph)
    if args.action == "chain":
        return _chain(ctx, args, program, module, graph)
    return _hogs(ctx, args, module, graph)


def _open(ctx, args, need_module):
    if args.pe:
        program = Program()
        image = PEImage.from_file(args.pe)
        return program, program.add_image(image, _file_symbols(args, image))
    if not ctx.has_target_source():
        raise BadInput("give --pe FILE, or --dump FILE with --module NAME")
    target = ctx.target
    program = Program(target)
    if args.module:
        loaded = target.module_named(args.module)
        if loaded is None:
            raise BadInput("no module named %r in the target (loaded: %s)" % (args.module, _module_names(target)))
        return program, program.add_target_module(loaded)
    if need_module:
        raise BadInput("give --module NAME (loaded: %s)" % _module_names(target))
    return program, None


def _file_symbols(args, image):
    """Symbols for a PE on disk from ``--symbols`` ISF files: the file named after
    the image's stem (``driver.json`` for ``driver.sys``), as for dump modules."""
    if not args.symbols:
        return None
    table = load_isf_directory(args.symbols)
    module_symbols = table.module_symbols(image.name.rsplit(".", 1)[0]) or table.module_symbols(image.name)
    return module_symbols.symbols if module_symbols is not None else None


def _module_names(target, limit=12):
    names = [module.name for module in target.modules()]
    if not names:
        return "none"
    more = " and %d more" % (len(names) - limit) if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _functions(ctx, args, module, graph):
    graph.analyse_all(module)
    functions = [module.functions[va] for va in sorted(module.functions)]
    bounds = {f.va: graph.bound(f) for f in functions} if args.depth else None
    render_functions(ctx.out, module, functions, bounds, jsonl=args.jsonl, as_json=args.json)
    return 0


def _address(text):
    """``0x...``, WinDbg's ``fffff801`23400000`` or bare hex of 8+ digits -> int, else None."""
    cleaned = text.replace("`", "")
    if cleaned.lower().startswith("0x") or "`" in text or (
            len(cleaned) >= 8 and all(c in "0123456789abcdefABCDEF" for c in cleaned)):
        try:
            return int(cleaned, 16)
        except ValueError:
            return None
    return None


def _resolve(program, module, subject):
    if not subject:
        raise BadInput("chain needs a function name or address")
    address = _address(subject)
    if address is not None:
        found = program.module_for(address)
        if found is None:
            raise BadInput("0x%x is not in any analysable module" % address)
        function = found.function_containing(address) if address not in found.functions else found.functions[address]
        if function is None:
            function = found.add(address, "request")
        if function is None:
            raise BadInput("0x%x is not in the code of %s" % (address, found.name))
        return function
    name = subject
    candidates = [module] if module is not None else list(program.modules)
    if "!" in subject:
        module_name, name = subject.split("!", 1)
        if module is None and program.target is not None:
            loaded = program.target.module_named(module_name)
            if loaded is None:
                raise BadInput("no module named %r in the target" % module_name)
            candidates = [program.module_for(loaded.base)]
            if candidates[0] is None:
                raise BadInput("; ".join(program.problems) or "cannot analyse %s" % module_name)
    elif module is None and program.target is not None:
        address = program.target.symbol_address(subject)
        if address is not None:
            return _resolve(program, module, "0x%x" % address)
    for candidate in candidates:
        function = candidate.find_by_name(name)
        if function is not None:
            return function
    raise BadInput("no function named %r (exports and symbols searched)" % subject)


def _chain(ctx, args, program, module, graph):
    function = _resolve(program, module, args.subject)
    render_chain(ctx.out, graph.chain(function), as_json=args.json)
    return 0


def _thread(ctx, args):
    if args.pe:
        raise BadInput("thread needs a target (--dump FILE or WinDbg), not --pe")
    if not ctx.has_target_source():
        raise BadInput("thread needs --dump FILE (or WinDbg)")
    target = ctx.target
    thread = None
    if args.subject:
        thread = _address(args.subject)
        if thread is None:
            raise BadInput("not a thread address: %r" % args.subject)
    program = Program(target)
    stack = walk_thread(target, program, CallGraph(program), thread=thread, threshold=args.threshold)
    render_thread(ctx.out, stack, target, as_json=args.json)
    return 0


def _hogs(ctx, args, module, graph):
    graph.analyse_all(module)
    budget = args.budget if args.budget is not None else DEFAULT_BUDGET[module.arch]
    functions = [module.functions[va] for va in sorted(module.functions)]
    # A chained fragment runs in its parent's frame: listing it would repeat the parent.
    sized = [f for f in functions if f.frame_size is not None and f.fragment_of is None]
    largest = sorted(sized, key=lambda f: (-f.frame_size, f.va))[:max(args.top, 0)]
    bounds = {f.va: graph.bound(f) for f in functions}
    over = [f for f in functions if f.fragment_of is None and (
        bounds[f.va].status in (UNBOUNDED, UNKNOWN) or (bounds[f.va].value or 0) > budget)]
    # Finite chains over the budget first (deepest first), then unknown, then
    # unbounded (recursion): the finite ones are what a driver writer can fix.
    over.sort(key=lambda f: (SEVERITY[bounds[f.va].status], -(bounds[f.va].value or 0), f.va))
    render_hogs(ctx.out, module, largest, over[:max(args.top, 0)], len(over), budget, bounds, as_json=args.json)
    return 0


COMMAND = Command("stackuse", "frame sizes, worst-case call chains and thread stack consumption",
                  add_arguments, run)
