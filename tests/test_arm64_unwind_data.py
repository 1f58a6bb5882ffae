"""ARM64 unwind data decoded as llvm-readobj decodes it, and as Windows synthesises
codes for packed entries.

Truth: ``llvm-readobj --unwind`` (Debian's LLVM 14) on the real MSVC 2022 ARM64
PE (``xcpt4.exe``), on DLLs clang builds from ``tests/data/arm64/chain.c`` and on
``every_code.s`` (one function per group of unwind codes, written with the
assembler's SEH directives); the code bytes of the real PE's prologues, decoded by
capstone, for the packed entries (whose synthesised codes llvm-readobj does not
print).  LLVM 14 does not know pac_sign_lr (0xFC, "Bad opcode!"): there the
bytes are compared and the code must be one LLVM 14 does not know.
"""

import random
import re

import pytest

from arm64_support import BytesImage, XCPT4, MiniPE, build, llvm_unwind
from dbgext.stacks.arm64_unwind import (PackedFields, decode_code, decode_codes, expand_packed, function_unwind,
                                        parse_pdata, strip_pac)
from dbgext.stacks.x64 import UnwindError

LLVM14_UNKNOWN = {"pac_sign_lr", "save_any_reg", "ec_context", "reserved_nop"}


def _address(text):
    return int(text.split("(")[-1].rstrip(")").split()[-1], 16)


def _check_lines(lines, codes, epilogue, where):
    assert len(lines) == len(codes), (where, lines, codes)
    for (raw, text), code in zip(lines, codes):
        assert raw == code.raw.hex(), (where, raw, code)
        if text == "Bad opcode!":
            assert code.name in LLVM14_UNKNOWN, (where, raw, code)
        else:
            assert text == code.text(epilogue), (where, raw, text, code.text(epilogue))


def compare_with_llvm(path):
    """Every RuntimeFunction llvm-readobj prints, field by field and code by code;
    returns how many functions of each kind were compared."""
    image = MiniPE(path)
    entries = dict(image.pdata)
    counts = {"packed": 0, "fragment": 0, "xdata": 0, "epilogue scopes": 0, "codes": 0}
    reference = llvm_unwind(path)
    assert len(reference) == len(entries)
    for function in reference:
        begin = _address(function["Function"]) - image.image_base
        unwind = function_unwind(image, (begin, entries[begin]))
        where = image.describe(begin)
        assert unwind.function_length == int(function["FunctionLength"]), where
        if "Fragment" in function:
            assert unwind.kind == ("fragment" if function["Fragment"] == "Yes" else "packed"), where
            fields = unwind.packed
            assert (fields.reg_f, fields.reg_i, fields.h, fields.cr, fields.frame_size) == (
                int(function["RegF"]), int(function["RegI"]), int(function["HomedParameters"] == "Yes"),
                int(function["CR"]), int(function["FrameSize"])), where
            counts[unwind.kind] += 1
            continue
        counts["xdata"] += 1
        assert unwind.kind == "xdata"
        assert unwind.version == int(function["Version"])
        assert unwind.exception_data == (function["ExceptionData"] == "Yes"), where
        assert unwind.epilogue_in_header == (function["EpiloguePacked"] == "Yes"), where
        assert unwind.code_words * 4 == int(function["ByteCodeLength"]), where
        prologue = unwind.codes(0)
        _check_lines(function["Prologue"], prologue, False, where)
        counts["codes"] += len(prologue)
        if unwind.epilogue_in_header:
            assert unwind.epilogue_index == int(function["EpilogueOffset"]), where
            if "Epilogue" in function:
                _check_lines(function["Epilogue"], unwind.codes(unwind.epilogue_index), True, where)
        else:
            scopes = function["EpilogueScopes"]
            assert len(unwind.epilogue_scopes) == int(function["EpilogueScopes"] if isinstance(
                function["EpilogueScopes"], str) else len(scopes))
            assert [(int(scope["StartOffset"]), int(scope["EpilogueStartIndex"])) for scope in scopes] == \
                unwind.epilogue_scopes, where
            for scope, (_, index) in zip(scopes, unwind.epilogue_scopes):
                codes = unwind.codes(index)
                _check_lines(scope["Opcodes"], codes, True, where)
                counts["codes"] += len(codes)
                counts["epilogue scopes"] += 1
        if unwind.exception_data:
            routine = [line for line in function["ExceptionHandler"] if line.startswith("Routine:")][0]
            assert image.image_base + unwind.handler_rva == _address(routine), where
    return counts


