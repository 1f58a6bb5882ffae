"""Instruction-level stack-pointer semantics (capstone, x64 and x86) and the
prologue scan that estimates a frame size from code alone.

The frame size is what the function moves the stack pointer below its return
address: pushes plus allocation.  The scan walks the entry path and skips
everything that leaves SP alone (``mov [rsp+8], rbx`` home-space saves, argument
spills, ``mov r11, rsp``, frame-pointer set-up), because "pushes then one sub"
pattern matching is wrong for most Microsoft-built prologues.  It understands the
stack-probe helpers (``mov eax, N; call __chkstk``, with or without a following
``sub rsp, rax``), MSVC's x86 frame helpers (``__SEH_prolog4``, ``__EH_prolog3``,
``_EH_prolog``), and shrink-wrapped functions whose
early-exit test comes before the prologue (it follows the branch).

Instructions are decoded with capstone's ``disasm_lite`` (no detail objects) and
classified from their text: that is several times faster than detail mode, which
matters for images with tens of thousands of functions.  The x64 prologue most
compilers emit (register pushes, then ``sub rsp, N`` or a stack probe) is read
from its bytes without decoding (:func:`common_x64_frame`), to the same result.
"""

from ..disasm import Disassembler, direct_target, memory_displacement, parse_int, split_operands
from .layouts import FRAME_HELPERS

MAX_PROLOGUE_INSTRUCTIONS = 80
MAX_PROLOGUE_PATHS = 4
DECODE_WINDOW = 256
DECODE_COUNT = 8  # instructions decoded per cache miss (capstone decodes eagerly)
PRIMED_INSTRUCTIONS = 6  # of a swept function, kept for its prologue scan (93% of scans read no more)
STACK_PROBE_MINIMUM = 0x1000
COMMON_PROLOGUE_BYTES = 48  # read for common_x64_frame: a dozen pushes, a probe and the sub

SP = {"x64": "rsp", "x86": "esp"}
FP = {"x64": "rbp", "x86": "ebp"}
ACCUMULATOR = {"x64": ("rax", "eax"), "x86": ("eax",)}
CALLEE_SAVED = {
    "x64": frozenset(["rbx", "rbp", "rdi", "rsi", "r12", "r13", "r14", "r15"]),
    "x86": frozenset(["ebx", "ebp", "esi", "edi"]),
}
PUSH_SIZE = {"x64": 8, "x86": 4}
# x86 registers no calling convention preserves: a push of one nobody wrote yet
# reserves a stack slot — for EAX always (no Windows convention passes arguments
# in it), for ECX/EDX (fastcall/thiscall arguments) unless the next call takes it
# as an argument.
SCRATCH = frozenset(["eax", "ecx", "edx"])
MAX_ARGUMENT_LOOKAHEAD = 24
CLEANUP_LOOKAHEAD = 4
# Instructions that never write the accumulator implicitly (an explicit `mov eax,
# ...` is handled as a destination): the stack-probe size survives them.
KEEPS_ACCUMULATOR = frozenset(["mov", "lea", "push", "test", "cmp", "movzx", "movsx", "nop"])
PROBE_LOOKAHEAD = 4
SEH_RECORD_LOOKAHEAD = 24  # MSVC puts the locals, saves and the cookie between the record and fs:[0]
# Mnemonics that end a path through a function (besides ret/jmp).
STOPS = frozenset(["int3", "ud2", "hlt", "iretq", "iretd", "sysret", "sysexit"])
# Mnemonics that move SP without naming it as an operand.
SP_MNEMONICS = frozenset(["push", "pop", "pushfq", "pushfd", "pushf", "popfq", "popfd", "popf", "pushal",
                          "pushad", "popal", "popad", "leave"])
