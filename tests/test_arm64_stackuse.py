"""ARM64 frame sizes from prologues, reconciled with the unwind data and checked
against the frames unicorn measures while the code runs."""

import io
import json
import struct

import pytest

from arm64_support import IMAGE_BASE, XCPT4, MiniPE, build, execute, scenario
from dbgext.cli import main
from dbgext.pe import PEImage
from dbgext.stackuse.callgraph import CallGraph, Program
from dbgext.stackuse.thread import walk_thread
from dbgext.disasm import Disassembler
from dbgext.stacks.arm64_unwind import find_entry, function_table, function_unwind
from dbgext.stackuse.arm64_prologue import scan_prologue

MOV_X15_0x1234 = 0xD282468F
MOVK_X15_1_LSL_16 = 0xF2A0002F
BL_FORWARD = 0x94000010
SUB_SP_X15_LSL_4 = 0xCB2F73FF
STP_FPLR_PRE_16 = 0xA9BF7BFD
SUB_SP_16 = 0xD10043FF
SUB_SP_4096 = 0xD14007FF
RET = 0xD65F03C0
CBZ_X0_PLUS_8 = 0xB4000040
STR_X19_PRE_16 = 0xF81F0FF3
MOV_FP_SP = 0x910003FD
PACIASP = 0xD503233F
STP_X0_X1_HOME = 0xA90107E0
MOV_SP_X20 = 0x9100029F


def _scan(*words):
    return scan_prologue(struct.pack("<%dI" % len(words), *words), 0x1000)


def test_the_frame_is_the_sum_of_pre_indexed_stores_and_sp_subtractions_up_to_the_first_call():
    result = _scan(PACIASP, STR_X19_PRE_16, STP_FPLR_PRE_16, MOV_FP_SP, STP_X0_X1_HOME, SUB_SP_16, SUB_SP_4096,
                   BL_FORWARD, SUB_SP_16, RET)
    assert (result.frame_size, result.dynamic, result.problem) == (16 + 16 + 16 + 4096, None, None)


def test_chkstk_takes_the_size_in_16_byte_units_in_x15():
    result = _scan(STP_FPLR_PRE_16, MOV_X15_0x1234, MOVK_X15_1_LSL_16, BL_FORWARD, SUB_SP_X15_LSL_4, BL_FORWARD)
    assert result.frame_size == 16 + 16 * 0x11234 and result.dynamic is None


def test_sp_set_from_a_register_makes_the_frame_dynamic_beyond_the_static_part():
    result = _scan(STP_FPLR_PRE_16, MOV_SP_X20, RET)
    assert result.frame_size == 16 and result.dynamic == "mov sp, x20"


def test_an_early_exit_before_the_frame_is_followed_to_the_real_prologue():
    # cbz x0 -> +8 skips a ret: the path at +8 builds the frame
    result = _scan(CBZ_X0_PLUS_8, RET, STP_FPLR_PRE_16, SUB_SP_16, RET)
    assert result.frame_size == 32


def test_a_leaf_without_stack_use_has_a_zero_frame_and_undecodable_code_is_a_problem():
    assert _scan(RET).frame_size == 0
    broken = scan_prologue(b"\xff\xff\xff\xff", 0x1000)
    assert broken.frame_size is None and "0x1000" in broken.problem


def _reconcile(path):
    image = MiniPE(path)
    table, dropped = function_table(image, image.pdata)
    assert dropped == []
    disassembler = Disassembler.for_arch("arm64")
    results = {}
    for begin, end, word in table:
        scanned = scan_prologue(image.read(begin, end - begin), IMAGE_BASE + begin, disassembler)
        results[begin] = (function_unwind(image, (begin, word)).frame_size, scanned)
    return image, table, results


def test_every_prologue_of_the_real_msvc_pe_reconciles_with_its_unwind_data():
    _, table, results = _reconcile(XCPT4)
    assert len(table) == 234
    assert all(scanned.frame_size == unwind and not scanned.dynamic for unwind, scanned in results.values())


@pytest.mark.parametrize("config", ["O0", "O1", "O2", "Os", "O1-fp"])
def test_static_frames_match_the_unwind_data_and_what_unicorn_measures(config):
    path = build(config)
    image, table, results = _reconcile(path)
    begins = [entry[0] for entry in table]
    measured = {}
    for argument in range(6):
        execute(path, argument=argument, frame_sizes=measured)
    dynamic = 0
    for address, depth in measured.items():
        rva = address - IMAGE_BASE
        entry = find_entry(table, begins, rva)
        if entry is None:       # a leaf: no unwind data, the prologue scan alone
            scanned = scan_prologue(image.read(rva, 64), address)
            assert scanned.frame_size == depth == 0, (config, hex(address))
            continue
        assert entry[0] == rva
        unwind, scanned = results[rva]
        assert scanned.frame_size == unwind, (config, hex(address))
        if scanned.dynamic:
            dynamic += 1
            assert depth > unwind, (config, hex(address))       # the alloca went below the static frame
        else:
            assert depth == unwind, (config, hex(address), depth, unwind)
    assert dynamic == 1 and len(measured) >= 9