def test_every_function_of_the_real_msvc_arm64_pe_decodes_as_llvm_readobj_decodes_it():
    counts = compare_with_llvm(XCPT4)
    # MSVC 14.31 uses both forms; its xdata records have epilogue scopes and pac_sign_lr.
    assert counts["packed"] > 20 and counts["xdata"] > 100 and counts["epilogue scopes"] > 100, counts


@pytest.mark.parametrize("config", ["O0", "O2"])
def test_every_function_of_a_clang_built_arm64_dll_decodes_as_llvm_readobj_decodes_it(config):
    counts = compare_with_llvm(build(config))
    assert counts["packed"] + counts["xdata"] >= 7, counts


def test_every_unwind_code_the_assembler_can_emit_decodes_as_llvm_readobj_decodes_it():
    path = build("O0", source="every_code.s", exports=("every_code",))
    counts = compare_with_llvm(path)
    names = set()
    image = MiniPE(path)
    for entry in image.pdata:
        unwind = function_unwind(image, entry)
        names.update(code.name for code in unwind.codes(0))
        for _, index in unwind.epilogue_scopes:
            names.update(code.name for code in unwind.codes(index))
    assert names >= {"alloc", "save_r19r20_x", "save_fplr", "save_fplr_x", "save_regp", "save_regp_x",
                     "save_reg", "save_reg_x", "save_lrpair", "save_fregp", "save_fregp_x", "save_freg",
                     "save_freg_x", "set_fp", "add_fp", "nop", "end", "save_next", "trap_frame",
                     "machine_frame", "context", "clear_unwound_to_call"}, sorted(names)
    assert counts["epilogue scopes"] >= 1


# -- the codes against the real prologues and epilogues -----------------------------------------

def _capstone(image, rva, count):
    """``count`` instructions at ``rva`` as capstone spells them, with ``#A, lsl
    #12`` immediates folded into one value."""
    import capstone
    decoder = capstone.Cs(capstone.CS_ARCH_ARM64, capstone.CS_MODE_ARM)
    texts = []
    for _, _, mnemonic, operands in decoder.disasm_lite(image.read(rva, 4 * count), image.image_base + rva):
        if operands.endswith(", lsl #12") and operands.count("#") == 2:
            head, value = operands[:-len(", lsl #12")].rsplit("#", 1)
            operands = "%s#0x%x" % (head, int(value, 0) << 12)
        operands = re.sub(r"#(\d+)(?=[],!]|$)", lambda match: "#0x%x" % int(match.group(1)), operands)
        texts.append("%s %s" % (mnemonic, operands) if operands else mnemonic)
    return texts


def _expected_instruction(code, epilogue):
    """What capstone shows for the instruction a code describes; None where any
    instruction fits (nop: homed parameters, a probe call; save_next's pair)."""
    if code.name in ("nop", "save_next", "reserved_nop"):
        return None
    if code.name == "alloc":
        return "%s sp, sp, #0x%x" % ("add" if epilogue else "sub", code.stack_bytes)
    if code.name == "set_fp":
        return "mov sp, x29" if epilogue else "mov x29, sp"
    if code.name == "add_fp":
        return ("sub sp, x29, #0x%x" if epilogue else "add x29, sp, #0x%x") % code.offset
    if code.name == "pac_sign_lr":
        return "autibsp" if epilogue else "pacibsp"

    def register(number):
        return "x%d" % number if code.bank == "x" else "%s%d" % (code.bank, number)
    if code.name == "save_lrpair":
        operands = "%s, x30" % register(code.register)
    elif code.count == 2:
        operands = "%s, %s" % (register(code.register), register(code.register + 1))
    else:
        operands = register(code.register)
    mnemonic = ("ld" if epilogue else "st") + ("p" if code.count == 2 else "r")
    if code.writeback:
        if epilogue:
            return "%s %s, [sp], #0x%x" % (mnemonic, operands, code.offset)
        return "%s %s, [sp, #-0x%x]!" % (mnemonic, operands, code.offset)
    if code.offset:
        return "%s %s, [sp, #0x%x]" % (mnemonic, operands, code.offset)
    return "%s %s, [sp]" % (mnemonic, operands)


