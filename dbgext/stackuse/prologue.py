"""Instruction-level stack-pointer semantics (capstone, x64 and x86) and the
prologue scan that estimates a frame size from code alone.

The frame size is what the function moves the stack pointer below its return
address: pushes plus allocation.  The scan walks the entry path and skips
everything that leaves SP alone (``mov [rsp+8], rbx`` home-space saves, argument
spills, ``mov r11, rsp``, frame-pointer set-up), because "pushes then one sub"
pattern matching is wrong for most Microsoft-built prologues.  It understands the
stack-probe helpers (``mov eax, N; call __chkstk``, with or without a following
``sub rsp, rax``), the x86 SEH prologue helper, and shrink-wrapped functions whose
early-exit test comes before the prologue (it follows the branch).

Instructions are decoded with capstone's ``disasm_lite`` (no detail objects) and
classified from their text: that is several times faster than detail mode, which
matters for images with tens of thousands of functions.
"""

from ..disasm import Disassembler, direct_target, memory_displacement, parse_int, split_operands
from .layouts import SEH_PROLOG_FRAME_OVERHEAD

MAX_PROLOGUE_INSTRUCTIONS = 80
MAX_PROLOGUE_PATHS = 4
DECODE_WINDOW = 256
DECODE_COUNT = 8  # instructions decoded per cache miss (capstone decodes eagerly)
STACK_PROBE_MINIMUM = 0x1000

SP = {"x64": "rsp", "x86": "esp"}
FP = {"x64": "rbp", "x86": "ebp"}
ACCUMULATOR = {"x64": ("rax", "eax"), "x86": ("eax",)}
CALLEE_SAVED = {
    "x64": frozenset(["rbx", "rbp", "rdi", "rsi", "r12", "r13", "r14", "r15"]),
    "x86": frozenset(["ebx", "ebp", "esi", "edi"]),
}
PUSH_SIZE = {"x64": 8, "x86": 4}
# Mnemonics that end a path through a function (besides ret/jmp).
STOPS = frozenset(["int3", "ud2", "hlt", "iretq", "iretd", "sysret", "sysexit"])
# Mnemonics that move SP without naming it as an operand.
SP_MNEMONICS = frozenset(["push", "pop", "pushfq", "pushfd", "pushf", "popfq", "popfd", "popf", "pushal",
                          "pushad", "popal", "popad", "leave"])
STACK_PROBE_NAMES = ("chkstk", "alloca_probe")
SEH_PROLOG_NAMES = ("SEH_prolog",)
SEH_EPILOG_NAMES = ("SEH_epilog",)


class Decoder(object):
    """Decodes instructions of a :class:`PEImage` by VA, caching each one.

    ``at(va)`` -> (address, size, mnemonic, op_str) or None with ``problem(va)``
    explaining why (unreadable page, outside the image, undecodable bytes)."""

    def __init__(self, image):
        self.image = image
        self.arch = image.arch
        self._disassembler = Disassembler.for_arch(image.arch)
        self.instructions = self._insns = {}
        self._failed = {}

    def at(self, va):
        insn = self._insns.get(va)
        if insn is None and va not in self._failed:
            self.decode_range(va, va + DECODE_WINDOW, DECODE_COUNT)
            insn = self._insns.get(va)
            if insn is None and va not in self._failed:
                self._failed[va] = "undecodable instruction at 0x%x" % va
        return insn

    def problem(self, va):
        return self._failed.get(va)

    def decode_range(self, start_va, end_va, count=0):
        """Decode linearly from ``start_va`` up to ``end_va`` (at most ``count``
        instructions when given) in one capstone call."""
        image = self.image
        rva = start_va - image.image_base
        code = image.read_partial(rva, max(1, end_va - start_va))
        if not code:
            self._failed[start_va] = "code at 0x%x is not readable in %s" % (start_va, image.name)
            return
        insns = self._insns
        for insn in self._disassembler.decode(code, start_va, count):
            insns[insn[0]] = insn


class SpState(object):
    """What the analyses track along a path: SP depth below the return address,
    the registers holding a copy of SP (the frame pointer, or ``mov r11, rsp`` /
    ``lea r11, [rsp+X]`` that an epilogue restores RSP from) as the depth they
    mark, and the accumulator when it holds a constant (a stack-probe size)."""

    __slots__ = ("depth", "copies", "accumulator")

    def __init__(self, depth=0, copies=None, accumulator=None):
        self.depth = depth
        self.copies = copies if copies is not None else {}
        self.accumulator = accumulator

    def copy(self):
        return SpState(self.depth, dict(self.copies), self.accumulator)


class StepResult(object):
    """How one instruction changed SP: ``dynamic`` names a non-static adjustment."""

    __slots__ = ("dynamic", "unknown")

    def __init__(self, dynamic=None, unknown=None):
        self.dynamic = dynamic
        self.unknown = unknown


