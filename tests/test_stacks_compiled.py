"""The unwinder over stacks made by executing real compiled code.

Each case runs ``tests/data/stacks/chain.c`` (MinGW-w64 gcc -O0/-O2, clang -O2,
clang with frame pointers) in an emulator to a chosen instruction; the frames the
unwinder finds must be exactly the live calls the execution left — return address
and child-SP — which the emulator tracked independently of the unwind data.
"""

import io
import json
import struct

import pytest

from dbgext.cli import main
from dbgext.stacks import analyze
from dbgext.stacks.scan import follows_call
from dbgext.stackuse.callgraph import Program, depths_in
from dbgext.stacks.images import runtime_functions

from stacks_support import CONFIGS, IMAGE_BASE, build, epilogue_offset, run, tail_call_epilogue_offsets


def walked(stopped, **options):
    return analyze(stopped.scenario(**options).target())


def frames_of(result):
    return [(frame.ip, frame.child_sp) for frame in result.frames]


def names_of(result):
    return [frame.function.split("+")[0] for frame in result.frames]


@pytest.mark.parametrize("config", CONFIGS)
def test_a_call_chain_unwinds_to_exactly_the_live_calls(config):
    stopped = run(config, "entry", 5, stop_at="leaf")
    result = walked(stopped)
    assert frames_of(result) == stopped.expected_frames()
    assert names_of(result) == ["chain!leaf", "chain!middle", "chain!outer", "chain!entry"]
    assert [frame.found_by for frame in result.frames] == ["context", "unwind", "unwind", "unwind"]
    assert [frame.return_address for frame in result.frames] == [ip for ip, _ in stopped.expected_frames()[1:]] + [0]
    assert list(result.problems) == []


@pytest.mark.parametrize("config", CONFIGS)
def test_a_frame_stopped_inside_its_epilogue_is_unwound_by_emulating_the_rest_of_it(config):
    # The frame's allocation is already released: undoing the unwind codes again
    # would land 0x28+ bytes too high.
    stopped = run(config, "entry", 5, stop_at=("outer", epilogue_offset(build(config), "outer")))
    result = walked(stopped)
    assert frames_of(result) == stopped.expected_frames()
    assert names_of(result) == ["chain!outer", "chain!entry"]


@pytest.mark.parametrize("config", CONFIGS)
def test_an_interrupt_machine_frame_is_crossed_into_the_interrupted_code(config):
    # The interrupt arrives on touch's first instruction; isr_stub's unwind data
    # has PUSH_MACHFRAME, which gives the interrupted RIP and RSP.
    stopped = run(config, "entry", 5, stop_at="leaf", interrupt_at=("touch", 0))
    result = walked(stopped)
    assert frames_of(result) == stopped.expected_frames()
    assert names_of(result) == ["chain!leaf", "chain!isr_body", "chain!isr_stub", "chain!touch", "chain!middle",
                                "chain!outer", "chain!entry"]
    machine_frame = stopped.calls[2][1]
    isr = result.frames[2]
    assert isr.machine_frame == machine_frame
    assert isr.trap_frame == machine_frame - 0x168  # the _KTRAP_FRAME around it (kernel target)
    assert isr.return_address == stopped.address("touch")
    assert list(result.problems) == []


def test_a_leaf_function_without_unwind_data_returns_through_the_slot_at_rsp():
    stopped = run("clang-O2", "entry", 5, stop_at="leaf")
    leaf = stopped.image.exports_by_name["leaf"]
    assert not any(begin <= leaf < end for begin, end, _ in runtime_functions(stopped.image))
    result = walked(stopped)
    assert result.frames[0].return_slot == stopped.registers["rsp"]
    assert result.frames[1].found_by == "unwind"


