"""ARM64 user minidumps (SystemInfo ProcessorArchitecture 12, CONTEXT_ARM64 in
the thread list and the exception stream), written by tests/minidump_writer.py
from an ``arm64`` user scenario.  The truth is the scenario: its threads'
registers, its modules and every captured byte.

The ``minidump`` package cannot be the oracle here: its PROCESSOR_ARCHITECTURE
has no 12 (only breakpad's ARM64 number, 0x8003), so it refuses Windows ARM64
minidumps; the test below pins that, so the day it learns them it becomes one."""

import io
import random

import pytest

import dbgext
from dbgext.address import TargetResolver, evaluate
from dbgext.cli import main
from dbgext.layouts.dump_formats import PAGE_SIZE
from dbgext.sample.scenario import Scenario, Thread

from dumps_support import probe_addresses, random_bytes, scenario_bytes
from minidump_writer import write_minidump
from requirements import need_module

EXE, DLL = 0x7FF612340000, 0x7FFB00000000
FAULT = EXE + 0x1A2C


def arm64_user_scenario(seed=71):
    rng = random.Random(seed)
    scenario = Scenario("arm64", "user", build=22621)
    scenario.add_module("app", EXE, 0x5000, image="app.exe", content=b"MZ\x90\x00")
    scenario.add_module("ntdll", DLL, 0x3000, image="ntdll.dll", content=b"MZ\x90\x00")
    for _ in range(8):
        size = rng.choice([8, 100, 0xFFF, 0x1001])
        address = scenario.alloc(size, align=16)
        scenario.write(address, random_bytes(rng, size))
    for index, thread_id in enumerate((0x1A0, 0x1A4)):
        stack = scenario.alloc_pages(0x2000)
        scenario.write(stack + 0x1F00, random_bytes(rng, 0x100))
        registers = {"pc": EXE + 0x1000 + 0x10 * index, "sp": stack + 0x1F00, "fp": stack + 0x1F40,
                     "lr": DLL + 0x200 + index, "x0": 0xA0 + index, "x28": 0x28}
        scenario.threads.append(Thread(thread_id, 0, stack, 0x2000, registers))
    return scenario


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    scenario = arm64_user_scenario()
    path = str(tmp_path_factory.mktemp("arm64-minidump") / "app.dmp")
    write_minidump(scenario, path, exception={"thread_id": 0x1A4, "code": 0xC0000005, "address": FAULT,
                                              "parameters": [1, 0x10]})
    return scenario, path


def test_architecture_12_opens_as_an_arm64_target_with_8_byte_pointers(written):
    _, path = written
    with dbgext.open(path) as target:
        assert (target.arch, target.pointer_size, target.backend.kind) == ("arm64", 8, "minidump")


def test_each_threads_context_is_decoded_with_the_arm64_layout(written):
    scenario, path = written
    with dbgext.open(path) as target:
        threads = dict((thread.id, thread.registers) for thread in target.threads())
        for thread in scenario.threads:
            assert dict((name, threads[thread.thread_id][name]) for name in thread.registers) == thread.registers


def test_the_exception_stream_selects_its_thread_and_keeps_the_fault(written):
    scenario, path = written
    with dbgext.open(path) as target:
        assert target.thread.id == 0x1A4
        info = target.info()
        assert (info["exception"]["code"], info["exception"]["address"], info["exception"]["parameters"]) == (
            0xC0000005, FAULT, [1, 0x10])
        resolver = TargetResolver(target)
        assert evaluate("@pc", resolver) == scenario.threads[1].registers["pc"]
        assert evaluate("@x30", resolver) == DLL + 0x201 == evaluate("@lr", resolver)


def test_every_captured_byte_reads_back_and_nothing_else_does(written):
    scenario, path = written
    rng = random.Random(5)
    with dbgext.open(path) as target:
        assert [(module.name, module.base) for module in target.modules()] == [("app", EXE), ("ntdll", DLL)]
        for va, page in scenario.pages.items():
            assert target.read(va, PAGE_SIZE) == page, hex(va)
        for address in probe_addresses(scenario, rng):
            expected = scenario_bytes(scenario, address, 8)
            assert (target.read(address, 8) if target.is_readable(address, 8) else None) == expected, hex(address)


def test_dumpinfo_and_k_show_the_arm64_context_of_the_exception_thread(written):
    scenario, path = written
    out, err = io.StringIO(), io.StringIO()
    assert main(["dumpinfo", "--dump", path], stream=out, error_stream=err) == 0
    assert "Context:          pc=00007ff6`12341010 sp=" in out.getvalue()
    out, err = io.StringIO(), io.StringIO()
    assert main(["k", "--dump", path], stream=out, error_stream=err) == 0
    # The minidump holds no code and no image is given: frame 0 only, and why.
    assert "app+0x1010" in out.getvalue() and "no unwind data for app.exe" in err.getvalue()


def test_the_minidump_package_does_not_know_windows_arm64_minidumps(written):
    need_module("minidump")  # the minidump oracle
    from minidump.minidumpfile import MinidumpFile
    _, path = written
    with pytest.raises(Exception, match="12 is not a valid PROCESSOR_ARCHITECTURE"):
        MinidumpFile.parse(path)
