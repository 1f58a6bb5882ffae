"""One frame by its frame-pointer chain (x86 EBP; x64 RBP where a module has no
unwind data).

A function built with a frame pointer keeps ``[bp]`` = its caller's frame pointer
and ``[bp+size]`` = its return address, so the caller's stack pointer is
``bp + 2*size``.  On x86, frame 0 may not have built its frame yet: at ``push
ebp`` (or the ``mov edi, edi`` hot-patch pad before it) the return address is
still at ``[esp]``, after it at ``[esp+4]``; at a ``ret`` it is at ``[esp]``
again.

The chain is followed where the code is not in the dump (a minidump holds none),
each step checked: the frame pointer lies inside the stack (at or above the stack
pointer, below the stack's base), so the stack grows; the return address points
into a module's code (or is 0: the thread's first frame).  Where the code at the return address can be read, a
``call`` must precede it (the chain is confirmed) or the step gives up and the
walker scans; where it cannot, the frame is taken and marked unconfirmed.
Functions built without a frame pointer (FPO) are unwound by the PDB's FPO and
FrameData records (:mod:`dbgext.symbols.framedata`) before the chain is tried.
"""

PUSH_EBP = b"\x55"
HOTPATCH_PAD = b"\x8b\xff"                       # mov edi, edi
MOV_EBP_ESP = (b"\x8b\xec", b"\x89\xe5")         # mov ebp, esp (both encodings)
RETURNS = (b"\xc3", b"\xc2")
REGISTER_NAMES = {"x86": ("eip", "esp", "ebp", 4), "x64": ("rip", "rsp", "rbp", 8)}


def unwind_frame_chain(target, registers, first, returns, bounds=None, code_at=None):
    """(caller registers, "frame_chain", return slot, None, confirmed), or None when
    the chain does not apply here (the walker then scans).  ``bounds`` (low,
    high) are the stack's, when known; ``code_at(address, size)`` reads code the
    target may lack (from the module's image file)."""
    ip_name, sp_name, fp_name, size = REGISTER_NAMES[target.arch]
    sp, fp = registers[sp_name], registers.get(fp_name)
    read = target.pointer
    if first and target.arch == "x86":
        head = _code(target, registers[ip_name], 3, code_at)
        if head.startswith((PUSH_EBP, HOTPATCH_PAD)) or head[:1] in RETURNS:
            return _returned(registers, sp, read(sp), fp, returns, REGISTER_NAMES["x86"])
        if head[:2] in MOV_EBP_ESP:
            return _returned(registers, sp + 4, read(sp + 4), read(sp), returns, REGISTER_NAMES["x86"])
    if fp is None or fp < sp or (bounds is not None and fp + 2 * size > bounds[1]):
        return None
    return _returned(registers, fp + size, read(fp + size), read(fp), returns, REGISTER_NAMES[target.arch])


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
    return caller, "frame_chain", slot, None, verdict is True
