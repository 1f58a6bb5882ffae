"""One x64 frame unwound the way Windows' RtlVirtualUnwind does it.

Given the context of a frame (``rip``, ``rsp`` and whatever other registers are
known) and the RUNTIME_FUNCTION covering ``rip``:

* the *establisher frame* is RSP, or the frame register minus its offset once the
  prologue has set it (``SET_FPREG`` executed, or the prologue is complete);
* when ``rip`` is inside an epilogue (``add rsp``/``lea rsp`` then ``pop``s, then
  ``ret`` or a tail ``jmp``, see :func:`_ends_function`) the epilogue's remaining
  instructions are emulated,
  because the unwind codes no longer describe the stack there;
* otherwise the unwind codes are undone in order — only those whose prologue
  offset was reached when ``rip`` is inside the prologue — then the parent entries
  of a chain (all of their codes);
* ``PUSH_MACHFRAME`` takes RIP and RSP from the machine frame the processor pushed
  on an interrupt or exception (crossing into the interrupted code); otherwise the
  return address is popped.

A function without a RUNTIME_FUNCTION is a leaf that never moved RSP: its return
address is at ``[rsp]``.  Corrupt unwind data raises :class:`UnwindError` (the
walker records it and falls back); chains are bounded and checked for loops.
"""

from .unwind_data import (MAX_CHAIN_LENGTH, REGISTERS, UNW_FLAG_CHAININFO, UWOP_ALLOC_LARGE, UWOP_ALLOC_SMALL,
                          UWOP_PUSH_MACHFRAME, UWOP_PUSH_NONVOL, UWOP_SAVE_NONVOL, UWOP_SAVE_NONVOL_FAR,
                          UWOP_SET_FPREG, parse_unwind_info)

# Machine frame (what the processor pushes): RIP, CS, EFLAGS, RSP, SS.
MACHINE_FRAME_RSP = 24
EPILOGUE_WINDOW = 32  # bytes of code read at RIP to recognise an epilogue
# What an epilogue's first remaining instruction can start with: REX.W (add/lea
# rsp), a pop (0x58-0x5F, 0x41 for r8-r15), ret, rep ret, or a jmp.
EPILOGUE_FIRST_BYTES = frozenset([0x41, 0xC3, 0xC2, 0xF3, 0xE9, 0xEB, 0xFF] + list(range(0x48, 0x50))
                                 + list(range(0x58, 0x60)))


class UnwindError(Exception):
    """Unwind data that cannot be used: ``kind`` and ``address`` for the Problem."""

    def __init__(self, kind, address, message):
        Exception.__init__(self, message)
        self.kind = kind
        self.address = address


class UnwindStep(object):
    """The caller's context after unwinding one frame."""

    __slots__ = ("registers", "return_slot", "machine_frame", "epilogue", "unwound_to_call")

    def __init__(self, registers, return_slot, machine_frame=None, epilogue=False, unwound_to_call=True):
        self.registers = registers
        self.return_slot = return_slot        # where the new RIP was read
        self.machine_frame = machine_frame    # address of the machine frame crossed, if any
        self.epilogue = epilogue              # True when RIP was in an epilogue (emulated)
        # ARM64: False when the caller's pc is where it was interrupted, not a
        # return address (the custom-stack codes, clear_unwound_to_call among them).
        self.unwound_to_call = unwound_to_call


def unwind_leaf(registers, read_pointer):
    """A function without unwind data: the return address is at RSP."""
    rsp = registers["rsp"]
    caller = dict(registers)
    caller["rip"] = read_pointer(rsp)
    caller["rsp"] = rsp + 8
    return UnwindStep(caller, rsp)


