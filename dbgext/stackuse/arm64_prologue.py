"""ARM64 frame sizes from prologues (capstone's A64 decoding), to set beside the
unwind data's (:attr:`dbgext.stacks.arm64_unwind.FunctionUnwind.frame_size`).

On ARM64 nothing but the function moves sp: no return address is pushed, so the
frame is what the prologue allocates —

* ``sub sp, sp, #N`` (also ``#N, lsl #12``);
* a pre-indexed store: ``stp x29, x30, [sp, #-N]!``, ``str x19, [sp, #-N]!``
  (any registers, x or d or q);
* the stack probe: ``mov x15, #N`` (``movz``/``movk`` pieces included), ``bl
  __chkstk``, then ``sub sp, sp, x15, lsl #4`` — Windows' ARM64 convention gives
  __chkstk the size in 16-byte units in x15, which it leaves unchanged.

The scan follows the entry path until the first ordinary call (the frame is
complete there), a return or an unconditional branch; a conditional branch taken
before the stack moved is followed too (shrink-wrapped early exits).  ``sub sp,
sp, xN`` by a register other than the probe's makes the frame dynamic (alloca).
A probe of a size computed at run time, then sp set from a register, is an
alloca.  ``mov x29, sp``, ``add x29, sp, #N``, ``pacibsp`` and stores without
writeback (homed parameters, saves into the allocated area) leave sp alone.
"""

from ..disasm import Disassembler, parse_int
from .prologue import PrologueResult

MAX_PROLOGUE_INSTRUCTIONS = 64
MAX_PROLOGUE_PATHS = 4
INSTRUCTION_SIZE = 4
PROBE_REGISTER = "x15"
PROBE_REGISTERS = ("x15", "w15")
DYNAMIC_PROBE = "dynamic"   # x15 computed at run time: the probe precedes an alloca
PROBE_UNIT = 16
PROLOGUE_WINDOW = MAX_PROLOGUE_INSTRUCTIONS * INSTRUCTION_SIZE * MAX_PROLOGUE_PATHS   # the code a scan reads
CONDITIONAL_BRANCHES = ("cbz", "cbnz", "tbz", "tbnz")
STOPS = ("ret", "retaa", "retab", "br", "braa", "brab", "brk", "udf", "hlt", "eret")


def scan_prologue(code, address, disassembler=None):
    """The :class:`~dbgext.stackuse.prologue.PrologueResult` of the function
    whose code (bytes, at least its prologue) starts at ``address``."""
    disassembler = disassembler or Disassembler.for_arch("arm64")
    instructions = dict((insn[0], insn) for insn in disassembler.decode(
        code[:PROLOGUE_WINDOW], address))
    result = PrologueResult()
    pending = [address]
    seen = set()
    best = None
    while pending and len(seen) < MAX_PROLOGUE_PATHS:
        start = pending.pop(0)
        if start in seen:
            continue
        seen.add(start)
        depth, dynamic, problem, branches = _scan_path(instructions, start)
        if dynamic:
            result.dynamic = dynamic
        if depth is not None and (best is None or depth > best):
            best = depth
        if problem and best is None:
            result.problem = problem
        if not depth:
            pending.extend(branches)
    if best is not None:
        result.frame_size = best
        result.problem = None
    return result


def _scan_path(instructions, start):
    """(deepest sp below entry, dynamic instruction text or None, problem or None,
    conditional branch targets taken before the stack moved)."""
    depth = deepest = 0
    probe = None            # x15's value while it is known
    branches = []
    address = start
    for _ in range(MAX_PROLOGUE_INSTRUCTIONS):
        insn = instructions.get(address)
        if insn is None:
            return (deepest if deepest else None), None, "undecodable or unreadable code at 0x%x" % address, branches
        _, _, mnemonic, operands = insn
        parts = [part.strip() for part in operands.split(",")]
        if mnemonic in STOPS:
            break
        if mnemonic == "b":
            break
        if mnemonic.startswith("b.") or mnemonic in CONDITIONAL_BRANCHES:
            if depth == 0:
                branches.append(parse_int(parts[-1].lstrip("#")))
        elif mnemonic in ("bl", "blr"):
            if probe is None:
                break           # the first ordinary call: the frame is complete
            # A call after x15 was set is the stack probe; what follows allocates.
        elif parts and parts[0] in PROBE_REGISTERS:
            if mnemonic in ("mov", "movz"):
                probe = _immediate(parts[1:])
            elif mnemonic == "movk" and probe is not None:
                piece = _immediate(parts[1:])
                probe = None if piece is None else probe | piece
            else:
                probe = None
            probe = DYNAMIC_PROBE if probe is None else probe
        elif parts and parts[0] == "sp" and mnemonic in ("sub", "add"):
            if _is_probe_allocation(insn):
                if probe is DYNAMIC_PROBE or probe is None:
                    return deepest, "%s %s" % (mnemonic, operands), None, branches
                depth += probe * PROBE_UNIT
                probe = None
            else:
                amount = _immediate(parts[2:]) if len(parts) > 2 and parts[1] == "sp" else None
                if amount is None:
                    return deepest, "%s %s" % (mnemonic, operands), None, branches
                depth += amount if mnemonic == "sub" else -amount
        elif operands.endswith("]!") and "[sp, #-" in operands:
            depth += parse_int(operands[operands.index("[sp, #-") + 7:-2])
        elif operands.endswith("]!") and "[sp, #" in operands:
            depth -= parse_int(operands[operands.index("[sp, #") + 6:-2])
        elif "[sp], #" in operands:
            depth -= parse_int(operands[operands.index("[sp], #") + 7:])
        elif parts and parts[0] == "sp":
            return deepest, "%s %s" % (mnemonic, operands), None, branches   # sp from a register
        deepest = max(deepest, depth)
        address += INSTRUCTION_SIZE
    return deepest, None, None, branches


def _is_probe_allocation(insn):
    return insn[2] == "sub" and insn[3].replace(" ", "") == "sp,sp,%s,lsl#4" % PROBE_REGISTER


def _immediate(parts):
    """``["#0x10"]`` or ``["#0x1", "lsl #12"]`` -> the value, or None."""
    if not parts or not parts[0].startswith("#"):
        return None
    value = parse_int(parts[0][1:])
    if value is None:
        return None
    if len(parts) == 2 and parts[1].startswith("lsl #"):
        shift = parse_int(parts[1][5:])
        return None if shift is None else value << shift
    return value if len(parts) == 1 else None
