"""Running triage over many dumps: locally on a process pool, or on a Dask cluster.

The parent expands the paths and skips files it has hashed before and that have not
changed since (same path, size, modification and change time, and a recorded hash).
Every other file becomes one *task*.  A worker hashes the whole file (SHA-256,
streaming: a dump's identity is its content), tells the parent the hash, opens the
dump, builds its :class:`DumpRecord` and sends back only that compact record.  The
parent writes each record in its own transaction as it arrives; a record whose
hash is already in the database (a copy of a recorded dump) is not written again.

Faults are per dump: a corrupt or truncated file, an analysis exception, a worker
process that dies or one that exceeds the per-dump timeout (the worker is killed and
replaced) each produce a failed record with the reason, and the batch goes on.  A
file that cannot even be hashed is reported, not recorded, and is tried again by the
next run.  Ctrl-C stops the batch: workers ignore SIGINT, the parent kills them and
keeps every record already committed.

``python -m dbgext.triage.run`` analyses one task read as JSON from stdin and
prints the hash line, then the record, as JSON: the isolated form the Dask path
runs per dump.
"""

import contextlib
import fnmatch
import glob
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from multiprocessing.connection import wait as wait_for

from ..errors import BadInput, DbgextError
from .record import (STATUS_FAILED, DumpRecord, build_record, content_hash, failed_record, load_plugins,
                     select_analyses)

HASH_LINE = "hash "

DUMP_EXTENSIONS = (".dmp", ".mdmp", ".hdmp", ".kdmp")
DUMP_MAGICS = (b"PAGE", b"MDMP")
DEFAULT_TIMEOUT = 600.0


# -- finding dumps ---------------------------------------------------------------------

def _looks_like_dump(path):
    if path.lower().endswith(DUMP_EXTENSIONS):
        return True
    try:
        with open(path, "rb") as handle:
            return handle.read(4) in DUMP_MAGICS
    except OSError:
        return False


def expand_paths(paths):
    """Dump files named by ``paths`` (files, directories searched recursively, globs),
    in a stable order without duplicates, plus messages about paths that matched
    nothing.  Inside directories only files with a dump extension or signature count;
    a file named explicitly is always taken (a corrupt dump must be recorded too)."""
    found = []
    seen = set()
    unmatched = []

    def take(path):
        real = os.path.abspath(path)
        if real not in seen:
            seen.add(real)
            found.append(real)

    for pattern in paths:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not any(os.path.exists(m) for m in matches):
            unmatched.append("no such file or directory: %s" % pattern)
            continue
        for match in matches:
            if os.path.isdir(match):
                for root, dirs, files in os.walk(match):
                    dirs.sort()
                    for name in sorted(files):
                        candidate = os.path.join(root, name)
                        if not fnmatch.fnmatch(name, ".*") and _looks_like_dump(candidate):
                            take(candidate)
            elif os.path.isfile(match):
                take(match)
    return found, unmatched


# -- one dump --------------------------------------------------------------------------

def file_stat(path):
    """(size, mtime_ns, ctime_ns): what tells an unchanged file from a rewritten one."""
    status = os.stat(path)
    return status.st_size, status.st_mtime_ns, status.st_ctime_ns


def make_task(path, stat, analyses=None, plugins=(), symbols=None):
    """A task is plain data so it pickles to a local worker and serialises to Dask."""
    return {"path": path, "size": stat[0], "stat": list(stat), "analyses": analyses,
            "plugins": list(plugins or ()), "symbols": list(symbols) if symbols else None}


def analyse_dump(task, on_hash=None):
    """Hash the task's dump (calling ``on_hash(hash)``), open it and return its
    record as a dict.  Never raises for a bad dump: corrupt files and analysis
    failures become failed records; a file that cannot be read at all gives a
    failed record without a hash."""
    import dbgext

    started = time.time()
    path, size = task["path"], task["size"]
    try:
        content_key = content_hash(path)
    except BadInput as error:
        return failed_record(path, size, None, str(error), time.time() - started).as_dict()
    hashed = time.time()
    if on_hash is not None:
        on_hash(content_key)
    try:
        load_plugins(task.get("plugins"))
        analyses = select_analyses(task.get("analyses"))
    except DbgextError as error:
        return failed_record(path, size, content_key, "cannot load analyses: %s" % error).as_dict()
    try:
        target = dbgext.open(path, symbols=task.get("symbols"))
    except DbgextError as error:
        return failed_record(path, size, content_key, "cannot open dump: %s" % error,
                             time.time() - started).as_dict()
    except Exception as error:  # a parser that chokes on a corrupt file
        return failed_record(path, size, content_key, "cannot open dump: %s: %s" % (type(error).__name__, error),
                             time.time() - started).as_dict()
    try:
        record = build_record(target, path, size, content_key, analyses)
    except DbgextError as error:  # the dump changed or vanished under the reader
        record = failed_record(path, size, content_key, str(error))
    except Exception as error:  # identity/signature code met something it did not expect
        record = failed_record(path, size, content_key, "%s: %s" % (type(error).__name__, error))
    finally:
        target.close()
    record.timings["hash"] = round(hashed - started, 6)
    record.seconds = round(time.time() - started, 6)
    return record.as_dict()