def unwind_function(image, module_base, entry, registers, read_pointer, code, info_cache):
    """Unwind one frame with the RUNTIME_FUNCTION ``entry`` (begin, end, unwind rva)
    of ``image`` (a :class:`dbgext.pe.PEImage`, or the unwinder's
    :class:`~dbgext.stacks.images.TargetImage`, of the module loaded at
    ``module_base``).  ``read_pointer(address)`` reads the stack (raises
    UnreadableMemory); ``code`` is the code bytes at RIP (for epilogue detection)."""
    rip = registers["rip"]
    begin, end, unwind_rva = entry
    offset = rip - module_base - begin
    info = _unwind_info(image, module_base, unwind_rva, info_cache)
    frame_base = _establisher_frame(info, offset, registers)
    in_prologue = offset < info.prolog_size and not info.flags & UNW_FLAG_CHAININFO
    if not in_prologue:
        emulated = _emulate_epilogue(code, rip, module_base + begin, module_base + end, info, registers,
                                     read_pointer)
        if emulated is not None:
            return emulated
    caller = dict(registers)
    machine_frame = None
    visited = set()
    current = info
    for depth in range(MAX_CHAIN_LENGTH):
        for unwind_code in current.codes:
            if depth == 0 and in_prologue and unwind_code.prolog_offset > offset:
                continue  # not executed yet
            machine_frame = _undo(unwind_code, current, caller, frame_base, read_pointer) or machine_frame
        if current.chained is None:
            break
        visited.add(current.rva)
        parent_rva = current.chained[2]
        if parent_rva in visited:
            raise UnwindError("unwind_chain_loop", module_base + parent_rva,
                              "the unwind chain of %s loops" % image.describe(begin))
        current = _unwind_info(image, module_base, parent_rva, info_cache)
    else:
        raise UnwindError("unwind_chain_too_long", module_base + begin,
                          "the unwind chain of %s is longer than %d entries" % (image.describe(begin),
                                                                                MAX_CHAIN_LENGTH))
    if machine_frame is not None:
        return UnwindStep(caller, machine_frame, machine_frame=machine_frame)
    rsp = caller["rsp"]
    caller["rip"] = read_pointer(rsp)
    caller["rsp"] = rsp + 8
    return UnwindStep(caller, rsp)


def _unwind_info(image, module_base, rva, cache):
    info = cache.get(rva)
    if info is None:
        if not 0 < rva < image.size_of_image:
            raise UnwindError("unwind_info_outside_image", module_base + rva,
                              "unwind info rva 0x%x lies outside %s" % (rva, image.name))
        info = cache[rva] = parse_unwind_info(image, rva)
    if info.problem:
        raise UnwindError("unwind_info_corrupt", module_base + rva, info.problem)
    return info


def _establisher_frame(info, offset, registers):
    """RSP, or the frame register's value less its offset once SET_FPREG ran."""
    if info.frame_register == 0:
        return registers["rsp"]
    established = offset >= info.prolog_size or info.flags & UNW_FLAG_CHAININFO or any(
        code.op == UWOP_SET_FPREG and code.prolog_offset <= offset for code in info.codes)
    if not established:
        return registers["rsp"]
    value = registers.get(REGISTERS[info.frame_register])
    if value is None:
        raise UnwindError("frame_register_unknown", registers["rip"],
                          "the frame register %s is not in the context" % REGISTERS[info.frame_register])
    return value - info.frame_offset


def _undo(unwind_code, info, registers, frame_base, read_pointer):
    """Undo one prologue operation on ``registers``; returns the machine frame's
    address for PUSH_MACHFRAME, else None."""
    op = unwind_code.op
    if op == UWOP_PUSH_NONVOL:
        registers[REGISTERS[unwind_code.info]] = read_pointer(registers["rsp"])
        registers["rsp"] += 8
    elif op in (UWOP_ALLOC_SMALL, UWOP_ALLOC_LARGE):
        registers["rsp"] += unwind_code.stack_bytes
    elif op == UWOP_SET_FPREG:
        value = registers.get(REGISTERS[info.frame_register])
        if value is None:
            raise UnwindError("frame_register_unknown", registers["rip"],
                              "the frame register %s is not in the context" % REGISTERS[info.frame_register])
        registers["rsp"] = value - info.frame_offset
    elif op in (UWOP_SAVE_NONVOL, UWOP_SAVE_NONVOL_FAR):
        registers[REGISTERS[unwind_code.info]] = read_pointer(frame_base + unwind_code.save_offset)
    elif op == UWOP_PUSH_MACHFRAME:
        frame = registers["rsp"] + (8 if unwind_code.info else 0)  # past the error code
        registers["rip"] = read_pointer(frame)
        registers["rsp"] = read_pointer(frame + MACHINE_FRAME_RSP)
        return frame
    # SAVE_XMM128(_FAR) and EPILOG restore nothing the walk needs.
    return None


