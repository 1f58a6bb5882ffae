"""``dbgext triage`` as one dump's record (offline ``--dump`` and inside WinDbg
through ``commands/triage.py``) and its usage errors."""

import io
import json

import pytest

from dbgext.cli import main

from pykd_support import run_windbg_script
from triage_support import DRIVER_TIMESTAMP, crash_scenario, user_crash_scenario, write_dump, write_user_dump


def triage(*argv):
    stream = io.StringIO()
    code = main(["triage"] + list(argv), stream=stream)
    return code, stream.getvalue()


@pytest.fixture(scope="module")
def crash_dump(tmp_path_factory):
    return write_dump(crash_scenario("mydrv", "DispatchIoctl", 0xD1, salt=1),
                      str(tmp_path_factory.mktemp("one") / "crash.dmp"))


def test_one_dump_record_as_json(crash_dump):
    code, text = triage("--dump", crash_dump, "--json", "--analyses", "rtltrace")
    assert code == 0, text
    record = json.loads(text)
    assert list(record)[0] == "schema_version" and record["schema_version"] == 1
    assert record["path"] == crash_dump and record["kind"] == "kernel-dump" and len(record["hash"]) == 64
    assert (record["bugcheck_code"], record["signature"]) == (0xD1, "mydrv!DispatchIoctl")
    assert (record["bucket"], record["bucket_basis"]) == ("0xD1_mydrv!DispatchIoctl", "symbol")
    assert record["faulting"]["image"] == "mydrv.sys" and record["faulting"]["module_timestamp"] == DRIVER_TIMESTAMP
    assert record["system_time"] == "2024-09-06T02:56:33Z" and record["status"] == "ok"
    assert list(record["analyses"]) in ([], ["rtltrace"])   # absent when rtltrace is not installed


def test_one_dump_record_as_text_reads_like_analyze_v(crash_dump):
    code, text = triage("record", "--dump", crash_dump, "--analyses", "rtltrace")
    assert code == 0, text
    lines = text.splitlines()
    assert "DRIVER_IRQL_NOT_LESS_OR_EQUAL (d1)" in lines
    assert "Arg1: 00000000`00000011, memory referenced" in lines
    assert "Arg4: fffff800`01002041, address of the instruction that referenced the memory" in lines
    assert any(line.startswith("FAULTING_IP:      mydrv!DispatchIoctl+0x41 (fffff800`01002041), stack frame found by")
               for line in lines)
    assert "IMAGE_NAME:       mydrv.sys" in lines and "IMAGE_TIMESTAMP:  5f3c2a10, size 0x10000" in lines
    assert "BUCKET_ID:        0xD1_mydrv!DispatchIoctl (by symbol)" in lines
    assert "00 fffff800`00001000 nt!KeBugCheckEx  (context)" in lines
    assert any(line.startswith("03 fffff800`01002041 mydrv!DispatchIoctl+0x41  (") for line in lines)
    assert any(line.startswith("STATUS:           ok") for line in lines)
    assert "{" not in text and "18446" not in text   # no Python dicts, no decimal addresses


def test_triage_with_a_dump_and_no_action_word_is_the_record(crash_dump):
    implicit, explicit = (json.loads(triage(*argv)[1]) for argv in (
        ("--dump", crash_dump, "--json"), ("record", "--dump", crash_dump, "--json")))
    assert (implicit["hash"], implicit["bucket"]) == (explicit["hash"], explicit["bucket"])


def test_a_minidump_record_names_its_exception(tmp_path):
    path = write_user_dump(user_crash_scenario(salt=1), str(tmp_path / "app.mdmp"))
    code, text = triage("--dump", path, "--analyses", "etwstacks")
    assert code == 0, text
    assert "ACCESS_VIOLATION (c0000005)" in text and "SYMBOL_NAME:      app!ParseRequest" in text
    assert "BUCKET_ID:        0xC0000005_app!ParseRequest (by symbol)" in text


def test_a_corrupt_dump_given_with_dump_is_a_one_line_error(tmp_path):
    path = tmp_path / "bad.dmp"
    path.write_bytes(b"PAGEDU64" + b"\xff" * 0x2000)
    code, text = triage("--dump", str(path))
    assert code == 1 and text.startswith("error: ") and len(text.strip().splitlines()) == 1


