"""x64 unwind data: RUNTIME_FUNCTION entries and UNWIND_INFO, every operation, chains.

The unwind codes describe exactly what the prologue did to RSP, so they are the
reference for a function's frame size (``stackuse``) and for unwinding a frame
(:mod:`dbgext.stacks.x64`).  Chained entries (split-off fragments that run inside
their parent's frame) add their parent's codes: the frame is the sum along the
chain.  Chains are followed with a visited set and a depth limit, so a corrupt
image whose chain loops costs a few steps and one reported problem.

Images are :class:`dbgext.pe.PEImage` objects (a file or a module in target memory)
or the unwinder's :class:`~dbgext.stacks.images.TargetImage`, which answers the
same calls from target memory on demand.
"""

# -- UNWIND_INFO (the PE/COFF x64 exception-handling format) -----------------------------

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

# Extra 16-bit slots an operation uses after its own (the Windows unwinder's table);
# ALLOC_LARGE with info 1 uses one more than listed.
UNWIND_EXTRA_SLOTS = {0: 0, 1: 1, 2: 0, 3: 0, 4: 1, 5: 2, 6: 1, 7: 2, 8: 1, 9: 2, 10: 0}

MACHFRAME_SIZE = {0: 40, 1: 48}  # PUSH_MACHFRAME without / with an error code

# The x64 general registers in unwind-code order (the operation info's numbering).
REGISTERS = ("rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
             "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")

MAX_CHAIN_LENGTH = 32


class UnwindCode(object):
    __slots__ = ("prolog_offset", "op", "info", "stack_bytes", "save_offset")

    def __init__(self, prolog_offset, op, info, stack_bytes, save_offset=None):
        self.prolog_offset = prolog_offset
        self.op = op
        self.info = info
        self.stack_bytes = stack_bytes  # how far this operation moved RSP
        # SAVE_NONVOL(_FAR) / SAVE_XMM128(_FAR): where the register was stored,
        # relative to the frame base (the establisher frame).
        self.save_offset = save_offset

    def __repr__(self):
        return "UnwindCode(@%d op=%d info=%d rsp-=%d)" % (self.prolog_offset, self.op, self.info, self.stack_bytes)


class UnwindInfo(object):
    """One UNWIND_INFO record (not following its chain)."""

    __slots__ = ("rva", "version", "flags", "prolog_size", "frame_register", "frame_offset",
                 "codes", "chained", "problem")

    def __init__(self, rva):
        self.rva = rva
        self.version = 0
        self.flags = 0
        self.prolog_size = 0
        self.frame_register = 0
        self.frame_offset = 0
        self.codes = []
        self.chained = None  # (begin, end, unwind rva) of the parent entry
        self.problem = None

    @property
    def own_stack_bytes(self):
        return sum(code.stack_bytes for code in self.codes)



def parse_unwind_info(image, rva):
    """Decode the UNWIND_INFO at ``rva`` of a :class:`PEImage`; problems go in ``.problem``."""
    info = UnwindInfo(rva)
    fields = image.unpack("<BBBB", rva)
    if fields is None:
        info.problem = "unwind info at %s is unreadable" % image.describe(rva)
        return info
    header, info.prolog_size, count, frame = fields
    info.version = header & 7
    info.flags = header >> 3
    info.frame_register = frame & 0xF
    info.frame_offset = (frame >> 4) * 16
    if info.version not in (1, 2):
        info.problem = "unwind info at %s has unknown version %d" % (image.describe(rva), info.version)
        return info
    slots_at = rva + 4
    slots = image.unpack("<%dH" % count, slots_at)
    if slots is None:
        info.problem = "unwind codes at %s are unreadable" % image.describe(slots_at)
        return info
    info.codes, problem = _decode_codes(slots)
    if problem:
        info.problem = "unwind info at %s: %s" % (image.describe(rva), problem)
    if info.flags & UNW_FLAG_CHAININFO:
        # After the codes, padded to an even slot count, sits the parent RUNTIME_FUNCTION.
        parent_at = slots_at + 2 * (count + (count & 1))
        info.chained = image.unpack("<III", parent_at)
        if info.chained is None:
            info.problem = "chained entry of unwind info at %s is unreadable" % image.describe(rva)
    return info


