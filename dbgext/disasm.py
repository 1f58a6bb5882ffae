"""The one capstone wrapper: x86 code (16-, 32- and 64-bit) and ARM64 code
decoded into ``(address, size, mnemonic, op_str)`` tuples.

Decoding uses capstone's ``disasm_lite`` (no detail objects): several times faster
than detail mode, which matters for images with tens of thousands of functions and
for instruction-flow reconstruction.  :class:`DecodedRun` goes further for whole
bodies: the decode stays in capstone's buffer and only the instructions asked for
(by capstone id) become tuples.  Callers classify instructions from the text
with the helpers below (Intel syntax, capstone's spelling: ``0x1234`` immediates,
``qword ptr [rsp + 8]`` memory operands).
"""

import ctypes

import capstone

from .errors import BadInput

# capstone's own cs_disasm and cs_insn, for DecodedRun: the binding's
# disasm_lite reads every field of every instruction through ctypes, which costs
# more than the decoding itself.
_cs = capstone._cs
_INSN = capstone._cs_insn
_INSN_WORDS = ctypes.sizeof(_INSN) // 4
_ID_WORD = _INSN.id.offset // 4

BITS = {"x64": 64, "x86": 32, "arm64": "arm64"}
_MODES = {16: (capstone.CS_ARCH_X86, capstone.CS_MODE_16), 32: (capstone.CS_ARCH_X86, capstone.CS_MODE_32),
          64: (capstone.CS_ARCH_X86, capstone.CS_MODE_64),
          "arm64": (capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)}   # A64, little-endian
# Prefixes capstone folds into the mnemonic ("bnd jmp", "notrack call", "rep stosd").
_PREFIXES = ("bnd ", "notrack ", "rep ", "repz ", "repe ", "repne ", "repnz ", "lock ")


class Disassembler(object):
    """A decoder for one mode: ``Disassembler(64)`` (x86 16/32/64-bit or
    ``"arm64"``), or ``Disassembler.for_arch("x86")``."""

    __slots__ = ("bits", "_cs")

    def __init__(self, bits):
        if bits not in _MODES:
            raise ValueError("code is x86 16-, 32- or 64-bit or \"arm64\", not %r" % (bits,))
        self.bits = bits
        self._cs = capstone.Cs(*_MODES[bits])

    @classmethod
    def for_arch(cls, arch):
        """``"x64"``, ``"x86"`` or ``"arm64"`` (a PEImage's ``arch``); BadInput for another machine."""
        if arch not in BITS:
            raise BadInput("%s code cannot be disassembled (x86, x64 and arm64 only)" % arch)
        return cls(BITS[arch])

    def decode(self, code, address, count=0):
        """Iterator of ``(address, size, mnemonic, op_str)`` decoding ``code`` (bytes at
        ``address``) linearly; it stops at the first undecodable byte or after
        ``count`` instructions (0: no limit)."""
        return self._cs.disasm_lite(code, address, count)

    def run(self, code, address):
        """A :class:`DecodedRun` of ``code`` (bytes at ``address``) decoded linearly
        up to the first undecodable byte: instructions are read into Python only
        when asked for (use it in a ``with`` block: it holds capstone's buffer)."""
        return DecodedRun(self._cs.csh, code, address)

    def one(self, code, address):
        """The first instruction of ``code`` as a tuple, or None when undecodable."""
        for insn in self._cs.disasm_lite(code, address, 1):
            return insn
        return None


class DecodedRun(object):
    """One linear decode held in capstone's buffer: ``count`` instructions,
    ``reached`` (the address after the last one), ``run[index]`` as a
    ``(address, size, mnemonic, op_str)`` tuple and :meth:`indices_of` to find
    instructions by capstone id (``capstone.x86_const.X86_INS_*``) without reading
    the others."""

    def __init__(self, handle, code, address):
        if not isinstance(code, bytes):
            code = bytes(code)
        self._instructions = ctypes.POINTER(_INSN)()
        self.count = _cs.cs_disasm(handle, code, len(code), address, 0, ctypes.byref(self._instructions)) \
            if code else 0
        self.reached = address
        if self.count:
            last = self._instructions[self.count - 1]
            self.reached = last.address + last.size

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        if self.count:
            _cs.cs_free(self._instructions, self.count)
            self.count = 0

    def __getitem__(self, index):
        insn = self._instructions[index]
        return (insn.address, insn.size, insn.mnemonic.decode("ascii"), insn.op_str.decode("ascii"))

    def indices_of(self, ids):
        """Indexes (in order) of the instructions whose capstone id is in ``ids``
        (a set of :func:`instruction_ids`)."""
        if not self.count:
            return []
        words = memoryview(ctypes.string_at(self._instructions, self.count * _INSN_WORDS * 4)).cast("I")
        return [index for index, value in enumerate(words[_ID_WORD::_INSN_WORDS]) if value in ids]


def instruction_ids(mnemonics):
    """capstone's instruction ids of x86 ``mnemonics`` (for :meth:`DecodedRun.indices_of`)."""
    return frozenset(getattr(capstone.x86_const, "X86_INS_" + mnemonic.upper()) for mnemonic in mnemonics)


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
