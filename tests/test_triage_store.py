"""The DuckDB store and the WER-like report, over hand-made records (no dumps)."""

import pytest

pytest.importorskip("duckdb")

from dbgext.errors import DbgextError  # noqa: E402
from dbgext.triage.record import DumpRecord, failed_record  # noqa: E402
from dbgext.triage.report import build_report, render_report  # noqa: E402
from dbgext.triage.store import TriageStore  # noqa: E402
from dbgext.render.output import Output  # noqa: E402


def crash(key, signature, code=0xD1, hour=1, hogs=(), problems=(), path=None):
    record = DumpRecord(path or "/dumps/%s.dmp" % key, 1000, key)
    record.kind, record.arch, record.build = "kernel-dump", "x64", 19041
    record.system_time = "2024-09-06T%02d:00:00Z" % hour
    record.bugcheck_code, record.bugcheck_parameters = code, [1, 2, 0, 0xFFFFF80001002040]
    record.frames = ["nt!KeBugCheckEx", signature]
    record.signature = signature
    if hogs:
        record.analyses["stackuse"] = {"used": 9000, "limit": 24576,
                                       "biggest_frames": [{"function": f, "bytes": b} for f, b in hogs]}
    for analysis, message in problems:
        record.add_problem(analysis, message, 0xFFFFC08000000000)
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
                    problems=[("rtltrace", "segment chain loops")]))
    assert store.query("SELECT position, frame FROM frames ORDER BY position") == [
        {"position": 0, "frame": "nt!KeBugCheckEx"}, {"position": 1, "frame": "mydrv!DispatchIoctl"}]
    assert store.query("SELECT analysis, message, address FROM problems") == [
        {"analysis": "rtltrace", "message": "segment chain loops", "address": 0xFFFFC08000000000}]
    assert store.query("SELECT function, frame_bytes FROM stack_hogs") == [
        {"function": "mydrv!Big", "frame_bytes": 4096}]
    assert store.record("h1")["signature"] == "mydrv!DispatchIoctl"
    row = store.query("SELECT bugcheck_code, bugcheck_parameters, status, analyses FROM dumps")[0]
    assert row == {"bugcheck_code": 0xD1, "bugcheck_parameters": [1, 2, 0, 0xFFFFF80001002040],
                   "status": "ok", "analyses": ["stackuse"]}


def test_a_failed_row_is_kept_unless_a_retry_replaces_it(store):
    store.add(failed_record("/d/x.dmp", 10, "hx", "timed out after 5 s (worker killed)"))
    assert store.add(crash("hx", "mydrv!F")) is False
    assert store.add(crash("hx", "mydrv!F"), replace_failed=True) is True
    assert store.query("SELECT status, reason, signature FROM dumps") == [
        {"status": "ok", "reason": None, "signature": "mydrv!F"}]
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
    assert (first["bugcheck_code"], first["signature"], first["dumps"]) == (0xD1, "mydrv!DispatchIoctl", 3)
    assert (first["first_seen"], first["last_seen"]) == ("2024-09-06T01:00:00Z", "2024-09-06T03:00:00Z")
    assert first["examples"] == ["/dumps/a2.dmp", "/dumps/a3.dmp"]  # oldest first
    assert sorted((b["bugcheck_code"], b["signature"]) for b in report["buckets"][1:]) == [
        (0x7E, "mydrv!DispatchIoctl"), (0x7E, "netdrv!ProcessPacket")]
    assert report["failures"] == [{"path": "/dumps/bad.dmp", "reason": "cannot open dump: truncated"}]


def test_the_report_ranks_stack_hogs_and_lists_suspicious_dumps(store):
    store.add(crash("a", "x!F", hogs=[("mydrv!Big", 4096), ("nt!Small", 64)],
                    problems=[("rtltrace", "bucket chain loops"), ("rtltrace", "bad magic"),
                              ("stackuse", "dynamic frame")]))
    store.add(crash("b", "x!F", hogs=[("mydrv!Big", 3000), ("net!Mid", 512)],
                    problems=[("etwstacks", "free list cycle")]))
    report = build_report(store, top=2)
    assert report["stack_hogs"] == [{"function": "mydrv!Big", "biggest_frame": 4096, "dumps": 2},
                                    {"function": "net!Mid", "biggest_frame": 512, "dumps": 1}]
    assert [(s["path"], s["analysis"], s["problems"]) for s in report["suspicious"]] == [
        ("/dumps/a.dmp", "rtltrace", 2), ("/dumps/b.dmp", "etwstacks", 1)]


def test_the_report_renders_as_text_tables(store):
    import io
    store.add(crash("a", "mydrv!DispatchIoctl"))
    stream = io.StringIO()
    render_report(Output(stream), build_report(store))
    text = stream.getvalue()
    assert "0xD1 mydrv!DispatchIoctl" in text and "1 dumps: 1 ok, 0 failed" in text


def test_an_empty_database_reports_zeros(store):
    report = build_report(store)
    assert report["totals"]["dumps"] == 0 and report["buckets"] == [] and report["failures"] == []


def test_tables_export_to_parquet(store, tmp_path):
    store.add(crash("a", "mydrv!DispatchIoctl", hogs=[("mydrv!Big", 4096)]))
    paths = store.export_parquet(str(tmp_path / "out"))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == [
        "dumps.parquet", "frames.parquet", "problems.parquet", "stack_hogs.parquet", "summaries.parquet"]
    rows = store.query("SELECT signature FROM read_parquet(?)", [str(tmp_path / "out" / "dumps.parquet")])
    assert rows == [{"signature": "mydrv!DispatchIoctl"}]


def test_a_missing_database_is_a_clear_error_for_the_report(tmp_path):
    with pytest.raises(DbgextError, match="no triage database"):
        TriageStore(str(tmp_path / "none.duckdb"), read_only=True)


def test_a_file_that_is_not_a_database_is_a_clear_error(tmp_path):
    path = tmp_path / "junk.duckdb"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(DbgextError, match="cannot open triage database"):
        TriageStore(str(path))
