"""One x86 frame by its EBP chain.

A function built with a frame pointer keeps ``[ebp]`` = its caller's EBP and
``[ebp+4]`` = its return address, so the caller's ESP is ``ebp + 8``.  Frame 0
may not have built its frame yet: at ``push ebp`` (or the ``mov edi, edi``
hot-patch pad before it) the return address is still at ``[esp]``, after it at
``[esp+4]``; at a ``ret`` it is at ``[esp]`` again.

Functions built without a frame pointer (FPO) need the PDB's FPO data to unwind;
until the symbols layer provides it such frames are found by scanning.  The
chain is checked: EBP must lie above ESP, and the return address must be
plausible, or the step gives up (and the walker scans).
"""

PUSH_EBP = b"\x55"
HOTPATCH_PAD = b"\x8b\xff"                       # mov edi, edi
MOV_EBP_ESP = (b"\x8b\xec", b"\x89\xe5")         # mov ebp, esp (both encodings)


def unwind_frame_chain(target, registers, first, returns):
    """(caller registers, "frame_chain", return slot, None), or None when the chain
    does not apply here (the walker then scans)."""
    esp, ebp = registers["esp"], registers.get("ebp")
    read = target.u32
    if first:
        code = target.try_read(registers["eip"], 3)
        head = code.data if code.complete else b""
        if head.startswith((PUSH_EBP, HOTPATCH_PAD)) or head[:1] in (b"\xc3", b"\xc2"):
            return _returned(registers, esp, read(esp), ebp, returns)
        if head[:2] in MOV_EBP_ESP:
            return _returned(registers, esp + 4, read(esp + 4), read(esp), returns)
    if ebp is None or ebp < esp:
        return None
    return _returned(registers, ebp + 4, read(ebp + 4), read(ebp), returns)


def _returned(registers, slot, return_address, caller_ebp, returns):
    if not returns.plausible(return_address):
        return None
    caller = dict(registers)
    caller["eip"], caller["esp"], caller["ebp"] = return_address, slot + 4, caller_ebp
    return caller, "frame_chain", slot, None
