"""``dbgext triage`` as one dump's record (offline ``--dump`` and inside WinDbg
through ``commands/triage.py``) and its usage errors."""

import io
import json

import pytest

from dbgext.cli import main

from pykd_support import run_windbg_script
from triage_support import crash_scenario, user_crash_scenario, write_dump, write_user_dump


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
    assert record["path"] == crash_dump and record["kind"] == "kernel-dump" and len(record["hash"]) == 64
    assert (record["bugcheck_code"], record["signature"]) == (0xD1, "mydrv!DispatchIoctl")
    assert record["system_time"] == "2024-09-06T02:56:33Z" and record["status"] == "ok"
    assert list(record["analyses"]) in ([], ["rtltrace"])   # absent when rtltrace is not installed


def test_one_dump_record_as_text(crash_dump):
    code, text = triage("--dump", crash_dump)
    assert code == 0, text
    assert "bug check  0xD1 (0x11, 0x2, 0x0, 0xfffff80001002041)" in text
    assert "signature  mydrv!DispatchIoctl" in text and "  03 mydrv!DispatchIoctl" in text
    assert "status     ok" in text


def test_a_minidump_record_names_its_exception(tmp_path):
    path = write_user_dump(user_crash_scenario(salt=1), str(tmp_path / "app.mdmp"))
    code, text = triage("--dump", path, "--analyses", "etwstacks")
    assert code == 0, text
    assert "exception  0xC0000005" in text and "signature  app!ParseRequest" in text


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
    assert record["frames"][0] == "nt!KeBugCheckEx"


def test_inside_windbg_the_record_can_be_written_to_a_json_file(tmp_path):
    out = tmp_path / "record.json"
    text, _ = run_windbg_script("triage", ["--analyses", "etwstacks", "--out", str(out)], crash_scenario(salt=3))
    assert "signature  mydrv!DispatchIoctl" in text
    assert json.loads(out.read_text())["signature"] == "mydrv!DispatchIoctl"


def test_inside_windbg_the_text_record_has_no_traceback():
    text, _ = run_windbg_script("triage", ["--analyses", "rtltrace,ipt"], crash_scenario(salt=2))
    assert "signature  mydrv!DispatchIoctl" in text and "Traceback" not in text


@pytest.mark.parametrize("argv, message", [
    ([], "give dump PATHs to triage"),
    (["report", "extra"], "'triage report' takes no paths"),
    (["some.dmp", "--dump", "other.dmp"], "give dump PATHs or --dump FILE, not both"),
    (["x.dmp", "--workers", "0"], "--workers must be at least 1"),
    (["--dump", "x.dmp", "--analyses", "nonsense"], "unknown analysis nonsense"),
])
def test_usage_mistakes_are_one_line_errors(argv, message, tmp_path):
    code, text = triage(*argv)
    assert code == 1 and message in text and "Traceback" not in text


def test_the_report_of_a_missing_database_says_how_to_make_one(tmp_path):
    pytest.importorskip("duckdb")
    code, text = triage("report", "--db", str(tmp_path / "none.duckdb"))
    assert code == 1 and "run `dbgext triage PATH... --db" in text
