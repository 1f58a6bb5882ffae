"""The ``dbgext`` console entry and the shared runner for ``commands/*.py``.

One registry of commands: every capability package exposes a ``COMMAND`` (or
``COMMANDS``) in its ``command`` module, listed in ``COMMAND_MODULES`` under the
command names it declares.  Running one command imports only its module (WinDbg's
``!py`` starts a fresh interpreter for every script run, so start-up time counts).
"""

import argparse
import importlib
import os
import sys
import traceback

from .command import Context
from .errors import DbgextError
from .render.output import Output
from .target import open_dump

COMMAND_MODULES = [
    ("dbgext.basic.command", ("db", "dd", "dq", "dps", "lm")),
    ("dbgext.sample.command", ("sample", "demo")),
    ("dbgext.rtltrace.command", ("rtltrace",)),
    ("dbgext.etwcache.command", ("etwstacks",)),
    ("dbgext.ipt.command", ("ipt",)),
    ("dbgext.stackuse.command", ("stackuse",)),
    ("dbgext.triage.command", ("triage",)),
]


def load_commands(only=None):
    """The declared commands; with ``only`` (a command name), just that command's
    module is imported."""
    commands = []
    for module_name, names in COMMAND_MODULES:
        if only is not None and only not in names:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            # A capability that is not built yet is simply absent.
            if getattr(error, "name", None) and module_name.startswith(error.name):
                continue
            raise
        commands.extend(getattr(module, "COMMANDS", None) or [module.COMMAND])
    return commands


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of calling sys.exit inside WinDbg (where exit
    would end the debugger's Python, not the command), and prints help through the
    command's Output (the debugger's stdout takes str only)."""

    output_stream = None

    def _print_message(self, message, file=None):
        if message:
            (self.output_stream or sys.stdout).write(message)

    def error(self, message):
        raise _UsageError("%s: error: %s" % (self.prog, message), self.format_usage())


class _UsageError(Exception):
    def __init__(self, message, usage):
        super().__init__(message)
        self.usage = usage


def add_target_options(parser):
    parser.add_argument("--dump", metavar="FILE", help="kernel crash/live dump or minidump to analyse "
                        "(inside WinDbg: default is the current target)")
    parser.add_argument("--symbols", metavar="PATH", action="append",
                        help="ISF symbol file or directory (repeatable; default: <dump>.symbols/ or "
                        "symbols/ beside the dump)")


def build_parser(commands, prog="dbgext", stream=None, command_prog=None):
    """``command_prog``: how a command is invoked when that is not ``<prog> <name>``
    (inside WinDbg: ``!py <path>\\commands\\<name>.py``)."""
    class Parser(_Parser):
        output_stream = stream

    parser = Parser(prog=prog, description="Windows kernel and driver debugging analyses "
                     "(WinDbg via pykd, or offline over dumps).")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks for internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in commands:
        extra = {"prog": command_prog} if command_prog else {}
        command_parser = sub.add_parser(command.name, help=command.help, description=command.help, **extra)
        if command.needs_target:
            add_target_options(command_parser)
        if command.json_option:
            command_parser.add_argument("--json", action="store_true", help="print one JSON document")
        command.add_arguments(command_parser)
        command_parser.set_defaults(_command=command)
    return parser


def open_target(args, windbg):
    if getattr(args, "dump", None):
        return open_dump(args.dump, symbols=args.symbols)
    if windbg:
        from .target.pykd_backend import open_pykd_target
        return open_pykd_target()
    raise DbgextError("no target: give --dump FILE (or run inside WinDbg with pykd)")


def main(argv=None, windbg=False, stream=None, target=None):
    """Run one command; returns the exit code.  Never lets a traceback reach the
    user unless --debug is given.  ``target``: an already open Target to run the
    command on instead of opening one (tests over in-memory scenarios); the caller
    keeps ownership and closes it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out = Output(stream)
    requested = next((word for word in argv if not word.startswith("-")), None)
    commands = load_commands(only=requested)
    if not commands:
        commands = load_commands()
    # Inside WinDbg the user typed ``!py <script> <args>``: usage lines say so.
    command_prog = "!py %s" % sys.argv[0] if windbg and sys.argv and sys.argv[0] else None
    parser = build_parser(commands, prog="!py dbgext" if windbg else "dbgext", stream=out.stream,
                          command_prog=command_prog)
    try:
        args = parser.parse_args(argv)
    except _UsageError as error:
        out.line(error.usage.rstrip())
        out.line(str(error))
        return 2
    except SystemExit as exit_request:  # -h / --help
        return exit_request.code or 0
    if not getattr(args, "_command", None):
        out.lines(parser.format_help().rstrip().split("\n"))
        return 2
    if target is not None:
        ctx = Context(args, out=out, windbg=windbg, target_factory=lambda a: target)
    else:
        ctx = Context(args, out=out, windbg=windbg, target_factory=lambda a: open_target(a, windbg))
    try:
        return args._command.run(ctx, args) or 0
    except DbgextError as error:
        out.line("error: %s" % error)
        return 1
    except KeyboardInterrupt:
        out.line("interrupted")
        return 130
    except BrokenPipeError:  # the reader went away (| head): not dbgext's failure
        raise
    except Exception as error:  # a bug in dbgext: one line unless asked for more
        if args.debug:
            out.lines(traceback.format_exc().rstrip().split("\n"))
        else:
            out.line("internal error: %s: %s (run with --debug for the traceback)"
                     % (type(error).__name__, error))
        return 3
    finally:
        if target is None:
            ctx.close()


def console_main():
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    sys.exit(code)
