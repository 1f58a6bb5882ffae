"""ARM64 unwind data (``.pdata`` and ``.xdata``) and one frame unwound the way
Windows' ARM64 ``RtlVirtualUnwind`` does it.

A ``.pdata`` entry is two u32: the function's begin RVA and a word whose low two
bits say what the rest is (``PDATA_*``):

* 0 — the RVA of an ``.xdata`` record: a header (function length, version, X =
  exception data present, E = one epilogue described by the prologue's codes,
  epilogue count, code words; an extension word when both counts are 0), the
  epilogue scopes (start offset in instructions, index of its first code), the
  unwind code bytes, then the handler RVA when X is set;
* 1 — packed unwind data for a function with one canonical prologue and
  epilogue: FunctionLength, RegF (d8..), RegI (x19..), H (x0-x7 homed), CR (how
  fp/lr are saved: 0 unchained, 1 lr saved with the integer registers, 2 chained
  with a PAC-signed lr, 3 chained) and FrameSize;
* 2 — the same for a fragment without prologue or epilogue;
* 3 — the RVA (+3) of another ``.pdata`` entry whose unwind data applies.

Packed entries are unwound by synthesising the unwind codes Windows would have
emitted for them (``RtlpExpandCompactToFull``), so both forms take one path.

The codes are listed in *unwind* order (the last prologue instruction first).
To unwind a frame, the codes are executed from the start — minus those of the
prologue instructions not yet executed when the pc is inside the prologue — or,
when the pc is inside an epilogue, from that epilogue's first code minus the
instructions it already executed.  Then pc = lr.  A function without a ``.pdata``
entry is a leaf: lr still holds its return address and sp never moved.

Registers are a dict with the names of :mod:`dbgext.layouts.arm64` (``x0``..
``x28``, ``fp``, ``lr``, ``sp``, ``pc``; restored d8-d15 as ``d8``..).  Images
answer ``unpack(fmt, rva)``, ``describe(rva)`` and ``size_of_image``, like the
x64 unwind data's.  Corrupt data raises :class:`~dbgext.stacks.x64.UnwindError`.
"""

import bisect

from ..layouts.arm64 import (CONTEXT_ARM64, GENERAL_REGISTERS, KTRAP_FRAME_ARM64, KTRAP_FRAME_ARM64_VOLATILE_X,
                             MACHINE_FRAME_ARM64)
from .x64 import UnwindError, UnwindStep

PDATA_ENTRY_SIZE = 8
PDATA_XDATA = 0
PDATA_PACKED = 1
PDATA_PACKED_FRAGMENT = 2
PDATA_CHAINED = 3

CR_UNCHAINED = 0
CR_UNCHAINED_SAVED_LR = 1
CR_CHAINED_PAC = 2
CR_CHAINED = 3

INSTRUCTION_SIZE = 4
VIRTUAL_ADDRESS_BITS = 48   # Windows' ARM64 VA size: the bits above hold a PAC

# 0xE0-0xFF: each code's size in bytes, and how many instructions it stands for
# (the custom-stack codes 0xE8-0xEC and the reserved ones stand for none).
_LONG_CODE_SIZE = (4, 1, 2, 1, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1,
                   1, 1, 1, 1, 1, 1, 1, 1, 2, 3, 4, 5, 1, 1, 1, 1)