def _helper_moving_sp(image, call, size):
    """True when ``call`` (``bl #target``) calls a helper whose own unwind data
    moves sp for its caller (by ``size``; None: by any amount).  MSVC frees an
    area a helper allocated that way: the epilogue's code for that call is the
    alloc it undoes, or set_fp when the area lay between fp and sp."""
    if not call.startswith("bl #"):
        return False
    target = int(call[4:], 16) - image.image_base
    entries = dict(image.pdata)
    if target not in entries:
        return False
    helper = function_unwind(image, (target, entries[target]))
    codes = helper.codes(0) + [code for _, index in helper.epilogue_scopes for code in helper.codes(index)]
    return any(code.name == "alloc" and size in (None, code.stack_bytes) for code in codes)


def _check_scope(image, rva, codes, epilogue, where):
    described = [code for code in codes if not code.is_end and code.instructions]
    ordered = described if epilogue else list(reversed(described))
    actual = _capstone(image, rva, len(ordered) + (1 if epilogue else 0))
    for code, got in zip(ordered, actual):
        want = _expected_instruction(code, epilogue)
        helper = code.name in ("alloc", "set_fp") and _helper_moving_sp(
            image, got, code.stack_bytes if code.name == "alloc" else None)
        # __chkstk's convention: the size in 16-byte units in x15, then sub sp by it.
        probe = code.name == "alloc" and got == "sub sp, sp, x15, lsl #0x4" and \
            "mov x15, #0x%x" % (code.stack_bytes // 16) in actual
        assert want is None or want == got or helper or probe, (where, [_expected_instruction(c, epilogue) for c in ordered],
                                                       actual)
    if epilogue:
        assert actual[-1].split()[0] in ("ret", "b", "br"), (where, actual)


@pytest.mark.parametrize("which", ["msvc", "clang-O0", "clang-O2", "clang-O1-fp"])
def test_every_prologue_and_epilogue_the_codes_describe_is_the_code_there(which):
    """Prologues (packed entries' synthesised codes included) and every epilogue
    scope, at the offsets the unwinder uses to tell where the pc is, in the real
    MSVC PE and the clang-built DLLs."""
    image = MiniPE(XCPT4 if which == "msvc" else build(which.split("-", 1)[1]))
    counts = {"prologues": 0, "epilogues": 0}
    for begin, word in image.pdata:
        unwind = function_unwind(image, (begin, word))
        where = image.describe(begin)
        codes = unwind.codes(0)
        _check_scope(image, begin, codes, False, where)
        assert unwind.prologue_size == sum(code.instructions for code in codes)
        counts["prologues"] += 1
        scopes = list(unwind.epilogue_scopes)
        if unwind.epilogue_in_header:
            size = sum(code.instructions for code in unwind.codes(unwind.epilogue_index)) + 1
            scopes.append((unwind.function_length // 4 - size, unwind.epilogue_index))
        for start, index in scopes:
            _check_scope(image, begin + 4 * start, unwind.codes(index), True, where)
            counts["epilogues"] += 1
    if which == "msvc":
        assert counts["prologues"] == 234 and counts["epilogues"] > 150, counts
    else:
        assert counts["prologues"] >= 8 and counts["epilogues"] >= counts["prologues"], counts


@pytest.mark.parametrize("word,expected", [
    # CR=3 RegI=3 FrameSize=48: stp x19,x20,[sp,#-32]!; str x21,[sp,#16]; stp x29,lr,[sp,#-16]!; mov x29,sp
    ((48 // 16) << 23 | 3 << 21 | 3 << 16 | 20 << 2 | 1, "e1 81 d0 82 cc 03 e4"),
    # CR=1 RegI=1 (x19 and lr): the allocation comes first, then one save_lrpair
    ((16 // 16) << 23 | 1 << 21 | 1 << 16 | 8 << 2 | 1, "d6 00 01 e4"),
    # CR=2: pacibsp first; RegF=1 saves d8 and d9
    ((64 // 16) << 23 | 2 << 21 | 1 << 13 | 16 << 2 | 1, "e1 85 da 01 fc e4"),
    # H=1 with RegI=2: the save area holds x19, x20 and x0-x7 (80 bytes); four nops for x0-x7, the epilogue's copy after the prologue without them
    ((96 // 16) << 23 | 1 << 20 | 2 << 16 | 16 << 2 | 1, "01 e3 e3 e3 e3 cc 09 e4 01 cc 09 e4"),
    # a fragment: end_c, no epilogue
    ((32 // 16) << 23 | 8 << 2 | 2, "e5 02 e4"),
    # a frame above 512 bytes chained: alloc_m, then save_fplr at [sp], then set_fp
    ((1024 // 16) << 23 | 3 << 21 | 8 << 2 | 1, "e1 40 c0 40 e4"),
])
def test_packed_entries_expand_into_the_codes_windows_synthesises(word, expected):
    unwind = expand_packed(0x1000, word)
    assert unwind.code_bytes.hex(" ") == expected
    assert unwind.frame_size == PackedFields(word).frame_size


def test_every_consistent_packed_entry_expands_into_codes_moving_sp_by_its_frame_size():
    generator = random.Random(2025)
    checked = 0
    for _ in range(3000):
        word = generator.randrange(1 << 32) & ~3 | generator.choice((1, 2))
        fields = PackedFields(word)
        saved = fields.reg_i + (fields.cr == 1) + (fields.reg_f + 1 if fields.reg_f else 0)
        saved += 8 * fields.h if saved else 0
        if fields.reg_i > 10 or 8 * (saved + (saved & 1)) > fields.frame_size:
            continue        # not a layout a compiler can describe with packed data
        unwind = expand_packed(0, word)
        assert unwind.frame_size == fields.frame_size, hex(word)
        assert unwind.codes(0)[-1].name == "end"
        checked += 1
    assert checked > 300


def test_a_packed_entrys_epilogue_skips_the_frame_pointer_set_up_and_the_homing_nops():
    chained = expand_packed(0, (48 // 16) << 23 | 3 << 21 | 3 << 16 | 20 << 2 | 1)
    assert chained.epilogue_in_header and chained.epilogue_index == 1
    homed = expand_packed(0, (96 // 16) << 23 | 1 << 20 | 2 << 16 | 16 << 2 | 1)
    assert [code.name for code in homed.codes(homed.epilogue_index)] == ["alloc", "save_regp_x", "end"]


# -- bad input ---------------------------------------------------------------------------------

def test_pdata_is_read_as_eight_byte_entries_ignoring_a_cut_tail():
    data = (0x1000).to_bytes(4, "little") + (0x2001).to_bytes(4, "little") + b"\x10\x20\x00"
    assert parse_pdata(data) == [(0x1000, 0x2001)]


@pytest.mark.parametrize("raw,why", [(b"\xc8", "runs past"), (b"\xdf\x00", "invalid"), (b"\xf0", "invalid"),
                                     (b"\xe7\x80\x00", "invalid"), (b"\xe0\x00", "runs past")])
def test_truncated_and_reserved_codes_are_refused_with_their_position(raw, why):
    with pytest.raises(ValueError, match=why):
        decode_code(raw, 0)


def test_random_code_bytes_decode_or_are_refused_but_never_raise_anything_else():
    generator = random.Random(25)
    for _ in range(2000):
        data = bytes(generator.randrange(256) for _ in range(generator.randrange(1, 12)))
        try:
            codes = decode_codes(data)
        except ValueError:
            continue
        assert sum(len(code.raw) for code in codes) <= len(data)


def test_xdata_outside_the_image_or_cut_short_is_reported_with_its_address():
    with pytest.raises(UnwindError) as outside:
        function_unwind(BytesImage(b""), (0x10, 0x20000))
    assert outside.value.kind == "unwind_info_outside_image" and outside.value.address == 0x20000
    header = (4 | 2 << 27).to_bytes(4, "little")          # 2 code words, but only 3 bytes follow
    with pytest.raises(UnwindError, match="unreadable") as cut:
        function_unwind(BytesImage(b"\0" * 0x20 + header + b"\xe4\xe4\xe4"), (0x10, 0x20))
    assert cut.value.address == 0x24


def test_a_chained_entry_pointing_at_another_chained_entry_is_refused():
    data = bytearray(0x40)
    data[0x20:0x28] = (0x30).to_bytes(4, "little") + (0x20 + 3).to_bytes(4, "little")
    with pytest.raises(UnwindError) as error:
        function_unwind(BytesImage(bytes(data)), (0x10, 0x20 + 3))
    assert error.value.kind == "unwind_chain_too_long"


def test_pac_is_stripped_to_the_48_bit_address_keeping_the_half_it_belongs_to():
    assert strip_pac(0x003A_7FF6_1234_5678) == 0x7FF6_1234_5678
    assert strip_pac(0xFFC5_F803_1234_5678) == 0xFFFF_F803_1234_5678