def _worker_loop(connection):
    """A local pool worker: tasks in; the hash, then the record, out; until it gets
    None.  Ctrl-C is the parent's to handle: a worker only ever gets killed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            task = connection.recv()
        except EOFError:
            return
        if task is None:
            return
        connection.send(("record", analyse_dump(task, on_hash=lambda value: connection.send(("hash", value)))))


# -- local process pool ------------------------------------------------------------------

# Imported once in the fork server, so a new or replacement worker starts warm.
WORKER_PRELOAD = ["dbgext.triage.run", "dbgext.triage.analyses", "dbgext.target.kdump", "dbgext.target.minidump"]


def _context():
    # forkserver: children fork from a clean server (not from a parent holding a DuckDB
    # connection and threads); spawn where fork does not exist.
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(WORKER_PRELOAD)
    return context


class _Slot(object):
    __slots__ = ("process", "connection", "task", "hash", "deadline")

    def __init__(self, process, connection):
        self.process = process
        self.connection = connection
        self.task = None
        self.hash = None        # the task's content hash, once the worker has sent it
        self.deadline = None


class LocalPool(object):
    """``workers`` processes; each dump gets at most ``timeout`` seconds, after which
    its worker is killed and replaced."""

    def __init__(self, workers=None, timeout=DEFAULT_TIMEOUT):
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.timeout = timeout if timeout and timeout > 0 else None
        self._context = _context()
        self._slots = []

    def _start(self):
        parent_end, child_end = self._context.Pipe()
        process = self._context.Process(target=_worker_loop, args=(child_end,), daemon=True)
        process.start()
        child_end.close()
        return _Slot(process, parent_end)

    def _retire(self, slot, kill):
        if kill:
            slot.process.kill()
        slot.process.join(5)
        slot.connection.close()

    def run(self, tasks):
        """Yield (task, record dict) per task, in completion order."""
        pending = list(reversed(tasks))
        self._slots = [self._start() for _ in range(min(self.workers, len(tasks)))]
        try:
            self._dispatch(pending)
            while any(slot.task for slot in self._slots):
                busy = [slot for slot in self._slots if slot.task]
                deadlines = [slot.deadline for slot in busy if slot.deadline]
                wait_seconds = max(0.0, min(deadlines) - time.time()) if deadlines else None
                ready = wait_for([slot.connection for slot in busy] + [slot.process.sentinel for slot in busy],
                                 wait_seconds)
                finished = [done for done in (self._collect(slot, ready) for slot in busy) if done]
                # Hand out the next dumps before the caller spends time committing these.
                self._dispatch(pending)
                for done in finished:
                    yield done
        finally:
            for slot in self._slots:
                try:
                    slot.connection.send(None)
                except (OSError, ValueError):
                    pass
            for slot in self._slots:
                self._retire(slot, kill=slot.process.is_alive() and slot.task is not None)
            self._slots = []

    def _dispatch(self, pending):
        for slot in self._slots:
            if slot.task is None and pending:
                slot.task = pending.pop()
                slot.hash = None
                slot.deadline = time.time() + self.timeout if self.timeout else None
                try:
                    slot.connection.send(slot.task)
                except OSError:
                    pass  # the worker is gone: its sentinel reports the dump as failed

    def _collect(self, slot, ready):
        """(task, record) if the slot's task finished, died or timed out (replacing
        the worker in the last two cases); None while it is still working."""
        task = slot.task
        if slot.connection in ready or slot.process.sentinel in ready:
            try:
                while slot.connection.poll():
                    kind, value = slot.connection.recv()
                    if kind == "hash":
                        slot.hash = value
                        continue
                    slot.task = None
                    return task, value
                if slot.process.is_alive():
                    return None
            except (EOFError, OSError):
                pass
            slot.process.join(1)
            reason = "worker process died while analysing the dump (exit code %s)" % slot.process.exitcode
            seconds = 0.0
        elif slot.deadline and time.time() >= slot.deadline:
            reason = "timed out after %g s (worker killed)" % self.timeout
            seconds = self.timeout
        else:
            return None
        content_key = slot.hash
        self._replace(slot)
        return task, failed_record(task["path"], task["size"], content_key, reason, seconds).as_dict()

    def _replace(self, slot):
        self._retire(slot, kill=True)
        fresh = self._start()
        slot.process, slot.connection, slot.task, slot.hash, slot.deadline = (
            fresh.process, fresh.connection, None, None, None)


# -- Dask --------------------------------------------------------------------------------

def analyse_dump_isolated(task, timeout=DEFAULT_TIMEOUT):
    """Run one task in a child interpreter (``python -m dbgext.triage.run``), killing
    it after ``timeout`` seconds.  Dask cannot kill a running task, and a parser
    crash must not take the Dask worker down, so each dump gets its own process.
    The child prints the hash line first, so a dump that hangs later still gets a
    failed row under its content hash."""
    started = time.time()
    environment = dict(os.environ)
    inherited = [p for p in sys.path + environment.get("PYTHONPATH", "").split(os.pathsep) if p]
    environment["PYTHONPATH"] = os.pathsep.join(inherited)
    try:
        finished = subprocess.run([sys.executable, "-m", "dbgext.triage.run"], input=json.dumps(task).encode(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment,
                                  timeout=timeout if timeout and timeout > 0 else None)
    except subprocess.TimeoutExpired as expired:
        content_key, _ = _child_output(expired.stdout)
        return failed_record(task["path"], task["size"], content_key,
                             "timed out after %g s (worker killed)" % timeout, time.time() - started).as_dict()
    content_key, document = _child_output(finished.stdout)
    if finished.returncode == 0 and document is not None:
        return document
    detail = finished.stderr.decode("utf-8", "replace").strip().splitlines()
    return failed_record(task["path"], task["size"], content_key,
                         "worker process died while analysing the dump (exit code %s)%s"
                         % (finished.returncode, ": " + detail[-1] if detail else ""),
                         time.time() - started).as_dict()


def _child_output(data):
    """(hash or None, record dict or None) from what the child printed."""
    text = (data or b"").decode("utf-8", "replace")
    content_key = None
    if text.startswith(HASH_LINE):
        first, _, text = text.partition("\n")
        content_key = first[len(HASH_LINE):].strip() or None
    try:
        document = json.loads(text) if text.strip() else None
    except ValueError:
        document = None
    return content_key, document


class DaskPool(object):
    """The same tasks on an existing Dask distributed cluster at ``address``; the
    workers must reach the dump paths and import dbgext."""

    def __init__(self, address, timeout=DEFAULT_TIMEOUT):
        try:
            from distributed import Client
        except ImportError:
            raise DbgextError("triage on a Dask cluster needs dask.distributed: pip install \"dbgext[dask]\"")
        self.address = address
        self.timeout = timeout if timeout and timeout > 0 else None
        try:
            self.client = Client(address, timeout="10s")
        except (OSError, TimeoutError) as error:
            raise DbgextError("cannot reach the Dask scheduler at %s: %s" % (address, error))

    def run(self, tasks):
        from distributed import as_completed

        futures = {}
        for task in tasks:
            future = self.client.submit(analyse_dump_isolated, task, self.timeout, pure=False)
            futures[future] = task
        try:
            for future in as_completed(list(futures)):
                task = futures[future]
                try:
                    yield task, future.result()
                except Exception as error:  # the Dask worker itself was lost
                    yield task, failed_record(task["path"], task["size"], None, "Dask task failed: %s: %s"
                                              % (type(error).__name__, error)).as_dict()
        finally:
            for future in futures:
                future.cancel()
            self.client.close()


# -- the batch ---------------------------------------------------------------------------

class BatchResult(object):
    """Counts of one ``triage`` run, for the command's closing lines."""

    __slots__ = ("found", "skipped", "analysed", "failed", "unreadable", "seconds")

    def __init__(self):
        self.found = 0
        self.skipped = 0        # already in the database (unchanged files, copies of recorded dumps)
        self.analysed = 0       # records written this run
        self.failed = 0         # of those, failed ones
        self.unreadable = []    # messages about paths that could not be found, read or hashed
        self.seconds = 0.0


