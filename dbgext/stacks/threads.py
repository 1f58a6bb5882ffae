"""Which thread a walk starts from, with its registers and stack bounds.

* a :class:`~dbgext.target.base.Thread` (a minidump thread, the crash context,
  the debugger's current thread) is used as it is;
* a KTHREAD address of a thread that is not running starts from the switch frame
  its ``KernelStack`` points at (``_KSWITCH_FRAME``: the saved RBP and the return
  address into the scheduler), as WinDbg's ``.thread`` does;
* a kernel thread's stack bounds come from ``_KTHREAD.InitialStack`` and
  ``StackLimit``;
* a kernel dump's crashing thread is its processor's ``_KPRCB.CurrentThread``,
  the KPRCB found as Windows finds it: on ARM64 inside the KPCR that x18 holds in
  kernel mode, on x64 through ``nt!KiProcessorBlock``.

Layouts come from the target's type information first, then the dump's
debugger data, then the built-in table below (:func:`dbgext.layouts.lookup_layout`).
"""

from ..errors import LayoutNotFound, UnreadableMemory
from ..layouts import BuiltinLayouts, lookup_layout
from ..layouts.arm64 import KTRAP_FRAME_ARM64
from ..target.base import Thread

KTHREAD_TYPE = "nt!_KTHREAD"
KTRAP_FRAME_TYPE = "nt!_KTRAP_FRAME"
KTHREAD_STACK_FIELDS = ("InitialStack", "StackLimit", "KernelStack")
KPRCB_TYPE = "nt!_KPRCB"
KPRCB_CURRENT_THREAD = "CurrentThread"
PROCESSOR_BLOCK_SYMBOL = "nt!KiProcessorBlock"
KPCR_TYPE = "nt!_KPCR"
# The register that holds the running processor's KPCR in kernel mode.
KPCR_REGISTER = {"arm64": "x18"}
# How a KPCR leads to its KPRCB: the KPRCB inside it (KDDEBUGGER_DATA64's
# OffsetPcrContainedPrcb, 0x980 on the real ARM64 dump), else a pointer to it
# (OffsetPcrCurrentPrcb).
KPCR_CONTAINED_PRCB = "Prcb"
KPCR_CURRENT_PRCB = "CurrentPrcb"

BUILTIN = BuiltinLayouts({
    "_KTHREAD": [
        {"arch": "x64", "builds": (10240, 99999), "size": 0x430,
         "fields": {"InitialStack": (0x28, "P"), "StackLimit": (0x30, "P"), "KernelStack": (0x58, "P")}},
    ],
    # Where the processor's machine frame sits in the trap frame the kernel's
    # fault and interrupt handlers build (kv prints the trap frame's address).
    "_KTRAP_FRAME": [
        {"arch": "x64", "builds": None, "size": 0x190,
         "fields": {"Rbp": (0x158, "P"), "Rip": (0x168, "P"), "Rsp": (0x180, "P")}},
        {"arch": "arm64", "builds": None, "size": KTRAP_FRAME_ARM64["size"],
         "fields": dict((field, (KTRAP_FRAME_ARM64[field], "P")) for field in ("Sp", "Lr", "Fp", "Pc"))},
    ],
})
# The _KTRAP_FRAME fields a walk starts from, and the registers they give.
TRAP_FRAME_REGISTERS = {"x64": (("Rip", "rip"), ("Rsp", "rsp"), ("Rbp", "rbp")),
                        "arm64": (("Pc", "pc"), ("Sp", "sp"), ("Fp", "fp"), ("Lr", "lr"))}

# _KSWITCH_FRAME (x64): the frame a waiting thread's KernelStack points at.
SWITCH_FRAME_RBP = 0x30
SWITCH_FRAME_RETURN = 0x38
SWITCH_FRAME_SIZE = 0x40


def selected_thread(target, problems):
    """The target's selected thread.  On a kernel target whose thread says neither
    its KTHREAD nor its stack bounds, the processor block's CurrentThread is taken
    (its KTHREAD holds the bounds)."""
    info = target.info() or {}
    thread = target.thread
    if thread is None:
        return None
    if thread.kernel_thread is None and thread.stack_base is None and info.get("mode") == "kernel":
        kernel_thread = current_kernel_thread(target, thread.registers, problems)
        if kernel_thread:
            thread = Thread(thread.id, thread.registers, kernel_thread=kernel_thread, teb=thread.teb,
                            stack_base=thread.stack_base, stack_limit=thread.stack_limit, name=thread.name)
    return thread


def current_kernel_thread(target, registers, problems):
    """The running thread's KTHREAD, _KPRCB.CurrentThread of the processor whose
    context is ``registers``: its KPRCB from the KPCR in the register Windows keeps
    it in (ARM64's x18), else nt!KiProcessorBlock[processor].  Offsets come from
    type information or the dump's KDDEBUGGER_DATA64; when they are unknown, None
    and a one-line note."""
    thread_offset = _field_offset(target, KPRCB_TYPE, KPRCB_CURRENT_THREAD)
    register = KPCR_REGISTER.get(target.arch)
    try:
        if register is not None:
            prcb = _prcb_of_kpcr(target, register, registers.get(register), thread_offset, problems)
        else:
            prcb = _prcb_of_processor_block(target, thread_offset, problems)
        return None if prcb is None else target.pointer(prcb + thread_offset)
    except UnreadableMemory as error:
        problems.add("thread_unreadable", error.address, "cannot read the current thread's KTHREAD")
        return None