def test_inside_windbg_the_script_prints_the_current_targets_record():
    text, _ = run_windbg_script("triage", ["--json", "--analyses", "etwstacks"],
                                crash_scenario("netdrv", "ProcessPacket", 0x7E, salt=4))
    record = json.loads(text)
    assert record["path"] is None and record["hash"] is None
    assert (record["bugcheck_code"], record["signature"]) == (0x7E, "netdrv!ProcessPacket")
    assert record["bucket"] == "0x7E_netdrv!ProcessPacket"


def test_inside_windbg_the_record_can_be_written_to_a_json_file(tmp_path):
    out = tmp_path / "record.json"
    text, _ = run_windbg_script("triage", ["--analyses", "etwstacks", "--out", str(out)], crash_scenario(salt=3))
    assert "BUCKET_ID:        0xD1_mydrv!DispatchIoctl (by symbol)" in text
    assert json.loads(out.read_text())["signature"] == "mydrv!DispatchIoctl"


def test_inside_windbg_the_text_record_has_no_traceback():
    text, _ = run_windbg_script("triage", ["--analyses", "rtltrace,ipt"], crash_scenario(salt=2))
    assert "BUCKET_ID:        0xD1_mydrv!DispatchIoctl (by symbol)" in text and "Traceback" not in text


@pytest.mark.parametrize("argv, message", [
    ([], "give dump PATHs to triage"),
    (["record"], "triage record needs --dump FILE"),
    (["some.dmp", "--dump", "other.dmp"], "give dump PATHs or --dump FILE, not both"),
    (["x.dmp", "--workers", "0"], "--workers must be at least 1"),
    (["--dump", "x.dmp", "--analyses", "nonsense"], "unknown analysis nonsense"),
])
def test_usage_mistakes_are_one_line_errors(argv, message, tmp_path):
    code, text = triage(*argv)
    assert code == 1 and message in text and "Traceback" not in text


def test_the_report_takes_no_paths_as_a_usage_error():
    code, text = triage("report", "extra")
    assert code == 2 and "unrecognized arguments: extra" in text


def test_each_action_has_its_own_help():
    for action, words in (("run", "PATH"), ("report", "--top"), ("record", "--out")):
        code, text = triage(action, "--help")
        assert code == 0 and words in text and "usage: dbgext triage %s" % action in text


def test_the_report_of_a_missing_database_says_how_to_make_one(tmp_path):
    code, text = triage("report", "--db", str(tmp_path / "none.duckdb"))
    assert code == 1 and "no triage database at" in text and "a triage run over dumps makes one" in text


def test_a_small_dump_record_shows_its_unloaded_drivers_mm_information_and_image_timestamps(tmp_path):
    from dumps_support import small_dump
    path = str(tmp_path / "Mini112326-01.dmp")
    small_dump().write(path)
    code, text = triage("record", "--dump", path, "--json", "--analyses", "rtltrace")
    assert code == 0, text
    record = json.loads(text)
    assert record["dump"]["unloaded_drivers"][0] == {"name": "oldfilter.sy", "start": 0xFFFFF80013000000,
                                                     "end": 0xFFFFF80013010000}
    assert record["dump"]["mm"]["CommittedPages"] == 0x9ABC and record["dump"]["broken_driver"] == "mydrv.sys"
    # No image headers in a small dump: the timestamp comes from its own driver list.
    assert (record["faulting"]["module_timestamp"], record["faulting"]["module_size"]) == (0x61000001, 0x6000)
    assert (record["bucket"], record["bucket_basis"]) == ("0xD1_mydrv+0x1234", "offset")
    code, text = triage("record", "--dump", path, "--analyses", "rtltrace")
    assert "UNLOADED_DRIVERS: name oldfilter.sy, start fffff800`13000000, end fffff800`13010000" in text
    assert "IMAGE_TIMESTAMP:  61000001, size 0x6000" in text and "CommittedPages 39612" in text


def test_analysis_summaries_in_the_text_record_show_addresses_windbg_style(tmp_path):
    from dbgext.sample import write_sample
    code, text = triage("record", "--dump", write_sample(str(tmp_path)), "--analyses", "rtltrace,stackuse")
    assert code == 0, text
    assert "per_database: address ffffc080`00000000, traces 300" in text
    assert "{'" not in text and "': " not in text and "18446" not in text   # no Python dicts, no decimal addresses
