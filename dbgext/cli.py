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

from . import __version__
from .command import Context
from .errors import (EXIT_ERROR, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE,
                     DbgextError, WrongSignature)
from .hexaddr import hexaddr
from .render.output import Output
from .target import open_dump

COMMAND_MODULES = [
    ("dbgext.basic.command", ("db", "dd", "dq", "dps", "lm")),
    ("dbgext.sample.command", ("sample", "demo")),
    ("dbgext.rtltrace.command", ("rtltrace",)),
    ("dbgext.etwcache.command", ("etwstacks",)),
    ("dbgext.ipt.command", ("ipt",)),
    ("dbgext.stackuse.command", ("stackuse",)),
    ("dbgext.stacks.command", ("k",)),
    ("dbgext.triage.command", ("triage",)),
    ("dbgext.dumpinfo.command", ("dumpinfo",)),
    ("dbgext.symbols.command", ("ln", "x", "dt")),
]


def load_commands(only=None):
    """The declared commands; with ``only`` (a command name), just that command's
    module is imported."""
    commands = []
    for module_name, names in COMMAND_MODULES:
        if only is not None and only not in names:
            continue
        module = importlib.import_module(module_name)   # every command is part of dbgext: no silent absence
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


def add_target_options(parser, default=None):
    _add_option(parser, "--dump", metavar="FILE", default=default,
                help="kernel crash/live dump or minidump to analyse (inside WinDbg: default is the current target)")
    _add_option(parser, "--symbols", metavar="PATH", action="append", default=default,
                help="symbol path, WinDbg syntax: ';'-separated directories, ISF .json and .pdb files, "
                "srv*CACHE*URL, cache*DIR (repeatable; default: <dump>.symbols/ or symbols/ beside the dump, "
                "then _NT_SYMBOL_PATH)")
    _add_option(parser, "--no-download", action="store_true", default=default or False,
                help="never download from a symbol server in the symbol path")
    _add_option(parser, "--thread", dest="select_thread", metavar="ID", default=default,
                help="the thread whose registers @reg means (like ~Ns): a thread id, ~N, or a KTHREAD address")


def _add_option(parser, flag, **options):
    """Add ``flag`` unless the command declared it itself."""
    if flag not in parser._option_string_actions:
        parser.add_argument(flag, **options)


def _add_common_options(parser, command, default=None):
    """The options every command takes, on ``parser``.  Leaf parsers of commands
    with sub-actions get them too (with a suppressed default, so a value given
    before the sub-action survives), which makes option order free."""
    if command.needs_target:
        add_target_options(parser, default)
    if command.json_option:
        _add_option(parser, "--json", action="store_true", default=default or False, help="print one JSON document")
    _add_option(parser, "--debug", action="store_true", default=default or False,
                help="show Python tracebacks for internal errors")


def _leaf_parsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield child
                for grandchild in _leaf_parsers(child):
                    yield grandchild


def build_parser(commands, prog="dbgext", stream=None, command_prog=None):
    """``command_prog``: how a command is invoked when that is not ``<prog> <name>``
    (inside WinDbg: ``!py <path>\\commands\\<name>.py``)."""
    class Parser(_Parser):
        output_stream = stream

    parser = Parser(prog=prog, description="Windows kernel and driver debugging analyses "
                     "(WinDbg via pykd, or offline over dumps).")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks for internal errors")
    parser.add_argument("--version", action="version", version="dbgext %s" % __version__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for command in commands:
        extra = {"prog": command_prog} if command_prog else {}
        command_parser = sub.add_parser(command.name, help=command.help, description=command.help, **extra)
        command.add_arguments(command_parser)
        _add_common_options(command_parser, command, default=argparse.SUPPRESS)
        for leaf in _leaf_parsers(command_parser):
            _add_common_options(leaf, command, default=argparse.SUPPRESS)
        command_parser.set_defaults(_command=command)
    return parser


def _fill_defaults(args):
    for name, value in (("dump", None), ("symbols", None), ("no_download", False), ("select_thread", None),
                        ("json", False), ("debug", False)):
        if not hasattr(args, name):
            setattr(args, name, value)


def open_target(args, windbg, err=None):
    """``err``: where symbol warnings and download progress go (the diagnostics Output)."""
    if getattr(args, "dump", None):
        return open_dump(args.dump, symbols=args.symbols, no_download=args.no_download, diagnostics=err)
    if windbg:
        from .target.pykd_backend import open_pykd_target
        return open_pykd_target()
    raise DbgextError("no target: give --dump FILE (or run inside WinDbg with pykd)")


def os_error_text(error):
    """One line for an OSError: what the system said and the path(s) it concerns."""
    paths = [path for path in (error.filename, error.filename2) if path is not None]
    return "%s: %s" % (error.strerror or error, " -> ".join(str(path) for path in paths)) if paths else \
        str(error.strerror or error)


def main(argv=None, windbg=False, stream=None, target=None, error_stream=None):
    """Run one command; returns the exit code (``dbgext.errors.EXIT_*``).  Results
    go to ``stream`` (default stdout); errors, warnings and progress to
    ``error_stream`` (default stderr).  Inside WinDbg, and for a caller that passes
    only ``stream``, both go to that one stream, as the debugger shows them.
    Never lets a traceback reach the user unless --debug is given.  ``target``: an already open Target to run the
    command on instead of opening one (tests over in-memory scenarios); the caller
    keeps ownership and closes it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out = Output(stream)
    if error_stream is None:
        error_stream = out.stream if (windbg or stream is not None) else sys.stderr
    err = Output(error_stream, dml=False if error_stream is not out.stream else None)
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
        err.line(error.usage.rstrip())
        err.line(str(error))
        return EXIT_USAGE
    except SystemExit as exit_request:  # -h / --help
        return exit_request.code or EXIT_OK
    if not getattr(args, "_command", None):
        err.lines(parser.format_help().rstrip().split("\n"))
        return EXIT_USAGE
    _fill_defaults(args)
    if target is not None:
        ctx = Context(args, out=out, err=err, windbg=windbg, target_factory=lambda a: target)
    else:
        ctx = Context(args, out=out, err=err, windbg=windbg, target_factory=lambda a: open_target(a, windbg, err))
    try:
        return args._command.run(ctx, args) or EXIT_OK
    except WrongSignature as error:   # the library names its parameter; a command user types the flag
        err.line("error: no %s at %s: found %s there (give --force to walk it anyway)"
                 % (error.what, hexaddr(error.address), error.found))
        return EXIT_ERROR
    except DbgextError as error:
        err.line("error: %s" % error)
        return EXIT_ERROR
    except KeyboardInterrupt:
        err.line("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (| head): not dbgext's failure
        raise
    except OSError as error:  # the filesystem refused (exists, not a directory, no space, no permission)
        err.line("error: %s" % os_error_text(error))
        return EXIT_ERROR
    except Exception as error:  # a bug in dbgext: one line unless asked for more
        if args.debug:
            err.lines(traceback.format_exc().rstrip().split("\n"))
        else:
            err.line("internal error: %s: %s (run with --debug for the traceback)"
                     % (type(error).__name__, error))
        return EXIT_INTERNAL
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