_LONG_CODE_INSTRUCTIONS = (1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0,
                           0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
_SINGLE_BYTE_NAMES = {0xE1: "set_fp", 0xE3: "nop", 0xE4: "end", 0xE5: "end_c", 0xE6: "save_next",
                      0xE8: "trap_frame", 0xE9: "machine_frame", 0xEA: "context", 0xEB: "ec_context",
                      0xEC: "clear_unwound_to_call", 0xFC: "pac_sign_lr"}
CUSTOM_STACK_CODES = ("trap_frame", "machine_frame", "context", "ec_context", "clear_unwound_to_call")


class UnwindCode(object):
    """One decoded unwind code: ``name`` (the Microsoft documentation's), its
    ``raw`` bytes, and what it saves where: ``register`` (first register number,
    x19.. or d8.. by ``bank``: "x" general, "d" double, "q" vector), ``count``
    registers, at sp + ``offset``; ``writeback`` when the instruction also moved sp
    (pre-decrement by ``offset``).  ``stack_bytes``: how far it moved sp."""

    __slots__ = ("index", "raw", "name", "bank", "register", "count", "offset", "writeback", "stack_bytes")

    def __init__(self, index, raw, name, bank=None, register=None, count=0, offset=0, writeback=False,
                 stack_bytes=0):
        self.index = index
        self.raw = raw
        self.name = name
        self.bank = bank
        self.register = register
        self.count = count
        self.offset = offset
        self.writeback = writeback
        self.stack_bytes = stack_bytes

    @property
    def instructions(self):
        """How many prologue/epilogue instructions the code stands for (end and
        end_c close the scope: none)."""
        if self.is_end:
            return 0
        first = self.raw[0]
        return 1 if first < 0xE0 else _LONG_CODE_INSTRUCTIONS[first - 0xE0]

    @property
    def is_end(self):
        return self.name in ("end", "end_c")

    def text(self, epilogue=False):
        """The instruction, spelled as ``llvm-readobj --unwind`` spells it."""
        name = self.name
        if name == "alloc":
            return "%s sp, #%d" % ("add" if epilogue else "sub", self.stack_bytes)
        if self.bank is not None:
            if name == "save_lrpair":
                registers = "x%d, lr" % self.register
            elif self.count == 2:
                registers = "%s%d, %s%d" % (self.bank, self.register, self.bank, self.register + 1)
            else:
                registers = "%s%d" % (self.bank, self.register)
            mnemonic = ("ld" if epilogue else "st") + ("p" if self.count == 2 else "r")
            if not self.writeback:
                return "%s %s, [sp, #%d]" % (mnemonic, registers, self.offset)
            if epilogue:
                return "%s %s, [sp], #%d" % (mnemonic, registers, self.offset)
            return "%s %s, [sp, #-%d]!" % (mnemonic, registers, self.offset)
        if name == "set_fp":
            return "mov sp, fp" if epilogue else "mov fp, sp"
        if name == "add_fp":
            return ("sub sp, fp, #%d" if epilogue else "add fp, sp, #%d") % self.offset
        if name == "save_next":
            return "restore next" if epilogue else "save next"
        if name == "pac_sign_lr":
            return "autibsp" if epilogue else "pacibsp"
        return name.replace("_", " ") if name in CUSTOM_STACK_CODES else name

    def __repr__(self):
        return "UnwindCode(%s %s)" % (self.raw.hex(), self.text())


def decode_code(data, index):
    """The :class:`UnwindCode` at ``data[index:]``; raises ValueError when it runs
    past the data or is not a valid code."""
    first = data[index]
    size = 1 if first < 0xC0 else 2 if first < 0xE0 else _LONG_CODE_SIZE[first - 0xE0]
    raw = bytes(data[index:index + size])
    if len(raw) < size:
        raise ValueError("unwind code 0x%02x at byte %d runs past the code bytes" % (first, index))
    nxt = raw[1] if size > 1 else 0
    if first < 0x20:
        return UnwindCode(index, raw, "alloc", stack_bytes=16 * first)
    if first < 0x40:
        offset = 8 * (first & 0x1F)
        return UnwindCode(index, raw, "save_r19r20_x", "x", 19, 2, offset, True, offset)
    if first < 0x80:
        return UnwindCode(index, raw, "save_fplr", "x", 29, 2, 8 * (first & 0x3F))
    if first < 0xC0:
        offset = 8 * ((first & 0x3F) + 1)
        return UnwindCode(index, raw, "save_fplr_x", "x", 29, 2, offset, True, offset)
    if first < 0xC8:
        return UnwindCode(index, raw, "alloc", stack_bytes=16 * (((first & 7) << 8) | nxt))
    if first < 0xD0:
        writeback = first >= 0xCC
        offset = 8 * ((nxt & 0x3F) + (1 if writeback else 0))
        return UnwindCode(index, raw, "save_regp_x" if writeback else "save_regp", "x",
                          19 + ((first & 3) << 2) + (nxt >> 6), 2, offset, writeback, offset if writeback else 0)
    if first < 0xD4:
        return UnwindCode(index, raw, "save_reg", "x", 19 + ((first & 3) << 2) + (nxt >> 6), 1, 8 * (nxt & 0x3F))
    if first < 0xD6:
        offset = 8 * ((nxt & 0x1F) + 1)
        return UnwindCode(index, raw, "save_reg_x", "x", 19 + ((first & 1) << 3) + (nxt >> 5), 1, offset, True,
                          offset)
    if first < 0xD8:
        return UnwindCode(index, raw, "save_lrpair", "x", 19 + 2 * (((first & 1) << 2) + (nxt >> 6)), 2,
                          8 * (nxt & 0x3F))
    if first < 0xDC:
        writeback = first >= 0xDA
        offset = 8 * ((nxt & 0x3F) + (1 if writeback else 0))
        return UnwindCode(index, raw, "save_fregp_x" if writeback else "save_fregp", "d",
                          8 + ((first & 1) << 2) + (nxt >> 6), 2, offset, writeback, offset if writeback else 0)
    if first < 0xDE:
        return UnwindCode(index, raw, "save_freg", "d", 8 + ((first & 1) << 2) + (nxt >> 6), 1, 8 * (nxt & 0x3F))
    if first == 0xDE:
        offset = 8 * ((nxt & 0x1F) + 1)
        return UnwindCode(index, raw, "save_freg_x", "d", 8 + (nxt >> 5), 1, offset, True, offset)
    if first == 0xE0:
        return UnwindCode(index, raw, "alloc", stack_bytes=16 * int.from_bytes(raw[1:4], "big"))
    if first == 0xE2:
        return UnwindCode(index, raw, "add_fp", offset=8 * nxt)
    if first == 0xE7:
        return _decode_save_any_reg(index, raw)
    if first in _SINGLE_BYTE_NAMES:
        return UnwindCode(index, raw, _SINGLE_BYTE_NAMES[first])
    if first >= 0xF8:
        return UnwindCode(index, raw, "reserved_nop")   # reserved for future use: a nop (as Windows treats it)
    raise ValueError("invalid unwind code 0x%02x at byte %d" % (first, index))


def _decode_save_any_reg(index, raw):
    """save_any_reg (11100111 0pxrrrrr ffoooooo): p pair, x writeback, r register,
    f bank (x, d, q), o offset in 16 bytes (writeback, pair or q) or 8 bytes."""
    second, third = raw[1], raw[2]
    if second & 0x80 or (third >> 6) == 3:
        raise ValueError("invalid save_any_reg code %s at byte %d" % (raw.hex(), index))
    pair, writeback, register = (second >> 6) & 1, (second >> 5) & 1, second & 0x1F
    bank = "xdq"[third >> 6]
    scale = 16 if writeback or pair or bank == "q" else 8
    offset = ((third & 0x3F) + writeback) * scale
    return UnwindCode(index, raw, "save_any_reg", bank, register, 1 + pair, offset, bool(writeback),
                      offset if writeback else 0)


def decode_codes(data, start=0):
    """The codes from byte ``start`` up to and including the first end (or the
    end of ``data``): an end_c, which continues into the parent scope, does not
    stop them.  Raises ValueError on a bad code."""
    codes = []
    index = start
    while index < len(data):
        code = decode_code(data, index)
        codes.append(code)
        if code.name == "end":
            break
        index += len(code.raw)
    return codes


# -- .pdata / .xdata ---------------------------------------------------------------------------

class FunctionUnwind(object):
    """What a ``.pdata`` entry says about one function: ``kind`` ("xdata",
    "packed", "fragment"), the function length in bytes, the unwind code bytes
    (synthesised for packed entries), the epilogue scopes as (start offset in
    instructions, index of the first code) — or, with the E bit, the one
    epilogue's code index in ``epilogue_index`` — and the handler RVA when the
    record has exception data.  ``packed``: the packed fields (packed kinds)."""

    __slots__ = ("begin", "word", "kind", "function_length", "version", "exception_data", "epilogue_in_header",
                 "epilogue_index", "epilogue_scopes", "code_bytes", "handler_rva", "packed")

    def __init__(self, begin, word, kind):
        self.begin = begin
        self.word = word
        self.kind = kind
        self.function_length = 0
        self.version = 0
        self.exception_data = False
        self.epilogue_in_header = False
        self.epilogue_index = None
        self.epilogue_scopes = []
        self.code_bytes = b""
        self.handler_rva = None
        self.packed = None

    @property
    def code_words(self):
        return (len(self.code_bytes) + 3) // 4

    def codes(self, start=0):
        """The codes from byte ``start``: 0 for the prologue's, an epilogue's index for its."""
        return decode_codes(self.code_bytes, start)

    @property
    def prologue_size(self):
        """The prologue's length in instructions (what its codes stand for)."""
        return _scope_size(self.code_bytes, 0, False)

    @property
    def frame_size(self):
        """Bytes the prologue moves sp by: the sum of its stack-moving codes."""
        return sum(code.stack_bytes for code in self.codes(0))


class PackedFields(object):
    """The fields of a packed ``.pdata`` word (sizes in bytes)."""

    __slots__ = ("flag", "function_length", "reg_f", "reg_i", "h", "cr", "frame_size")

    def __init__(self, word):
        self.flag = word & 3
        self.function_length = ((word >> 2) & 0x7FF) * INSTRUCTION_SIZE
        self.reg_f = (word >> 13) & 7
        self.reg_i = (word >> 16) & 0xF
        self.h = (word >> 20) & 1
        self.cr = (word >> 21) & 3
        self.frame_size = ((word >> 23) & 0x1FF) * 16


def parse_pdata(data):
    """``.pdata`` bytes as [(begin rva, unwind word)] (8-byte ARM64 entries)."""
    usable = len(data) - len(data) % PDATA_ENTRY_SIZE
    return [(int.from_bytes(data[at:at + 4], "little"), int.from_bytes(data[at + 4:at + 8], "little"))
            for at in range(0, usable, PDATA_ENTRY_SIZE)]


def function_table(image, pdata):
    """The ``.pdata`` entries as (begin, end, word) sorted by begin — the shape of
    the x64 unwinder's RUNTIME_FUNCTIONs — with the end from the packed length or
    the ``.xdata`` header (a chained entry takes its parent's length), and
    [(begin, why)] for the entries whose extent cannot be read."""
    table, dropped = [], []
    for begin, word in sorted(pdata):
        try:
            length = function_unwind(image, (begin, word), header_only=True).function_length
        except UnwindError as error:
            dropped.append((begin, str(error)))
            continue
        table.append((begin, begin + length, word))
    return table, dropped


def runtime_functions(image, data):
    """The ``.pdata`` bytes ``data`` of ``image`` (a PEImage or a module in target
    memory) as :func:`function_table`'s (begin, end, word) entries; the entries
    left out are reported in ``image.problems``."""
    table, dropped = function_table(image, parse_pdata(data))
    for begin, why in dropped:
        image.problems.add("pdata_entry_unreadable", image.image_base + begin, "%s: .pdata entry dropped: %s"
                           % (image.name, why))
    return table


def find_entry(table, begins, rva):
    """The entry of ``table`` (from :func:`function_table`; ``begins`` its begin
    RVAs) covering ``rva``, or None: the function is a leaf."""
    at = bisect.bisect_right(begins, rva) - 1
    if at >= 0 and table[at][0] <= rva < table[at][1]:
        return table[at]
    return None


def function_unwind(image, entry, header_only=False):
    """The :class:`FunctionUnwind` of the ``.pdata`` ``entry`` ((begin, word) or
    (begin, end, word)) of ``image``; a chained entry (kind 3) gives its
    parent's.  ``header_only``: the length and flags, not the codes.  Raises
    UnwindError."""
    begin, word = entry[0], entry[-1]
    if word & 3 == PDATA_CHAINED:
        parent_at = word - 3
        parent = image.unpack("<II", parent_at)
        if parent is None:
            raise UnwindError("unwind_info_corrupt", parent_at, "the chained .pdata entry of %s at %s is "
                              "unreadable" % (image.describe(begin), image.describe(parent_at)))
        if parent[1] & 3 == PDATA_CHAINED:
            raise UnwindError("unwind_chain_too_long", parent_at, "the .pdata entry of %s chains to another "
                              "chained entry" % image.describe(begin))
        return function_unwind(image, parent, header_only)
    if word & 3 == PDATA_XDATA:
        return _parse_xdata(image, begin, word, header_only)
    return expand_packed(begin, word)


def _parse_xdata(image, begin, rva, header_only=False):
    unwind = FunctionUnwind(begin, rva, "xdata")
    if not 0 < rva < image.size_of_image:
        raise UnwindError("unwind_info_outside_image", rva, "the .xdata of %s at rva 0x%x lies outside the "
                          "image" % (image.describe(begin), rva))
    header = image.unpack("<I", rva)
    if header is None:
        raise UnwindError("unwind_info_corrupt", rva, "the .xdata at %s is unreadable" % image.describe(rva))
    header = header[0]
    unwind.function_length = (header & 0x3FFFF) * INSTRUCTION_SIZE
    unwind.version = (header >> 18) & 3
    unwind.exception_data = bool(header & (1 << 20))
    unwind.epilogue_in_header = bool(header & (1 << 21))
    if header_only:
        return unwind
    epilogue_count = (header >> 22) & 0x1F
    code_words = header >> 27
    at = rva + 4
    if epilogue_count == 0 and code_words == 0:
        extension = image.unpack("<I", at)
        if extension is None:
            raise UnwindError("unwind_info_corrupt", at, "the .xdata extension word at %s is unreadable"
                              % image.describe(at))
        epilogue_count, code_words = extension[0] & 0xFFFF, (extension[0] >> 16) & 0xFF
        at += 4
    if unwind.version != 0:
        raise UnwindError("unwind_info_corrupt", rva, "the .xdata of %s has unknown version %d"
                          % (image.describe(begin), unwind.version))
    if unwind.epilogue_in_header:
        unwind.epilogue_index = epilogue_count
    elif epilogue_count:
        scopes = image.unpack("<%dI" % epilogue_count, at)
        if scopes is None:
            raise UnwindError("unwind_info_corrupt", at, "the epilogue scopes at %s are unreadable"
                              % image.describe(at))
        unwind.epilogue_scopes = [(scope & 0x3FFFF, scope >> 22) for scope in scopes]
        at += 4 * epilogue_count
    codes = image.unpack("<%ds" % (4 * code_words), at)
    if codes is None:
        raise UnwindError("unwind_info_corrupt", at, "the unwind codes at %s are unreadable" % image.describe(at))
    unwind.code_bytes = codes[0]
    at += 4 * code_words
    if unwind.exception_data:
        handler = image.unpack("<I", at)
        unwind.handler_rva = handler[0] if handler else None
    return unwind


def expand_packed(begin, word):
    """The :class:`FunctionUnwind` of a packed entry, with the codes Windows
    synthesises for it (``RtlpExpandCompactToFull``): the saves of RegI integer
    registers (lr with them when CR is 1), RegF+1 d registers, the homed x0-x7 as
    four nops, then the locals with the fp/lr frame record when chained."""
    fields = PackedFields(word)
    unwind = FunctionUnwind(begin, word, "fragment" if fields.flag == PDATA_PACKED_FRAGMENT else "packed")
    unwind.packed = fields
    unwind.function_length = fields.function_length
    int_slots = fields.reg_i + (1 if fields.cr == CR_UNCHAINED_SAVED_LR else 0)
    fp_slots = fields.reg_f + 1 if fields.reg_f else 0
    save_slots = int_slots + fp_slots
    if save_slots:
        save_slots += 8 * fields.h            # homes go in the save area when there is one
    save_slots += save_slots & 1
    local_slots = fields.frame_size // 8 - save_slots
    saves = _SaveArea(8 * save_slots)
    saves.ops.append(bytes([0xE4]))
    if fields.cr == CR_CHAINED_PAC:
        saves.ops.append(bytes([0xFC]))
    if int_slots:
        if fields.reg_i == 1 and fields.cr == CR_UNCHAINED_SAVED_LR:
            saves.ops.append(_alloc(saves.size))    # x19 + lr has no _x form: sp moves first
            saves.predecremented = True
        for register in range(0, fields.reg_i // 2 * 2, 2):
            saves.save(register, True, _INTEGER_SAVES)
        last = fields.reg_i // 2 * 2
        if fields.reg_i % 2 and fields.cr == CR_UNCHAINED_SAVED_LR:
            saves.ops.append(_save_lrpair(last, 8 * saves.slot))
            saves.slot += 2
        elif fields.reg_i % 2:
            saves.save(last, False, _INTEGER_SAVES)
        elif fields.cr == CR_UNCHAINED_SAVED_LR:
            saves.save(11, False, _INTEGER_SAVES)     # lr is x19 + 11
    if fp_slots:
        for register in range(0, fp_slots // 2 * 2, 2):
            saves.save(register, True, _FLOAT_SAVES)
        if fp_slots % 2:
            saves.save(fp_slots // 2 * 2, False, _FLOAT_SAVES)
    ops = saves.ops     # execution (prologue) order
    nops_after = None
    if fields.h and saves.predecremented:
        nops_after = len(ops)
        ops.extend([bytes([0xE3])] * 4)
    frame_record = False
    if local_slots > 0:
        if fields.cr in (CR_CHAINED, CR_CHAINED_PAC):
            if local_slots <= 512 // 8:
                ops.append(bytes([0x80 | (local_slots - 1)]))              # save_fplr_x
            else:
                ops.append(_alloc(8 * local_slots))
                ops.append(bytes([0x40]))                                  # save_fplr at [sp]
            ops.append(bytes([0xE1]))                                      # set_fp
            frame_record = True
        else:
            ops.append(_alloc(8 * local_slots))
    if fields.flag == PDATA_PACKED_FRAGMENT:
        ops.append(bytes([0xE5]))
    prologue = b"".join(reversed(ops))
    if fields.flag == PDATA_PACKED_FRAGMENT:
        unwind.code_bytes = prologue
        return unwind
    unwind.epilogue_in_header = True
    unwind.epilogue_index = 1 if frame_record else 0   # the epilogue does not undo "mov fp, sp"
    if nops_after is not None:
        # The epilogue does not reload the homed parameters: its codes are the
        # prologue's without the four nops, stored after them.
        epilogue = b"".join(reversed(ops[:nops_after] + ops[nops_after + 4:]))
        unwind.epilogue_index += len(prologue)
        prologue += epilogue
    unwind.code_bytes = prologue
    return unwind


class _SaveArea(object):
    """A packed prologue's codes in execution order, and its register saves: the
    first save pre-decrements sp by the whole save area (``size`` bytes), the
    others store at the next free slot."""

    def __init__(self, size):
        self.size = size
        self.slot = 0
        self.predecremented = False
        self.ops = []

    def save(self, register, pair, encoders):
        single, paired, single_x, paired_x = encoders
        if self.predecremented:
            self.ops.append((paired if pair else single)(register, 8 * self.slot))
        else:
            self.ops.append((paired_x if pair else single_x)(register, self.size))
            self.predecremented = True
        self.slot += 2 if pair else 1


def _alloc(size):
    units = size // 16
    if units < 0x20:
        return bytes([units])
    if units < 0x800:
        return bytes([0xC0 | (units >> 8), units & 0xFF])
    return bytes([0xE0]) + units.to_bytes(3, "big")


def _save_regp(register, offset):
    return bytes([0xC8 | (register >> 2), ((register & 3) << 6) | (offset // 8)])


def _save_regp_x(register, size):
    return bytes([0xCC | (register >> 2), ((register & 3) << 6) | (size // 8 - 1)])


def _save_reg(register, offset):
    return bytes([0xD0 | (register >> 2), ((register & 3) << 6) | (offset // 8)])


def _save_reg_x(register, size):
    return bytes([0xD4 | (register >> 3), ((register & 7) << 5) | (size // 8 - 1)])


def _save_lrpair(register, offset):
    return bytes([0xD6 | (register // 2 >> 2), ((register // 2 & 3) << 6) | (offset // 8)])


def _save_fregp(register, offset):
    return bytes([0xD8 | (register >> 2), ((register & 3) << 6) | (offset // 8)])


def _save_fregp_x(register, size):
    return bytes([0xDA | (register >> 2), ((register & 3) << 6) | (size // 8 - 1)])


def _save_freg(register, offset):
    return bytes([0xDC | (register >> 2), ((register & 3) << 6) | (offset // 8)])


def _save_freg_x(register, size):
    return bytes([0xDE, (register << 5) | (size // 8 - 1)])


_INTEGER_SAVES = (_save_reg, _save_regp, _save_reg_x, _save_regp_x)
_FLOAT_SAVES = (_save_freg, _save_fregp, _save_freg_x, _save_fregp_x)


def _scope_size(code_bytes, start, epilogue):
    """A prologue's or epilogue's length in instructions, from its codes (an
    epilogue has one more: its ret)."""
    size = 0
    index = start
    while index < len(code_bytes):
        first = code_bytes[index]
        if first & 0xFE == 0xE4:
            break
        if first < 0xE0:
            size += 1
            index += 1 if first < 0xC0 else 2
        else:
            size += _LONG_CODE_INSTRUCTIONS[first - 0xE0]
            index += _LONG_CODE_SIZE[first - 0xE0]
    return size + (1 if epilogue else 0)


# -- the virtual unwind ------------------------------------------------------------------------

def unwind_leaf(registers):
    """A function without unwind data: lr holds the return address, sp is unchanged."""
    if registers["pc"] == registers.get("lr"):
        raise UnwindError("unwind_no_progress", registers["pc"], "a leaf function whose lr equals its pc: the "
                          "stack cannot be unwound from here")
    caller = dict(registers)
    caller["pc"] = registers["lr"]
    return UnwindStep(caller, None)


def unwind_function(image, module_base, entry, registers, read_pointer, unwound_to_call=False,
                    unwind_cache=None):
    """Unwind one frame with the ``.pdata`` ``entry`` (begin, end, word) of
    ``image`` (the module loaded at ``module_base``).  ``registers["pc"]`` is where
    control is in the function; ``unwound_to_call`` says it is a return address
    (every frame but the first, unless a trap or machine frame was crossed), and
    then the call instruction before it is taken as the position, as Windows'
    walkers do.  ``read_pointer(address)`` reads the stack (raises
    UnreadableMemory).  ``unwind_cache``: optional dict entry -> FunctionUnwind."""
    unwind = unwind_cache.get(entry) if unwind_cache is not None else None
    if unwind is None:
        unwind = function_unwind(image, entry)
        if unwind_cache is not None:
            unwind_cache[entry] = unwind
    try:
        if entry[-1] & 3 == PDATA_CHAINED:
            # The entry's code runs in its parent's frame, past the parent's prologue.
            start, skip, epilogue = 0, 0, False
        else:
            control = registers["pc"] - (INSTRUCTION_SIZE if unwound_to_call else 0)
            start, skip, epilogue = _where(unwind, (control - module_base - entry[0]) // INSTRUCTION_SIZE)
        return _execute(unwind, start, skip, registers, read_pointer, epilogue)
    except ValueError as error:
        raise UnwindError("unwind_info_corrupt", module_base + entry[0], "%s: %s" % (image.describe(entry[0]),
                                                                                      error))


def _where(unwind, offset):
    """(first code byte, codes to skip, in an epilogue) for the pc at
    ``offset`` instructions into the function: RtlVirtualUnwind's choice."""
    code_bytes = unwind.code_bytes
    words = unwind.code_words
    if offset < 4 * words:
        size = _scope_size(code_bytes, 0, False)
        if offset < size:
            return 0, size - offset, False
    length = unwind.function_length // INSTRUCTION_SIZE
    if unwind.epilogue_in_header:
        index = unwind.epilogue_index
        if offset + (4 * words - index) >= length:
            start = length - _scope_size(code_bytes, index, True)
            if offset >= start:
                return index, offset - start, True
        return 0, 0, False
    for start, index in unwind.epilogue_scopes:
        if offset < start:
            break
        if offset < start + (4 * words - index) and offset < start + _scope_size(code_bytes, index, True):
            return index, offset - start, True
    return 0, 0, False


def _execute(unwind, start, skip, registers, read_pointer, epilogue):
    code_bytes = unwind.code_bytes
    index = start
    while index < len(code_bytes) and skip > 0:
        code = decode_code(code_bytes, index)
        if code.is_end:
            break
        index += len(code.raw)
        skip -= 1
    caller = dict(registers)
    return_slot = None
    special_frame = None
    pc_from_lr = True       # False once a custom-stack code gave pc: then it is not a return address
    save_nexts = 0
    while index < len(code_bytes):
        code = decode_code(code_bytes, index)
        index += len(code.raw)
        name = code.name
        if save_nexts and name not in ("save_next", "save_r19r20_x", "save_regp", "save_regp_x", "save_fregp",
                                       "save_fregp_x") and not (name == "save_any_reg" and code.count == 2):
            raise ValueError("save_next before %s, which saves no pair" % name)
        if name == "end":
            break
        if name == "alloc":
            caller["sp"] += code.stack_bytes
        elif name == "save_next":
            save_nexts += 1
        elif code.bank is not None:
            count = code.count + 2 * save_nexts if code.count == 2 else code.count
            if name == "save_lrpair":
                slot = _restore(caller, read_pointer, "x", code.register, 1, code.offset, False)
                return_slot = _restore(caller, read_pointer, "x", 30, 1, code.offset + 8, False)
            else:
                slot = _restore(caller, read_pointer, code.bank, code.register, count, code.offset, code.writeback)
                if code.bank == "x" and code.register <= 30 < code.register + count:
                    return_slot = slot + 8 * (30 - code.register)
            save_nexts = 0
        elif name == "set_fp":
            caller["sp"] = _register(caller, "fp")
        elif name == "add_fp":
            caller["sp"] = _register(caller, "fp") - code.offset
        elif name == "pac_sign_lr":
            caller["lr"] = strip_pac(_register(caller, "lr"))
        elif name in CUSTOM_STACK_CODES:
            special_frame, return_slot = _custom(name, caller, read_pointer)
            pc_from_lr = False
        # nop, end_c and the reserved codes change nothing.
    if pc_from_lr:
        caller["pc"] = _register(caller, "lr")
    return UnwindStep(caller, return_slot, machine_frame=special_frame, epilogue=epilogue,
                      unwound_to_call=pc_from_lr)


def _register(registers, name):
    value = registers.get(name)
    if value is None:
        raise UnwindError("frame_register_unknown", registers.get("pc"), "the unwind needs %s, which the "
                          "context does not hold" % name)
    return value


def _restore(registers, read_pointer, bank, first, count, offset, writeback):
    """Load ``count`` registers from sp + offset (from sp, then sp += offset, with
    writeback); returns the address of the first."""
    if first + count > (31 if bank == "x" else 32):
        raise ValueError("restoring %d registers from %s%d runs past the register file" % (count, bank, first))
    sp = registers["sp"]
    address = sp if writeback else sp + offset
    width = 16 if bank == "q" else 8
    for number in range(first, first + count):
        value = read_pointer(address + (number - first) * width)
        registers[GENERAL_REGISTERS[number] if bank == "x" else "%s%d" % (bank, number)] = value
    if writeback:
        registers["sp"] = sp + offset
    return address


def _custom(name, registers, read_pointer):
    """The custom-stack codes: the frame they cross, and where pc was read."""
    sp = registers["sp"]
    if name == "trap_frame":
        base = sp + KTRAP_FRAME_ARM64["X"]
        for number in range(KTRAP_FRAME_ARM64_VOLATILE_X):
            registers[GENERAL_REGISTERS[number]] = read_pointer(base + 8 * number)
        for field in ("Sp", "Lr", "Fp", "Pc"):
            registers[field.lower()] = read_pointer(sp + KTRAP_FRAME_ARM64[field])
        return sp, sp + KTRAP_FRAME_ARM64["Pc"]
    if name == "machine_frame":
        registers["sp"] = read_pointer(sp + MACHINE_FRAME_ARM64["Sp"])
        registers["pc"] = read_pointer(sp + MACHINE_FRAME_ARM64["Pc"])
        return sp, sp + MACHINE_FRAME_ARM64["Pc"]
    if name == "context":
        for register, (offset, size) in CONTEXT_ARM64["registers"].items():
            if size == 8:
                registers[register] = read_pointer(sp + offset)
        return sp, sp + CONTEXT_ARM64["registers"]["pc"][0]
    if name == "clear_unwound_to_call":
        registers["pc"] = _register(registers, "lr")
        return None, None
    raise UnwindError("unwind_unsupported", registers.get("pc"), "the ARM64EC context frame (unwind code "
                      "0xEB) is not supported")


def strip_pac(value):
    """A return address without its pointer-authentication code: the bits above
    the 48-bit VA copy bit 55 (set in kernel addresses, clear in user ones)."""
    if value >> 55 & 1:
        return value | ((1 << 64) - (1 << VIRTUAL_ADDRESS_BITS))
    return value & ((1 << VIRTUAL_ADDRESS_BITS) - 1)


# -- without unwind data -----------------------------------------------------------------------

FRAME_RECORD_SIZE = 16      # {fp, lr}, the frame record x29 points at


def unwind_frame_chain(registers, read_pointer):
    """The fallback where a function has no usable unwind data: the frame record
    x29 points at holds the caller's x29 and the return address.  The caller's sp
    is not recorded there: it is given as just above the record (a lower bound),
    so frames found this way are marked as such.  None when fp cannot be a frame
    record (zero, misaligned or below sp)."""
    fp = registers.get("fp")
    sp = registers.get("sp")
    if not fp or fp & 7 or sp is None or fp < sp:
        return None
    caller = dict(registers)
    caller["fp"] = read_pointer(fp)
    caller["lr"] = caller["pc"] = read_pointer(fp + 8)
    caller["sp"] = fp + FRAME_RECORD_SIZE
    return UnwindStep(caller, fp + 8)


def follows_call(before):
    """True when the 4 bytes before a candidate return address are a ``bl`` or
    ``blr`` (what a stack scan asks of a slot before taking it for a return address)."""
    if len(before) < INSTRUCTION_SIZE:
        return False
    word = int.from_bytes(before[-INSTRUCTION_SIZE:], "little")
    return word & 0xFC000000 == 0x94000000 or word & 0xFFFFFC1F == 0xD63F0000