def apply_sp_effect(arch, mnemonic, op_str, state):
    """Update ``state`` for one non-control-flow instruction; return a StepResult
    when the instruction makes the frame dynamic or loses track of SP."""
    sp = SP[arch]
    push = PUSH_SIZE[arch]
    if mnemonic == "push":
        state.depth += push
        return None
    if mnemonic == "pop":
        state.depth -= push
        state.copies.pop(op_str, None)
        return None
    if mnemonic in ("pushfq", "pushfd", "pushf"):
        state.depth += push
        return None
    if mnemonic in ("popfq", "popfd", "popf"):
        state.depth -= push
        return None
    if mnemonic in ("pushal", "pushad"):
        state.depth += 32
        return None
    if mnemonic in ("popal", "popad"):
        state.depth -= 32
        return None
    if mnemonic == "leave":
        frame = state.copies.pop(FP[arch], None)
        if frame is None:
            return StepResult(unknown="leave without a known frame pointer")
        state.depth = frame - push
        return None
    accumulator = state.accumulator
    if mnemonic != "mov":
        # Only moves keep the stack-probe size: `mul`, `cmpxchg`, `cpuid`... write
        # the accumulator implicitly.
        state.accumulator = None
    operands = split_operands(op_str)
    if not operands:
        return None
    destination = operands[0]
    source = operands[1] if len(operands) > 1 else ""
    if destination != sp:
        if "[" in destination or mnemonic in ("cmp", "test"):
            return None
        if destination in ACCUMULATOR[arch]:
            # Track `mov eax, N` for the stack-probe helpers; anything else forgets it.
            state.accumulator = parse_int(source) if mnemonic == "mov" else None
        if mnemonic == "mov" and source == sp:
            state.copies[destination] = state.depth
        elif mnemonic == "lea" and memory_displacement(source, sp) is not None:
            state.copies[destination] = state.depth - memory_displacement(source, sp)
        elif state.copies:
            state.copies.pop(destination, None)
        return None
    if mnemonic == "sub" or mnemonic == "add":
        value = parse_int(source)
        if value is None and source in ACCUMULATOR[arch] and accumulator is not None:
            value = accumulator
        if value is None:
            return StepResult(dynamic="%s %s" % (mnemonic, op_str))
        state.depth += value if mnemonic == "sub" else -value
        return None
    if mnemonic == "lea":
        offset = memory_displacement(source, sp)
        if offset is not None:
            state.depth -= offset
            return None
        for register, depth in state.copies.items():
            offset = memory_displacement(source, register)
            if offset is not None:
                state.depth = depth - offset
                return None
        return StepResult(dynamic="%s %s" % (mnemonic, op_str))
    if mnemonic == "mov":
        if source in state.copies:
            state.depth = state.copies[source]
            return None
        return StepResult(dynamic="%s %s" % (mnemonic, op_str))
    if mnemonic in ("and",):
        return StepResult(dynamic="stack realignment: %s %s" % (mnemonic, op_str))
    if mnemonic in ("cmp", "test", "xchg") or mnemonic.startswith("mov"):
        return None
    return StepResult(unknown="%s %s" % (mnemonic, op_str))


def is_named(name, fragments):
    if not name:
        return False
    lowered = name.lower()
    return any(fragment.lower() in lowered for fragment in fragments)


def helper_call_effect(arch, decoder, insn, state, target, name_of):
    """Stack effect of calling a prologue helper, or None for an ordinary call.

    Returns ("probe", moved bytes) for a stack probe (``__chkstk``: moves SP by the
    accumulator unless a ``sub sp, ax`` follows), or ("seh", bytes) for the x86
    ``__SEH_prolog4`` helper, which builds the frame itself."""
    name = name_of(target) if target is not None else None
    probe_size = state.accumulator
    if probe_size is not None and probe_size >= STACK_PROBE_MINIMUM and (
            name is None or is_named(name, STACK_PROBE_NAMES)):
        following = decoder.at(insn[0] + insn[1])
        if following is not None and following[2] == "sub" and following[3].startswith(SP[arch] + ", ") \
                and following[3].split(", ")[1] in ACCUMULATOR[arch]:
            return ("probe", 0)
        # x64's __chkstk never moves RSP; x86's __chkstk/_alloca_probe does.
        if arch == "x86":
            return ("probe", probe_size)
    if arch == "x86" and is_named(name, SEH_PROLOG_NAMES):
        return ("seh", None)
    return None


class PrologueResult(object):
    __slots__ = ("frame_size", "dynamic", "problem")

    def __init__(self):
        self.frame_size = None
        self.dynamic = None
        self.problem = None


