"""The DuckDB store and the WER-like report, over hand-made records (no dumps)."""

import os
import subprocess
import sys

import pytest

from dbgext.errors import DbgextError
from dbgext.problems import Problem
from dbgext.triage.record import DumpRecord, failed_record
from dbgext.triage.report import build_report, render_report
from dbgext.triage.signature import CrashFrame, bucket_key
from dbgext.triage.store import TriageStore
from dbgext.render.output import Output
from requirements import need_file

DRIVER_BASE = 0xFFFFF80001000000


def frame(signature, offset=0x2040, timestamp=0x5F3C2A10, symbols=True):
    """The faulting frame ``module!function`` at ``offset`` in its module; without
    ``symbols`` only module+offset is known."""
    module = signature.split("!")[0]
    return CrashFrame(DRIVER_BASE + offset, "bugcheck_argument",
                      name="%s+0x%x" % (signature, 0x40) if symbols else "%s+0x%x" % (module, offset),
                      module=module, image=module + ".sys", module_offset=offset,
                      function=signature if symbols else None, function_offset=0x40 if symbols else None,
                      module_timestamp=timestamp, module_size=0x10000)


def crash(key, signature, code=0xD1, hour=1, hogs=(), problems=(), path=None, symbols=True, offset=0x2040,
          timestamp=0x5F3C2A10):
    record = DumpRecord(path or "/dumps/%s.dmp" % key, 1000, key)
    record.kind, record.arch, record.build = "kernel-dump", "x64", 19041
    record.system_time = "2024-09-06T%02d:00:00Z" % hour
    record.bugcheck_code, record.bugcheck_parameters = code, [1, 2, 0, DRIVER_BASE + offset]
    record.faulting = frame(signature, offset, timestamp, symbols)
    record.frames = [CrashFrame(0xFFFFF80000001000, "context", "nt!KeBugCheckEx"), record.faulting]
    record.bucket, record.bucket_basis = bucket_key(code, record.faulting)
    if hogs:
        record.analyses["stackuse"] = {"used": 9000, "limit": 24576,
                                       "biggest_frames": [{"function": f, "bytes": b} for f, b in hogs]}
    for analysis, kind, message in problems:
        record.problems_of(analysis).add(kind, 0xFFFFC08000000000, message)
    return record


@pytest.fixture
def store():
    with TriageStore(":memory:") as opened:
        yield opened


def test_each_dump_is_one_row_and_a_second_add_of_the_same_hash_is_ignored(store):
    assert store.add(crash("h1", "mydrv!DispatchIoctl")) is True
    assert store.add(crash("h1", "mydrv!DispatchIoctl", path="/elsewhere/copy.dmp")) is False
    assert store.count("dumps") == 1 and store.count("frames") == 2
    assert store.query("SELECT path FROM dumps") == [{"path": "/dumps/h1.dmp"}]


def test_child_rows_hang_off_the_dump_hash(store):
    store.add(crash("h1", "mydrv!DispatchIoctl", hogs=[("mydrv!Big", 4096)],
                    problems=[("rtltrace", "segment_cycle", "segment chain loops")]))
    assert store.query("SELECT position, name, how FROM frames ORDER BY position") == [
        {"position": 0, "name": "nt!KeBugCheckEx", "how": "context"},
        {"position": 1, "name": "mydrv!DispatchIoctl+0x40", "how": "bugcheck_argument"}]
    assert store.query("SELECT analysis, kind, severity, address, \"offset\", message FROM problems") == [
        {"analysis": "rtltrace", "kind": "segment_cycle", "severity": "error", "address": 0xFFFFC08000000000,
         "offset": None, "message": "segment chain loops"}]
    assert store.query("SELECT function, frame_bytes FROM stack_hogs") == [
        {"function": "mydrv!Big", "frame_bytes": 4096}]
    assert store.record("h1")["signature"] == "mydrv!DispatchIoctl"
    row = store.query("SELECT bugcheck_code, bugcheck_parameters, bucket, bucket_basis, image, module_timestamp, "
                      "module_size, module_offset, function, status, analyses FROM dumps")[0]
    assert row == {"bugcheck_code": 0xD1, "bugcheck_parameters": [1, 2, 0, 0xFFFFF80001002040],
                   "bucket": "0xD1_mydrv!DispatchIoctl", "bucket_basis": "symbol", "image": "mydrv.sys",
                   "module_timestamp": 0x5F3C2A10, "module_size": 0x10000, "module_offset": 0x2040,
                   "function": "mydrv!DispatchIoctl", "status": "ok", "analyses": ["stackuse"]}


