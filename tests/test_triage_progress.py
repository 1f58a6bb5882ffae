"""The progress bar (done/failed/remaining, throughput, ETA) and the local pool's
handling of workers that die or hang, and path expansion."""

import io
import os

from dbgext.triage.progress import Progress, format_duration, progress_line
from dbgext.triage.run import LocalPool, expand_paths, make_task


class Clock(object):
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_the_line_shows_done_failed_remaining_rate_and_eta():
    assert progress_line(40, 12, 2, 36.0) == (
        "[#######-----------------] 12/40  failed 2  remaining 28  20.0 dumps/min  eta 1m24s")


def test_before_anything_is_done_there_is_no_rate():
    assert progress_line(10, 0, 0, 0.0) == "[------------------------] 0/10  failed 0  remaining 10"


def test_a_finished_batch_has_no_eta():
    assert progress_line(3, 3, 1, 6.0).endswith("remaining 0  30.0 dumps/min")


def test_an_empty_batch_is_complete():
    assert progress_line(0, 0, 0, 0.0).startswith("[########################] 0/0")


def test_durations_read_naturally():
    assert [format_duration(s) for s in (5, 84, 3725)] == ["5s", "1m24s", "1h02m"]


def test_on_a_pipe_lines_are_printed_at_most_every_interval_and_at_the_end():
    stream, clock = io.StringIO(), Clock()
    progress = Progress(stream, interval=5.0, clock=clock)
    progress.start(4)
    for step in range(4):
        clock.now += 1.0
        progress.advance(failed=step == 1)
    progress.finish()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].endswith("0/4  failed 0  remaining 4")
    assert "4/4  failed 1  remaining 0  60.0 dumps/min" in lines[1]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_the_bar_redraws_in_place():
    stream, clock = Terminal(), Clock()
    progress = Progress(stream, clock=clock)
    progress.start(2)
    clock.now += 30.0
    progress.advance()
    clock.now += 30.0
    progress.advance(failed=True)
    progress.finish()
    draws = stream.getvalue().split("\r")[1:]
    assert len(draws) == 3
    assert draws[1].rstrip() == "[############------------] 1/2  failed 0  remaining 1  2.0 dumps/min  eta 30s"
    assert draws[2] == "[########################] 2/2  failed 1  remaining 0  2.0 dumps/min".ljust(
        len(draws[1])) + "\n"


def test_a_plugin_or_file_a_worker_cannot_load_fails_only_its_dump(tmp_path):
    (tmp_path / "other.dmp").write_bytes(b"PAGEDU64" + b"\0" * 100)
    missing_file = make_task(str(tmp_path / "missing.dmp"), (0, 0, 0))
    missing_plugin = make_task(str(tmp_path / "other.dmp"), (108, 0, 0), plugins=["no_such_triage_plugin"])
    records = {os.path.basename(task["path"]): record
               for task, record in LocalPool(workers=1, timeout=30).run([missing_plugin, missing_file])}
    assert records["other.dmp"]["status"] == "failed" and len(records["other.dmp"]["hash"]) == 64
    assert records["other.dmp"]["reason"].startswith("cannot load analyses: cannot import triage plug-in")
    # A file that cannot even be read has no content, so no hash: the batch reports it, the store never sees it.
    assert records["missing.dmp"]["hash"] is None and records["missing.dmp"]["reason"].startswith("cannot read")


def test_a_worker_process_that_dies_is_replaced_and_the_batch_goes_on(tmp_path, monkeypatch):
    # A worker killed mid-dump is what a parser dying of a signal looks like.
    tasks = []
    for index in range(3):
        (tmp_path / ("d%d.dmp" % index)).write_bytes(b"PAGEDU64" + bytes([index]) * 100)
        tasks.append(make_task(str(tmp_path / ("d%d.dmp" % index)), (108, 0, 0)))
    pool = LocalPool(workers=1, timeout=30)
    started = []
    original_start = pool._start

    def start_and_kill_first():
        slot = original_start()
        started.append(slot)
        if len(started) == 1:
            slot.process.kill()   # the first worker dies before answering
        return slot

    monkeypatch.setattr(pool, "_start", start_and_kill_first)
    records = {os.path.basename(task["path"]): record for task, record in pool.run(tasks)}
    assert set(records) == {"d0.dmp", "d1.dmp", "d2.dmp"} and len(started) == 2
    assert "worker process died" in records["d0.dmp"]["reason"] and records["d0.dmp"]["hash"] is None
    assert all("cannot open dump" in records[name]["reason"] and len(records[name]["hash"]) == 64
               for name in ("d1.dmp", "d2.dmp"))


def test_paths_expand_to_dump_files_only_inside_directories(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("a.dmp", "sub/b.mdmp", "sub/readme.txt", ".hidden.dmp"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub" / "noext").write_bytes(b"MDMP....")
    found, unmatched = expand_paths([str(tmp_path), str(tmp_path / "a.dmp"), str(tmp_path / "nope*.dmp")])
    assert [os.path.relpath(p, str(tmp_path)) for p in found] == ["a.dmp", "sub/b.mdmp", "sub/noext"]
    assert unmatched == ["no such file or directory: %s" % (tmp_path / "nope*.dmp")]


def test_the_isolated_child_reports_its_hash_first_and_a_file_it_cannot_read_without_one(tmp_path):
    from dbgext.triage.run import analyse_dump_isolated
    path = tmp_path / "d.dmp"
    path.write_bytes(b"PAGEDU64" + b"\0" * 100)
    record = analyse_dump_isolated(make_task(str(path), (108, 0, 0)), timeout=60)
    assert record["reason"].startswith("cannot open dump") and len(record["hash"]) == 64
    record = analyse_dump_isolated(make_task(str(tmp_path / "gone.dmp"), (0, 0, 0)), timeout=60)
    assert record["hash"] is None and record["reason"].startswith("cannot read")
