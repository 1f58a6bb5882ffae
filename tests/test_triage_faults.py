"""Triage under storage faults and interruptions: a full disk, read-only or missing
directories, existing output files, a second run on the same database, Ctrl-C, and
outputs that name an input.  Each ends in one line and a documented exit code, and
nothing already committed is lost.  Plus the identity rule: a dump is its whole
content, so dumps that differ anywhere are both analysed."""

import contextlib
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest

from dbgext.cli import main
from dbgext.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_PROBLEMS
from dbgext.triage.store import TriageStore

from triage_support import crash_scenario, write_dump

TESTS_DIRECTORY = os.path.dirname(os.path.abspath(__file__))
PLUGIN = "triage_support:register_test_analyses"


def triage(*argv):
    import io
    stream = io.StringIO()
    code = main(["triage"] + list(argv), stream=stream)
    return code, stream.getvalue()


def sha256(path):
    with open(str(path), "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def count_dumps(db):
    with TriageStore(db, read_only=True) as store:
        return store.query("SELECT count(*) AS n, count(DISTINCT hash) AS hashes FROM dumps")[0]


def dump_directory(directory, count, first_salt=0):
    os.makedirs(str(directory), exist_ok=True)
    return [write_dump(crash_scenario(salt=first_salt + index), os.path.join(str(directory), "d%02d.dmp" % index))
            for index in range(count)]


def triage_process(argv, limit_file_size=None, markers=None):
    """``dbgext triage ARGV`` in a child process of its own process group."""
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS_DIRECTORY, os.environ.get("PYTHONPATH", "")]))
    if markers is not None:
        environment["TRIAGE_TEST_MARKERS"] = str(markers)

    def limit():
        if limit_file_size is not None:
            # Writing past RLIMIT_FSIZE fails with EFBIG (SIGXFSZ ignored): a disk that fills up.
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_size, limit_file_size))

    return subprocess.Popen([sys.executable, "-c", "import sys; from dbgext.cli import main; "
                             "sys.exit(main(sys.argv[1:]))", "triage"] + list(argv),
                            env=environment, start_new_session=True, preexec_fn=limit,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_markers(markers, count, child, seconds=60):
    deadline = time.time() + seconds
    while len(os.listdir(str(markers))) < count and time.time() < deadline and child.poll() is None:
        time.sleep(0.05)


@contextlib.contextmanager
def read_only_directory(path):
    """``path`` made unwritable, for root too (root ignores mode bits: the
    directory is made immutable instead)."""
    os.makedirs(str(path), exist_ok=True)
    if os.geteuid() == 0:
        if subprocess.call(["chattr", "+i", str(path)], stderr=subprocess.DEVNULL) != 0:
            pytest.skip("cannot make a directory read-only for root here (no chattr +i)")
        try:
            yield str(path)
        finally:
            subprocess.call(["chattr", "-i", str(path)])
    else:
        os.chmod(str(path), 0o555)
        try:
            yield str(path)
        finally:
            os.chmod(str(path), 0o755)


def one_line(text):
    return len(text.strip().splitlines()) == 1 and "Traceback" not in text


@pytest.fixture(scope="module")
def crash_dump(tmp_path_factory):
    return write_dump(crash_scenario(salt=1), str(tmp_path_factory.mktemp("faults") / "crash.dmp"))


# -- outputs never overwrite inputs ---------------------------------------------------

def test_out_naming_the_dump_is_refused_and_the_dump_is_untouched(crash_dump):
    before = sha256(crash_dump)
    code, text = triage("--dump", crash_dump, "--out", crash_dump, "--json")
    assert code == EXIT_ERROR and one_line(text) and "is one of the inputs" in text
    assert sha256(crash_dump) == before


def test_out_naming_the_dump_through_another_path_is_refused_too(crash_dump, tmp_path):
    link = tmp_path / "alias.dmp"
    os.symlink(crash_dump, str(link))
    code, text = triage("--dump", crash_dump, "--out", str(link))
    assert code == EXIT_ERROR and "is one of the inputs" in text


def test_db_naming_a_dump_to_triage_is_refused(tmp_path):
    dumps = dump_directory(tmp_path / "dumps", 1)
    before = sha256(dumps[0])
    code, text = triage(dumps[0], "--db", dumps[0])
    assert code == EXIT_ERROR and one_line(text) and "--db %s is one of the inputs" % dumps[0] in text
    assert sha256(dumps[0]) == before


def test_an_existing_out_file_is_replaced_only_with_force(crash_dump, tmp_path):
    out = tmp_path / "record.json"
    out.write_text("keep me")
    code, text = triage("--dump", crash_dump, "--out", str(out), "--analyses", "rtltrace")
    assert code == EXIT_ERROR and one_line(text) and "already exists (give --force" in text
    assert out.read_text() == "keep me"
    code, text = triage("--dump", crash_dump, "--out", str(out), "--analyses", "rtltrace", "--force")
    assert code == EXIT_OK and json.loads(out.read_text())["bucket"] == "0xD1_mydrv!DispatchIoctl"
    assert [name for name in os.listdir(str(tmp_path)) if name != "record.json"] == []   # no temporary left


def test_out_into_a_missing_directory_is_one_line(crash_dump, tmp_path):
    code, text = triage("--dump", crash_dump, "--out", str(tmp_path / "no" / "such" / "record.json"),
                        "--analyses", "rtltrace")
    assert code == EXIT_ERROR and one_line(text) and "cannot write" in text


def test_out_into_a_read_only_directory_is_one_line(crash_dump, tmp_path):
    with read_only_directory(tmp_path / "locked") as locked:
        code, text = triage("--dump", crash_dump, "--out", os.path.join(locked, "record.json"),
                            "--analyses", "rtltrace")
        assert code == EXIT_ERROR and one_line(text) and "cannot write" in text
        assert os.listdir(locked) == []


# -- the database and its exports --------------------------------------------------------

@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    base = tmp_path_factory.mktemp("recorded")
    dumps = dump_directory(base / "dumps", 2)
    db = str(base / "r.duckdb")
    code, text = triage(str(base / "dumps"), "--db", db, "--analyses", "rtltrace", "--no-progress")
    assert code == EXIT_OK, text
    return db, dumps


def test_parquet_onto_an_existing_export_is_refused_unless_forced(recorded, tmp_path):
    db, _ = recorded
    export = tmp_path / "pq"
    assert triage("report", "--db", db, "--parquet", str(export))[0] == EXIT_OK
    stamp = os.path.getmtime(str(export / "dumps.parquet"))
    code, text = triage("report", "--db", db, "--parquet", str(export))
    assert code == EXIT_ERROR and "already exists (replace it to export again)" in text
    assert os.path.getmtime(str(export / "dumps.parquet")) == stamp
    assert triage("report", "--db", db, "--parquet", str(export), "--force")[0] == EXIT_OK


def test_parquet_into_a_read_only_or_impossible_directory_is_one_line(recorded, tmp_path):
    db, _ = recorded
    with read_only_directory(tmp_path / "locked") as locked:
        code, text = triage("report", "--db", db, "--parquet", locked)
        assert code == EXIT_ERROR and "cannot export to %s" % locked in text
        assert os.listdir(locked) == []   # no half-written export
    (tmp_path / "a-file").write_text("x")
    code, text = triage("report", "--db", db, "--parquet", str(tmp_path / "a-file"))
    assert code == EXIT_ERROR and "it is a file, not a directory" in text


def test_a_database_in_a_missing_directory_is_one_line(tmp_path):
    dumps = dump_directory(tmp_path / "dumps", 1)
    code, text = triage(dumps[0], "--db", str(tmp_path / "no" / "such" / "r.duckdb"), "--no-progress")
    assert code == EXIT_ERROR and "directory %s does not exist" % (tmp_path / "no" / "such") in text


def test_a_database_in_a_read_only_directory_is_one_line(tmp_path):
    dumps = dump_directory(tmp_path / "dumps", 1)
    with read_only_directory(tmp_path / "locked") as locked:
        code, text = triage(dumps[0], "--db", os.path.join(locked, "r.duckdb"), "--no-progress")
        assert code == EXIT_ERROR and one_line(text.replace("\r", "")) and "triage database" in text


def test_a_full_disk_ends_the_batch_in_one_line_and_keeps_what_was_committed(tmp_path):
    dump_directory(tmp_path / "dumps", 24)
    db = str(tmp_path / "full.duckdb")
    # Enough room for the empty database and a few records' log, not for 24.
    child = triage_process([str(tmp_path / "dumps"), "--db", db, "--workers", "1", "--no-progress",
                            "--analyses", "rtltrace"], limit_file_size=48 * 1024)
    _, error = child.communicate(timeout=300)
    error = error.decode()
    assert child.returncode == EXIT_ERROR, error
    assert one_line(error) and "cannot write triage database %s" % db in error
    assert "committed before are kept" in error
    kept = count_dumps(db)
    assert 0 < kept["n"] < 24 and kept["n"] == kept["hashes"]
    # With room again, the same command finishes the job without duplicates.
    code, text = triage(str(tmp_path / "dumps"), "--db", db, "--analyses", "rtltrace", "--no-progress", "--json")
    assert code == EXIT_OK and json.loads(text)["skipped"] == kept["n"]
    assert count_dumps(db) == {"n": 24, "hashes": 24}


# -- two runs, Ctrl-C -------------------------------------------------------------------------

def slow_run(tmp_path, dumps, started):
    """A run over ``dumps`` new dumps with one worker and an analysis that takes its
    time, once ``started`` dumps are under way: (process, database)."""
    dump_directory(tmp_path / "dumps", dumps)
    markers = tmp_path / "markers"
    markers.mkdir()
    db = str(tmp_path / "slow.duckdb")
    child = triage_process([str(tmp_path / "dumps"), "--db", db, "--workers", "1", "--no-progress",
                            "--plugin", PLUGIN, "--analyses", "test-slow"], markers=markers)
    wait_for_markers(markers, started, child)
    return child, db


def test_a_second_run_on_a_database_in_use_refuses_in_one_line(tmp_path):
    first, db = slow_run(tmp_path, 24, started=1)   # about 6 s of work: the others start meanwhile
    second = triage_process([str(tmp_path / "dumps"), "--db", db, "--no-progress", "--analyses", "rtltrace"])
    report = triage_process(["report", "--db", db])
    _, error = second.communicate(timeout=120)
    _, report_error = report.communicate(timeout=120)
    assert first.poll() is None, "the first run ended before the others could meet it"
    _, first_error = first.communicate(timeout=120)
    assert second.returncode == EXIT_ERROR and one_line(error.decode())
    assert "is in use by another process (PID %d)" % first.pid in error.decode()
    assert report.returncode == EXIT_ERROR and "in use by another process" in report_error.decode()
    assert first.returncode == EXIT_OK, first_error.decode()
    assert count_dumps(db) == {"n": 24, "hashes": 24}


def test_ctrl_c_ends_the_batch_as_interrupted_and_keeps_committed_dumps(tmp_path):
    child, db = slow_run(tmp_path, 6, started=3)
    os.killpg(child.pid, signal.SIGINT)        # what the terminal sends the whole process group
    _, error = child.communicate(timeout=120)
    error = error.decode()
    assert child.returncode == EXIT_INTERRUPTED, error
    assert error.strip() == "interrupted"      # no traceback from the workers or DuckDB
    kept = count_dumps(db)
    assert 1 <= kept["n"] < 6 and kept["n"] == kept["hashes"]
    code, text = triage(str(tmp_path / "dumps"), "--db", db, "--plugin", PLUGIN, "--analyses", "test-slow",
                        "--no-progress", "--json")
    assert code == EXIT_OK and json.loads(text)["skipped"] == kept["n"]
    assert count_dumps(db) == {"n": 6, "hashes": 6}


# -- identity is content ------------------------------------------------------------------------

def old_sampled_offsets(size, chunk=0x10000, samples=16):
    """Where the former sampled key looked: head, tail and 16 evenly spaced 64 KiB samples."""
    step = (size - chunk) // (samples + 1)
    return [0] + [step * (index + 1) for index in range(samples)] + [size - chunk]


def test_dumps_equal_on_every_sampled_byte_but_different_elsewhere_are_both_analysed(tmp_path):
    directory = tmp_path / "dumps"
    directory.mkdir()
    scenario = crash_scenario(salt=3)
    scenario.alloc_pages(0x300000)               # a dump over 3 MiB, as real ones are
    first = write_dump(scenario, str(directory / "first.dmp"))
    second = str(directory / "second.dmp")
    shutil.copyfile(first, second)
    size = os.path.getsize(first)
    offset = next(at for at in range(0x20000, size, 0x1000)
                  if all(not start <= at < start + 0x10000 for start in old_sampled_offsets(size)))
    with open(second, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))
    db = str(tmp_path / "identity.duckdb")
    code, text = triage(str(directory), "--db", db, "--analyses", "rtltrace", "--no-progress", "--json")
    assert code == EXIT_OK, text
    summary = json.loads(text)
    assert (summary["analysed"], summary["skipped"]) == (2, 0)
    assert count_dumps(db) == {"n": 2, "hashes": 2}


