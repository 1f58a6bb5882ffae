"""Which thread a walk starts from, with its registers and stack bounds.

* a :class:`~dbgext.target.base.Thread` (a minidump thread, the crash context,
  the debugger's current thread) is used as it is;
* a KTHREAD address of a thread that is not running starts from the switch frame
  its ``KernelStack`` points at (``_KSWITCH_FRAME``: the saved RBP and the return
  address into the scheduler), as WinDbg's ``.thread`` does;
* a kernel thread's stack bounds come from ``_KTHREAD.InitialStack`` and
  ``StackLimit``.

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
        kernel_thread = current_kernel_thread(target, problems)
        if kernel_thread:
            thread = Thread(thread.id, thread.registers, kernel_thread=kernel_thread, teb=thread.teb,
                            stack_base=thread.stack_base, stack_limit=thread.stack_limit, name=thread.name)
    return thread


def current_kernel_thread(target, problems):
    """nt!KiProcessorBlock[processor] -> _KPRCB.CurrentThread, the offset from type
    information or the dump's KDDEBUGGER_DATA64."""
    block = target.symbol_address(PROCESSOR_BLOCK_SYMBOL)
    try:
        offset = lookup_layout(target, KPRCB_TYPE, None, fields=(KPRCB_CURRENT_THREAD,)).offset(KPRCB_CURRENT_THREAD)
    except LayoutNotFound:
        offset = None
    if block is None or offset is None:
        problems.add("layout_missing", None, "no %s / %s.%s in the symbols: the current thread's KTHREAD is "
                     "unknown" % (PROCESSOR_BLOCK_SYMBOL, KPRCB_TYPE, KPRCB_CURRENT_THREAD), "note")
        return None
    processor = target.info().get("processor") or 0
    try:
        prcb = target.pointer(block + processor * target.pointer_size)
        return target.pointer(prcb + offset)
    except UnreadableMemory as error:
        problems.add("thread_unreadable", error.address, "cannot read the current thread's KTHREAD")
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