STACK_PROBE_NAMES = ("chkstk", "alloca_probe")
BRANCH_PREFIXES = ("bnd ", "notrack ")


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
        self._common_frames = {}

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

    @property
    def disassembler(self):
        """The image architecture's :class:`~dbgext.disasm.Disassembler`."""
        return self._disassembler

    def run(self, start_va, end_va, keep=False):
        """A :class:`~dbgext.disasm.DecodedRun` over [start_va, end_va) (use it in a
        ``with`` block) and the first VA that could not be read or decoded, or
        None.  ``keep`` caches the first instructions (a prologue's worth) until
        :meth:`forget`, unless :func:`common_x64_frame` reads the prologue's frame
        from its bytes."""
        code = self.image.read_partial(start_va - self.image.image_base, end_va - start_va)
        run = self._disassembler.run(code, start_va)
        if keep and self._remember_common_frame(start_va, code) is None:
            self._insns.update((insn[0], insn) for insn in (run[index] for index in range(
                min(PRIMED_INSTRUCTIONS, run.count))))
        return run, (run.reached if run.reached < end_va else None)

    def common_frame(self, va):
        """:func:`common_x64_frame` of the code at ``va`` (x64 only; None otherwise)."""
        if va in self._common_frames:
            return self._common_frames[va]
        return self._remember_common_frame(va, self.image.read_partial(
            va - self.image.image_base, COMMON_PROLOGUE_BYTES))

    def _remember_common_frame(self, va, code):
        frame = self._common_frames[va] = common_x64_frame(code) if self.arch == "x64" else None
        return frame

    def forget(self):
        """Drop every cached instruction (memory stays bounded by one function)."""
        self._insns.clear()
        self._failed.clear()
        self._common_frames.clear()

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
            if insn[2].startswith(BRANCH_PREFIXES):
                # `bnd jne`, `bnd ret` (MSVC's /guard-era CRT), `notrack jmp`: the
                # branch's prefix changes nothing of its control flow or stack.
                insn = (insn[0], insn[1], insn[2].split(" ", 1)[1], insn[3])
            insns[insn[0]] = insn


def common_x64_frame(code):
    """The frame size the prologue scan finds for x64 ``code`` (bytes at an entry)
    of the shape most compilers emit, read from the bytes without decoding; None
    for any other shape.  The shape: register pushes (``50+r``, ``41 50+r``), at
    most one ``mov eax, imm32`` (``B8``) and then either ``sub rsp, imm`` (``48 83
    EC ib``, ``48 81 EC id``), or the stack probe ``call rel32; sub rsp, rax`` (``E8
    .. 48 29 C4``) after the ``mov eax``.  Immediates with the sign bit set are left
    to the scan (capstone spells them differently)."""
    depth = 0
    probe_size = None
    offset = 0
    length = len(code)
    while offset < length:
        opcode = code[offset]
        if 0x50 <= opcode <= 0x57:
            depth += 8
            offset += 1
        elif opcode == 0x41 and offset + 1 < length and 0x50 <= code[offset + 1] <= 0x57:
            depth += 8
            offset += 2
        elif opcode == 0xB8 and probe_size is None and offset + 4 < length and code[offset + 4] < 0x80:
            probe_size = int.from_bytes(code[offset + 1:offset + 5], "little")
            offset += 5
        elif opcode == 0xE8 and probe_size is not None:
            return depth + probe_size if code[offset + 5:offset + 8] == b"\x48\x29\xc4" else None
        elif opcode == 0x48 and code[offset + 1:offset + 3] == b"\x83\xec" and offset + 3 < length \
                and code[offset + 3] < 0x80:
            return depth + code[offset + 3]
        elif opcode == 0x48 and code[offset + 1:offset + 3] == b"\x81\xec" and offset + 6 < length \
                and code[offset + 6] < 0x80:
            return depth + int.from_bytes(code[offset + 3:offset + 7], "little")
        else:
            return None
    return None


class SpState(object):
    """What the analyses track along a path: SP depth below the return address,
    the registers holding a copy of SP (the frame pointer, or ``mov r11, rsp`` /
    ``lea r11, [rsp+X]`` that an epilogue restores RSP from) as the depth they
    mark, and the accumulator when it holds a constant (a stack-probe size)."""

    __slots__ = ("depth", "copies", "accumulator", "padding", "lost", "pushed", "unsure")

    def __init__(self, depth=0, copies=None, accumulator=None, padding=0, lost=False, pushed=0, unsure=0):
        self.depth = depth
        # SP was set from a value that is not a copy of it (``mov esp, ecx``,
        # ``sub esp, eax``): ``depth`` is not where SP is until a copy restores it.
        self.lost = lost
        self.copies = copies if copies is not None else {}
        self.accumulator = accumulator
        # Bytes counted in ``depth`` for realignment (``and esp, -16``) at their
        # maximum: compilers leave them out of the frame size.
        self.padding = padding
        # x86 body walk: bytes pushed since the path's last call that may be its
        # arguments, and bytes by which ``depth`` may run high because an import or
        # indirect call with no cleanup after it (stdcall) popped them unseen.
        self.pushed = pushed
        self.unsure = unsure

    def copy(self):
        return SpState(self.depth, dict(self.copies), self.accumulator, self.padding, self.lost, self.pushed,
                       self.unsure)


