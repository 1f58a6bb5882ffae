"""WinDbg's pseudo-registers of the selected thread, for ``@$name`` in addresses:
``$ip`` and ``$csp`` (its instruction and stack pointers), ``$thread`` (its ETHREAD
on a kernel target, its TEB in user mode) and ``$proc`` (the EPROCESS it runs in,
``KTHREAD.ApcState.Process``; the PEB in user mode, ``TEB.ProcessEnvironmentBlock``)."""

from .address import TargetResolver
from .errors import BadInput, LayoutNotFound
from .layouts import lookup_layout
from .problems import ProblemLog
from .target.base import POINTER_REGISTERS

NAMES = ("ip", "csp", "thread", "proc")
KTHREAD_PROCESS = ("nt!_KTHREAD", "ApcState.Process")
TEB_PEB = ("_TEB", "ProcessEnvironmentBlock")


def pseudo_register(target, name):
    """The value of ``@$name`` on ``target``; BadInput naming it otherwise."""
    name = name.lower()
    if name in ("ip", "csp"):
        ip, sp = POINTER_REGISTERS.get(target.arch, POINTER_REGISTERS["x64"])
        return target.register(ip if name == "ip" else sp)
    if name not in NAMES:
        raise BadInput("@$%s: unknown pseudo-register (dbgext knows %s)"
                       % (name, ", ".join("@$" + known for known in NAMES)))
    # Imported here: every command resolves addresses, few name @$thread or @$proc,
    # and WinDbg's !py starts each command in a fresh interpreter.
    from .stacks.threads import selected_thread
    # The problems are dropped: a pseudo-register either has a value or is an error.
    thread = selected_thread(target, ProblemLog())
    if thread is None:
        raise BadInput("@$%s: this target has no thread" % name)
    kernel = thread.kernel_thread is not None or (target.info() or {}).get("mode") == "kernel"
    if name == "thread":
        value = thread.kernel_thread if kernel else thread.teb
        if value is None:
            raise BadInput("@$thread: the selected thread's %s is unknown" % ("KTHREAD" if kernel else "TEB"))
        return value
    base, (type_name, field) = (thread.kernel_thread, KTHREAD_PROCESS) if kernel else (thread.teb, TEB_PEB)
    if base is None:
        raise BadInput("@$proc: the selected thread's %s is unknown" % ("KTHREAD" if kernel else "TEB"))
    try:
        offset = lookup_layout(target, type_name, fields=(field,)).offset(field)
    except LayoutNotFound:
        raise BadInput("@$proc: no layout gives %s.%s (type information or KDDEBUGGER_DATA64)"
                       % (type_name.split("!")[-1], field))
    return target.pointer(base + offset)


class PseudoRegisterResolver(TargetResolver):
    """Symbols, modules, registers and pseudo-registers of a Target."""

    def pseudo_register(self, name):
        return pseudo_register(self._target, name)
