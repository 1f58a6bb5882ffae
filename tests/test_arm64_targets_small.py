"""A written ARM64 small memory dump (tests/triage_writer.py with arch="arm64"):
the parts of dumps_support.small_dump with an ARM64 context.  Where the header
holds no context (ContextFlags 0) the TRIAGE_DUMP64's copy at ContextOffset is
read, with the ARM64 layout too; triage buckets by the faulting driver from the
context's pc while ARM64 unwinding is not wired."""

import io
import json
import struct

import pytest

import dbgext
from dbgext.cli import main
from dbgext.layouts.arm64 import CONTEXT_ARM64
from dbgext.layouts.dump_formats import DUMP_HEADER64

from dumps_support import DRIVER_BASE, STACK_POINTER, THREAD_ADDRESS, small_dump

REGISTERS = {"pc": DRIVER_BASE + 0x1234, "sp": STACK_POINTER, "fp": STACK_POINTER + 0x80, "lr": DRIVER_BASE + 0x2000,
             "x0": 0xC0FFEE, "x18": 0xFFFFF80000E00000}


def write(path, header_context=True):
    dump = small_dump()
    dump.arch = "arm64"
    dump.header.registers = dict(REGISTERS)
    offsets = dump.write(path)
    if not header_context:   # the header's CONTEXT_ARM64 unset: readers take the TRIAGE_DUMP64's copy
        with open(path, "r+b") as handle:
            handle.seek(DUMP_HEADER64["ContextRecord"])
            handle.write(bytes(CONTEXT_ARM64["size"]))
    return offsets


@pytest.mark.parametrize("header_context", [True, False], ids=["header", "copy"])
def test_the_context_is_arm64s_from_the_header_or_from_context_offset(tmp_path, header_context):
    path = str(tmp_path / "arm64.dmp")
    offsets = write(path, header_context)
    with open(path, "rb") as handle:
        data = handle.read()
    assert struct.unpack_from("<I", data, DUMP_HEADER64["MachineImageType"])[0] == 0xAA64
    assert struct.unpack_from("<Q", data, offsets["ContextOffset"] + CONTEXT_ARM64["registers"]["pc"][0])[0] == \
        REGISTERS["pc"]
    with dbgext.open(path) as target:
        assert target.arch == "arm64"
        thread = target.thread
        assert dict((name, thread.registers[name]) for name in REGISTERS) == REGISTERS
        assert thread.kernel_thread == THREAD_ADDRESS and thread.stack_limit < STACK_POINTER < thread.stack_base
        assert [module.name for module in target.modules()] == ["nt", "mydrv", "ACPI"]
        assert target.read(STACK_POINTER, 8) == data[offsets["CallStackOffset"]:offsets["CallStackOffset"] + 8]
        assert target.info()["problems"] == []


def test_triage_buckets_by_the_driver_at_pc_and_names_the_bug_check(tmp_path):
    path = str(tmp_path / "arm64.dmp")
    write(path)
    out = io.StringIO()
    assert main(["triage", "--dump", path, "--json"], stream=out, error_stream=io.StringIO()) == 0
    record = json.loads(out.getvalue())
    assert (record["arch"], record["bugcheck_name"]) == ("arm64", "DRIVER_IRQL_NOT_LESS_OR_EQUAL")
    assert record["bucket"] == "0xD1_mydrv+0x1234"
    assert [(frame["how"], frame["address"]) for frame in record["frames"]] == [("context", REGISTERS["pc"])]