class StepResult(object):
    """How one instruction changed SP: ``dynamic`` names a non-static adjustment;
    ``switched`` an x86 ESP loaded from another frame (``mov esp, [ebp - 0x18]``
    with EBP not set by this path, see :func:`_names_another_frame`): the code
    goes on in a frame it did not build — an SEH ``__finally`` block, called
    inside its function, resuming its parent at the end of the ``try``, or a
    longjmp target — so the path's depth ends there and the frame is not dynamic."""

    __slots__ = ("dynamic", "unknown", "switched")

    def __init__(self, dynamic=None, unknown=None, switched=None):
        self.dynamic = dynamic
        self.unknown = unknown
        self.switched = switched


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
        if op_str in ACCUMULATOR[arch]:
            state.accumulator = None
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
        state.lost = False
        return None
    accumulator = state.accumulator
    if mnemonic not in KEEPS_ACCUMULATOR:
        # `mul`, `cmpxchg`, `cpuid`... write the accumulator implicitly.
        state.accumulator = None
    operands = split_operands(op_str)
    if not operands:
        return None
    destination = operands[0]
    source = operands[1] if len(operands) > 1 else ""
    if destination != sp:
        if "[" in destination:
            if mnemonic == "mov" and source == sp:
                # SP saved in a stack slot (clang's stacksave around a call):
                # remembered by the slot's place below the return address.
                offset = memory_displacement(destination, sp)
                if offset is not None:
                    state.copies["slot %d" % (state.depth - offset)] = state.depth
            return None
        if mnemonic in ("cmp", "test"):
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
            return _sp_lost(state, "%s %s" % (mnemonic, op_str))
        if arch == "x86" and value >= 1 << 31:
            # capstone spells a 32-bit immediate unsigned: `add esp, 0xfffffecc` is -0x134.
            value -= 1 << 32
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
                state.lost = False
                return None
        return _sp_lost(state, "%s %s" % (mnemonic, op_str))
    if mnemonic == "mov":
        offset = memory_displacement(source, sp)
        key = source if offset is None else "slot %d" % (state.depth - offset)
        if key in state.copies:
            state.depth = state.copies[key]
            state.lost = False
            return None
        if arch == "x86" and _names_another_frame(source, state):
            return StepResult(switched="%s %s" % (mnemonic, op_str))
        return _sp_lost(state, "%s %s" % (mnemonic, op_str))
    if mnemonic == "and":
        mask = parse_int(source)
        alignment = -mask if mask is not None and mask < 0 else (
            (1 << (8 * push)) - mask if mask is not None and mask > 0 else 0)
        if alignment <= 0 or alignment & (alignment - 1):
            return _sp_lost(state, "stack realignment: %s %s" % (mnemonic, op_str))
        # SP rounds down to a multiple of ``alignment``: at most alignment - push
        # bytes deeper (SP is push-aligned already).
        extra = max(alignment - push, 0)
        state.depth += extra
        state.padding += extra
        return None
    if mnemonic == "xchg":
        return _sp_lost(state, "%s %s" % (mnemonic, op_str))
    if mnemonic in ("cmp", "test") or mnemonic.startswith("mov"):
        return None
    return StepResult(unknown="%s %s" % (mnemonic, op_str))


def _names_another_frame(source, state):
    """True when ``source`` (of ``mov esp, source``) is EBP or a memory slot based
    on a register this path never made a copy of SP: its caller's frame pointer
    (the parent's epilogue run by a ``__finally`` block ending in longjmp), or a
    record of its parent's frame (``_JumpToContinuation``'s ``[ebx - 4]``).  A
    slot based on a copy (clang's ``mov [esi + 0x1c], esp`` ... ``mov esp, [esi +
    0x1c]``) is the function's own."""
    if source == "ebp":
        return "ebp" not in state.copies
    base = source.partition("[")[2].split(" ", 1)[0].rstrip("]")
    return bool(base) and base != "esp" and base not in state.copies


def _sp_lost(state, text):
    """SP was written with a value that is not a known copy of it."""
    state.lost = True
    return StepResult(dynamic=text)


