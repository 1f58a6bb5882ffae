"""dbgext never writes a dump: every command runs over a kernel dump and a
minidump while every way of opening a file is watched, and the dump's hash and
modification time are the same afterwards."""

import builtins
import hashlib
import io
import mmap
import os

import pytest

from dbgext.cli import load_commands, main
from dbgext.sample import build_sample_scenario
from minidump_writer import write_minidump

# Every command, with arguments that make it read the dump.  A new command must be
# added here: the coverage test below fails otherwise.
KERNEL_RUNS = {
    "db": ["db", "nt", "L20"], "dd": ["dd", "nt"], "dq": ["dq", "nt"], "dps": ["dps", "nt", "L8"],
    "lm": ["lm"], "rtltrace": ["rtltrace", "--find"], "etwstacks": ["etwstacks", "--validate"],
    "ipt": ["ipt", "scan"], "stackuse": ["stackuse", "thread"], "triage": ["triage", "--json"],
    "k": ["k"], "ln": ["ln", "nt+10"], "x": ["x", "nt!Ke*"], "dt": ["dt", "nt!_KTHREAD"],
    "dumpinfo": ["dumpinfo"],
}
NO_DUMP = {"sample", "demo"}  # they write their own files, never read one


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    directory = tmp_path_factory.mktemp("readonly")
    scenario, _ = build_sample_scenario()
    kernel = str(directory / "sample.dmp")
    scenario.write_kernel_dump(kernel)
    from dumps_support import user_scenario
    user = str(directory / "user.mdmp")
    write_minidump(user_scenario("x64"), user)
    return [kernel, user]


class _OpenWatch(object):
    """Records every open of ``paths`` in a mode that could write."""

    def __init__(self, monkeypatch, paths):
        self.paths = set(os.path.realpath(path) for path in paths)
        self.writes = []
        real_open, real_os_open, real_mmap = builtins.open, os.open, mmap.mmap

        def watched_open(file, mode="r", *args, **kwargs):
            if isinstance(file, (str, bytes, os.PathLike)) and self._ours(file) and set(mode) & set("wax+"):
                self.writes.append(("open", file, mode))
            return real_open(file, mode, *args, **kwargs)

        def watched_os_open(path, flags, *args, **kwargs):
            if self._ours(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_CREAT):
                self.writes.append(("os.open", path, flags))
            return real_os_open(path, flags, *args, **kwargs)

        class WatchedMmap(real_mmap):
            def __new__(cls, fileno, length, *args, **kwargs):
                access = kwargs.get("access", args[2] if len(args) > 2 else mmap.ACCESS_DEFAULT)
                if access != mmap.ACCESS_READ and fileno != -1:
                    self.writes.append(("mmap", fileno, access))
                return real_mmap.__new__(cls, fileno, length, *args, **kwargs)

        monkeypatch.setattr(builtins, "open", watched_open)
        monkeypatch.setattr(io, "open", watched_open)
        monkeypatch.setattr(os, "open", watched_os_open)
        monkeypatch.setattr(mmap, "mmap", WatchedMmap)

    def _ours(self, path):
        try:
            return os.path.realpath(os.fsdecode(path)) in self.paths
        except (TypeError, ValueError):
            return False


def _fingerprint(path):
    with open(path, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    return digest, os.stat(path).st_mtime_ns


def test_every_command_is_in_the_read_only_run():
    names = set(command.name for command in load_commands())
    assert names - NO_DUMP <= set(KERNEL_RUNS), sorted(names - NO_DUMP - set(KERNEL_RUNS))


def test_no_command_opens_a_dump_for_writing_or_changes_it(dumps, monkeypatch, tmp_path):
    before = [_fingerprint(path) for path in dumps]
    monkeypatch.chdir(tmp_path)  # triage's default database lands here, not beside the dump
    watch = _OpenWatch(monkeypatch, dumps)
    registered = set(command.name for command in load_commands())
    codes = {}
    for dump in dumps:
        for name, argv in sorted(KERNEL_RUNS.items()):
            if name not in registered:
                continue
            for extra in ([], ["--json"]):
                if "--json" in argv and extra:
                    continue
                code = main(argv + ["--dump", dump] + extra, stream=io.StringIO())
                codes[(os.path.basename(dump), name, bool(extra))] = code
    assert watch.writes == []
    assert [_fingerprint(path) for path in dumps] == before
    assert all(code in (0, 1, 4) for code in codes.values()), codes


def test_the_readers_have_no_write_mode_in_their_source():
    """Belt and braces: no dump reader even names a writing mode (symbols.py, which
    also writes the sample's ISF files, reads no dump)."""
    import re
    import dbgext.target
    directory = os.path.dirname(dbgext.target.__file__)
    writing = re.compile(r"""ACCESS_WRITE|ACCESS_COPY|O_RDWR|O_WRONLY|open\([^)]*["'][rwa]?b?\+|open\([^)]*["'][wa]b?["']""")
    offenders = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".py") and name != "symbols.py":
            with open(os.path.join(directory, name)) as handle:
                offenders += ["%s: %s" % (name, line.strip()) for line in handle if writing.search(line)]
    assert offenders == []


def test_the_watch_sees_a_write(dumps, monkeypatch, tmp_path):
    copy = tmp_path / "copy.dmp"
    copy.write_bytes(b"PAGE")
    watch = _OpenWatch(monkeypatch, [str(copy)])
    with open(str(copy), "r+b") as handle:
        mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_WRITE).close()
    assert [kind for kind, _, _ in watch.writes] == ["open", "mmap"]
