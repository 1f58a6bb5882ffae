"""Running triage over many dumps: locally on a process pool, or on a Dask cluster.

The parent expands the paths, hashes each file (a bounded read, see
:func:`content_hash`), skips hashes the database already holds, and hands out one
*task* per dump.  A worker opens the dump, builds its :class:`DumpRecord` and sends
back only that compact record.  The parent writes each record in its own
transaction as it arrives.

Faults are per dump: a corrupt or truncated file, an analysis exception, a worker
process that dies (kdmp-parser can SIGBUS on a truncated file) or one that exceeds
the per-dump timeout (the worker is killed and replaced) each produce a failed
record with the reason, and the batch goes on.

``python -m dbgext.triage.run`` analyses one task read as JSON from stdin and
prints the record as JSON: the isolated form the Dask path runs per dump.
"""

import fnmatch
import glob
import json
import multiprocessing
import os
import subprocess
import sys
import time
from multiprocessing.connection import wait as wait_for

from ..errors import BadInput, DbgextError
from .record import (STATUS_FAILED, DumpRecord, build_record, content_hash, failed_record, load_plugins,
                     select_analyses)

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

def make_task(path, content_key, size, analyses=None, plugins=(), symbols=None):
    """A task is plain data so it pickles to a local worker and serialises to Dask."""
    return {"path": path, "hash": content_key, "size": size, "analyses": analyses,
            "plugins": list(plugins or ()), "symbols": list(symbols) if symbols else None}


def analyse_dump(task):
    """Open the task's dump and return its record as a dict.  Never raises for a
    bad dump: corrupt files and analysis failures become failed records."""
    import dbgext

    started = time.time()
    path, size, content_key = task["path"], task["size"], task["hash"]
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
    except Exception as error:  # identity/signature code met something it did not expect
        record = failed_record(path, size, content_key, "%s: %s" % (type(error).__name__, error))
    finally:
        target.close()
    record.seconds = round(time.time() - started, 6)
    return record.as_dict()


def _worker_loop(connection):
    """A local pool worker: tasks in, records out, until it gets None."""
    while True:
        try:
            task = connection.recv()
        except EOFError:
            return
        if task is None:
            return
        connection.send(analyse_dump(task))


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
    __slots__ = ("process", "connection", "task", "deadline")

    def __init__(self, process, connection):
        self.process = process
        self.connection = connection
        self.task = None
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
        """Yield one record dict per task, in completion order."""
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
                finished = [record for record in (self._collect(slot, ready) for slot in busy) if record]
                # Hand out the next dumps before the caller spends time committing these.
                self._dispatch(pending)
                for record in finished:
                    yield record
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
                slot.deadline = time.time() + self.timeout if self.timeout else None
                try:
                    slot.connection.send(slot.task)
                except OSError:
                    pass  # the worker is gone: its sentinel reports the dump as failed

    def _collect(self, slot, ready):
        """The slot's record if it finished, died or timed out (replacing the worker
        in the last two cases); None while it is still working."""
        task = slot.task
        if slot.connection in ready or slot.process.sentinel in ready:
            try:
                if slot.connection.poll():
                    record = slot.connection.recv()
                    slot.task = None
                    return record
            except (EOFError, OSError):
                pass
            slot.process.join(1)
            reason = "worker process died while analysing the dump (exit code %s)" % slot.process.exitcode
        elif slot.deadline and time.time() >= slot.deadline:
            reason = "timed out after %g s (worker killed)" % self.timeout
        else:
            return None
        self._replace(slot)
        return failed_record(task["path"], task["size"], task["hash"], reason,
                             self.timeout if reason.startswith("timed out") else 0.0).as_dict()

    def _replace(self, slot):
        self._retire(slot, kill=True)
        fresh = self._start()
        slot.process, slot.connection, slot.task, slot.deadline = fresh.process, fresh.connection, None, None


# -- Dask --------------------------------------------------------------------------------

