"""The real ARM64 small memory dump (../shared/realworld/kernel/rizin__triage_arm64.dmp:
Windows 11 build 22000, bug check 0x1C8, 245 drivers) read as WinDbg reads it.

Every value below can be checked by hand in the file: the DUMP_HEADER64 (machine
0xAA64 at 0x30, bug check at 0x38, the CONTEXT_ARM64 at 0x348: pc at +0x108, sp at
+0x100), the TRIAGE_DUMP64 at 0x2000 (DriverCount 0xF5 at +0x34, TopOfStack at
+0x48) and the driver list's first entry (ntoskrnl.exe, DllBase at entry +0x38)."""

import json
import struct

import pytest

import dbgext
from dbgext.address import evaluate
from dbgext.pseudo_registers import PseudoRegisterResolver
from realworld import REALWORLD, real_file, run

ARM64 = REALWORLD / "kernel" / "rizin__triage_arm64.dmp"

NT_BASE = 0xFFFFF803F2E00000
PC = 0xFFFFF803F32DE014          # header 0x348 + 0x108
SP = 0xFFFFE00E0E4BC4A0          # header 0x348 + 0x100, = TopOfStack
KPCR = 0xFFFFF803EFD00000        # x18 in kernel mode


def real():
    return real_file(ARM64)


@pytest.fixture(scope="module")
def raw():
    return ARM64.read_bytes() if ARM64.is_file() else b""


@pytest.fixture(scope="module")
def info():
    with dbgext.open(real()) as target:
        assert (target.arch, target.pointer_size) == ("arm64", 8)
        return target.info()


def test_the_header_says_arm64_build_22000_and_bug_check_0x1c8_with_its_parameters(info, raw):
    assert struct.unpack_from("<I", raw, 0x30)[0] == 0xAA64 == info["machine"]
    assert (info["arch"], info["dump_type"], info["build"], info["processors"]) == ("arm64", 4, 22000, 8)
    assert info["bugcheck"] == [0x1C8, 0x1B58, 0xFFFFF803F3A20860, 0, 0]
    assert info["bugcheck"] == [struct.unpack_from("<I", raw, 0x38)[0]] + list(struct.unpack_from("<4Q", raw, 0x40))


def test_the_context_is_decoded_with_the_arm64_layout_not_amd64s(info, raw):
    registers = info["registers"]
    assert (registers["pc"], registers["sp"], registers["fp"], registers["x18"]) == (PC, SP, SP, KPCR)
    assert registers["cpsr"] == 0x80000144 and "rip" not in registers
    assert struct.unpack_from("<QQ", raw, 0x348 + 0x100) == (SP, PC)
    assert info["triage"]["TopOfStack"] == SP and info["exception"]["address"] == PC


def test_245_drivers_named_as_windbg_names_them_with_nt_first(info, raw):
    drivers = info["drivers"]
    assert len(drivers) == 245 == struct.unpack_from("<I", raw, 0x2000 + 0x34)[0]
    first = drivers[0]
    assert (first["name"], first["module"], first["base"], first["size"], first["timestamp"]) == (
        "\\SystemRoot\\system32\\ntoskrnl.exe", "nt", NT_BASE, 0x103E000, 0xDF291B09)
    assert first["base"] == struct.unpack_from("<Q", raw, first["entry_offset"] + 0x38)[0]
    assert info["debugger_data"]["kernel_base"] == NT_BASE
    assert info["problems"] == []


def test_the_crashing_thread_has_its_kthread_and_stack_bounds_around_sp():
    with dbgext.open(real()) as target:
        thread = target.thread
        assert thread.kernel_thread == 0xFFFFBB8EB1719180
        assert thread.stack_limit < SP < thread.stack_base
        assert target.symbolize(PC) == "nt+0x4de014"
        resolver = PseudoRegisterResolver(target)
        assert [evaluate(text, resolver) for text in ("@pc", "@x29", "@fp", "@lr", "@$ip", "@$csp", "@sp+8")] == [
            PC, SP, SP, 0, PC, SP, SP + 8]