def test_a_file_rewritten_in_place_is_hashed_again(tmp_path):
    dumps = dump_directory(tmp_path / "dumps", 1)
    db = str(tmp_path / "rewritten.duckdb")
    assert triage(dumps[0], "--db", db, "--analyses", "rtltrace", "--no-progress")[0] == EXIT_OK
    stat = os.stat(dumps[0])
    write_dump(crash_scenario(salt=9), dumps[0])
    os.utime(dumps[0], ns=(stat.st_atime_ns, stat.st_mtime_ns))   # even with its old modification time
    code, text = triage(dumps[0], "--db", db, "--analyses", "rtltrace", "--no-progress", "--json")
    assert code == EXIT_OK and json.loads(text)["analysed"] == 1
    assert count_dumps(db)["n"] == 2


def test_a_path_that_is_gone_is_reported_not_recorded(tmp_path):
    dumps = dump_directory(tmp_path / "dumps", 2)
    os.remove(dumps[1])
    db = str(tmp_path / "r.duckdb")
    code, text = triage(dumps[0], dumps[1], "--db", db, "--analyses", "rtltrace", "--no-progress", "--json")
    assert code == EXIT_PROBLEMS
    summary = json.loads(text)
    assert summary["analysed"] == 1 and "no such file or directory: %s" % dumps[1] in summary["unreadable"]