def test_problems_keep_their_kind_and_severity_in_their_own_columns(store):
    record = crash("h1", "mydrv!F")
    record.problems_of("rtltrace").append(Problem("bad_magic", None, "no database here", "warning"))
    store.add(record)
    assert store.query("SELECT kind, severity FROM problems") == [{"kind": "bad_magic", "severity": "warning"}]


def test_a_failed_row_is_kept_unless_a_retry_replaces_it(store):
    store.add(failed_record("/d/x.dmp", 10, "hx", "timed out after 5 s (worker killed)"))
    assert store.add(crash("hx", "mydrv!F")) is False
    assert store.add(crash("hx", "mydrv!F"), replace_failed=True) is True
    assert store.query("SELECT status, reason, bucket FROM dumps") == [
        {"status": "ok", "reason": None, "bucket": "0xD1_mydrv!F"}]
    assert store.add(crash("hx", "other!G"), replace_failed=True) is False  # an ok row is never replaced


def test_the_report_buckets_by_bugcheck_and_faulting_function(store):
    store.add(crash("a1", "mydrv!DispatchIoctl", hour=3))
    store.add(crash("a2", "mydrv!DispatchIoctl", hour=1))
    store.add(crash("a3", "mydrv!DispatchIoctl", hour=2))
    store.add(crash("b1", "mydrv!DispatchIoctl", code=0x7E, hour=4))
    store.add(crash("c1", "netdrv!ProcessPacket", code=0x7E, hour=5))
    store.add(failed_record("/dumps/bad.dmp", 10, "bad", "cannot open dump: truncated"))
    report = build_report(store, top=10, examples=2)
    assert report["totals"]["dumps"] == 6 and report["totals"]["ok"] == 5 and report["totals"]["failed"] == 1
    first = report["buckets"][0]
    assert (first["bucket"], first["basis"], first["dumps"]) == ("0xD1_mydrv!DispatchIoctl", "symbol", 3)
    assert (first["image"], first["module_timestamp"]) == ("mydrv.sys", 0x5F3C2A10)
    assert (first["first_seen"], first["last_seen"]) == ("2024-09-06T01:00:00Z", "2024-09-06T03:00:00Z")
    assert first["examples"] == ["/dumps/a2.dmp", "/dumps/a3.dmp"]  # oldest first
    assert sorted(b["bucket"] for b in report["buckets"][1:]) == ["0x7E_mydrv!DispatchIoctl",
                                                                  "0x7E_netdrv!ProcessPacket"]
    assert report["failures"] == [{"path": "/dumps/bad.dmp", "reason": "cannot open dump: truncated"}]


def test_the_report_ranks_stack_hogs_and_lists_suspicious_dumps(store):
    store.add(crash("a", "x!F", hogs=[("mydrv!Big", 4096), ("nt!Small", 64)],
                    problems=[("rtltrace", "bucket_cycle", "bucket chain loops"),
                              ("rtltrace", "bad_magic", "bad magic"), ("stackuse", "dynamic_frame", "dynamic frame")]))
    store.add(crash("b", "x!F", hogs=[("mydrv!Big", 3000), ("net!Mid", 512)],
                    problems=[("etwstacks", "free_list_cycle", "free list cycle")]))
    report = build_report(store, top=2)
    assert report["stack_hogs"] == [{"function": "mydrv!Big", "biggest_frame": 4096, "dumps": 2},
                                    {"function": "net!Mid", "biggest_frame": 512, "dumps": 1}]
    assert [(s["path"], s["analysis"], s["problems"]) for s in report["suspicious"]] == [
        ("/dumps/a.dmp", "rtltrace", 2), ("/dumps/b.dmp", "etwstacks", 1)]
    assert {(k["analysis"], k["kind"]): k["dumps"] for k in report["problem_kinds"]}[("rtltrace", "bad_magic")] == 1


