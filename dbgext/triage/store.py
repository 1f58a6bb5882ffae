"""Triage results in an embedded DuckDB file.

``dumps`` has exactly one row per dump content ever seen, keyed by its SHA-256; the
other tables hang off that key: ``frames`` (the faulting thread's stack),
``problems`` (everything the analyses reported, with its kind), ``summaries`` (each
analysis' compact summary as JSON) and ``stack_hogs`` (the faulting thread's
biggest frames, for fleet-wide ranking).  ``files`` remembers which file (path,
size, modification and change times) had which hash, so a re-run does not read
unchanged files again.

Every dump is written in its own transaction, so a run stopped midway (Ctrl-C,
SIGKILL, a full disk) keeps what it committed and a re-run skips those dumps.
Storage faults become one-line :class:`StorageError`s; DuckDB's own lock refuses a
second writer, which is reported as such.
"""

import contextlib
import json
import os
import re

from ..errors import BadInput, DbgextError
from ..outputs import is_link, refuse_link, replacing
from .record import STATUS_FAILED, DumpRecord

SCHEMA_VERSION = 2

SCHEMA = [
    "CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
    """CREATE TABLE IF NOT EXISTS dumps (
        hash VARCHAR PRIMARY KEY,
        path VARCHAR,
        size BIGINT,
        kind VARCHAR,
        arch VARCHAR,
        build INTEGER,
        system_time TIMESTAMP,
        bugcheck_code UBIGINT,
        bugcheck_name VARCHAR,
        bugcheck_parameters UBIGINT[],
        bucket VARCHAR,
        bucket_basis VARCHAR,
        signature VARCHAR,
        module VARCHAR,
        image VARCHAR,
        module_timestamp UBIGINT,
        module_size UBIGINT,
        module_offset UBIGINT,
        function VARCHAR,
        status VARCHAR NOT NULL,
        reason VARCHAR,
        analysis_seconds DOUBLE,
        analyses VARCHAR[],
        recorded_at TIMESTAMP DEFAULT current_timestamp,
        record VARCHAR
    )""",
    # No key on files: DuckDB's upsert costs more than the rest of a record's commit,
    # so a changed file simply gets another row and the latest row of a path counts.
    "CREATE TABLE IF NOT EXISTS files (path VARCHAR, size BIGINT, mtime_ns BIGINT, ctime_ns BIGINT, hash VARCHAR)",
    "CREATE TABLE IF NOT EXISTS frames (hash VARCHAR, position INTEGER, address UBIGINT, name VARCHAR, how VARCHAR)",
    "CREATE TABLE IF NOT EXISTS problems (hash VARCHAR, analysis VARCHAR, kind VARCHAR, severity VARCHAR, "
    "address UBIGINT, \"offset\" UBIGINT, message VARCHAR)",
    "CREATE TABLE IF NOT EXISTS summaries (hash VARCHAR, analysis VARCHAR, summary VARCHAR)",
    "CREATE TABLE IF NOT EXISTS stack_hogs (hash VARCHAR, function VARCHAR, frame_bytes BIGINT)",
]

CHILD_TABLES = ("frames", "problems", "summaries", "stack_hogs")
EXPORTED_TABLES = ("dumps", "files") + CHILD_TABLES


class StorageError(DbgextError):
    """The triage database or an output file could not be read or written (a full
    disk, a read-only or missing directory, a database another run holds)."""


# New database files are written in the storage format DuckDB 1.0 reads, so a
# database made under a recent Python (a recent DuckDB) opens under Python 3.8/3.9,
# where pykd runs and DuckDB stops at 1.2.  (Existing files keep their format.)
STORAGE_CONFIG = {"storage_compatibility_version": "v1.0.0"}


def import_duckdb():
    try:
        import duckdb
    except ImportError:
        raise DbgextError("the triage database needs DuckDB: pip install duckdb")
    return duckdb


def _u64(value):
    return value if isinstance(value, int) and 0 <= value < 1 << 64 else None


_LOCK_HOLDER = re.compile(r"Conflicting lock is held in (.*?) \(PID (\d+)\)")


def describe_storage_error(path, error):
    """One line for a DuckDB or OS error on the database ``path``."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    holder = _LOCK_HOLDER.search(text)
    if holder:
        return ("triage database %s is in use by another process (PID %s): wait for that run to finish, "
                "or use another database" % (path, holder.group(2)))
    if "Could not set lock" in text:
        return "triage database %s is locked by another process: wait for it to finish, or use another database" % path
    for marker, meaning in (("No space left", "the disk is full"), ("File too large", "the file size limit was hit"),
                            ("Permission denied", "permission denied"), ("Read-only file system",
                                                                         "the file system is read-only")):
        if marker in text:
            return "cannot write triage database %s: %s (%s)" % (path, meaning, _strip_prefix(text))
    return "triage database %s: %s" % (path, _strip_prefix(text))


def _strip_prefix(text):
    """DuckDB's messages start with their class ("IO Error: ..."); the path is ours."""
    return re.sub(r"^[A-Za-z ]*(Error|Exception): ", "", text)


