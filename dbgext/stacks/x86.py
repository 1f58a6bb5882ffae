"""One frame by its frame-pointer chain (x86 EBP; x64 RBP where a module has no
unwind data).

A function built with a frame pointer keeps ``[bp]`` = its caller's frame pointer
and ``[bp+size]`` = its return address, so the caller's stack pointer is
``bp + 2*size``.  On x86, frame 0 may not have built its frame yet: at ``push
ebp`` (or the ``mov edi, edi`` hot-patch pad before it) the return address is
still at ``[esp]``, after it at ``[esp+4]``; at a ``ret``, or in an import thunk
(``jmp dword ptr [IAT]``), it is at ``[esp]``.

The chain is followed where the code is not in the dump (a minidump holds none),
each step checked: the frame pointer lies inside the stack (at or above the stack
pointer, below the stack's base), so the stack grows; the return address points
into a module's code (or is 0: the thread's first frame).  Where the code at the return address can be read, a
``call`` must precede it (the chain is confirmed) or the step gives up and the
walker scans; where it cannot, the frame is taken and marked unconfirmed.
Functions built without a frame pointer (FPO) are unwound by the PDB's FPO and
FrameData records (:mod:`dbgext.symbols.framedata`) before the chain is tried.
"""

from ..errors import UnreadableMemory
from ..symbols.framedata import RA_SEARCH_CONFIRMED_SLOTS, RA_SEARCH_SLOTS, ProgramError, evaluate
from .result import Step

PUSH_EBP = b"\x55"
HOTPATCH_PAD = b"\x8b\xff"                       # mov edi, edi
MOV_EBP_ESP = (b"\x8b\xec", b"\x89\xe5")         # mov ebp, esp (both encodings)
RETURNS = (b"\xc3", b"\xc2")
IMPORT_THUNK = b"\xff\x25"                     # jmp dword ptr [IAT slot]: no frame, ever
JUMP_REL32 = b"\xe9"
X86_REGISTERS = ("eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi", "eip")
REGISTER_NAMES = {"x86": ("eip", "esp", "ebp", 4), "x64": ("rip", "rsp", "rbp", 8)}


def unwind_frame_chain(target, registers, first, returns, bounds=None, code_at=None):
    """The :class:`~dbgext.stacks.result.Step` to the caller, or None when the chain
    does not apply here (the walker then scans).  ``bounds`` (low,
    high) are the stack's, when known; ``code_at(address, size)`` reads code the
    target may lack (from the module's image file)."""
    ip_name, sp_name, fp_name, size = REGISTER_NAMES[target.arch]
    sp, fp = registers[sp_name], registers.get(fp_name)
    read = target.pointer
    if first and target.arch == "x86":
        head = _code(target, registers[ip_name], 3, code_at)
        if head.startswith((PUSH_EBP, HOTPATCH_PAD, IMPORT_THUNK)) or head[:1] in RETURNS:
            return _returned(registers, sp, read(sp), fp, returns, REGISTER_NAMES["x86"])
        if head[:2] in MOV_EBP_ESP:
            return _returned(registers, sp + 4, read(sp + 4), read(sp), returns, REGISTER_NAMES["x86"])
    if fp is None or fp < sp or (bounds is not None and fp + 2 * size > bounds[1]):
        return None
    return _returned(registers, fp + size, read(fp + size), read(fp), returns, REGISTER_NAMES[target.arch])


def unwind_at_entry(target, registers, returns, function_start, outside_functions, code_at=None):
    """Frame 0 where a PDB has no frame record: at a function's first instruction
    (``function_start``), or on a linker thunk — one ``jmp rel32`` (an
    incremental-link table entry) or ``jmp dword ptr [IAT]`` — nothing is pushed:
    the return address is at ``[esp]``.  Where the code cannot be read, code
    outside every function the PDB describes (``outside_functions``) is taken for
    such a thunk.  None elsewhere."""
    head = _code(target, registers["eip"], 2, code_at)
    thunk = head[:1] == JUMP_REL32 or head == IMPORT_THUNK if head else outside_functions
    if not function_start and not thunk:
        return None
    esp = registers["esp"]
    return _returned(registers, esp, target.u32(esp), registers.get("ebp"), returns, REGISTER_NAMES["x86"])


def _code(target, address, size, code_at):
    read = target.try_read(address, size)
    if read.complete:
        return read.data
    return code_at(address, size) if code_at is not None else b""


def _returned(registers, slot, return_address, caller_fp, returns, names):
    ip_name, sp_name, fp_name, size = names
    # Return address 0 in a chain that holds so far: the thread's first frame.
    verdict = True if return_address == 0 else returns.verdict(return_address)
    if verdict is False:
        return None
    caller = dict(registers)
    caller[ip_name], caller[sp_name], caller[fp_name] = return_address, slot + size, caller_fp
    return Step(caller, "frame_chain", slot, None, verdict is True, 0)


def unwind_frame_data(target, record, offset, registers, first, returns, callee_parameters, bounds=None):
    """The step by ``record`` (a :class:`~dbgext.symbols.framedata.FrameRecord`
    covering EIP, ``offset`` bytes into its block), as dbghelp takes it, or None
    when its program cannot give a caller here (the walker falls back).
    ``callee_parameters``: the bytes of parameters the frame below was passed."""
    esp = registers["esp"]
    read = target.u32
    if first and record.function_start and offset == 0:
        # A function's first instruction: nothing pushed, whatever its program
        # (a one-jmp thunk's record may describe an EBP frame it never builds).
        step = _returned(registers, esp, read(esp), registers.get("ebp"), returns, REGISTER_NAMES["x86"])
        return step._replace(found_by="unwind") if step is not None else None
    if first and record.uses_frame_pointer and record.function_start and offset < record.prolog:
        return None  # EBP is not this function's frame yet: the chain's prologue rules apply

    def search():
        start = esp + callee_parameters + record.locals + record.saved_registers
        for index in range(RA_SEARCH_CONFIRMED_SLOTS):
            slot = start + 4 * index
            if bounds is not None and slot + 4 > bounds[1]:
                break
            value = read(slot)
            verdict = returns.verdict(value)
            if verdict is True or (verdict is None and (index < RA_SEARCH_SLOTS or returns.inside_function(value))):
                return slot
        raise ProgramError("no return address above %s" % target.format_address(start))
    values = dict(("$" + name, registers.get(name)) for name in X86_REGISTERS)
    values.update({".raSearch": search, ".raSearchStart": search, ".cbLocals": record.locals,
                   ".cbSavedRegs": record.saved_registers, ".cbParams": record.params,
                   ".cbCalleeParams": callee_parameters})
    try:
        assigned = evaluate(record.program, values, read)
    except (ProgramError, UnreadableMemory):
        return None
    caller_ip, caller_sp = assigned.get("$eip"), assigned.get("$esp")
    if caller_ip is None or caller_sp is None or caller_sp <= esp or (
            bounds is not None and caller_sp > bounds[1]):
        return None
    verdict = True if caller_ip == 0 else returns.verdict(caller_ip)
    if verdict is False:
        return None
    caller = dict(registers)
    for name in X86_REGISTERS:
        if "$" + name in assigned:
            caller[name] = assigned["$" + name]
    return Step(caller, "unwind", caller_sp - 4, None, verdict is True, record.params)
