"""Real minidumps (../shared/realworld/minidumps/): the module list's image
timestamps and sizes reach triage records and buckets, and ``dumpinfo`` says
which platform wrote a dump (the SystemInfo stream), with its CPU, version and
service pack, and prints addresses at the target's pointer width.  The values
can be checked by hand in the files' SystemInfo and ModuleList streams."""

import json

import pytest

import dbgext
from dbgext.triage import analyze as triage_analyze
from realworld import REALWORLD, real_file, run

MINIDUMPS = REALWORLD / "minidumps"


def real(name):
    return real_file(MINIDUMPS / name)


def test_triage_keeps_the_module_lists_image_timestamp_and_size():
    code, out, _ = run(["triage", "--dump", real("breakpad__tiny-exe-fastfail.dmp"), "--json"])
    assert code == 0
    faulting = json.loads(out)["faulting"]
    assert (faulting["module"], faulting["image"], faulting["module_timestamp"], faulting["module_size"]) == (
        "tiny", "tiny.exe", 0x62D66DAA, 0x101000)
    code, out, _ = run(["triage", "--dump", real("breakpad__tiny-exe-fastfail.dmp")])
    assert "IMAGE_TIMESTAMP:  62d66daa, size 0x101000" in out


def test_an_offset_bucket_carries_the_image_build():
    with dbgext.open(real("breakpad__tiny-exe-fastfail.dmp")) as target:
        record = triage_analyze(target)
    assert record.bucket == "0xC0000409_tiny+0x1af42"
    assert (record.faulting.module_timestamp, record.faulting.module_size) == (0x62D66DAA, 0x101000)


def test_an_x86_windows_xp_minidump_says_its_system_and_prints_32_bit_addresses():
    code, out, err = run(["dumpinfo", "--dump", real("breakpad__minidump2.dmp")])
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert "Machine:          x86, processors: 1 (family 6, model 0xd, stepping 8, GenuineIntel)" in lines
    assert "System:           Windows 5.1 build 2600, workstation, Service Pack 2" in lines
    assert "System time:      2007-02-14T19:13:55Z" in lines
    assert "Context:          eip=0040429e esp=0012fe84" in lines
    assert "Exception:        0xC0000005 at 0040429e in thread 0xbf4, parameters 00000001, 00000045" in lines
    assert "Modules (13):" in lines
    assert any(line.startswith("00400000  0042d000  test_app  45D35F6C") for line in lines)
    assert "`" not in out   # no 64-bit address anywhere


@pytest.mark.parametrize("name, system, machine", [
    ("rustmd__simple-crashpad.dmp", "macOS 10.15.7 (build 19H114)", "x64, processors: 12"),
    ("rustmd__linux-mini.dmp", "Linux (Linux 4.9.60-linuxkit-aufs #1 SMP Mon Nov 6 16:00:12 UTC 2017 x86_64)",
     "x64, processors: 4 (family 6, model 0x46, stepping 1, GenuineIntel)"),
    ("breakpad__tiny-exe-fastfail.dmp", "Windows 10.0 build 19042, workstation", "x64, processors: 36")])
def test_dumpinfo_names_the_platform_that_wrote_the_dump(name, system, machine):
    code, out, _ = run(["dumpinfo", "--dump", real(name)])
    assert code == 0
    assert "System:           %s\n" % system in out
    assert "Machine:          %s" % machine in out
    document = json.loads(run(["dumpinfo", "--dump", real(name), "--json"])[1])
    assert document["platform"] == system.split(" ")[0]