def scan_prologue(decoder, entry, name_of=lambda va: None):
    """Estimate the frame size from the code at ``entry`` (VA).

    Walks the entry path, counting pushes and allocations and skipping moves.  The
    walk ends at the first ordinary call (the frame is complete there), a return,
    a jump, or on x86 at a push that is not a callee-saved register save (an
    outgoing argument).  A conditional branch taken before any stack change is
    followed too when the fall-through path never builds a frame (shrink-wrapping).
    """
    arch = decoder.arch
    result = PrologueResult()
    pending = [entry]
    seen_paths = set()
    best = None
    while pending and len(seen_paths) < MAX_PROLOGUE_PATHS:
        start = pending.pop(0)
        if start in seen_paths:
            continue
        seen_paths.add(start)
        frame, dynamic, problem, branches = _scan_path(decoder, start, arch, name_of)
        if dynamic:
            result.dynamic = dynamic
        if frame is not None and (best is None or frame > best):
            best = frame
        if problem and best is None:
            result.problem = problem
        if frame == 0 or frame is None:
            pending.extend(branches)
    if best is not None:
        result.frame_size = best
        result.problem = None
    return result


def _scan_path(decoder, start, arch, name_of):
    state = SpState()
    written = set()
    deepest = 0
    branches = []
    address = start
    dynamic = None
    saves = CALLEE_SAVED[arch]
    for _ in range(MAX_PROLOGUE_INSTRUCTIONS):
        insn = decoder.at(address)
        if insn is None:
            return (deepest if deepest else None), dynamic, decoder.problem(address), branches
        _, size, mnemonic, op_str = insn
        next_address = address + size
        if mnemonic == "call":
            target = direct_target(op_str)
            effect = helper_call_effect(arch, decoder, insn, state, target, name_of)
            if effect is None:
                break
            kind, moved = effect
            if kind != "probe" or moved:
                # Keep the size only for the `sub sp, ax` that follows a non-moving probe.
                state.accumulator = None
            if kind == "probe":
                state.depth += moved
            else:
                # push N; push scopetable; call __SEH_prolog4: N comes from the first push.
                locals_size = pushed_immediate_before(decoder, start, address, 2)
                if locals_size is None:
                    break
                state.copies[FP[arch]] = state.depth - 8 + 4
                state.depth = state.depth - 8 + SEH_PROLOG_FRAME_OVERHEAD + locals_size
            deepest = max(deepest, state.depth)
            address = next_address
            continue
        if mnemonic.startswith("ret") or mnemonic == "jmp" or mnemonic in STOPS:
            break
        if mnemonic[0] == "j" or mnemonic.startswith("loop"):
            target = direct_target(op_str)
            if target is not None and state.depth == 0:
                branches.append(target)
            address = next_address
            continue
        if arch == "x86" and mnemonic == "push" and state.depth > 0:
            # After the frame starts, only saves of untouched callee-saved registers
            # belong to the prologue; anything else is an outgoing argument — except
            # the two pushes that feed the SEH prologue helper.
            if not (op_str in saves and op_str not in written) and not _feeds_seh_prolog(
                    decoder, next_address, name_of):
                break
        step = apply_sp_effect(arch, mnemonic, op_str, state)
        if step is not None:
            if step.dynamic:
                dynamic = step.dynamic
            break
        if mnemonic != "push":
            operands = [operand.strip() for operand in op_str.split(",", 1)]
            # `mov edi, edi` (the hotpatch pad) writes nothing new.
            if operands and "[" not in operands[0] and not (len(operands) == 2 and operands[0] == operands[1]):
                written.add(operands[0])
        deepest = max(deepest, state.depth)
        address = next_address
        if arch == "x64" and mnemonic == "sub" and op_str.startswith("rsp"):
            # The x64 ABI makes the fixed allocation the prologue's last SP change.
            break
    return deepest, dynamic, None, branches


def _feeds_seh_prolog(decoder, address, name_of):
    """True when a push at ``address - size`` is followed (within one push) by a call
    to the SEH prologue helper."""
    for _ in range(2):
        insn = decoder.at(address)
        if insn is None:
            return False
        if insn[2] == "call":
            return is_named(name_of(direct_target(insn[3]) or 0), SEH_PROLOG_NAMES)
        if insn[2] != "push":
            return False
        address += insn[1]
    return False


def pushed_immediate_before(decoder, start, call_address, count):
    """The immediate of the ``count``-th push before ``call_address`` on the path from
    ``start`` (the SEH helper's local size)."""
    pushes = []
    address = start
    while address < call_address:
        insn = decoder.at(address)
        if insn is None:
            return None
        if insn[2] == "push":
            pushes.append(insn[3])
        address += insn[1]
    if len(pushes) < count:
        return None
    return parse_int(pushes[-count])