def analyse_dump_isolated(task, timeout=DEFAULT_TIMEOUT):
    """Run one task in a child interpreter (``python -m dbgext.triage.run``), killing
    it after ``timeout`` seconds.  Dask cannot kill a running task, and a parser
    crash must not take the Dask worker down, so each dump gets its own process."""
    started = time.time()
    environment = dict(os.environ)
    inherited = [p for p in sys.path + environment.get("PYTHONPATH", "").split(os.pathsep) if p]
    environment["PYTHONPATH"] = os.pathsep.join(inherited)
    try:
        finished = subprocess.run([sys.executable, "-m", "dbgext.triage.run"], input=json.dumps(task).encode(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment,
                                  timeout=timeout if timeout and timeout > 0 else None)
    except subprocess.TimeoutExpired:
        return failed_record(task["path"], task["size"], task["hash"],
                             "timed out after %g s (worker killed)" % timeout, time.time() - started).as_dict()
    if finished.returncode == 0:
        try:
            return json.loads(finished.stdout.decode("utf-8"))
        except ValueError:
            pass
    detail = finished.stderr.decode("utf-8", "replace").strip().splitlines()
    return failed_record(task["path"], task["size"], task["hash"],
                         "worker process died while analysing the dump (exit code %s)%s"
                         % (finished.returncode, ": " + detail[-1] if detail else ""),
                         time.time() - started).as_dict()


class DaskPool(object):
    """The same tasks on an existing Dask distributed cluster at ``address``; the
    workers must reach the dump paths and import dbgext."""

    def __init__(self, address, timeout=DEFAULT_TIMEOUT):
        try:
            from distributed import Client
        except ImportError:
            raise DbgextError("--dask needs dask.distributed: pip install \"dbgext[triage]\"")
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
                    yield future.result()
                except Exception as error:  # the Dask worker itself was lost
                    yield failed_record(task["path"], task["size"], task["hash"],
                                        "Dask task failed: %s: %s" % (type(error).__name__, error)).as_dict()
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
        self.skipped = 0        # already in the database
        self.analysed = 0       # records written this run
        self.failed = 0         # of those, failed ones
        self.unreadable = []    # messages about paths that could not be hashed/found
        self.seconds = 0.0


def plan_tasks(paths, store, analyses=None, plugins=(), symbols=None, retry_failed=False):
    """Expand and hash ``paths`` and return (tasks for dumps not yet recorded, BatchResult)."""
    result = BatchResult()
    files, result.unreadable = expand_paths(paths)
    result.found = len(files)
    known = store.status_by_hash()
    planned = set()
    tasks = []
    for path in files:
        try:
            content_key = content_hash(path)
            size = os.path.getsize(path)
        except (BadInput, OSError) as error:
            result.unreadable.append(str(error))
            continue
        status = known.get(content_key)
        if content_key in planned or (status is not None and not (retry_failed and status == STATUS_FAILED)):
            result.skipped += 1
            continue
        planned.add(content_key)
        tasks.append(make_task(path, content_key, size, analyses, plugins, symbols))
    return tasks, result


def run_batch(paths, store, workers=None, timeout=DEFAULT_TIMEOUT, analyses=None, plugins=(), symbols=None,
              dask_address=None, retry_failed=False, progress=None):
    """Triage every new dump under ``paths`` into ``store``; returns a BatchResult."""
    started = time.time()
    load_plugins(plugins)
    select_analyses(analyses)  # unknown analysis names fail here, before any work
    tasks, result = plan_tasks(paths, store, analyses, plugins, symbols, retry_failed)
    pool = None
    if tasks:
        pool = DaskPool(dask_address, timeout) if dask_address else LocalPool(workers, timeout)
    if progress is not None:
        progress.start(len(tasks))
    if pool is not None:
        for document in pool.run(tasks):
            store.add(document, replace_failed=retry_failed)
            result.analysed += 1
            failed = document.get("status") == STATUS_FAILED
            result.failed += failed
            if progress is not None:
                progress.advance(failed)
    if progress is not None:
        progress.finish()
    result.seconds = time.time() - started
    return result


def _main():
    """One task from stdin -> its record as JSON on stdout (see analyse_dump_isolated)."""
    task = json.loads(sys.stdin.read())
    document = analyse_dump(task)
    sys.stdout.write(json.dumps(DumpRecord.from_dict(document).as_dict(), default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    _main()
