"""The faulting thread's stack signature: top frames as ``module!function``.

Triage has no unwind data for every module of every dump, so it does what
WinDbg's ``kv`` falls back to and what ``!analyze`` bucketing needs: frame 0 is the
context's instruction pointer, then the stack is scanned upward from the stack
pointer for values that are return addresses — they point into a loaded module
*and* the bytes before them are a ``call`` instruction.  The signature (the bucket
key, like WER's faulting function) is the first frame that is not bug-check or
exception-dispatch plumbing.
"""

import struct

from ..errors import DbgextError

MAX_FRAMES = 8
STACK_SCAN_SLOTS = 1024   # 8 KiB (x64) of stack above the stack pointer, read in one bulk read

# Frames that say *how* the system stopped, not *where* it went wrong.
PLUMBING = frozenset(name.lower() for name in (
    "nt!KeBugCheckEx", "nt!KeBugCheck", "nt!KeBugCheck2", "nt!KiBugCheckDispatch",
    "nt!KiPageFault", "nt!KiGeneralProtectionFault", "nt!KiDoubleFaultAbort",
    "nt!KiExceptionDispatch", "nt!KiBreakpointTrap", "nt!KiDivideErrorFault",
    "nt!KiInvalidOpcodeFault", "nt!KiSystemServiceHandler", "nt!RtlRaiseStatus",
    "nt!ExRaiseStatus", "nt!KiRaiseException", "nt!KiDispatchException",
    "ntdll!KiUserExceptionDispatcher", "ntdll!RtlRaiseException", "ntdll!RtlDispatchException",
    "ntdll!RtlReportException", "kernelbase!RaiseException", "kernelbase!UnhandledExceptionFilter",
    "ntdll!NtWaitForSingleObject", "ntdll!NtWaitForMultipleObjects", "kernelbase!WaitForSingleObjectEx",
    "ntdll!ZwWaitForSingleObject",
))

PC_NAMES = ("rip", "eip", "pc")
SP_NAMES = ("rsp", "esp", "sp")


class StackSignature(object):
    """``frames``: names of the top frames; ``addresses``: their code addresses;
    ``signature``: the faulting function; ``problems``: (message, address) pairs."""

    __slots__ = ("frames", "addresses", "signature", "problems")

    def __init__(self):
        self.frames = []
        self.addresses = []
        self.signature = None
        self.problems = []


def context_registers(info):
    """The crash context from target.info(): ``context`` or ``registers`` (any key
    case); None when there is none or it is all zero (a dump written without one)."""
    for key in ("context", "registers"):
        registers = info.get(key)
        if isinstance(registers, dict) and registers:
            registers = {str(name).lower(): value for name, value in registers.items()}
            if _first(registers, PC_NAMES) or _first(registers, SP_NAMES):
                return registers
    return None


def _first(registers, names):
    for name in names:
        value = registers.get(name)
        if isinstance(value, int):
            return value
    return None


def follows_call(before):
    """True when ``before`` (the bytes just ahead of a candidate return address)
    ends with an x86/x64 ``call`` encoding."""
    n = len(before)
    if n >= 5 and before[n - 5] == 0xE8:                                    # call rel32
        return True
    if n >= 2 and before[n - 2] == 0xFF and (before[n - 1] & 0xF8) == 0xD0:  # call reg
        return True
    if n >= 3 and before[n - 3] == 0xFF and (before[n - 2] & 0xF8) == 0x50:  # call [reg+disp8]
        return True
    if n >= 6 and before[n - 6] == 0xFF and before[n - 5] in (0x15, 0x90, 0x91, 0x92, 0x93, 0x95, 0x96, 0x97):
        return True                                                        # call [rip+disp32] / [reg+disp32]
    if n >= 3 and before[n - 3] == 0xFF and before[n - 2] == 0x14 and before[n - 1] == 0x24:
        return True                                                        # call [rsp]
    return False


def is_return_address(target, value, code_cache):
    """``value`` points into a module and follows a call instruction."""
    known = code_cache.get(value)
    if known is not None:
        return known
    result = False
    if value >= 8 and target.module_at(value) is not None:
        read = target.try_read(value - 7, 7)
        result = read.complete and follows_call(read.data)
    code_cache[value] = result
    return result


def name_of(target, address):
    try:
        name = target.symbols.function_of(address)
    except DbgextError:
        name = None
    return name or ("0x%x" % address)


def stack_walk(target, registers, max_frames=MAX_FRAMES, scan_slots=STACK_SCAN_SLOTS):
    """Code addresses of the top ``max_frames`` frames and problems met, from the
    context's pc and a bounded scan of the stack above its sp."""
    problems = []
    pc = _first(registers, PC_NAMES)
    sp = _first(registers, SP_NAMES)
    addresses = []
    if pc:
        addresses.append(pc)
    if not sp:
        problems.append(("the crash context has no stack pointer", None))
        return addresses, problems
    read = target.try_read(sp, scan_slots * target.pointer_size)
    if read.holes and read.holes[0][0] == sp:
        problems.append(("stack at 0x%x is unreadable" % sp, sp))
        return addresses, problems
    readable_end = read.holes[0][0] if read.holes else sp + len(read.data)
    slots = (readable_end - sp) // target.pointer_size
    values = struct.unpack_from("<%d%s" % (slots, "Q" if target.pointer_size == 8 else "I"), read.data)
    modules = target.modules()
    if not modules:
        return addresses, problems
    # Most stack slots are data: a range test spares them the module lookup.
    lowest, highest = modules[0].base, max(module.end for module in modules)
    code_cache = {}
    for value in values:
        if len(addresses) >= max_frames:
            break
        if lowest <= value < highest and is_return_address(target, value, code_cache):
            addresses.append(value)
    return addresses, problems


def faulting_signature(target, info=None):
    """The :class:`StackSignature` of the crash context, empty when the dump has none."""
    result = StackSignature()
    registers = context_registers(info if info is not None else (target.info() or {}))
    if not registers:
        return result
    result.addresses, result.problems = stack_walk(target, registers)
    result.frames = [name_of(target, address) for address in result.addresses]
    for frame in result.frames:
        if frame.lower() not in PLUMBING:
            result.signature = frame
            break
    else:
        result.signature = result.frames[0] if result.frames else None
    return result