@pytest.mark.parametrize("config", CONFIGS)
def test_a_stale_return_address_that_a_scan_would_take_is_not_a_frame(config):
    # stale() called deep1 -> deep2 -> deep3 -> leaf, which returned; big_locals'
    # uninitialised buffer now holds their return addresses above leaf's frame.
    stopped = run(config, "stale", 5, stop_at="leaf", hit=2)
    result = walked(stopped)
    assert names_of(result) == ["chain!leaf", "chain!big_locals", "chain!stale"]
    assert frames_of(result) == stopped.expected_frames()
    big_locals_frame = range(result.frames[1].child_sp, result.frames[2].child_sp - 8, 8)
    deep = set(stopped.address(name) for name in ("deep1", "deep2", "deep3"))
    leftovers = [slot for slot in big_locals_frame if _follows_call_into(stopped, slot, deep)]
    assert leftovers, "the stale return addresses the test relies on are not on the stack"


def _follows_call_into(stopped, slot, functions):
    value = struct.unpack("<Q", stopped.read_stack(slot, 8))[0]
    if not IMAGE_BASE < value < IMAGE_BASE + len(stopped.data):
        return False
    rva = value - IMAGE_BASE
    owner = max((start for start in functions if start <= value), default=None)
    return owner is not None and value - owner < 0x40 and follows_call(stopped.data[rva - 7:rva])


@pytest.mark.parametrize("config", CONFIGS)
def test_each_frames_stack_use_matches_stackuse_depth_at_its_instruction(config):
    # stackuse's prologue analysis (not the unwind data) knows how deep each
    # instruction runs below its return address: the frame's use is that plus the
    # return address itself.
    stopped = run(config, "entry", 5, stop_at="leaf", interrupt_at=("touch", 0))
    target = stopped.scenario().target()
    result = analyze(target)
    program = Program(target)
    compared = 0
    for inner, outer in zip(result.frames, result.frames[1:]):
        if inner.machine_frame is not None:
            continue  # the interrupt moved RSP, not a prologue
        function = program.module_for(inner.ip).function_containing(inner.ip)
        assert outer.memory == depths_in(program, function)[inner.ip] + 8, inner.function
        compared += 1
    assert compared == len(result.frames) - 2


def test_k_over_a_kernel_dump_file_written_from_an_executed_stack(tmp_path):
    stopped = run("clang-O2", "entry", 5, stop_at="leaf", interrupt_at=("touch", 0))
    scenario = stopped.scenario(bounds=False)
    dump = str(tmp_path / "chain.dmp")
    scenario.write_kernel_dump(dump)
    scenario.write_symbols(dump + ".symbols")
    out = io.StringIO()
    assert main(["k", "--dump", dump, "--json"], stream=out) == 0
    document = json.loads(out.getvalue())
    assert document["schema_version"] == 1
    assert [(frame["ip"], frame["child_sp"]) for frame in document["frames"]] == stopped.expected_frames()
    assert document["found_by"] == {"context": 1, "unwind": 6, "frame_chain": 0, "scan": 0}
    out = io.StringIO()
    assert main(["k", "--dump", dump, "--frame-sizes"], stream=out) == 0
    text = out.getvalue()
    assert "chain!isr_stub+0xa" in text and "Memory" in text


@pytest.mark.parametrize("config", ["mingw-O2", "clang-O2"])   # -O0 and clang-fp make a call and ret
def test_a_frame_stopped_on_each_instruction_of_an_indirect_tail_call_epilogue_unwinds_exactly(config):
    # (pop ...;) rex.W jmp reg: the REX.W marks the jump as the epilogue's end, so
    # the pops still to run are emulated instead of undoing the whole prologue.
    offsets = tail_call_epilogue_offsets(build(config), "tail_indirect")
    assert len(offsets) >= 1
    for offset in offsets:
        stopped = run(config, "dispatch", 5, stop_at=("tail_indirect", offset))
        result = walked(stopped)
        assert frames_of(result) == stopped.expected_frames(), "stopped at tail_indirect+0x%x" % offset
        assert names_of(result) == ["chain!tail_indirect", "chain!dispatch"]
        assert [frame.found_by for frame in result.frames] == ["context", "unwind"]
        assert list(result.problems) == []