def is_named(name, fragments):
    if not name:
        return False
    lowered = name.lower()
    return any(fragment.lower() in lowered for fragment in fragments)


class NoCallees(object):
    """What the prologue scan asks about callees when nothing is known of them."""

    def callee_kind(self, va):
        return None

    def pops_of(self, va):
        return None


def helper_call_effect(arch, decoder, insn, state, helper):
    """Stack effect of a call, or None for an ordinary call.  ``helper`` is what is
    known of the callee (``callee_kind``): None (nothing), "call" (an ordinary
    function), "probe" (named ``__chkstk``/``_alloca_probe``, or found to move the
    caller's SP), "frame <name>" (an MSVC frame-building helper, see
    ``layouts.FRAME_HELPERS``), "epilog".

    Returns ("probe", moved bytes) for a stack probe with a constant size in the
    accumulator: ``mov eax, N; call P; sub esp, eax`` (the probe only touches the
    pages: MinGW's ``___chkstk_ms``, x64's ``__chkstk``), or on x86 a helper that
    moves ESP by N itself (MSVC's ``__chkstk``; an unknown callee given N of a page
    or more); ("dynamic", None) for such a helper given a variable size (alloca);
    ("frame", name) for a frame-building helper."""
    probe_size = state.accumulator
    if probe_size is not None and _allocates_accumulator_next(decoder, insn[0] + insn[1], arch):
        return ("probe", 0)
    if arch != "x86":
        return None
    if helper == "probe":
        return ("probe", probe_size) if probe_size is not None else ("dynamic", None)
    if helper is None and probe_size is not None and probe_size >= STACK_PROBE_MINIMUM:
        return ("probe", probe_size)
    if helper is not None and helper.startswith("frame "):
        return ("frame", helper[6:])
    return None


def apply_frame_helper(decoder, start, call_address, state, name):
    """The caller's state after ``call <frame helper name>`` at ``call_address``
    (the path began at ``start``); False when the local size pushed for it is not
    a constant."""
    for fragment, pushes, overhead in FRAME_HELPERS:
        if fragment == name:
            break
    locals_size = pushed_immediate_before(decoder, start, call_address, pushes) if pushes else 0
    if locals_size is None:
        return False
    before = state.depth - 4 * pushes
    state.copies["ebp"] = before + 4
    state.depth = before + overhead + locals_size
    state.accumulator = None
    return True


def _allocates_accumulator_next(decoder, address, arch):
    """True when ``sub sp, ax`` follows within a few instructions that write
    neither SP nor the accumulator (gcc schedules moves in between)."""
    sp, accumulators = SP[arch], ACCUMULATOR[arch]
    for _ in range(PROBE_LOOKAHEAD):
        insn = decoder.at(address)
        if insn is None:
            return False
        destination = insn[3].split(",", 1)[0]
        if insn[2] == "sub" and destination == sp:
            return insn[3].split(", ")[1] in accumulators
        if destination == sp or destination in accumulators or insn[2] not in KEEPS_ACCUMULATOR:
            return False
        address += insn[1]
    return False


class PrologueResult(object):
    __slots__ = ("frame_size", "dynamic", "problem", "padding")

    def __init__(self):
        self.frame_size = None
        self.dynamic = None
        self.problem = None
        self.padding = 0  # realignment padding the frame may add (not in frame_size)


def scan_prologue(decoder, entry, callees=NoCallees()):
    """Estimate the frame size from the code at ``entry`` (VA).

    Walks the entry path, counting pushes and allocations and skipping moves.  The
    walk ends at the first ordinary call (the frame is complete there), a return,
    a jump, or on x86 at a push that is not a callee-saved register save (an
    outgoing argument).  A conditional branch taken before any stack change is
    followed too when the fall-through path never builds a frame (shrink-wrapping).
    On x86 a conditional branch taken after the frame began is followed, from the
    state at the branch, when the fall-through path is an early exit — it ends in
    a return or jump, or releases stack below the branch's depth (MSVC's
    ``pop ebx; ...; call __security_check_cookie; ret``): the branch's path goes on
    building the frame (callee-saved registers pushed only there).
    """
    arch = decoder.arch
    result = PrologueResult()
    if arch == "x64":
        result.frame_size = decoder.common_frame(entry)
        if result.frame_size is not None:
            return result
    pending = [(entry, None)]
    seen_paths = set()
    best = None
    while pending and len(seen_paths) < MAX_PROLOGUE_PATHS:
        start, resumed = pending.pop(0)
        if start in seen_paths:
            continue
        seen_paths.add(start)
        frame, dynamic, problem, branches, padding, continuations = _scan_path(decoder, start, arch, callees,
                                                                               resumed)
        pending.extend(continuations)
        result.padding = max(result.padding, padding)
        if dynamic:
            result.dynamic = dynamic
        if frame is not None and (best is None or frame > best):
            best = frame
        if problem and best is None:
            result.problem = problem
        if frame == 0 or frame is None:
            pending.extend((branch, None) for branch in branches)
    if best is not None:
        result.frame_size = best
        result.problem = None
    return result


