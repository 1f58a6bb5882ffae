"""The one capstone wrapper: x86 code (16-, 32- and 64-bit) decoded into
``(address, size, mnemonic, op_str)`` tuples.

Decoding uses capstone's ``disasm_lite`` (no detail objects): several times faster
than detail mode, which matters for images with tens of thousands of functions and
for instruction-flow reconstruction.  Callers classify instructions from the text
with the helpers below (Intel syntax, capstone's spelling: ``0x1234`` immediates,
``qword ptr [rsp + 8]`` memory operands).
"""

import ctypes

import capstone

# capstone's own cs_disasm and cs_insn, for decoded_end (the binding's
# disasm_lite reads every instruction into Python).
_cs = capstone._cs
_INSN = capstone._cs_insn

BITS = {"x64": 64, "x86": 32}
_MODES = {16: capstone.CS_MODE_16, 32: capstone.CS_MODE_32, 64: capstone.CS_MODE_64}
# Prefixes capstone folds into the mnemonic ("bnd jmp", "notrack call", "rep stosd").
_PREFIXES = ("bnd ", "notrack ", "rep ", "repz ", "repe ", "repne ", "repnz ", "lock ")


class Disassembler(object):
    """A decoder for one mode: ``Disassembler(64)``, or ``Disassembler.for_arch("x86")``."""

    __slots__ = ("bits", "_cs")

    def __init__(self, bits):
        if bits not in _MODES:
            raise ValueError("x86 code is 16-, 32- or 64-bit, not %r" % (bits,))
        self.bits = bits
        self._cs = capstone.Cs(capstone.CS_ARCH_X86, _MODES[bits])

    @classmethod
    def for_arch(cls, arch):
        """``"x64"`` or ``"x86"`` (a PEImage's ``arch``)."""
        return cls(BITS[arch])

    def decode(self, code, address, count=0):
        """Iterator of ``(address, size, mnemonic, op_str)`` decoding ``code`` (bytes at
        ``address``) linearly; it stops at the first undecodable byte or after
        ``count`` instructions (0: no limit)."""
        return self._cs.disasm_lite(code, address, count)

    def decoded_end(self, code, address):
        """The address after the last instruction of a linear decode of ``code`` (at
        ``address``): where decoding stops, at the end of ``code`` or at the first
        undecodable byte — :meth:`decode`'s reach without building its tuples."""
        if not code:
            return address
        if not isinstance(code, bytes):
            code = bytes(code)
        instructions = ctypes.POINTER(_INSN)()
        total = _cs.cs_disasm(self._cs.csh, code, len(code), address, 0, ctypes.byref(instructions))
        if not total:
            return address
        try:
            last = instructions[total - 1]
            return last.address + last.size
        finally:
            _cs.cs_free(instructions, total)

    def one(self, code, address):
        """The first instruction of ``code`` as a tuple, or None when undecodable."""
        for insn in self._cs.disasm_lite(code, address, 1):
            return insn
        return None


def base_mnemonic(mnemonic):
    """The mnemonic without prefixes: ``"bnd jmp"`` -> ``"jmp"``."""
    while mnemonic.startswith(_PREFIXES):
        mnemonic = mnemonic.split(" ", 1)[1]
    return mnemonic


def parse_int(text):
    """capstone's immediate spelling (``0x10``, ``-0x10``, ``16``) -> int, or None."""
    try:
        return int(text, 0)
    except ValueError:
        return None


def direct_target(op_str):
    """The absolute target of ``call 0x1234`` / ``jmp 0x1234``, or None (indirect)."""
    if op_str.startswith("0x") or op_str[:1].isdigit():
        return parse_int(op_str)
    return None


def split_operands(op_str):
    """``'qword ptr [rsp + 8], rbx'`` -> ``['qword ptr [rsp + 8]', 'rbx']`` (x86
    operands never contain a comma inside brackets)."""
    if "," not in op_str:
        return [op_str] if op_str else []
    return [part.strip() for part in op_str.split(",")]


def _memory_operand(operand):
    """What is between the brackets of a memory operand, or None for none."""
    start = operand.find("[")
    if start < 0:
        return None
    return operand[start + 1:operand.rfind("]")].strip()


def memory_displacement(operand, base):
    """The displacement of ``[base + d]`` / ``[base - d]`` / ``[base]``, or None when
    the operand is not exactly that form."""
    inner = _memory_operand(operand)
    if inner is None:
        return None
    if inner == base:
        return 0
    if inner.startswith(base + " + "):
        return parse_int(inner[len(base) + 3:])
    if inner.startswith(base + " - "):
        value = parse_int(inner[len(base) + 3:])
        return None if value is None else -value
    return None


def memory_slot(bits, op_str, next_address):
    """The address a ``call/jmp [mem]`` reads its target from when that is a fixed
    location (``[rip + d]`` in 64-bit code, ``[abs]`` in 32-bit code), else None."""
    inner = _memory_operand(op_str)
    if inner is None:
        return None
    if bits == 64:
        if inner.startswith("rip + "):
            value = parse_int(inner[6:])
            return None if value is None else next_address + value
        if inner.startswith("rip - "):
            value = parse_int(inner[6:])
            return None if value is None else next_address - value
        return None
    return parse_int(inner)