class DeferredInterrupt(object):
    """Ctrl-C during a database call takes effect when the call returns.  DuckDB
    polls for signals inside its queries and turns one into its own error, or
    drops it when the query completes anyway; deferred, a commit either happens
    whole or not at all, and the interrupt is never lost.  Installed only in the
    main thread (where Python delivers signals)."""

    def __init__(self):
        self.pending = False
        self._deferring = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _handle(self, signum, frame):
        if self._deferring:
            self.pending = True
            return
        raise KeyboardInterrupt()

    @contextlib.contextmanager
    def deferred(self):
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
        if self.pending:
            raise KeyboardInterrupt()


def plan_tasks(paths, store, analyses=None, plugins=(), symbols=None, retry_failed=False, exclude=(),
               expanded=None):
    """Expand ``paths`` and return (tasks for files not known to be recorded,
    BatchResult).  A file is known when its path, size, modification and change
    times are those it had when it was hashed whole, and that hash is recorded.
    ``exclude``: paths that are never dumps to triage (the database itself);
    ``expanded``: what :func:`expand_paths` gave for ``paths``, when the caller has it."""
    result = BatchResult()
    files, unmatched = expanded if expanded is not None else expand_paths(paths)
    result.unreadable = list(unmatched)
    excluded = set(os.path.realpath(path) for path in exclude)
    files = [path for path in files if os.path.realpath(path) not in excluded]
    result.found = len(files)
    status_by_hash = store.status_by_hash()
    known_files = store.known_files()
    tasks = []
    for path in files:
        try:
            stat = file_stat(path)
        except OSError as error:
            result.unreadable.append("cannot read %s: %s" % (path, error.strerror or error))
            continue
        known = known_files.get(path)
        status = status_by_hash.get(known[3]) if known is not None and tuple(known[:3]) == stat else None
        if status is not None and not (retry_failed and status == STATUS_FAILED):
            result.skipped += 1
            continue
        tasks.append(make_task(path, stat, analyses, plugins, symbols))
    return tasks, result