def _decode_codes(slots):
    codes = []
    index = 0
    while index < len(slots):
        slot = slots[index]
        prolog_offset = slot & 0xFF
        op = (slot >> 8) & 0xF
        op_info = slot >> 12
        extra = UNWIND_EXTRA_SLOTS.get(op)
        if extra is None:
            return codes, "unknown unwind operation %d in slot %d" % (op, index)
        if op == UWOP_ALLOC_LARGE and op_info == 1:
            extra = 2
        if index + extra >= len(slots):
            return codes, "unwind operation %d in slot %d runs past the code array" % (op, index)
        stack_bytes = 0
        save_offset = None
        if op in (UWOP_SAVE_NONVOL, UWOP_SAVE_XMM128):
            save_offset = slots[index + 1] * (8 if op == UWOP_SAVE_NONVOL else 16)
        elif op in (UWOP_SAVE_NONVOL_FAR, UWOP_SAVE_XMM128_FAR):
            save_offset = slots[index + 1] | (slots[index + 2] << 16)
        if op == UWOP_PUSH_NONVOL:
            stack_bytes = 8
        elif op == UWOP_ALLOC_SMALL:
            stack_bytes = op_info * 8 + 8
        elif op == UWOP_ALLOC_LARGE:
            if op_info == 0:
                stack_bytes = slots[index + 1] * 8
            elif op_info == 1:
                stack_bytes = slots[index + 1] | (slots[index + 2] << 16)
            else:
                return codes, "ALLOC_LARGE with info %d in slot %d" % (op_info, index)
        elif op == UWOP_PUSH_MACHFRAME:
            stack_bytes = MACHFRAME_SIZE.get(op_info, 48)
        codes.append(UnwindCode(prolog_offset, op, op_info, stack_bytes, save_offset))
        index += 1 + extra
    return codes, None


class UnwindFrame(object):
    """A function's frame according to its unwind data, chain followed."""

    __slots__ = ("frame_size", "chain", "problem")

    def __init__(self):
        self.frame_size = None
        self.chain = []          # RUNTIME_FUNCTION tuples from the entry to the primary
        self.problem = None

    @property
    def is_fragment(self):
        return len(self.chain) > 1


def frame_from_unwind(image, entry, cache=None):
    """Frame size for a RUNTIME_FUNCTION ``entry`` = sum of stack-moving unwind
    operations along its chain.  ``cache`` (dict rva -> UnwindInfo) is optional."""
    frame = UnwindFrame()
    total = 0
    visited = set()
    current = entry
    for _ in range(MAX_CHAIN_LENGTH):
        frame.chain.append(current)
        unwind_rva = current[2]
        if unwind_rva in visited:
            frame.problem = "unwind chain loops at %s" % image.describe(unwind_rva)
            return frame
        visited.add(unwind_rva)
        if not 0 < unwind_rva < image.size_of_image:
            frame.problem = "unwind info rva 0x%x of the entry at %s lies outside the image" % (
                unwind_rva, image.describe(current[0]))
            return frame
        info = cache.get(unwind_rva) if cache is not None else None
        if info is None:
            info = parse_unwind_info(image, unwind_rva)
            if cache is not None:
                cache[unwind_rva] = info
        if info.problem and not info.codes and info.chained is None:
            frame.problem = info.problem
            return frame
        if info.problem:
            frame.problem = info.problem
        total += info.own_stack_bytes
        if info.chained is None:
            if not frame.problem:
                frame.frame_size = total
            return frame
        current = info.chained
    frame.problem = "unwind chain from %s is longer than %d entries" % (
        image.describe(entry[0]), MAX_CHAIN_LENGTH)
    return frame
