"""Triage over a directory of generated dumps through the command line: records,
buckets, failure rows (corrupt, truncated, analysis exception, hang past the
timeout), idempotent re-runs, a run killed with SIGKILL and resumed, and the Dask
path on a LocalCluster started by the test."""

import glob
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from dbgext.cli import main
from dbgext.errors import EXIT_PROBLEMS
from dbgext.triage.store import TriageStore

import triage_support
from requirements import need_module
from triage_support import crash_scenario, write_dump, write_triage_directory

TESTS_DIRECTORY = os.path.dirname(os.path.abspath(__file__))
PLUGIN = "triage_support:register_test_analyses"
TIMEOUT = "2"
DASK_TIMEOUT = "4"   # each Dask task starts a fresh interpreter inside its time budget


def triage(*argv):
    stream = io.StringIO()
    code = main(["triage"] + list(argv), stream=stream)
    return code, stream.getvalue()


def rows(db, sql, parameters=None):
    with TriageStore(db, read_only=True) as store:
        return store.query(sql, parameters)


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """One run over the full directory (2 workers): (directory, dumps made, db, summary)."""
    base = tmp_path_factory.mktemp("triage")
    made = write_triage_directory(str(base / "dumps"), hang=True, explode=True)
    db = str(base / "results.duckdb")
    code, text = triage(str(base / "dumps"), "--db", db, "--workers", "2", "--timeout", TIMEOUT,
                        "--plugin", PLUGIN, "--analyses", "test-hang,test-explode", "--json")
    assert code == EXIT_PROBLEMS, text   # the run worked and some dumps failed
    return str(base / "dumps"), made, db, json.loads(text)


def test_every_dump_in_the_tree_is_recorded_once_and_other_files_are_ignored(batch):
    directory, made, db, summary = batch
    assert summary["found"] == len(made) and summary["analysed"] == len(made) and summary["skipped"] == 0
    recorded = rows(db, "SELECT path FROM dumps ORDER BY path")
    assert sorted(r["path"] for r in recorded) == sorted(path for path, _ in made.values())
    assert not any(r["path"].endswith("notes.txt") for r in recorded)


def test_good_dumps_get_full_records(batch):
    directory, made, db, summary = batch
    for name, (path, expectation) in made.items():
        if expectation[0] != "ok":
            continue
        row = rows(db, "SELECT * FROM dumps WHERE path = ?", [path])[0]
        assert (row["status"], row["bugcheck_code"], row["signature"]) == expectation, name
        assert row["bucket"] == "0x%X_%s" % (expectation[1], expectation[2]) and row["bucket_basis"] == "symbol"
        assert row["size"] == os.path.getsize(path)
        assert row["hash"] == hashlib.sha256(open(path, "rb").read()).hexdigest()
        assert row["arch"] == "x64" and row["build"] in (19041, 19042, 19043, 22621)
        assert row["system_time"] is not None and row["analyses"] == ["test-hang", "test-explode"]
    kinds = {r["kind"] for r in rows(db, "SELECT kind FROM dumps WHERE status = 'ok'")}
    assert kinds == {"kernel-dump", "kernel-bitmap-dump", "live-kernel-dump", "minidump"}


def test_bad_dumps_become_failed_rows_with_the_reason(batch):
    directory, made, db, summary = batch
    failed = {r["path"]: r["reason"] for r in rows(db, "SELECT path, reason FROM dumps WHERE status = 'failed'")}
    expected = {path: expectation[1] for path, expectation in made.values() if expectation[0] == "failed"}
    assert set(failed) == set(expected) and summary["failed"] == len(expected)
    for path, fragment in expected.items():
        assert fragment in failed[path], (path, failed[path])


def test_an_analysis_problem_is_stored_with_its_address(batch):
    directory, made, db, summary = batch
    problems = rows(db, "SELECT analysis, kind, severity, message, address FROM problems "
                        "WHERE analysis = 'test-explode'")
    assert problems and all(p == {"analysis": "test-explode", "kind": "test_problem", "severity": "warning",
                                  "message": "test problem", "address": 0x1000} for p in problems)


