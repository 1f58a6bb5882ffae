"""The kf-like thread view over the sample driver's scenario: in memory, and
through a real kernel dump file written from the same scenario."""

import io
import json

import pytest

from dbgext.cli import main
from dbgext.stackuse.callgraph import CallGraph, Program
from dbgext.stackuse.fixtures import KTHREAD_FIELDS, KTHREAD_SIZE, add_sample_driver
from dbgext.stackuse.thread import walk_thread
from dbgext.testing.scenario import Scenario


@pytest.fixture
def sample():
    scenario = Scenario("x64", "kernel")
    info = add_sample_driver(scenario)
    return scenario, info


def walk(target, thread=None, threshold=None):
    program = Program(target)
    return walk_thread(target, program, CallGraph(program), thread=thread, threshold=threshold)


def test_current_thread_frames_child_sps_and_actual_use(sample):
    scenario, info = sample
    stack = walk(scenario.target(), threshold=0x100)
    names = [frame.function.split("+")[0] for frame in stack.frames]
    assert names == ["sampledrv!CopyLeaf", "sampledrv!BuildRequest", "sampledrv!Dispatch",
                     "sampledrv!DriverEntry", "nt!IopLoadDriver"]
    assert [frame.child_sp for frame in stack.frames[:4]] == [sp for _, sp in info["frames"]]
    # kf's memory column: distance to the next frame = frame size + return address.
    assert [frame.uses for frame in stack.frames] == [8, 0x48 + 8, 0x228 + 8, 0x28 + 8, 0x28 + 8]
    assert [frame.frame_size for frame in stack.frames] == [0, 0x48, 0x228, 0x28, 0x28]
    assert stack.thread == info["thread"]
    assert (stack.initial_stack, stack.stack_limit) == (info["initial_stack"], info["stack_limit"])
    assert stack.used == info["initial_stack"] - info["rsp"]
    assert stack.remaining == info["rsp"] - info["stack_limit"]
    assert [frame.function.split("+")[0] for frame in stack.hogs()] == ["sampledrv!Dispatch"]
    assert stack.problems == []


def test_waiting_thread_starts_from_its_switch_frame(sample):
    scenario, info = sample
    waiting = scenario.alloc(KTHREAD_SIZE)
    # Its switch frame's return address is the one the current thread's RSP points at.
    scenario.pack(waiting + KTHREAD_FIELDS["KernelStack"], "<Q", info["rsp"] - 0x38)
    scenario.pack(waiting + KTHREAD_FIELDS["InitialStack"], "<Q", info["initial_stack"])
    scenario.pack(waiting + KTHREAD_FIELDS["StackLimit"], "<Q", info["stack_limit"])
    stack = walk(scenario.target(), thread=waiting)
    assert stack.frames[0].function.startswith("sampledrv!BuildRequest+")
    assert stack.frames[0].child_sp == info["frames"][1][1]
    assert stack.kernel_stack == info["rsp"] - 0x38


def test_without_thread_types_the_bounds_are_reported_missing_but_frames_still_come(sample):
    scenario, info = sample
    stack = walk(scenario.target(with_types=False))
    assert stack.initial_stack is None and stack.used is None
    assert any("KPRCB" in problem or "KTHREAD" in problem for problem in stack.problems)
    assert len(stack.frames) == 5


def test_unreadable_stack_page_is_reported_with_its_address(sample):
    scenario, info = sample
    scenario.unmap(info["rsp"], 8)  # the page holding every frame of the sample
    stack = walk(scenario.target())
    assert len(stack.frames) == 1
    assert any("stack unreadable at 0x%x" % info["rsp"] in problem for problem in stack.problems)


def test_frame_in_code_that_is_not_in_the_dump_falls_back_to_scanning(sample):
    scenario, info = sample
    build_request = scenario.module_symbols["sampledrv"].symbols["BuildRequest"]
    scenario.unmap(scenario.module("sampledrv").base + build_request, 1)  # the whole .text page
    stack = walk(scenario.target())
    assert stack.frames[1].how == "scanned"
    assert len(stack.frames) >= 2


def test_thread_command_through_a_kernel_dump_file(sample, tmp_path):
    scenario, info = sample
    dump = str(tmp_path / "sample.dmp")
    scenario.write_kernel_dump(dump)
    scenario.write_symbols(dump + ".symbols")
    stream = io.StringIO()
    assert main(["stackuse", "thread", "--dump", dump, "--threshold", "0x100", "--json"], stream=stream) == 0
    document = json.loads(stream.getvalue())
    assert [frame["uses"] for frame in document["frames"]] == [8, 0x50, 0x230, 0x30, 0x30]
    assert [frame["over_threshold"] for frame in document["frames"]] == [False, False, True, False, False]
    assert document["remaining"] == info["rsp"] - info["stack_limit"]
    stream = io.StringIO()
    assert main(["stackuse", "thread", "--dump", dump], stream=stream) == 0
    text = stream.getvalue()
    assert "sampledrv!Dispatch+0x11" in text and "used %d bytes" % (info["initial_stack"] - info["rsp"]) in text


def test_thread_command_rejects_a_bad_thread_address(sample, tmp_path):
    scenario, _ = sample
    dump = str(tmp_path / "sample.dmp")
    scenario.write_kernel_dump(dump)
    scenario.write_symbols(dump + ".symbols")
    stream = io.StringIO()
    assert main(["stackuse", "thread", "nonsense", "--dump", dump], stream=stream) == 1
    assert stream.getvalue().startswith("error: not a thread address")
    stream = io.StringIO()
    assert main(["stackuse", "thread", "0xffffc0800dead000", "--dump", dump], stream=stream) == 1
    assert "error:" in stream.getvalue() and "Traceback" not in stream.getvalue()
