"""How a command is declared once and run from both the CLI and WinDbg.

A capability package declares a :class:`Command` (name, help, its options, and a
``run(ctx, args)`` function).  ``dbgext.cli`` collects them into the ``dbgext``
console script; ``commands/<name>.py`` runs the very same declaration inside WinDbg
through :func:`dbgext.cli.main` with ``windbg=True``.  The only difference between
the two is where the Target comes from: ``--dump FILE`` offline, the live pykd
session (or the dump open in WinDbg) when no ``--dump`` is given inside WinDbg.
"""

import sys

from .address import evaluate, evaluate_count
from .pseudo_registers import PseudoRegisterResolver
from .render.output import Output


class Command(object):
    def __init__(self, name, help, add_arguments, run, needs_target=True, json_option=True):
        self.name = name
        self.help = help
        self.add_arguments = add_arguments
        self.run = run
        self.needs_target = needs_target
        self.json_option = json_option


class Context(object):
    """What a command's run function gets: the target (opened on first use), the
    result output (stdout), the diagnostics output (stderr: errors, warnings,
    progress), and whether it runs inside WinDbg."""

    def __init__(self, args, out=None, windbg=False, target_factory=None, err=None):
        self.args = args
        self.out = out or Output()
        self.err = err or Output(sys.stderr, dml=False)
        self.windbg = windbg
        self._target = None
        self._target_factory = target_factory

    def warn(self, text):
        self.err.line("warning: %s" % text)

    def address(self, text):
        """An address argument in WinDbg's grammar (hex, 0n, backticks,
        module!symbol+off, module+off, @reg) evaluated on the target."""
        return evaluate(text, _TargetOnDemand(self))

    def count(self, text):
        """A count argument: hex by default, ``0n`` decimal, optional ``L`` prefix;
        symbols and registers allowed as in WinDbg."""
        return evaluate_count(text, _TargetOnDemand(self))

    @property
    def target(self):
        if self._target is None:
            self._target = self._target_factory(self.args)
            wanted = getattr(self.args, "select_thread", None)
            if wanted is not None:
                self._target.select_thread(wanted)
        return self._target

    def has_target_source(self):
        return bool(getattr(self.args, "dump", None)) or self.windbg

    def close(self):
        if self._target is not None:
            self._target.close()


class _TargetOnDemand(PseudoRegisterResolver):
    """Resolves names through the context's target, opening it only when an
    expression names a symbol, module or register (plain numbers need none)."""

    def __init__(self, ctx):
        self._ctx = ctx

    @property
    def _target(self):
        return self._ctx.target
