"""Real kernel small memory dumps (../shared/realworld/kernel/) read as WinDbg
reads them.  The values below can be checked by hand in the file: the header
(0x38 bug check, 0x1038 MiniDumpFields), TRIAGE_DUMP64 at 0x2000, the driver list
and its string pool of full paths, and the DumpBlob records after SizeOfDump."""

import json

import pytest

import dbgext
from realworld import REALWORLD, real_file, run

KERNEL = REALWORLD / "kernel"
X64 = KERNEL / "rizin__triage_x64.dmp"

NT_BASE = 0xFFFFF8047BA00000
AMDPPM_BASE = 0xFFFFF8048B580000


real = real_file


@pytest.fixture(scope="module")
def info():
    with dbgext.open(real(X64)) as target:
        return target.info()


def test_the_header_facts_of_the_real_x64_small_dump(info):
    assert (info["dump_type"], info["build"], info["processors"]) == (4, 19041, 16)
    assert info["bugcheck"] == [0x1000007E, 0xFFFFFFFFC0000005, AMDPPM_BASE + 0x334C, 0xFFFF850429891EE8,
                                0xFFFF850429891720]
    assert info["registers"]["rip"] == AMDPPM_BASE + 0x334C


def test_triage_options_all_ones_is_no_overflow_and_no_problem_is_reported(info):
    assert info["triage"]["TriageOptions"] == 0xFFFFFFFF
    assert info["triage_overflowed"] is False
    assert info["problems"] == []   # 1,831 data blocks, overlapping ones hold the same bytes


def test_mini_dump_fields_0xcff_leave_the_mm_bit_clear_but_the_data_blocks_mapped(info):
    assert info["minidump_fields"] == ["context", "exception", "prcb", "process", "thread", "stack", "driver_list",
                                       "broken_driver", "debugger_data", "data_blocks"]
    parts = [part["what"] for part in info["parts"]]
    assert parts.count("data page") == 0 and "data block 1830" in parts and "KDDEBUGGER_DATA64" in parts
    assert info["mm"]["Version"] == 1 and info["mm"]["Size"] == 0x50


def test_drivers_keep_their_paths_and_modules_take_windbgs_names(info):
    drivers = info["drivers"]
    assert len(drivers) == 151
    assert (drivers[0]["name"], drivers[0]["module"], drivers[0]["base"], drivers[0]["timestamp"]) == (
        "\\SystemRoot\\system32\\ntoskrnl.exe", "nt", NT_BASE, 0x0D8333E6)
    amdppm = [d for d in drivers if d["module"] == "amdppm"]
    assert [(d["name"], d["base"], d["size"], d["timestamp"], d["checksum"]) for d in amdppm] == [
        ("\\SystemRoot\\System32\\drivers\\amdppm.sys", AMDPPM_BASE, 0x3B000, 0xC9C03000, 0x38E6B)]


def test_unloaded_driver_names_are_cut_at_twelve_characters(info):
    assert [d["name"] for d in info["unloaded_drivers"]] == ["dam.sys", "WdBoot.sys", "hwpolicy.sys", "mcupdate.dll"]


def test_the_dumpblob_records_after_size_of_dump_are_listed(info):
    blobs = info["secondary_data"]
    assert len(blobs) == 20
    assert (blobs[0]["tag"], blobs[0]["size"], blobs[0]["offset"]) == (
        "54c84888-01d1-4c1e-bed6-282c98241303", 0x1000, 0x13A2BC)
    assert info["triage"]["SizeOfDump"] == 0x13A28C and X64.stat().st_size - 0x13A28C == 157736
    last = blobs[-1]
    assert last["offset"] + last["size"] + 4 == X64.stat().st_size   # its PostPad ends the file


def test_dumpinfo_text_shows_modules_paths_and_secondary_data():
    code, text, err = run(["dumpinfo", "--dump", real(X64)])
    assert code == 0 and err == ""
    assert "Machine:          x64 (AMD64), processors: 16, build 19041" in text
    assert "Bug check:        0x1000007E (ffffffff`c0000005, fffff804`8b58334c," in text
    assert "Overflowed" not in text and "overlaps" not in text
    lines = text.splitlines()
    nt = [line for line in lines if line.startswith("fffff804`7ba00000  fffff804`7ca46000")]
    assert nt and nt[0].split()[2:5] == ["nt", "0D8333E6", "A5938C"] and nt[0].endswith("ntoskrnl.exe")
    assert "Secondary data after SizeOfDump (20 DumpBlob records" in text


def test_lm_shows_nt_and_amdppm_and_lm_m_finds_one():
    code, text, _ = run(["lm", "--dump", real(X64), "--json"])
    assert code == 0
    modules = json.loads(text)["modules"]
    names = [m["name"] for m in modules]
    assert len(modules) == 151 and "nt" in names and "amdppm" in names
    assert not any("\\" in name for name in names)
    code, text, _ = run(["lm", "m", "amdppm", "--dump", real(X64)])
    rows = [line for line in text.splitlines() if line.startswith("fffff804")]
    assert code == 0 and [row.split()[:4] for row in rows] == [
        ["fffff804`8b580000", "fffff804`8b5bb000", "amdppm", "amdppm.sys"]]


def test_db_nt_reads_the_kernels_header_page():
    code, text, _ = run(["db", "--dump", real(X64), "nt", "L10"])
    assert code == 0 and text.startswith("fffff804`7ba00000  4d 5a 90 00")


def test_k_and_triage_name_the_faulting_module_amdppm():
    code, text, _ = run(["k", "--dump", real(X64)])
    assert code == 0 and "amdppm+0x334c" in text and "SystemRoot" not in text
    code, text, _ = run(["triage", "--dump", real(X64), "--json"])
    record = json.loads(text)
    assert code == 0 and record["bucket"] == "0x1000007E_amdppm+0x334c"
    assert (record["faulting"]["module"], record["faulting"]["image"]) == ("amdppm", "amdppm.sys")
