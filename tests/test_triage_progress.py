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
    missing_file = make_task(str(tmp_path / "missing.dmp"), "k1", 0)
    missing_plugin = make_task(str(tmp_path / "other.dmp"), "k2", 0, plugins=["no_such_triage_plugin"])
    records = {r["hash"]: r for r in LocalPool(workers=1, timeout=30).run([missing_plugin, missing_file])}
    assert records["k2"]["status"] == "failed"
    assert records["k2"]["reason"].startswith("cannot load analyses: cannot import triage plug-in")
    assert records["k1"]["status"] == "failed" and records["k1"]["reason"].startswith("cannot open dump")


def test_a_worker_process_that_dies_is_replaced_and_the_batch_goes_on(tmp_path, monkeypatch):
    # A worker killed mid-dump is what kdmp-parser's SIGBUS on a truncated file looks like.
    tasks = [make_task(str(tmp_path / ("d%d.dmp" % i)), "k%d" % i, 0) for i in range(3)]
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
    records = {r["hash"]: r for r in pool.run(tasks)}
    assert set(records) == {"k0", "k1", "k2"} and len(started) == 2
    assert "worker process died" in records["k0"]["reason"]
    assert all("cannot open dump" in records[k]["reason"] for k in ("k1", "k2"))


def test_paths_expand_to_dump_files_only_inside_directories(tmp_path):
    (tmp_path / "sub").mkdir()
    for name in ("a.dmp", "sub/b.mdmp", "sub/readme.txt", ".hidden.dmp"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "sub" / "noext").write_bytes(b"MDMP....")
    found, unmatched = expand_paths([str(tmp_path), str(tmp_path / "a.dmp"), str(tmp_path / "nope*.dmp")])
    assert [os.path.relpath(p, str(tmp_path)) for p in found] == ["a.dmp", "sub/b.mdmp", "sub/noext"]
    assert unmatched == ["no such file or directory: %s" % (tmp_path / "nope*.dmp")]