def _scan_path(decoder, start, arch, callees, resumed=None):
    """One path from ``start`` (``resumed``: the (state, written registers, body
    started) of a branch taken after the frame began).  Returns (deepest frame,
    dynamic, problem, branches taken before any stack change, padding, the
    continuations [(branch target, resumed)] of an early exit)."""
    if resumed is None:
        state, written, body_started = SpState(), set(), False
    else:
        state, written, body_started = resumed[0].copy(), set(resumed[1]), resumed[2]
    deepest = state.depth - state.padding
    branches = []
    # Branches taken after the frame began: [target, depth at the branch, resumed,
    # the lowest depth since (below the branch's: the path released its frame)].
    later_branches = []
    kept = None   # (scratch register, depth after its push, deepest before it): `push ecx; ...; pop ecx`
    allocated = False  # the path allocated its frame (`sub esp, N`, a stack probe, a frame helper)
    address = start
    dynamic = None
    saves = CALLEE_SAVED[arch]
    for _ in range(MAX_PROLOGUE_INSTRUCTIONS):
        insn = decoder.at(address)
        if insn is None:
            return (deepest if deepest else None), dynamic, decoder.problem(address), branches, state.padding, []
        _, size, mnemonic, op_str = insn
        next_address = address + size
        if mnemonic == "call":
            target = direct_target(op_str)
            effect = helper_call_effect(arch, decoder, insn, state,
                                        callees.callee_kind(target) if target is not None else None)
            if effect is None:
                break
            if effect[0] == "dynamic":
                dynamic = "call at 0x%x allocates a variable size on the stack" % address
                break
            kind, detail = effect
            kept = None
            if arch == "x86" and kind == "probe" and detail and allocated:
                # A second allocation after the frame's own is the body's alloca
                # of a constant size (`sub esp, 0x34; push ebx; ...; mov eax,
                # 0x400; call __alloca_probe`): not the frame (FrameData's
                # cbLocals leaves it out); the call sites past it still count it.
                break
            allocated = True
            if kind == "frame":
                if not apply_frame_helper(decoder, start, address, state, detail):
                    break
            else:
                if detail:
                    # Keep the size only for the `sub sp, ax` after a non-moving probe.
                    state.accumulator = None
                state.depth += detail
            deepest = max(deepest, state.depth - state.padding)
            address = next_address
            continue
        if mnemonic.startswith("ret") or mnemonic == "jmp" or mnemonic in STOPS:
            for branch in later_branches:
                branch[3] = -1  # an exit: every branch before it leads on
            break
        if mnemonic[0] == "j" or mnemonic.startswith("loop"):
            target = direct_target(op_str)
            if target is not None and state.depth == 0:
                branches.append(target)
            elif target is not None and arch == "x86" and target > address:
                later_branches.append([target, state.depth, (state.copy(), set(written), body_started),
                                       state.depth])
            address = next_address
            continue
        if arch == "x86" and mnemonic == "push" and not (
                op_str in saves and op_str not in written):
            # A push belongs to the prologue when it saves an untouched callee-saved
            # register, feeds the SEH prologue helper, builds the exception
            # registration record MSVC's C++ prologue links into fs:[0] (`push -1;
            # push handler; mov eax, fs:[0]; push eax; ... mov fs:[0], eax`), or
            # reserves a local (`push ecx` of a scratch register: MSVC's and
            # clang's 4-byte allocation) — unless it is an outgoing argument of a
            # call that follows.  That holds for the first push too: MSVC's
            # frameless functions start straight with a call's arguments (`push
            # 48; push 0; push buffer; call memset`); only a first `push ecx`
            # stays a local without asking (`push ecx; push esi; push edi`).
            reserves_local = op_str in SCRATCH and op_str not in written and (
                state.depth == 0 or _addressed_through_frame_pointer(decoder, next_address, state)
                or _save_follows(decoder, next_address, written)
                or not _is_argument_push(decoder, next_address, callees, op_str == "eax"))
            if not reserves_local and not _feeds_frame_helper(decoder, next_address, callees) and not (
                    _installs_seh_record(decoder, next_address)):
                break
        if arch == "x86" and body_started and ((mnemonic == "push" and not (
                op_str in saves and op_str not in written) and not _installs_seh_record(decoder, next_address)) or (
                mnemonic == "sub" and op_str.startswith("esp, "))):
            # Once the body stores into its frame, space taken from the stack is a
            # call's argument area (clang: `sub esp, 24; mov [esp], eax; call f;
            # add esp, 24`), not part of the frame — but MSVC saves callee-saved
            # registers after storing the security cookie (`sub esp, 60; mov eax,
            # cookie; mov [esp+56], eax; ... push ebx; push esi`), and pushes the
            # cookie into its exception registration record before linking it.
            break
        before = deepest
        depth_before = state.depth
        if mnemonic in ("sub", "add") and op_str.startswith("esp, "):
            allocated = True
        step = apply_sp_effect(arch, mnemonic, op_str, state)
        if step is not None:
            if step.dynamic:
                dynamic = step.dynamic
            break
        if kept is not None and mnemonic == "pop" and depth_before == kept[1] and (
                op_str == kept[0] or (kept[0] == "flags" and "[esp" not in op_str)):
            # MSVC's debug prologue keeps ECX (`this`) across the fill of its frame
            # (`push ecx; lea edi, [ebp-N]; mov ecx, N/4; mov eax, 0xcccccccc; rep
            # stosd; pop ecx`): a register kept, not a slot of the frame; and
            # `pushfd; pop [flags]` (``__report_gsfailure``) copies the flags.
            deepest = kept[2]
        if state.depth != depth_before or "[esp" in op_str:
            # ... unless the slot is written or read: then it is a local (clang's
            # `push eax; mov [esp], eax; fild [esp]; pop eax`).
            if arch == "x86" and mnemonic == "push" and op_str in SCRATCH:
                kept = (op_str, state.depth, before)
            elif arch == "x86" and mnemonic == "pushfd":
                kept = ("flags", state.depth, before)
            else:
                kept = None
        if mnemonic != "push":
            operands = [operand.strip() for operand in op_str.split(",", 1)]
            # `mov edi, edi` (the hotpatch pad) writes nothing new; `xor ebx, ebx` does.
            if operands and "[" not in operands[0] and not (
                    mnemonic == "mov" and len(operands) == 2 and operands[0] == operands[1]):
                written.add(operands[0])
            elif operands and ("[esp" in operands[0] or "[ebp" in operands[0]):
                body_started = True
        deepest = max(deepest, state.depth - state.padding)
        for branch in later_branches:
            branch[3] = min(branch[3], state.depth)
        address = next_address
        if arch == "x64" and mnemonic == "sub" and op_str.startswith("rsp"):
            # The x64 ABI makes the fixed allocation the prologue's last SP change.
            break
    continuations = [(target, resumed) for target, depth, resumed, lowest in later_branches if lowest < depth]
    return deepest, dynamic, None, branches, state.padding, continuations


