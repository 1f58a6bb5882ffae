"""Structure layouts and format constants the stack analyses rely on (data, not code).

The kernel fields read through the target's type information, and x86 prologue
helpers.  The x64 exception-handling format (RUNTIME_FUNCTION and UNWIND_INFO)
is :mod:`dbgext.stacks.unwind_data`'s.
"""

# -- kernel threads -----------------------------------------------------------------------

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
