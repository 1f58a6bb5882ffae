"""``db``, ``dd``, ``dq``, ``dps`` and ``lm`` as dbgext commands (thin: parse,
call :mod:`dbgext.basic.memory`, render with :mod:`dbgext.basic.format`)."""

from ..command import Command
from ..errors import BadInput
from . import format as layout
from ..address import evaluate, parse_range
from ..pseudo_registers import PseudoRegisterResolver
from .memory import list_modules, read_pointers, read_units

# name -> (unit bytes or None for pointer-sized, default count, help)
DISPLAYS = {
    "db": (1, 0x80, "display bytes and ASCII, like WinDbg's db"),
    "dd": (4, 0x20, "display DWORDs, like WinDbg's dd"),
    "dq": (8, 0x10, "display QWORDs, like WinDbg's dq"),
    "dps": (None, 0x10, "display pointers with the symbols they point to, like WinDbg's dps"),
}


def _add_range_arguments(parser):
    parser.add_argument("address", help="start: hex (0x optional, ` allowed), 0n<decimal>, "
                        "module!symbol[+offset] or module")
    parser.add_argument("range", nargs="*", metavar="LEN",
                        help="L<count> (units, hex) or an inclusive end address, as in WinDbg")


def _start_and_count(ctx, args, unit, default_count):
    target = ctx.target
    resolver = PseudoRegisterResolver(target)
    address = evaluate(args.address, resolver)
    if target.pointer_size == 4 and address >> 32 == 0xFFFFFFFF:
        address &= 0xFFFFFFFF  # WinDbg's sign-extended form of a 32-bit address
    if address > target.address_mask:
        raise BadInput("address 0x%x is outside the %s address space" % (address, target.arch))
    return target, address, parse_range(args.range, address, unit, default_count, resolver)


def _run_units(name):
    unit, default_count, _ = DISPLAYS[name]

    def run(ctx, args):
        target, address, count = _start_and_count(ctx, args, unit, default_count)
        display = read_units(target, address, unit, count)
        if args.json:
            ctx.out.json(display.as_dict())
            return 0
        if display.clamped:
            ctx.err.line(layout.clamp_note(display.requested, len(display.values), unit))
        render = layout.byte_lines if unit == 1 else layout.unit_lines
        ctx.out.lines(render(display, target.format_address))
        return 0
    return run


def _run_dps(ctx, args):
    unit, default_count = ctx.target.pointer_size, DISPLAYS["dps"][1]
    target, address, count = _start_and_count(ctx, args, unit, default_count)
    display = read_pointers(target, address, count)
    if args.json:
        ctx.out.json(display.as_dict())
        return 0
    out = ctx.out
    if display.requested is not None:
        ctx.err.line(layout.clamp_note(display.requested, len(display.entries), unit))
    for entry in display.entries:
        where, value, symbol = layout.pointer_line_parts(entry, unit, target.format_address)
        if not out.dml or entry.value is None:
            out.line(("%s  %s %s" % (where, value, symbol)).rstrip())
            continue
        markup = "%s  %s" % (out.link(where, "dps 0x%x" % entry.address),
                             out.link(value, "dps 0x%x" % entry.value))
        if symbol:
            markup += " " + out.link(symbol, "u 0x%x" % entry.value)
        out.markup_line(markup)
    return 0


def _add_lm_arguments(parser):
    parser.add_argument("filter", nargs="*", metavar="m PATTERN",
                        help="'m PATTERN' lists only modules whose name matches the wildcard, as in WinDbg")


def _run_lm(ctx, args):
    pattern = None
    if args.filter:
        if len(args.filter) != 2 or args.filter[0].lower() != "m":
            raise BadInput("lm takes no arguments or 'm PATTERN' (got '%s')" % " ".join(args.filter))
        pattern = args.filter[1]
    target = ctx.target
    listing = list_modules(target, pattern)
    if args.json:
        ctx.out.json(listing.as_dict())
        return 0
    modules = listing.modules
    rows = [[target.format_address(m.start), target.format_address(m.end), m.name, m.image,
             _symbol_column(m)] for m in modules]
    links = {(index, 2): "lmvm %s" % m.name for index, m in enumerate(modules)}
    ctx.out.table(rows, ["start", "end", "module name", "image", "symbols"], links=links)
    return 0


def _symbol_column(module):
    """WinDbg's ``(pdb symbols)  C:\\sym\\nt.pdb`` / ``(export symbols)`` / ``(no symbols)``."""
    status = "(%s)" % module.symbols
    return "%s  %s" % (status, module.symbol_file) if module.symbol_file else status


COMMANDS = [
    Command(name, help_text, _add_range_arguments, _run_dps if name == "dps" else _run_units(name))
    for name, (_, _, help_text) in DISPLAYS.items()
] + [Command("lm", "list loaded modules (start, end, name, image), like WinDbg's lm", _add_lm_arguments, _run_lm)]