# -- memory follows content -----------------------------------------------------------------------

def test_a_minidump_claiming_a_4_gib_image_is_triaged_in_bounded_memory(tmp_path):
    from triage_support import APP_BASE, user_crash_scenario, write_user_dump
    path = write_user_dump(user_crash_scenario(salt=1), str(tmp_path / "claims.mdmp"))
    data = bytearray(open(path, "rb").read())
    modules = [at for at in range(0, len(data) - 12, 4)
               if data[at:at + 8] == APP_BASE.to_bytes(8, "little") and data[at + 8:at + 12] == b"\0\x80\0\0"]
    data[modules[0] + 8:modules[0] + 12] = b"\xff\xff\xff\xff"     # SizeOfImage 0xFFFFFFFF
    open(path, "wb").write(data)
    # A fresh parent whose only child is the triage run reports that run's peak memory.
    measure = ("import resource, subprocess, sys; "
               "run = subprocess.run([sys.executable, '-m', 'dbgext', 'triage', 'record', '--dump', sys.argv[1], "
               "'--json'], stdout=subprocess.PIPE); "
               "print(run.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
               "print(run.stdout.decode())")
    child = subprocess.run([sys.executable, "-c", measure, path], stdout=subprocess.PIPE, timeout=300)
    first_line, document = child.stdout.decode().split("\n", 1)
    code, peak_kib = (int(value) for value in first_line.split())
    assert code == EXIT_OK and json.loads(document)["bucket"] == "0xC0000005_app!ParseRequest"
    assert peak_kib < 300 * 1024