def test_a_dump_analysed_without_symbols_joins_the_bucket_its_image_build_got_by_name(store):
    store.add(crash("named", "mydrv!CopyLeaf", offset=0x2040))
    store.add(crash("bare", "mydrv!CopyLeaf", offset=0x2040, symbols=False))
    store.add(crash("other-build", "mydrv!CopyLeaf", offset=0x2040, symbols=False, timestamp=0x60000000))
    buckets = {(b["bucket"], b["module_timestamp"]): b for b in build_report(store)["buckets"]}
    assert buckets[("0xD1_mydrv!CopyLeaf", 0x5F3C2A10)]["dumps"] == 2
    assert buckets[("0xD1_mydrv!CopyLeaf", 0x5F3C2A10)]["basis"] == "symbol"
    assert buckets[("0xD1_mydrv!CopyLeaf", 0x5F3C2A10)]["joined_by_image_build"] == 1
    # Another build of the driver: the same offset is other code, so it stays apart, by offset.
    assert buckets[("0xD1_mydrv+0x2040", 0x60000000)]["basis"] == "offset"


def test_the_report_renders_as_text_tables(store):
    import io
    store.add(crash("a", "mydrv!DispatchIoctl"))
    stream = io.StringIO()
    render_report(Output(stream), build_report(store))
    text = stream.getvalue()
    assert "0xD1_mydrv!DispatchIoctl" in text and "DRIVER_IRQL" not in text and "1 dumps: 1 ok, 0 failed" in text


def test_an_empty_database_reports_zeros(store):
    report = build_report(store)
    assert report["totals"]["dumps"] == 0 and report["buckets"] == [] and report["failures"] == []


def test_tables_export_to_parquet(store, tmp_path):
    store.add(crash("a", "mydrv!DispatchIoctl", hogs=[("mydrv!Big", 4096)]))
    paths = store.export_parquet(str(tmp_path / "out"))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == [
        "dumps.parquet", "files.parquet", "frames.parquet", "problems.parquet", "stack_hogs.parquet",
        "summaries.parquet"]
    rows = store.query("SELECT signature FROM read_parquet(?)", [str(tmp_path / "out" / "dumps.parquet")])
    assert rows == [{"signature": "mydrv!DispatchIoctl"}]


def test_a_missing_database_is_a_clear_error_for_the_report(tmp_path):
    with pytest.raises(DbgextError, match="no triage database"):
        TriageStore(str(tmp_path / "none.duckdb"), read_only=True)


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path):
    path = tmp_path / "junk.duckdb"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(DbgextError, match="triage database .*junk.duckdb"):
        TriageStore(str(path))


def test_a_database_of_the_old_schema_is_refused_by_name(tmp_path):
    import duckdb
    path = str(tmp_path / "old.duckdb")
    connection = duckdb.connect(path)
    connection.execute("CREATE TABLE dumps (hash VARCHAR PRIMARY KEY)")
    connection.close()
    with pytest.raises(DbgextError, match="schema version 1.*use a new database"):
        TriageStore(path)


# -- across Python versions --------------------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# scripts/test.sh's other venv, beside the one running the tests: the newest DuckDB
# under the default Python (.venv), the last one for 3.8, 1.2 (.venv38).
OTHER_PYTHON = os.environ.get("DBGEXT_OTHER_PYTHON") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(sys.executable))),
    ".venv" if sys.version_info < (3, 9) else ".venv38", "bin", "python")
READ_BACK = ("import sys; from dbgext.triage.store import TriageStore\n"
             "with TriageStore(sys.argv[1], read_only=True) as store:\n"
             "    print(sorted(store.status_by_hash().items()))\n")


def test_a_database_written_here_is_read_by_the_other_supported_python_and_its_duckdb(tmp_path):
    other = need_file(OTHER_PYTHON, "scripts/test.sh makes both venvs; or set DBGEXT_OTHER_PYTHON")
    path = str(tmp_path / "results.duckdb")
    with TriageStore(path) as written:
        written.add(crash("a" * 64, "mydrv!CopyLeaf"))
        written.add(crash("b" * 64, "otherdrv!Parse", code=0x50))
    versions = subprocess.run([other, "-c", "import duckdb, sys; print(sys.version_info[:2], duckdb.__version__)"],
                              stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    import duckdb
    assert duckdb.__version__ not in versions   # a real cross-version check
    read = subprocess.run([other, "-c", READ_BACK, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    assert read.returncode == 0, read.stderr
    assert read.stdout.strip() == "[('%s', 'ok'), ('%s', 'ok')]" % ("a" * 64, "b" * 64)