def _is_argument_push(decoder, address, callees, explicit_only=False):
    """True when a push just before ``address`` is an outgoing argument of the next
    call: the bytes that call's arguments take (the ``add esp, N`` or pops right
    after it, or what the callee pops with ``ret N``) exceed the bytes pushed
    between here and the call.  ``explicit_only``: only an ``add esp, N`` counts
    (a pop after the call may be the epilogue freeing a ``push eax`` local)."""
    pushed_after = 0
    for _ in range(MAX_ARGUMENT_LOOKAHEAD):
        insn = decoder.at(address)
        if insn is None:
            return False
        mnemonic = insn[2]
        address += insn[1]
        if mnemonic == "call":
            if explicit_only:
                arguments = _argument_bytes_after(decoder, address, None, pops=False)
                return arguments is not None and pushed_after < arguments
            arguments = _argument_bytes_after(decoder, address, callees.pops_of(direct_target(insn[3]) or 0))
            return arguments is None or pushed_after < arguments
        if mnemonic == "push":
            pushed_after += 4
        elif mnemonic in SP_MNEMONICS or insn[3].startswith("esp") or mnemonic[0] == "j" \
                or mnemonic.startswith("ret"):
            return False
    return False


def _save_follows(decoder, address, written):
    """True when the instruction at ``address`` pushes a callee-saved register this
    path has not written: a save (its value means nothing to the function else),
    which no compiler puts between a call's arguments — so a push just before it
    reserves a local (``push ebp; mov ebp, esp; push ecx; push ebx; push esi; push
    edi; call [GetEnvironmentStringsW]``)."""
    insn = decoder.at(address)
    return insn is not None and insn[2] == "push" and insn[3] in CALLEE_SAVED["x86"] and insn[3] not in written