def test_the_disassembler_decodes_a64_for_the_arm64_architecture():
    decoder = Disassembler.for_arch("arm64")
    assert decoder.one(struct.pack("<I", STP_FPLR_PRE_16), 0x1000) == (0x1000, 4, "stp", "x29, x30, [sp, #-0x10]!")
    code = struct.pack("<3I", PACIASP, SUB_SP_16, RET)
    assert [insn[2] for insn in decoder.decode(code, 0x2000)] == ["paciasp", "sub", "ret"]
    with pytest.raises(ValueError):
        Disassembler("arm32")


# -- dbgext stackuse over ARM64 images ---------------------------------------------------------

XCPT4_PDB = XCPT4[:-len(".exe")] + ".pdb"


def _stackuse_json(*arguments):
    out, err = io.StringIO(), io.StringIO()
    assert main(["stackuse", "functions"] + list(arguments) + ["--json"], stream=out, error_stream=err) == 0, \
        err.getvalue()
    return json.loads(out.getvalue())


def test_stackuse_functions_on_the_real_msvc_pe_gives_every_pdata_frame_from_both_sources_named_by_the_pdb():
    document = _stackuse_json("--pe", XCPT4, "--pdb", XCPT4_PDB, "--depth")
    assert document["arch"] == "arm64" and document["problems"] == []
    image = MiniPE(XCPT4)
    table, _ = function_table(image, image.pdata)
    frames = dict((function["rva"], function) for function in document["functions"])
    for begin, _, word in table:
        function = frames[begin]
        assert (function["frame_size"], function["source"], function["disagreement"], function["found_by"]) == (
            function_unwind(image, (begin, word)).frame_size, "both", None, "pdata"), function
        assert function["name"], function       # named by the PDB
    assert frames[0x2520]["name"] == "main" and frames[0x2520]["frame_size"] == 64
    # Calls through the import address table are recognised (adrp/ldr/blr) and named.
    assert "call into api-ms-win-crt-stdio-l1-1-0!__stdio_common_vfprintf (not analysed)" in \
        frames[0x2520]["depth_unknown"]


@pytest.mark.parametrize("config", ["O0", "O1", "O2", "Os", "O1-fp"])
def test_frames_and_worst_case_depths_equal_what_unicorn_measures_where_they_are_exact(config):
    path = build(config)
    measured, frames = {}, {}
    for argument in range(6):
        execute(path, argument=argument, call_depths=measured, frame_sizes=frames)
    program = Program()
    module = program.add_image(PEImage.from_file(path))
    graph = CallGraph(program)
    graph.analyse_all(module)
    statuses = {}
    tails = 0
    for address, depth in measured.items():
        function = module.functions[address]
        if function.dynamic:
            assert frames[address] > function.unwind_size, (config, hex(address))
        else:
            # The frame stackuse reports is the one the code built.
            assert function.frame_size == frames[address], (config, hex(address), function.frame_size)
        bound = graph.bound(function)
        statuses[bound.status] = statuses.get(bound.status, 0) + 1
        if bound.status == "exact":
            # run() reaches every path of these functions: the bound is reached.
            assert bound.value == depth, (config, hex(address), bound.value, depth)
        elif bound.status == "lower":
            assert "dynamic frame" in bound.reasons[0], (config, hex(address))
            if [site.kind for site in function.call_sites] == ["tail"]:
                # A tail call hands the frame over (the emulator counts the callee
                # from then on): the bound is the callee's.
                tails += 1
                assert bound.value == graph.bound(module.functions[function.call_sites[0].target]).value
            else:
                assert bound.value <= depth, (config, hex(address))
        else:
            assert bound.status == "unbounded" and bound.reasons[0].startswith("recursion"), (config, hex(address))
    assert statuses["exact"] >= 5 and statuses["unbounded"] == 2, statuses
    assert tails == (0 if config in ("O0", "O1", "O1-fp") else 1)


def test_stackuse_thread_sets_each_frames_static_size_beside_the_stack_it_really_uses():
    path = build("O1")
    stopped = max(execute(path, argument=3, stops=range(0, 2000, 7)), key=lambda stop: len(stop.calls))
    target = scenario(stopped, path).target()
    program = Program(target)
    stack = walk_thread(target, program, CallGraph(program))
    assert [frame.child_sp for frame in stack.frames] == [sp for _, sp in stopped.expected_frames()]
    compared = 0
    for frame in stack.frames[:-2]:      # the last two: run's caller is outside every module
        if frame.frame_size is not None:
            # bl pushes nothing: a frame uses exactly its static size.
            assert stack.estimate(frame) == frame.uses, frame.function
            compared += 1
    assert compared >= 5


def test_the_pe_reader_reads_arm64_pointers_as_8_bytes():
    # .rdata of xcpt4.exe holds code addresses (image base 0x140000000) at 0x8190.
    image = PEImage.from_file(XCPT4)
    assert image.pointer_size == 8
    assert image.pointer(0x8190) == image.unpack("<Q", 0x8190)[0] == 0x140002518
