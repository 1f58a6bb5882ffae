"""``ln``, ``x`` and ``dt`` as dbgext commands, shaped like WinDbg's (thin: parse,
call :mod:`dbgext.symbols.query`, render)."""

import argparse

from ..command import Command
from ..errors import BadInput
from .query import MAX_DT_DEPTH, display_type, match_symbols, nearest_symbols


def _problems(ctx, result):
    for problem in result.problems:
        ctx.warn(str(problem))


# -- ln ------------------------------------------------------------------------------------

def _add_ln_arguments(parser):
    parser.add_argument("address", help="address: hex, 0n<decimal>, module!symbol[+offset], @reg")


def _run_ln(ctx, args):
    address = ctx.address(args.address)
    target = ctx.target
    result = nearest_symbols(target, address)
    if args.json:
        ctx.out.json(result.as_dict())
        return 0
    if result.module is None:
        ctx.out.line("%s is in no loaded module" % target.format_address(address))
        return 0
    if not result.before and not result.after:
        ctx.out.line("%s: %s has %s" % (target.format_address(address), result.module, result.status))
        return 0
    left = ["(%s)   %s%s" % (target.format_address(hit.address), hit.full_name,
                             "+0x%x" % result.displacement(hit) if result.displacement(hit) else "")
            for hit in result.before]
    right = ["(%s)   %s" % (target.format_address(hit.address), hit.full_name) for hit in result.after]
    ctx.out.line("   |   ".join(filter(None, [", ".join(left), ", ".join(right)])))
    if result.exact:
        ctx.out.line("Exact matches:")
        for hit in result.exact:
            ctx.out.line("    %s" % hit.full_name)
    _problems(ctx, result)
    return 0


# -- x -------------------------------------------------------------------------------------

MAX_NAMED_MODULES = 5    # modules named in one "no symbols" line; the rest are counted


def _add_x_arguments(parser):
    parser.add_argument("pattern", help="MODULE!PATTERN with * and ? wildcards, e.g. nt!Ke*Thread")


def _run_x(ctx, args):
    target = ctx.target
    result = match_symbols(target, args.pattern)
    if args.json:
        ctx.out.json(result.as_dict())
        return 0
    for hit in result.hits:
        size = " (size 0x%x)" % hit.size if hit.size else ""
        ctx.out.line("%s %s%s" % (target.format_address(hit.address), hit.full_name, size))
    if result.truncated:
        ctx.warn("more than %d matches; the rest are left out" % len(result.hits))
    reasons = []
    for why, names in _grouped(result.without_symbols):
        shown = ", ".join(names[:MAX_NAMED_MODULES])
        if len(names) > MAX_NAMED_MODULES:
            shown += " and %d more modules" % (len(names) - MAX_NAMED_MODULES)
        reasons.append("%s: no symbols: %s" % (shown, why))
    _problems(ctx, result)
    if not result.hits and reasons:
        # Nothing listed because nothing could be searched: an error, not a search that found nothing.
        raise BadInput("x %s: %s" % (args.pattern, "; ".join(reasons)))
    for reason in reasons:
        ctx.warn(reason)
    return 0


def _grouped(without_symbols):
    """[(why, [module names])] in the order the reasons first appear."""
    groups = {}
    for name, why in without_symbols:
        groups.setdefault(why, []).append(name)
    return list(groups.items())


# -- dt ------------------------------------------------------------------------------------

class _RecurseAction(argparse.Action):
    """``-r`` (all levels WinDbg allows) or ``-r1`` .. ``-r9``."""

    def __call__(self, parser, namespace, values, option_string=None):
        digits = option_string[2:]
        setattr(namespace, self.dest, int(digits) if digits else MAX_DT_DEPTH)


def _add_dt_arguments(parser):
    parser.add_argument("-r", *["-r%d" % depth for depth in range(1, MAX_DT_DEPTH + 1)], dest="recurse",
                        action=_RecurseAction, nargs=0, default=0,
                        help="show nested structures' members (-r1 .. -r9 levels; -r: all)")
    parser.add_argument("type", metavar="[MODULE!]TYPE", help="a structure, union or enum (wildcards list types)")
    parser.add_argument("address", nargs="?", help="show the values of the structure at this address")


def _run_dt(ctx, args):
    address = ctx.address(args.address) if args.address is not None else None
    target = ctx.target
    result = display_type(target, args.type, address, args.recurse)
    if args.json:
        ctx.out.json(result.as_dict())
        return 0
    if result.type_names is not None:
        ctx.out.lines(result.type_names)
        return 0
    _render_lines(ctx.out, result.lines, 1)
    for name, value in result.enumerators:
        ctx.out.line("   %s = 0n%d" % (name, value))
    _problems(ctx, result)
    return 0


def _render_lines(out, lines, level):
    width = max([len(line.name) for line in lines] or [0])
    indent = "   " * level
    for line in lines:
        shown = line.value if line.value is not None else line.type_text
        if line.value is not None and line.type_text.startswith("Ptr"):
            # WinDbg: the pointer's value, then what it points to (Ptr64 dropped).
            shown = "%s %s" % (line.value, line.type_text.split(" ", 1)[1].strip())
            if line.symbol:
                shown += "  " + line.symbol
        out.line("%s+0x%03x %s : %s" % (indent, line.offset, line.name.ljust(width), shown))
        if line.children:
            _render_lines(out, line.children, level + 1)


COMMANDS = [
    Command("ln", "list the nearest symbols before and after an address, like WinDbg's ln",
            _add_ln_arguments, _run_ln),
    Command("x", "list symbols matching MODULE!PATTERN with their addresses, like WinDbg's x",
            _add_x_arguments, _run_x),
    Command("dt", "display a type's members, and with an address their values, like WinDbg's dt",
            _add_dt_arguments, _run_dt),
]
