"""``dumpinfo`` says what a dump is and holds: the header, the dump type, the
parts a small dump maps, KDDEBUGGER_DATA64 and where structure offsets come from."""

import io
import json
import os

import pytest

import dbgext
from dbgext.cli import main
from dbgext.dumpinfo import DumpInfoResult, analyze
from dbgext.sample.kdump_writer import write_kernel_dump

from dumps_support import DRIVER_BASE, kernel_scenario, small_dump, user_scenario
from minidump_writer import write_minidump


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dumpinfo") / "Mini112326-01.dmp")
    small_dump().write(path)
    return path


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stream=out, error_stream=err)
    return code, out.getvalue(), err.getvalue()


def test_analyze_returns_a_result_with_the_dumps_facts(small):
    result = analyze(dbgext.open(small))
    assert isinstance(result, DumpInfoResult)
    assert result.get("dump_type") == 4 and result.get("kind") == "kernel-small-dump"
    assert result.system_time.startswith("20") and result.system_time.endswith("Z")
    assert list(result.problems) == []


def test_the_text_report_of_a_small_dump(small):
    code, text, err = run(["dumpinfo", "--dump", small])
    assert code == 0 and err == ""
    assert "Dump type:        4, kernel-small-dump: small memory dump" in text
    assert "Bug check:        0xD1 (ffffc080`00400ff8, 00000000`00000002" in text
    assert "_KTHREAD   from KDDEBUGGER_DATA64" in text
    assert "Mapped parts (everything else is unreadable):" in text
    assert "Drivers (3), the broken one: mydrv.sys:" in text
    assert "oldfilter.sy" in text and "MmSpecialPoolTag 0x6c6f6f50" in text
    assert "Note:             a small memory dump holds only" in text


def test_the_json_document_of_a_small_dump(small):
    code, text, _ = run(["dumpinfo", "--dump", small, "--json"])
    assert code == 0
    document = json.loads(text)
    assert list(document)[0] == "schema_version" and document["schema_version"] == 1
    assert document["dump_type"] == 4
    assert [part["what"] for part in document["parts"]][:3] == ["stack", "data page", "data block 0"]
    assert document["drivers"][1]["base"] == DRIVER_BASE
    assert {layout["type"]: layout["source"] for layout in document["layouts"]}["_EPROCESS"] == "KDDEBUGGER_DATA64"
    assert document["unloaded_drivers"][0]["name"] == "oldfilter.sy"
    assert document["mm"]["CommittedPages"] == 0x9ABC
    assert document["problems"] == []


def test_a_full_dump_reports_its_physical_page_count(tmp_path):
    path = write_kernel_dump(kernel_scenario(seed=71, blobs=2), str(tmp_path / "full.dmp"))
    # A full dump is its 0x2000-byte header followed by every physical page it holds.
    pages = (os.path.getsize(path) - 0x2000) // 0x1000
    code, text, _ = run(["dumpinfo", "--dump", path])
    assert code == 0 and pages > 100
    assert "Dump type:        1, kernel-dump" in text and "Physical memory:  %d pages (" % pages in text
    assert "KDDEBUGGER_DATA64: none in this dump" in text
    assert "_KPRCB     from built-in tables" in text


def test_problems_of_a_damaged_small_dump_are_listed(small, tmp_path):
    import struct
    from dbgext.layouts.dump_formats import TRIAGE_DUMP64
    data = bytearray(open(small, "rb").read())
    struct.pack_into("<I", data, TRIAGE_DUMP64["offset"] + TRIAGE_DUMP64["ValidOffset"], len(data) + 64)
    damaged = str(tmp_path / "damaged.dmp")
    open(damaged, "wb").write(bytes(data))
    code, text, _ = run(["dumpinfo", "--dump", damaged])
    assert code == 0 and "error triage_valid_offset at offset 0x" in text
    document = json.loads(run(["dumpinfo", "--dump", damaged, "--json"])[1])
    assert [p["kind"] for p in document["problems"]] == ["triage_valid_offset"]


def test_a_minidump_gets_the_facts_it_has(tmp_path):
    path = str(tmp_path / "user.mdmp")
    write_minidump(user_scenario("x64", seed=72, blobs=1), path)
    code, text, _ = run(["dumpinfo", "--dump", path])
    assert code == 0 and "minidump (user mode)" in text
    assert "Structure offsets" not in text
