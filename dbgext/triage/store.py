"""Triage results in an embedded DuckDB file.

``dumps`` has exactly one row per dump ever seen, keyed by content hash; the other
tables hang off that key: ``frames`` (the faulting stack), ``problems`` (everything
the analyses reported), ``summaries`` (each analysis' compact summary as JSON) and
``stack_hogs`` (the faulting thread's biggest frames, for fleet-wide ranking).
Every dump is written in its own transaction, so a run killed midway keeps what it
finished and a re-run finds those hashes and skips them.
"""

import json
import os

from ..errors import DbgextError
from .record import STATUS_FAILED, DumpRecord

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS dumps (
        hash VARCHAR PRIMARY KEY,
        path VARCHAR,
        size BIGINT,
        kind VARCHAR,
        arch VARCHAR,
        build INTEGER,
        system_time TIMESTAMP,
        bugcheck_code UBIGINT,
        bugcheck_parameters UBIGINT[],
        signature VARCHAR,
        status VARCHAR NOT NULL,
        reason VARCHAR,
        analysis_seconds DOUBLE,
        analyses VARCHAR[],
        recorded_at TIMESTAMP DEFAULT current_timestamp,
        record VARCHAR
    )""",
    "CREATE TABLE IF NOT EXISTS frames (hash VARCHAR, position INTEGER, frame VARCHAR)",
    "CREATE TABLE IF NOT EXISTS problems (hash VARCHAR, analysis VARCHAR, message VARCHAR, address UBIGINT)",
    "CREATE TABLE IF NOT EXISTS summaries (hash VARCHAR, analysis VARCHAR, summary VARCHAR)",
    "CREATE TABLE IF NOT EXISTS stack_hogs (hash VARCHAR, function VARCHAR, frame_bytes BIGINT)",
]

CHILD_TABLES = ("frames", "problems", "summaries", "stack_hogs")



def import_duckdb():
    try:
        import duckdb
    except ImportError:
        raise DbgextError("the triage database needs DuckDB: pip install \"dbgext[triage]\" (or duckdb)")
    return duckdb


def _u64(value):
    return value if isinstance(value, int) and 0 <= value < 1 << 64 else None


class TriageStore(object):
    """One DuckDB database file (``:memory:`` works for tests)."""

    def __init__(self, path, read_only=False):
        duckdb = import_duckdb()
        self.path = path
        if read_only and path != ":memory:" and not os.path.exists(path):
            raise DbgextError("no triage database at %s (run `dbgext triage PATH... --db %s` first)"
                              % (path, path))
        try:
            self.connection = duckdb.connect(path, read_only=read_only)
        except duckdb.Error as error:
            raise DbgextError("cannot open triage database %s: %s" % (path, error))
        if not read_only:
            for statement in SCHEMA:
                self.connection.execute(statement)

    def close(self):
        self.connection.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- what is already known ---------------------------------------------------------

    def status_by_hash(self):
        """{content hash: status} of every recorded dump."""
        return dict(self.connection.execute("SELECT hash, status FROM dumps").fetchall())

    def count(self, table="dumps"):
        if table not in ("dumps",) + CHILD_TABLES:
            raise ValueError(table)
        return self.connection.execute("SELECT count(*) FROM %s" % table).fetchone()[0]

    # -- writing -------------------------------------------------------------------------

    def add(self, record, replace_failed=False):
        """Insert one dump's record and its child rows in one transaction.

        Returns False (and writes nothing) when the hash is already recorded —
        unless ``replace_failed`` and the recorded row failed, which is replaced."""
        if isinstance(record, dict):
            record = DumpRecord.from_dict(record)
        existing = self.connection.execute("SELECT status FROM dumps WHERE hash = ?", [record.hash]).fetchone()
        if existing is not None:
            if not (replace_failed and existing[0] == STATUS_FAILED):
                return False
            # Older DuckDB rejects re-inserting a primary key deleted in the same
            # transaction, so the failed row goes in a transaction of its own; a run
            # killed in between simply finds the dump new next time.
            self._transaction(self._delete, record.hash)
        self._transaction(self._insert, record)
        return True

    def _transaction(self, action, argument):
        con = self.connection
        con.execute("BEGIN TRANSACTION")
        try:
            action(argument)
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise

    def _delete(self, content_key):
        for table in ("dumps",) + CHILD_TABLES:
            self.connection.execute("DELETE FROM %s WHERE hash = ?" % table, [content_key])

    def _insert(self, record):
        con = self.connection
        con.execute(
            "INSERT INTO dumps (hash, path, size, kind, arch, build, system_time, bugcheck_code, "
            "bugcheck_parameters, signature, status, reason, analysis_seconds, analyses, record) "
            "VALUES (?, ?, ?, ?, ?, ?, CAST(? AS TIMESTAMP), ?, ?, ?, ?, ?, ?, ?, ?)",
            [record.hash, record.path, record.size, record.kind, record.arch, record.build,
             record.system_time.rstrip("Z").replace("T", " ") if record.system_time else None,
             _u64(record.bugcheck_code), [_u64(p) for p in record.bugcheck_parameters],
             record.signature, record.status, record.reason, record.seconds,
             list(record.analyses), json.dumps(record.as_dict(), default=str)])
        self._insert_rows("frames", [[record.hash, index, frame] for index, frame in enumerate(record.frames)])
        self._insert_rows("problems", [[record.hash, p.get("analysis"), p.get("message"), _u64(p.get("address"))]
                                       for p in record.problems])
        self._insert_rows("summaries", [[record.hash, name, json.dumps(summary, default=str)]
                                        for name, summary in record.analyses.items()])
        self._insert_rows("stack_hogs", [
            [record.hash, str(frame.get("function")), int(frame.get("bytes") or 0)]
            for frame in (record.analyses.get("stackuse") or {}).get("biggest_frames") or ()
            if isinstance(frame, dict) and frame.get("function")])

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
        cursor = self.connection.execute(sql, parameters or [])
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    def record(self, content_key):
        row = self.connection.execute("SELECT record FROM dumps WHERE hash = ?", [content_key]).fetchone()
        return json.loads(row[0]) if row else None

    def export_parquet(self, directory):
        """Every table as ``<directory>/<table>.parquet``; returns the paths."""
        os.makedirs(directory, exist_ok=True)
        paths = []
        for table in ("dumps",) + CHILD_TABLES:
            path = os.path.join(directory, table + ".parquet")
            self.connection.execute("COPY %s TO '%s' (FORMAT PARQUET)" % (table, path.replace("'", "''")))
            paths.append(path)
        return paths