def _addressed_through_frame_pointer(decoder, address, state):
    """True when, before the next call, jump or return, the code at ``address``
    addresses the slot a push just before it filled (or one below it) through the
    frame pointer: ``push ecx; push ecx; push ebx; lea eax, [ebp - 8]`` — a local
    (MSVC reserves 4-byte locals so), never an outgoing argument."""
    frame = state.copies.get("ebp")
    if frame is None:
        return False
    slot = frame - (state.depth + 4)      # the pushed slot's displacement from EBP
    for _ in range(MAX_ARGUMENT_LOOKAHEAD):
        insn = decoder.at(address)
        if insn is None:
            return False
        mnemonic, op_str = insn[2], insn[3]
        if mnemonic == "call" or mnemonic[0] == "j" or mnemonic.startswith("ret"):
            return False
        for operand in split_operands(op_str):
            displacement = memory_displacement(operand, "ebp")
            if displacement is not None and displacement <= slot:
                return True
        address += insn[1]
    return False


def _argument_bytes_after(decoder, address, callee_pops, pops=True):
    """Bytes of arguments a call removes: ``add esp, N`` (or, with ``pops``, a pop
    of a scratch register) right after it (:func:`cleanup_after`), plus what the
    callee pops itself (0 for a callee followed and found to pop nothing); None
    when neither is known."""
    cleaned = cleanup_after(decoder, address, pops) or 0
    if callee_pops is None:
        return cleaned or None
    return cleaned + callee_pops


def cleanup_after(decoder, address, pops=True):
    """x86: bytes of arguments freed right after a call — ``add esp, N`` or (with
    ``pops``) a pop into a scratch register, within a few instructions that leave
    the stack alone (MSVC schedules a test or a move first); None when there is none."""
    for _ in range(CLEANUP_LOOKAHEAD):
        insn = decoder.at(address)
        if insn is None:
            return None
        mnemonic, op_str = insn[2], insn[3]
        if mnemonic == "add" and op_str.startswith("esp, "):
            return parse_int(op_str[5:])
        if pops and mnemonic == "pop" and op_str in SCRATCH:
            return PUSH_SIZE["x86"]
        if mnemonic in SP_MNEMONICS or mnemonic == "call" or mnemonic[0] == "j" or mnemonic.startswith("ret") \
                or "esp" in op_str:
            return None
        address += insn[1]
    return None


def _installs_seh_record(decoder, address):
    """True when the instructions from ``address`` store into ``fs:[0]`` before
    any call, jump or return: the pushes before that store build the exception
    registration record (and the cookie and saves around it) in the frame."""
    for _ in range(SEH_RECORD_LOOKAHEAD):
        insn = decoder.at(address)
        if insn is None:
            return False
        mnemonic, op_str = insn[2], insn[3]
        if mnemonic == "mov" and op_str.startswith("dword ptr fs:[0],"):
            return True
        if mnemonic == "call" or mnemonic[0] == "j" or mnemonic.startswith("ret"):
            return False
        address += insn[1]
    return False


def _feeds_frame_helper(decoder, address, callees):
    """True when a push just before ``address`` is followed, within one more push
    and a ``mov eax, handler``, by a call to a frame-building helper."""
    for _ in range(3):
        insn = decoder.at(address)
        if insn is None:
            return False
        if insn[2] == "call":
            return (callees.callee_kind(direct_target(insn[3]) or 0) or "").startswith("frame ")
        if insn[2] != "push" and not (insn[2] == "mov" and insn[3].startswith("eax, ")):
            return False
        address += insn[1]
    return False


def pushed_immediate_before(decoder, start, call_address, count):
    """The immediate of the ``count``-th push before ``call_address`` on the path from
    ``start`` (a frame helper's local size)."""
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