def test_the_report_buckets_dumps_sharing_a_crash(batch):
    directory, made, db, summary = batch
    code, text = triage("report", "--db", db, "--json")
    assert code == 0, text
    report = json.loads(text)
    buckets = {b["bucket"]: b for b in report["buckets"]}
    assert buckets["0xD1_mydrv!DispatchIoctl"]["dumps"] == 3
    assert buckets["0xD1_mydrv!DispatchIoctl"]["bugcheck_name"] == "DRIVER_IRQL_NOT_LESS_OR_EQUAL"
    assert buckets["0xD1_mydrv!DispatchIoctl"]["image"] == "mydrv.sys"
    assert buckets["0x7E_netdrv!ProcessPacket"]["dumps"] == 2
    assert buckets["0x161_netdrv!CompleteRequest"]["bugcheck_name"] == "LIVE_SYSTEM_DUMP"
    assert buckets["0xC0000005_app!ParseRequest"]["dumps"] == 2     # minidumps: the exception code
    assert buckets["0xC0000005_app!ParseRequest"]["bugcheck_name"] == "ACCESS_VIOLATION"
    assert report["buckets"][0]["bucket"] == "0xD1_mydrv!DispatchIoctl"
    assert len(report["failures"]) == 4
    code, text = triage("report", "--db", db, "--top", "1")
    assert code == 0 and "0xD1_mydrv!DispatchIoctl" in text and "Failed dumps" in text


def test_a_rerun_is_idempotent(batch):
    directory, made, db, summary = batch
    before = rows(db, "SELECT count(*) AS n FROM dumps")[0]["n"]
    code, text = triage(directory, "--db", db, "--timeout", TIMEOUT, "--plugin", PLUGIN, "--json")
    assert code == 0, text
    again = json.loads(text)
    assert again["analysed"] == 0 and again["skipped"] == len(made)
    assert rows(db, "SELECT count(*) AS n FROM dumps")[0]["n"] == before
    assert rows(db, "SELECT count(*) AS n FROM (SELECT hash FROM dumps GROUP BY hash HAVING count(*) > 1)")[0]["n"] == 0


def test_a_copy_of_a_recorded_dump_is_recognised_by_content(batch, tmp_path):
    directory, made, db, summary = batch
    copy = tmp_path / "renamed.dmp"
    copy.write_bytes(open(made["a1.dmp"][0], "rb").read())
    code, text = triage(str(copy), "--db", db, "--json")
    assert code == 0 and json.loads(text)["skipped"] == 1
    # The copy's path is remembered with its hash: the next run does not read it again.
    code, text = triage(str(copy), "--db", db, "--json", "--plugin", PLUGIN, "--analyses", "test-explode")
    assert json.loads(text)["skipped"] == 1


def test_retry_failed_analyses_failed_dumps_again_in_place(tmp_path):
    good = write_dump(crash_scenario(salt=20), str(tmp_path / "good.dmp"))
    db = str(tmp_path / "r.duckdb")
    code, text = triage(good, "--db", db, "--plugin", PLUGIN, "--analyses", "test-explode", "--json")
    assert json.loads(text)["failed"] == 0
    # Pretend the first run had failed, then retry.
    with TriageStore(db) as store:
        store.connection.execute("UPDATE dumps SET status = 'failed', reason = 'worker died'")
    code, text = triage(good, "--db", db, "--json")
    assert json.loads(text)["skipped"] == 1
    code, text = triage(good, "--db", db, "--retry-failed", "--json")
    assert json.loads(text)["analysed"] == 1
    assert rows(db, "SELECT status, reason FROM dumps") == [{"status": "ok", "reason": None}]


def test_globs_and_files_can_be_mixed_and_paths_that_match_nothing_are_reported(batch, tmp_path):
    directory, made, db, summary = batch
    code, text = triage(os.path.join(directory, "a*.dmp"), str(tmp_path / "missing.dmp"), "--db", db)
    assert code == EXIT_PROBLEMS   # a path that matched nothing is a problem of the run
    assert "3 dumps found, 3 already recorded" in text and "no such file or directory" in text


def test_nothing_to_triage_is_a_one_line_error_and_creates_no_database(tmp_path):
    code, text = triage(str(tmp_path / "nothing-here"), "--db", str(tmp_path / "x.duckdb"))
    assert code == 1 and text.startswith("error: no such file or directory")
    (tmp_path / "empty").mkdir()
    code, text = triage(str(tmp_path / "empty"), "--db", str(tmp_path / "x.duckdb"))
    assert code == 1 and text.startswith("error: no dump files under")
    assert not (tmp_path / "x.duckdb").exists()


