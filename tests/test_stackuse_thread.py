"""The kf-like thread view over the sample driver's scenario: in memory, and
through a real kernel dump file written from the same scenario.  The frames are
the unwinder's (dbgext.stacks); each carries stackuse's static estimate beside
the stack it really used."""

import io
import json

import pytest

from dbgext.cli import main
from dbgext.stackuse.callgraph import CallGraph, Program
from dbgext.stackuse.fixtures import KTHREAD_FIELDS, KTHREAD_SIZE, add_sample_driver
from dbgext.stackuse.thread import walk_thread
from dbgext.sample.scenario import Scenario


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
    assert [frame.how for frame in stack.frames] == ["context"] + ["unwind"] * 4
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
    assert any("KPRCB" in problem.message or "KTHREAD" in problem.message for problem in stack.problems)
    assert len(stack.frames) == 5


def test_unreadable_stack_page_is_reported_with_its_address(sample):
    scenario, info = sample
    scenario.unmap(info["rsp"], 8)  # the page holding every frame of the sample
    stack = walk(scenario.target())
    assert len(stack.frames) == 1
    assert [(problem.kind, problem.address) for problem in stack.problems] == [("stack_unreadable", info["rsp"])]


def test_code_missing_from_the_dump_does_not_matter_to_unwind_data(sample):
    scenario, info = sample
    build_request = scenario.module_symbols["sampledrv"].symbols["BuildRequest"]
    scenario.unmap(scenario.module("sampledrv").base + build_request, 1)  # the whole .text page
    stack = walk(scenario.target())
    assert [frame.how for frame in stack.frames] == ["context"] + ["unwind"] * 4


def test_a_driver_without_unwind_data_in_the_dump_is_walked_by_scanning(sample):
    scenario, info = sample
    from dbgext.pe import PEImage
    base = scenario.module("sampledrv").base
    pdata = PEImage.from_bytes(scenario.read(base, 0x1000) + bytes(0x10000)).directory(3)[0]
    scenario.unmap(base + pdata, 1)
    stack = walk(scenario.target())
    assert "scan" in [frame.how for frame in stack.frames]
    assert "no_unwind_data" in [problem.kind for problem in stack.problems]


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
    assert stream.getvalue().startswith("error:") and "nonsense" in stream.getvalue()
    stream = io.StringIO()
    assert main(["stackuse", "thread", "0xffffc0800dead000", "--dump", dump], stream=stream) == 1
    assert "error:" in stream.getvalue() and "Traceback" not in stream.getvalue()


def test_x86_return_address_unwinds_with_the_depth_at_its_call_before_a_stdcall_pop():
    from dbgext.stackuse.fixtures import Function, build_pe
    outer = Function("outer", [b"\x83\xec\x10", ("call", "caller"), b"\x83\xc4\x10", b"\xc3"])
    caller = Function("caller", [b"\x55", b"\x8b\xec", b"\x6a\x01", b"\x6a\x02", b"\x6a\x03", ("call", "std3"),
                                 b"\x5d", b"\xc3"])
    std3 = Function("std3", [b"\x56", b"\xb8\x01\x00\x00\x00", b"\x5e", b"\xc2\x0c\x00"])
    built = build_pe("x86", [outer, caller, std3], image_base=0x400000, name="app.exe")
    scenario = Scenario("x86", "user")
    scenario.add_module("app", 0x400000, built.size, image="app.exe", content=built.data)
    base = scenario.alloc_pages(0x2000)
    esp = base + 0x1000
    rva = built.rvas
    scenario.pack(esp + 4, "<I", 0x400000 + rva["caller"] + 1 + 2 + 6 + 5)     # after `call std3`
    scenario.pack(esp + 8 + 16, "<I", 0x400000 + rva["outer"] + 3 + 5)         # after `call caller`
    scenario.registers.update({"eip": 0x400000 + rva["std3"] + 1, "esp": esp})
    stack = walk(scenario.target())
    assert [frame.child_sp - esp for frame in stack.frames] == [0, 8, 8 + 16 + 4]
    assert [frame.uses for frame in stack.frames[:2]] == [8, 16 + 4]


def test_sample_driver_joins_an_existing_scenario_without_overwriting_it():
    scenario = Scenario("x64", "kernel")
    scenario.add_module("nt", 0xFFFFF80000000000, 0x10000, image="ntoskrnl.exe")
    scenario.add_type("nt", "_KTHREAD", 0x500, {"InitialStack": 0x28, "StackLimit": 0x30, "KernelStack": 0x58,
                                                "Teb": 0xF0})
    scenario.registers.update({"rip": 0xFFFFF80000001000, "rsp": 0xFFFFC08000100000})
    before = dict(scenario.registers)
    info = add_sample_driver(scenario)
    assert scenario.registers == before and info["current"] is False
    assert "Teb" in scenario.module_symbols["nt"].types["_KTHREAD"]["fields"]
    stack = walk(scenario.target(), thread=info["thread"])
    names = [frame.function.split("+")[0] for frame in stack.frames]
    assert names[:3] == ["sampledrv!BuildRequest", "sampledrv!Dispatch", "sampledrv!DriverEntry"]
    assert stack.frames[0].child_sp == info["frames"][1][1]