def _prcb_of_kpcr(target, register, kpcr, thread_offset, problems):
    """The KPRCB of the KPCR at ``kpcr`` (the value of ``register``), or None with a note."""
    if not kpcr or kpcr >> 47 != 0x1FFFF:
        problems.add("no_kpcr", kpcr, "%s (%s) is not a kernel address, so not the KPCR: the current thread's "
                     "KTHREAD is unknown" % (register, "unset" if kpcr is None else target.format_address(kpcr)),
                     "note")
        return None
    contained = _field_offset(target, KPCR_TYPE, KPCR_CONTAINED_PRCB)
    current = None if contained is not None else _field_offset(target, KPCR_TYPE, KPCR_CURRENT_PRCB)
    missing = None
    if contained is None and current is None:
        missing = "%s.%s (or %s)" % (KPCR_TYPE, KPCR_CONTAINED_PRCB, KPCR_CURRENT_PRCB)
    elif thread_offset is None:
        missing = "%s.%s" % (KPRCB_TYPE, KPRCB_CURRENT_THREAD)
    if missing:
        problems.add("layout_missing", None, "no offset of %s in type information or KDDEBUGGER_DATA64: the "
                     "current thread's KTHREAD is unknown" % missing, "note")
        return None
    return kpcr + contained if contained is not None else target.pointer(kpcr + current)


def _prcb_of_processor_block(target, thread_offset, problems):
    """nt!KiProcessorBlock[processor], or None with a note."""
    block = target.symbol_address(PROCESSOR_BLOCK_SYMBOL)
    if block is None or thread_offset is None:
        problems.add("layout_missing", None, "no %s / %s.%s in the symbols: the current thread's KTHREAD is "
                     "unknown" % (PROCESSOR_BLOCK_SYMBOL, KPRCB_TYPE, KPRCB_CURRENT_THREAD), "note")
        return None
    processor = target.info().get("processor") or 0
    return target.pointer(block + processor * target.pointer_size)


def _field_offset(target, type_name, field):
    """``type_name.field``'s offset from type information or KDDEBUGGER_DATA64, or None."""
    try:
        return lookup_layout(target, type_name, None, fields=(field,)).offset(field)
    except LayoutNotFound:
        return None


def kernel_thread_layout(target):
    try:
        return lookup_layout(target, KTHREAD_TYPE, BUILTIN, fields=KTHREAD_STACK_FIELDS)
    except LayoutNotFound:
        return None


def stack_bounds(target, kernel_thread, problems):
    """{field: value} of the KTHREAD's stack fields that could be read."""
    layout = kernel_thread_layout(target)
    if layout is None:
        problems.add("layout_missing", kernel_thread, "no layout of %s: the thread's stack bounds are unknown"
                     % KTHREAD_TYPE, "warning")
        return {}
    values = {}
    for field in KTHREAD_STACK_FIELDS:
        try:
            values[field] = layout.read(target, kernel_thread, field)
        except UnreadableMemory as error:
            problems.add("thread_unreadable", error.address, "%s.%s is unreadable" % (KTHREAD_TYPE, field))
    return values


def waiting_kernel_thread(target, kernel_thread, problems):
    """A Thread for a KTHREAD that is not running: registers from its switch frame,
    or None (with a problem) when its KernelStack or switch frame can't be read."""
    if target.arch != "x64":
        problems.add("unsupported", kernel_thread, "waiting kernel threads are walked on x64 targets only")
        return None
    bounds = stack_bounds(target, kernel_thread, problems)
    kernel_stack = bounds.get("KernelStack")
    if kernel_stack is None:
        problems.add("thread_unreadable", kernel_thread, "the KernelStack of thread %s is unknown"
                     % target.format_address(kernel_thread))
        return None
    try:
        rbp = target.pointer(kernel_stack + SWITCH_FRAME_RBP)
        rip = target.pointer(kernel_stack + SWITCH_FRAME_RETURN)
    except UnreadableMemory as error:
        problems.add("stack_unreadable", error.address, "the switch frame of thread %s is unreadable"
                     % target.format_address(kernel_thread))
        return None
    return Thread(kernel_thread, {"rip": rip, "rsp": kernel_stack + SWITCH_FRAME_SIZE, "rbp": rbp},
                  kernel_thread=kernel_thread, stack_base=bounds.get("InitialStack"),
                  stack_limit=bounds.get("StackLimit"), name="switch frame")


def trap_frame_thread(target, trap_frame):
    """A Thread whose context is the _KTRAP_FRAME at ``trap_frame`` (WinDbg's
    ``.trap``): RIP, RSP and RBP (ARM64: pc, sp, fp and lr) as the fault or
    interrupt left them."""
    fields = TRAP_FRAME_REGISTERS.get(target.arch, TRAP_FRAME_REGISTERS["x64"])
    layout = lookup_layout(target, KTRAP_FRAME_TYPE, BUILTIN, fields=[field for field, _ in fields])
    registers = dict((register, layout.read(target, trap_frame, field)) for field, register in fields)
    return Thread(trap_frame, registers, name="trap frame %s" % target.format_address(trap_frame))


def trap_frame_of(target, machine_frame, pc_slot):
    """The _KTRAP_FRAME holding the machine frame at ``machine_frame`` (kernel
    x64), or None.  ARM64's unwind codes read a trap frame itself (the frame
    crossed is the _KTRAP_FRAME when the pc came from ``pc_slot`` at its Pc; a
    machine frame or context record is none)."""
    arm64 = target.arch == "arm64"
    field = "Pc" if arm64 else "Rip"
    try:
        layout = lookup_layout(target, KTRAP_FRAME_TYPE, BUILTIN, fields=(field,))
    except LayoutNotFound:
        return None
    if arm64:
        return machine_frame if pc_slot == machine_frame + layout.offset(field) else None
    return machine_frame - layout.offset(field)