def test_a_run_killed_midway_loses_nothing_done_and_resumes(tmp_path):
    directory = tmp_path / "dumps"
    directory.mkdir()
    for salt in range(5):
        write_dump(crash_scenario(salt=30 + salt), str(directory / ("d%d.dmp" % salt)))
    markers = tmp_path / "markers"
    markers.mkdir()
    db = str(tmp_path / "k.duckdb")
    argv = ["triage", str(directory), "--db", db, "--workers", "1", "--plugin", PLUGIN,
            "--analyses", "test-slow", "--no-progress"]
    environment = dict(os.environ, TRIAGE_TEST_MARKERS=str(markers),
                       PYTHONPATH=os.pathsep.join([TESTS_DIRECTORY, os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen([sys.executable, "-c", "import sys; from dbgext.cli import main; "
                              "sys.exit(main(sys.argv[1:]))"] + argv,
                             env=environment, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while len(os.listdir(str(markers))) < 3 and time.time() < deadline and child.poll() is None:
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert len(os.listdir(str(markers))) < 5, "the run finished before it could be killed"

    os.environ["TRIAGE_TEST_MARKERS"] = ""
    try:
        code, text = triage(*(argv[1:] + ["--json"]))
    finally:
        del os.environ["TRIAGE_TEST_MARKERS"]
    assert code == 0, text
    resumed = json.loads(text)
    assert resumed["skipped"] >= 1 and resumed["skipped"] + resumed["analysed"] == 5
    assert rows(db, "SELECT count(*) AS n, count(DISTINCT hash) AS distinct_hashes FROM dumps") == [
        {"n": 5, "distinct_hashes": 5}]
    assert rows(db, "SELECT DISTINCT status FROM dumps") == [{"status": "ok"}]


def test_the_dask_path_records_good_failed_and_hung_dumps(tmp_path):
    need_module("distributed", "dask[distributed]")
    from distributed import LocalCluster

    directory = tmp_path / "dumps"
    directory.mkdir()
    write_dump(crash_scenario("mydrv", "DispatchIoctl", 0xD1, salt=40), str(directory / "a.dmp"))
    write_dump(crash_scenario("mydrv", "DispatchIoctl", 0xD1, salt=41), str(directory / "b.dmp"))
    (directory / "corrupt.dmp").write_bytes(b"PAGEDU64" + b"\xff" * 0x3000)
    write_dump(crash_scenario("mydrv", "ProcessPacket", triage_support.HANG_BUGCHECK, salt=42),
               str(directory / "hang.dmp"))
    db = str(tmp_path / "dask.duckdb")
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        code, text = triage(str(directory), "--db", db, "--dask", cluster.scheduler_address,
                            "--timeout", DASK_TIMEOUT, "--plugin", PLUGIN, "--analyses", "test-hang", "--json")
    assert code == EXIT_PROBLEMS, text
    assert json.loads(text)["analysed"] == 4
    found = {os.path.basename(r["path"]): r for r in rows(db, "SELECT path, status, reason, signature FROM dumps")}
    assert found["a.dmp"]["signature"] == found["b.dmp"]["signature"] == "mydrv!DispatchIoctl"
    assert "cannot open dump" in found["corrupt.dmp"]["reason"]
    assert "timed out" in found["hang.dmp"]["reason"]
    assert rows(db, "SELECT hash FROM dumps WHERE path LIKE '%hang.dmp'")[0]["hash"] == hashlib.sha256(
        open(str(directory / "hang.dmp"), "rb").read()).hexdigest()   # the hash line came before the hang


def test_parquet_export_from_a_run(batch, tmp_path):
    directory, made, db, summary = batch
    code, text = triage("report", "--db", db, "--parquet", str(tmp_path / "pq"), "--json")
    assert code == 0
    assert sorted(os.path.basename(p) for p in glob.glob(str(tmp_path / "pq" / "*"))) == [
        "dumps.parquet", "files.parquet", "frames.parquet", "problems.parquet", "stack_hogs.parquet",
        "summaries.parquet"]



def test_a_dump_without_symbols_lands_in_the_bucket_its_driver_build_got_by_name(tmp_path):
    directory = tmp_path / "dumps"
    directory.mkdir()
    # Same driver build, same faulting instruction (offsets repeat every 16 salts).
    write_dump(crash_scenario(salt=1), str(directory / "named.dmp"))
    write_dump(crash_scenario(salt=17), str(directory / "bare.dmp"), symbols=False)
    db = str(tmp_path / "symbols.duckdb")
    code, text = triage(str(directory), "--db", db, "--analyses", "rtltrace", "--no-progress")
    assert code == 0, text
    assert {(r["bucket"], r["bucket_basis"]) for r in rows(db, "SELECT bucket, bucket_basis FROM dumps")} == {
        ("0xD1_mydrv!DispatchIoctl", "symbol"), ("0xD1_mydrv+0x2041", "offset")}
    code, text = triage("report", "--db", db, "--json")
    buckets = json.loads(text)["buckets"]
    assert [(b["bucket"], b["basis"], b["dumps"], b["joined_by_image_build"], b["image"], b["module_timestamp"])
            for b in buckets] == [("0xD1_mydrv!DispatchIoctl", "symbol", 2, 1, "mydrv.sys",
                                   triage_support.DRIVER_TIMESTAMP)]
