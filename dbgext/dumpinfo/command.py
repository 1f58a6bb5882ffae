"""``dumpinfo``: declared once for the CLI and WinDbg."""

from ..command import Command
from . import analyze
from .render import lines


def add_arguments(parser):
    pass


def run(ctx, args):
    result = analyze(ctx.target)
    if args.json:
        ctx.out.json(result.as_dict())
        return 0
    for line in lines(result):
        if isinstance(line, tuple):
            title, headers, rows = line
            ctx.out.table(rows, headers, title=title)
        else:
            ctx.out.line(line)
    return 0


COMMAND = Command("dumpinfo", "what the dump is and holds: header, dump type, parts, KDDEBUGGER_DATA64 and where "
                  "structure offsets come from (like WinDbg's .dumpdebug and vertarget)", add_arguments, run)