# -- epilogues ---------------------------------------------------------------------------------

def _emulate_epilogue(code, rip, function_begin, function_end, info, registers, read_pointer):
    """When the bytes at RIP are the rest of an epilogue — optionally ``add rsp,
    imm`` or ``lea rsp, [frame register + disp]``, then ``pop``s, then ``ret`` or a
    ``jmp`` out of the function — emulate them and return the caller's step; else None."""
    if not code or code[0] not in EPILOGUE_FIRST_BYTES:
        return None
    at = 0
    rsp = registers["rsp"]
    rex = code[0] if code[0] & 0xF8 == 0x48 else None
    if rex is not None and len(code) >= 4 and code[1] in (0x81, 0x83) and code[2] == 0xC4:
        if code[1] == 0x83:          # add rsp, imm8
            rsp += _signed(code[3], 1)
            at = 4
        elif len(code) >= 7:         # add rsp, imm32
            rsp += _signed(int.from_bytes(code[3:7], "little"), 4)
            at = 7
    elif rex is not None and len(code) >= 4 and code[1] == 0x8D and code[2] & 0x38 == 0x20 and info.frame_register:
        # lea rsp, [frame register + disp8/disp32]
        base = (code[2] & 7) | ((rex & 1) << 3)
        if base != info.frame_register:
            return None
        mod = code[2] >> 6
        if mod == 1:
            displacement, at = _signed(code[3], 1), 4
        elif mod == 2 and len(code) >= 7:
            displacement, at = _signed(int.from_bytes(code[3:7], "little"), 4), 7
        else:
            return None
        value = registers.get(REGISTERS[base])
        if value is None:
            return None
        rsp = value + displacement
    pops = []
    while at < len(code):
        byte = code[at]
        if 0x58 <= byte <= 0x5F:
            pops.append(byte - 0x58)
            at += 1
        elif byte == 0x41 and at + 1 < len(code) and 0x58 <= code[at + 1] <= 0x5F:
            pops.append(code[at + 1] - 0x58 + 8)
            at += 2
        else:
            break
    if not _ends_function(code, at, rip + at, function_begin, function_end):
        return None
    caller = dict(registers)
    for register in pops:
        caller[REGISTERS[register]] = read_pointer(rsp)
        rsp += 8
    caller["rip"] = read_pointer(rsp)
    caller["rsp"] = rsp + 8
    return UnwindStep(caller, rsp, epilogue=True)


def _ends_function(code, at, address, function_begin, function_end):
    """What ends an epilogue for Windows' unwinder: ``ret``, ``rep ret``, ``ret
    imm16``; a relative jump out of the function or to its own start (tail calls,
    recursive ones included); ``jmp qword ptr [rip+disp32]`` (an import tail call);
    and any indirect ``jmp`` (``FF /4``) with a REX.W prefix — compilers add the
    REX.W (``48 ff e0``: rex.W jmp rax) precisely to mark an indirect tail call."""
    if at >= len(code):
        return False
    byte = code[at]
    if byte in (0xC3, 0xC2) or (byte == 0xF3 and at + 1 < len(code) and code[at + 1] == 0xC3):
        return True
    if byte in (0xE9, 0xEB):
        size = 5 if byte == 0xE9 else 2
        if at + size > len(code):
            return False
        target = address + size + _signed(int.from_bytes(code[at + 1:at + size], "little"), size - 1)
        return target == function_begin or not function_begin <= target < function_end
    if code[at:at + 2] == b"\xff\x25":
        return True
    return byte & 0xF8 == 0x48 and at + 2 < len(code) and code[at + 1] == 0xFF and code[at + 2] & 0x38 == 0x20


def _signed(value, size):
    bits = 8 * size
    return value - (1 << bits) if value & (1 << (bits - 1)) else value

