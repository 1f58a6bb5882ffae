"""The pykd backend on an ARM64 target: the fake pykd (tests/fake_pykd.py) poses
as WinDbg on the real ARM64 small dump (getCPUType/getCPUMode ARM64, the dump's
registers by WinDbg's ARM64 names), and the backend reads x0-x28, fp, lr, sp, pc
and cpsr, which ``@reg`` in addresses and the ``!py`` scripts then use."""

import re
from pathlib import Path

import pytest

from dbgext.address import evaluate
from dbgext.pseudo_registers import PseudoRegisterResolver
from dbgext.errors import BadInput, DbgextError
from dbgext.target.base import Target
from dbgext.target.pykd_backend import PykdBackend

from fake_pykd import make_fake_pykd
from pykd_support import run_windbg_script

ARM64 = Path(__file__).resolve().parents[1].parent / "shared" / "realworld" / "kernel" / "rizin__triage_arm64.dmp"
PC, SP, KPCR = 0xFFFFF803F32DE014, 0xFFFFE00E0E4BC4A0, 0xFFFFF803EFD00000


def real():
    if not ARM64.is_file():
        pytest.fail("%s is missing: the real-world files live in ../shared/realworld" % ARM64)
    return str(ARM64)


@pytest.fixture(scope="module")
def fake():
    return make_fake_pykd(real())


def test_the_fake_reports_an_arm64_cpu_and_the_backend_takes_it_for_arm64(fake):
    assert fake.getCPUType() == fake.CPUType.ARM64 == fake.getCPUMode()
    assert (fake.getIP(), fake.getSP(), fake.getFP()) == (PC, SP, SP)
    backend = PykdBackend(fake)
    assert (backend.arch, backend.address_mask) == ("arm64", (1 << 64) - 1)


def test_the_backend_reads_windbgs_arm64_register_names(fake):
    registers = Target(PykdBackend(fake)).thread.registers
    assert sorted(registers) == sorted(["x%d" % n for n in range(29)] + ["fp", "lr", "sp", "pc", "cpsr"])
    assert (registers["pc"], registers["sp"], registers["x18"], registers["cpsr"]) == (PC, SP, KPCR, 0x80000144)


def test_at_registers_in_addresses_resolve_on_the_arm64_session(fake):
    target = Target(PykdBackend(fake))
    resolver = PseudoRegisterResolver(target)
    assert [evaluate(text, resolver) for text in ("@pc", "@lr", "@sp", "@x0", "@x18+8", "@$ip")] == [
        PC, 0, SP, target.thread.registers["x0"], KPCR + 8, PC]
    with pytest.raises(BadInput, match="no such register in the arm64 context"):
        evaluate("@rip", resolver)


def test_a_32_bit_arm_session_is_refused_in_one_line(fake):
    class ArmSession(object):
        CPUType = fake.CPUType

        def __getattr__(self, name):
            return getattr(fake, name)

        def getCPUMode(self):
            return fake.CPUType.ARM

    with pytest.raises(DbgextError, match="32-bit ARM"):
        PykdBackend(ArmSession())


def test_the_dps_script_in_windbg_reads_the_stack_at_at_sp():
    text, _ = run_windbg_script("dps", ["@sp", "L2"], real())
    shown = re.sub(r"<[^>]+>", "", text)   # the DML links' text, as WinDbg shows it
    assert "ffffe00e`0e4bc4a8  fffff803`f33442a0 nt+0x5442a0" in shown
