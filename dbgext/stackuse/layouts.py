"""Constants the stack analyses rely on (data, not code): stack budgets and the
x86 prologue helpers.  The x64 exception-handling format (RUNTIME_FUNCTION and
UNWIND_INFO) is :mod:`dbgext.stacks.unwind_data`'s, a kernel thread's switch
frame :mod:`dbgext.stacks.threads`'.
"""

# Default stack budgets when a thread's real bounds are unknown (kernel stacks).
# ARM64 kernel stacks are taken to be x64's size (assumed, not verified on a dump).
DEFAULT_BUDGET = {"x64": 24 * 1024, "x86": 12 * 1024, "arm64": 24 * 1024}

# -- x86 prologue helpers ------------------------------------------------------------------

# MSVC's frame-building helpers, by name fragment (ordered: "EH_prolog" is part of
# the other two): (pushes the caller makes for it, the last of them holding the
# local size N or none; bytes the frame ends deeper than before those pushes,
# N excluded).  EBP ends up 4 bytes below the depth before the pushes.
#  - `push N; push scopetable; call __SEH_prolog4[_GS]`: N's slot becomes the saved
#    EBP; scope table, return-address slot (then the try level), handler, previous
#    registration, N, EBX/ESI/EDI and the cookie: 36 + N.
#  - `push N; mov eax, handler; call __EH_prolog3[_GS|_catch]`: N's slot becomes the
#    saved EBP; return-address slot, handler, previous registration, N, EBX/ESI/EDI
#    and the cookie: 32 + N.
#  - `mov eax, handler; call __EH_prolog`: the return-address slot becomes the saved
#    EBP; -1, handler, previous registration: 16 (the caller allocates its locals).
FRAME_HELPERS = (("SEH_prolog", 2, 36), ("EH_prolog3", 1, 32), ("EH_prolog", 0, 16))
FRAME_HELPER_EPILOGS = ("SEH_epilog", "EH_epilog3")

# The helpers by their first instructions, for images without symbols (capstone's
# spelling; a trailing "*" matches any rest).
HELPER_CODE = (
    ("frame SEH_prolog", ("push 0x*", "push dword ptr fs:[0]", "mov eax, dword ptr [esp + 0x10]",
                          "mov dword ptr [esp + 0x10], ebp", "lea ebp, [esp + 0x10]", "sub esp, eax")),
    ("frame EH_prolog3", ("push eax", "push dword ptr fs:[0]", "lea eax, [esp + 0xc]",
                          "sub esp, dword ptr [esp + 0xc]")),
    ("frame EH_prolog", ("push -1", "push eax", "mov eax, dword ptr fs:[0]", "push eax")),
    ("epilog", ("mov ecx, dword ptr [ebp - 0x*", "mov dword ptr fs:[0], ecx", "pop ecx")),
    ("epilog", ("mov ecx, dword ptr [ebp - 0x1c]", "xor ecx, ebp", "call 0x*", "jmp 0x*")),
)