def run_batch(paths, store, workers=None, timeout=DEFAULT_TIMEOUT, analyses=None, plugins=(), symbols=None,
              dask_address=None, retry_failed=False, progress=None, exclude=(), expanded=None):
    """Triage every new dump under ``paths`` into ``store``; returns a BatchResult.
    ``expanded``: (files, messages) of :func:`expand_paths` for ``paths``, when the
    caller has already expanded them (the directories are not walked again).

    KeyboardInterrupt and StorageError end the batch (workers killed); every record
    committed before stays in the store."""
    started = time.time()
    load_plugins(plugins)
    select_analyses(analyses)  # unknown analysis names fail here, before any work
    with DeferredInterrupt() as interrupts:
        with interrupts.deferred():
            tasks, result = plan_tasks(paths, store, analyses, plugins, symbols, retry_failed, exclude,
                                       expanded)
        pool = None
        if tasks:
            pool = DaskPool(dask_address, timeout) if dask_address else LocalPool(workers, timeout)
        if progress is not None:
            progress.start(len(tasks))
        try:
            for task, document in (pool.run(tasks) if pool is not None else ()):
                failed = document.get("status") == STATUS_FAILED
                if document.get("hash") is None:
                    result.unreadable.append("%s: %s" % (task["path"], document.get("reason")))
                    added = None
                else:
                    with interrupts.deferred():
                        added = store.add(document, replace_failed=retry_failed, stat=tuple(task["stat"]))
                if added:
                    result.analysed += 1
                    result.failed += failed
                elif added is False:
                    result.skipped += 1
                if progress is not None:
                    progress.advance(failed)
        finally:
            if progress is not None:
                progress.finish()
    result.seconds = time.time() - started
    return result


def _main():
    """One task from stdin -> its record as JSON on stdout (see analyse_dump_isolated)."""
    task = json.loads(sys.stdin.read())

    def print_hash(value):
        sys.stdout.write(HASH_LINE + value + "\n")
        sys.stdout.flush()

    document = analyse_dump(task, on_hash=print_hash)
    sys.stdout.write(json.dumps(DumpRecord.from_dict(document).as_dict(), default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    _main()