def test_dumpinfo_says_arm64_and_the_pc_sp_context():
    code, text, err = run(["dumpinfo", "--dump", real()])
    assert code == 0 and err == ""
    assert "Machine:          ARM64, processors: 8, build 22000" in text
    assert "Bug check:        0x1C8 (00000000`00001b58, fffff803`f3a20860, 00000000`00000000, 00000000`00000000)" in text
    assert "Context:          pc=fffff803`f32de014 sp=ffffe00e`0e4bc4a0" in text


def test_lm_lists_245_modules_with_nt_at_the_kernel_base():
    code, text, _ = run(["lm", "--dump", real(), "--json"])
    modules = json.loads(text)["modules"]
    assert code == 0 and len(modules) == 245
    nt = [module for module in modules if module["name"] == "nt"]
    assert len(nt) == 1 and nt[0]["image"] == "ntoskrnl.exe"


def test_db_dps_and_dq_read_the_kernel_header_the_stack_and_the_kpcr():
    code, text, _ = run(["db", "--dump", real(), "nt", "L10"])
    assert code == 0 and text.startswith("fffff803`f2e00000  4d 5a 90 00")
    code, text, _ = run(["dps", "--dump", real(), "@sp", "L2"])
    assert code == 0 and text.splitlines()[1] == "ffffe00e`0e4bc4a8  fffff803`f33442a0 nt+0x5442a0"
    code, text, _ = run(["dq", "--dump", real(), "@x18", "L1"])
    assert code == 0 and text.startswith("fffff803`efd00000  ")


def test_k_follows_the_x29_chain_of_the_real_stack_without_the_kernel_image():
    # No ntoskrnl.exe (so no .pdata) is at hand: the frame records x29 points at
    # give the callers.  The first is the record at sp — dps @sp shows its lr,
    # nt+0x5442a0 — and where the chain ends a scan, marked, goes on.
    code, text, err = run(["k", "--dump", real(), "-v"])
    assert code == 0
    rows = [line.split() for line in text.splitlines()[3:]]
    assert rows[0][:3] == ["00", "ffffe00e`0e4bc4a0", "fffff803`f33442a0"] and rows[0][-1] == "nt+0x4de014"
    assert rows[1][1] == "ffffe00e`0e4bc4b0" and rows[1][-2:] == ["frame_chain", "nt+0x5442a0"]
    assert "no unwind data for ntoskrnl.exe" in err
    code, text, _ = run(["k", "--dump", real(), "--json"])
    frames = json.loads(text)["frames"]
    assert [frame["found_by"] for frame in frames] == ["context"] + ["frame_chain"] * 4 + ["scan"] * 4
    # The walk ends at the thread's InitialStack (ffffe00e`0e4bcdb0).
    assert frames[-1]["child_sp"] < 0xFFFFE00E0E4BCDB0 and frames[-1]["return_address"] is None


def test_triage_names_the_bug_check_and_buckets_by_nt_offset():
    code, text, _ = run(["triage", "--dump", real(), "--json"])
    record = json.loads(text)
    assert code == 0 and record["arch"] == "arm64"
    assert (record["bugcheck_code"], record["bugcheck_name"]) == (0x1C8, "MANUALLY_INITIATED_POWER_BUTTON_HOLD")
    assert record["bucket"] == "0x1C8_nt+0x4de014"
    assert (record["faulting"]["module"], record["faulting"]["image"]) == ("nt", "ntoskrnl.exe")
    assert record["analyses"]["ipt"] == {"skipped": "Intel PT does not exist on ARM64: this target has no IPT "
                                                    "trace to decode"}


def test_ipt_on_an_arm64_target_refuses_in_one_line():
    code, out, err = run(["ipt", "scan", "--dump", real()])
    assert (code, out) == (1, "") and err.strip() == ("error: Intel PT does not exist on ARM64: this target has no "
                                                      "IPT trace to decode")
