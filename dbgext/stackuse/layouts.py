"""Structure layouts and format constants the stack analyses rely on (data, not code).

The x64 exception-handling format (RUNTIME_FUNCTION and
UNWIND_INFO in ``.pdata``/``.xdata``), and the kernel thread fields read through the
target's type information.
"""

# -- x64 exception data ----------------------------------------------------------------

# -- UNWIND_INFO ------------------------------------------------------------------------

UNW_FLAG_EHANDLER = 1
UNW_FLAG_UHANDLER = 2
UNW_FLAG_CHAININFO = 4

UWOP_PUSH_NONVOL = 0
UWOP_ALLOC_LARGE = 1
UWOP_ALLOC_SMALL = 2
UWOP_SET_FPREG = 3
UWOP_SAVE_NONVOL = 4
UWOP_SAVE_NONVOL_FAR = 5
UWOP_EPILOG = 6
UWOP_SPARE_CODE = 7
UWOP_SAVE_XMM128 = 8
UWOP_SAVE_XMM128_FAR = 9
UWOP_PUSH_MACHFRAME = 10

UNWIND_OP_NAMES = {
    UWOP_PUSH_NONVOL: "PUSH_NONVOL", UWOP_ALLOC_LARGE: "ALLOC_LARGE", UWOP_ALLOC_SMALL: "ALLOC_SMALL",
    UWOP_SET_FPREG: "SET_FPREG", UWOP_SAVE_NONVOL: "SAVE_NONVOL", UWOP_SAVE_NONVOL_FAR: "SAVE_NONVOL_FAR",
    UWOP_EPILOG: "EPILOG", UWOP_SPARE_CODE: "SPARE_CODE", UWOP_SAVE_XMM128: "SAVE_XMM128",
    UWOP_SAVE_XMM128_FAR: "SAVE_XMM128_FAR", UWOP_PUSH_MACHFRAME: "PUSH_MACHFRAME",
}

# Extra 16-bit slots an operation uses after its own (the Windows unwinder's table);
# ALLOC_LARGE with info 1 uses one more than listed.
UNWIND_EXTRA_SLOTS = {0: 0, 1: 1, 2: 0, 3: 0, 4: 1, 5: 2, 6: 1, 7: 2, 8: 1, 9: 2, 10: 0}

MACHFRAME_SIZE = {0: 40, 1: 48}  # PUSH_MACHFRAME without / with an error code

# -- kernel threads -----------------------------------------------------------------------

KTHREAD_TYPE = "nt!_KTHREAD"
KTHREAD_STACK_FIELDS = ("InitialStack", "StackLimit", "KernelStack")
KPRCB_TYPE = "nt!_KPRCB"
KPRCB_CURRENT_THREAD = "CurrentThread"
PROCESSOR_BLOCK_SYMBOL = "nt!KiProcessorBlock"

# A thread that is not running saved its context by pushing a switch frame at
# KernelStack; the return address into the scheduler sits at this offset in it
# (_KSWITCH_FRAME.Return on x64, the last push of KiSwapContext on x86).
SWITCH_FRAME_RETURN_OFFSET = {"x64": 0x38, "x86": 0x0C}

# Default stack budgets when a thread's real bounds are unknown (kernel stacks).
DEFAULT_BUDGET = {"x64": 24 * 1024, "x86": 12 * 1024}

# -- x86 prologue helpers ------------------------------------------------------------------

# `push N; push scopetable; call __SEH_prolog4`: the helper reuses N's slot for the
# saved EBP, keeps the scope-table slot, pushes the handler and the previous
# registration, allocates N, pushes EBX/ESI/EDI and the cookie-xor-EBP: measured
# from the depth before the two pushes the frame ends 36 + N bytes deeper.
SEH_PROLOG_FRAME_OVERHEAD = 36