def check_parquet_export(directory, replace=False):
    """The (table, path) of each file of a ``--parquet`` export into ``directory``;
    StorageError (one line) when the folder or a file is a link, or a file exists
    and not ``replace``.  Called before a batch too, so a refusal costs nothing."""
    targets = [(table, os.path.join(directory, table + ".parquet")) for table in EXPORTED_TABLES]
    if is_link(directory):
        raise StorageError("%s is a symbolic link: refusing to export through it" % directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise StorageError("cannot export to %s: it is a file, not a directory" % directory)
    for _, path in targets:
        if is_link(path):
            raise StorageError("%s is a symbolic link: refusing to write through it" % path)
    existing = [path for _, path in targets if os.path.exists(path)]
    if existing and not replace:
        raise StorageError("%s already exists (replace it to export again)" % existing[0])
    return targets


class TriageStore(object):
    """One DuckDB database file (``:memory:`` works for tests)."""

    def __init__(self, path, read_only=False):
        duckdb = import_duckdb()
        self._duckdb = duckdb
        self.path = path
        self.committed = 0
        if path != ":memory:":
            if read_only and not os.path.exists(path):
                raise DbgextError("no triage database at %s (a triage run over dumps makes one)" % path)
            if not read_only:
                # DuckDB opens (and creates) both files through links: a planted
                # one would have it write elsewhere.
                refuse_link(path)
                refuse_link(path + ".wal")
            directory = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(directory):
                raise StorageError("cannot create triage database %s: directory %s does not exist"
                                   % (path, directory))
        try:
            self.connection = duckdb.connect(path, read_only=read_only, config=STORAGE_CONFIG)
        except duckdb.Error as error:
            raise StorageError(describe_storage_error(path, error))
        try:
            self._check_schema(read_only)
        except duckdb.Error as error:
            self.connection.close()
            raise StorageError(describe_storage_error(path, error))
        except DbgextError:
            self.connection.close()
            raise

    def _check_schema(self, read_only):
        tables = set(row[0] for row in self.connection.execute(
            "SELECT table_name FROM information_schema.tables").fetchall())
        version = None
        if "meta" in tables:
            row = self.connection.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else None
        elif "dumps" in tables:
            version = 1
        if version is not None and version != SCHEMA_VERSION:
            raise StorageError("triage database %s has schema version %s; this dbgext writes version %d: "
                               "use a new database" % (self.path, version, SCHEMA_VERSION))
        if not read_only and version is None:
            self._transaction(self._create_schema)

    def _create_schema(self):
        for statement in SCHEMA:
            self.connection.execute(statement)
        self.connection.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])

    def close(self):
        try:
            self.connection.close()
        except self._duckdb.Error as error:
            raise StorageError(describe_storage_error(self.path, error))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- what is already known ---------------------------------------------------------

    def status_by_hash(self):
        """{content hash: status} of every recorded dump."""
        return dict(self.connection.execute("SELECT hash, status FROM dumps").fetchall())

    def known_files(self):
        """{path: (size, mtime_ns, ctime_ns, hash)} of every file hashed before (its latest row)."""
        return dict((row[0], tuple(row[1:])) for row in self.connection.execute(
            "SELECT path, size, mtime_ns, ctime_ns, hash FROM files ORDER BY rowid").fetchall())

    def count(self, table="dumps"):
        if table not in EXPORTED_TABLES:
            raise ValueError(table)
        return self.connection.execute("SELECT count(*) FROM %s" % table).fetchone()[0]

    # -- writing -------------------------------------------------------------------------

    def add(self, record, replace_failed=False, stat=None):
        """Insert one dump's record and its child rows in one transaction, and
        remember ``stat`` ((size, mtime_ns, ctime_ns) of the file) for its path.

        Returns False (and writes no dump rows) when the hash is already recorded —
        unless ``replace_failed`` and the recorded row failed, which is replaced.
        Raises StorageError when the database cannot be written; what was committed
        before stays."""
        if isinstance(record, dict):
            record = DumpRecord.from_dict(record)
        existing = self._query_one("SELECT status FROM dumps WHERE hash = ?", [record.hash])
        if existing is not None and not (replace_failed and existing[0] == STATUS_FAILED):
            if stat is not None:
                self._transaction(self._remember_file, record.path, stat, record.hash)
            return False
        if existing is not None:
            # Older DuckDB rejects re-inserting a primary key deleted in the same
            # transaction, so the failed row goes in a transaction of its own; a run
            # stopped in between simply finds the dump new next time.
            self._transaction(self._delete, record.hash)
        self._transaction(self._insert, record, stat)
        self.committed += 1
        return True

    def _query_one(self, sql, parameters):
        try:
            return self.connection.execute(sql, parameters).fetchone()
        except self._duckdb.Error as error:
            self._raise(error)

    def _transaction(self, action, *arguments):
        con = self.connection
        try:
            con.execute("BEGIN TRANSACTION")
            try:
                action(*arguments)
                con.execute("COMMIT")
            except BaseException:
                self._rollback()
                raise
        except self._duckdb.Error as error:
            self._raise(error)

    def _rollback(self):
        try:
            self.connection.execute("ROLLBACK")
        except self._duckdb.Error:
            pass  # a failed COMMIT already ended the transaction

    def _raise(self, error):
        if isinstance(error, self._duckdb.InterruptException) or "interrupted" in str(error).lower():
            raise KeyboardInterrupt()
        message = describe_storage_error(self.path, error)
        if self.committed:
            message += "; the %d dumps committed before are kept" % self.committed
        raise StorageError(message)

    def _delete(self, content_key):
        for table in ("dumps",) + CHILD_TABLES:
            self.connection.execute("DELETE FROM %s WHERE hash = ?" % table, [content_key])

    def _remember_file(self, path, stat, content_key):
        if path is None or stat is None:
            return
        self.connection.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?)",
                                [path, stat[0], stat[1], stat[2], content_key])

    def _insert(self, record, stat):
        con = self.connection
        faulting = record.faulting
        con.execute(
            "INSERT INTO dumps (hash, path, size, kind, arch, build, system_time, bugcheck_code, bugcheck_name, "
            "bugcheck_parameters, bucket, bucket_basis, signature, module, image, module_timestamp, module_size, "
            "module_offset, function, status, reason, analysis_seconds, analyses, record) "
            "VALUES (?, ?, ?, ?, ?, ?, CAST(? AS TIMESTAMP), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [record.hash, record.path, record.size, record.kind, record.arch, record.build,
             record.system_time.rstrip("Z").replace("T", " ") if record.system_time else None,
             _u64(record.bugcheck_code), record.bugcheck_name, [_u64(p) for p in record.bugcheck_parameters],
             record.bucket, record.bucket_basis, record.signature,
             faulting.module if faulting else None, faulting.image if faulting else None,
             _u64(faulting.module_timestamp) if faulting else None, _u64(faulting.module_size) if faulting else None,
             _u64(faulting.module_offset) if faulting else None, faulting.function if faulting else None,
             record.status, record.reason, record.seconds, list(record.analyses),
             json.dumps(record.as_dict(), default=str)])
        self._insert_rows("frames", [[record.hash, index, _u64(frame.address), frame.name, frame.how]
                                     for index, frame in enumerate(record.frames)])
        self._insert_rows("problems", [[record.hash, analysis, p.kind, p.severity, _u64(p.address), _u64(p.offset),
                                        p.message] for analysis, p in record.all_problems()])
        self._insert_rows("summaries", [[record.hash, name, json.dumps(summary, default=str)]
                                        for name, summary in record.analyses.items()])
        self._insert_rows("stack_hogs", [
            [record.hash, str(frame.get("function")), int(frame.get("bytes") or 0)]
            for frame in (record.analyses.get("stackuse") or {}).get("biggest_frames") or ()
            if isinstance(frame, dict) and frame.get("function")])
        self._remember_file(record.path, stat, record.hash)

    def _insert_rows(self, table, rows):
        """One multi-row INSERT: DuckDB's per-statement cost dwarfs the rows' (and
        executemany is one statement per row)."""
        if not rows:
            return
        one = "(%s)" % ", ".join("?" for _ in rows[0])
        self.connection.execute("INSERT INTO %s VALUES %s" % (table, ", ".join([one] * len(rows))),
                                [value for row in rows for value in row])

    # -- reading -------------------------------------------------------------------------

    def query(self, sql, parameters=None):
        """Rows of a SELECT as a list of dicts."""
        try:
            cursor = self.connection.execute(sql, parameters or [])
            names = [column[0] for column in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]
        except self._duckdb.Error as error:
            self._raise(error)

    def record(self, content_key):
        row = self._query_one("SELECT record FROM dumps WHERE hash = ?", [content_key])
        return json.loads(row[0]) if row else None

    def export_parquet(self, directory, replace=False):
        """Every table as ``<directory>/<table>.parquet``; returns the paths.

        Files are written under temporary names and renamed into place only when
        every table was written, so a failure leaves no half-written export.  An
        existing export is refused unless ``replace``."""
        targets = check_parquet_export(directory, replace)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as error:
            raise StorageError("cannot create %s: %s" % (directory, error.strerror or error))
        if not os.access(directory, os.W_OK):
            raise StorageError("cannot export to %s: permission denied" % directory)
        try:
            with contextlib.ExitStack() as files:
                for table, path in targets:
                    # A fresh, exclusively created name per table (outputs.replacing):
                    # DuckDB's COPY follows links, the name it writes to has none.
                    partial = files.enter_context(replacing(path, replace))
                    self.connection.execute("COPY %s TO '%s' (FORMAT PARQUET)"
                                            % (table, partial.replace("'", "''")))
        except self._duckdb.Error as error:
            raise StorageError("cannot export to %s: %s" % (directory, _strip_prefix(str(error).splitlines()[0])))
        except BadInput as error:
            raise StorageError(str(error))
        return [path for _, path in targets]
