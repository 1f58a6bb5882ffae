"""The fleet view over a triage database, like Windows Error Reporting buckets, and
one dump's record as text, like ``!analyze -v``.

:func:`build_report` is SQL over the store returning plain data (one dict, the
``--json`` form); :func:`render_report` and :func:`render_record` only lay out what
they are given.
"""

import datetime
from collections import OrderedDict

from ..hexaddr import hexaddr
from .record import STATUS_FAILED, STATUS_OK
from .signature import BASIS_OFFSET, BASIS_SYMBOL

# Analyses whose problems make a dump "suspicious" in the report.
SUSPICIOUS_ANALYSES = ("rtltrace", "etwstacks")

WHEN = "coalesce(system_time, recorded_at)"
JOINED = "symbol (same image build)"   # sorts after "symbol": min() says how a bucket was named

# A dump bucketed by module+offset joins the bucket another dump of the same image
# build (name, timestamp, size) got by name at the same offset: buckets do not
# depend on whether symbols happened to be there.
RESOLVED_DUMPS = """
WITH named AS (
    SELECT image, module_timestamp, module_size, module_offset, bugcheck_code, min(bucket) AS bucket
    FROM dumps WHERE bucket_basis = '{symbol}' AND module_timestamp IS NOT NULL
    GROUP BY image, module_timestamp, module_size, module_offset, bugcheck_code)
SELECT d.*, coalesce(n.bucket, d.bucket) AS bucket_key,
       CASE WHEN n.bucket IS NOT NULL THEN '{joined}' ELSE d.bucket_basis END AS key_basis
FROM dumps d LEFT JOIN named n
  ON d.bucket_basis = '{offset}' AND n.image = d.image AND n.module_timestamp = d.module_timestamp
 AND n.module_size = d.module_size AND n.module_offset = d.module_offset
 AND n.bugcheck_code IS NOT DISTINCT FROM d.bugcheck_code
""".format(symbol=BASIS_SYMBOL, offset=BASIS_OFFSET, joined=JOINED)


def _plain(value):
    if isinstance(value, datetime.datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%SZ")
    if isinstance(value, datetime.date):
        return value.isoformat()
    return value


def _plain_rows(rows):
    return [dict((key, _plain(value)) for key, value in row.items()) for row in rows]


def build_report(store, top=10, examples=3):
    totals = store.query(
        "SELECT count(*) AS dumps, count(*) FILTER (WHERE status = ?) AS ok, "
        "count(*) FILTER (WHERE status = ?) AS failed, min(system_time) AS first_seen, max(system_time) AS last_seen "
        "FROM dumps", [STATUS_OK, STATUS_FAILED])[0]
    # An offset bucket is one image build's: the same offset in another build is other code.
    buckets = store.query(
        "SELECT bucket_key AS bucket, min(key_basis) AS basis, "
        "count(*) FILTER (WHERE key_basis = '{joined}') AS joined_by_image_build, "
        "any_value(bugcheck_code) AS bugcheck_code, "
        "any_value(bugcheck_name) AS bugcheck_name, any_value(image) AS image, "
        "any_value(module_timestamp) AS module_timestamp, count(*) AS dumps, "
        "min({when}) AS first_seen, max({when}) AS last_seen, "
        "list_slice(list(path ORDER BY {when}), 1, ?) AS examples "
        "FROM ({resolved}) WHERE kind IS NOT NULL "
        "GROUP BY bucket_key, CASE WHEN key_basis = '{offset}' THEN module_timestamp END "
        "ORDER BY dumps DESC, first_seen, bucket LIMIT ?".format(when=WHEN, resolved=RESOLVED_DUMPS,
                                                               offset=BASIS_OFFSET, joined=JOINED),
        [examples, top])
    hogs = store.query(
        "SELECT function, max(frame_bytes) AS biggest_frame, count(DISTINCT hash) AS dumps FROM stack_hogs "
        "GROUP BY function ORDER BY biggest_frame DESC, dumps DESC, function LIMIT ?", [top])
    placeholders = ", ".join("?" for _ in SUSPICIOUS_ANALYSES)
    suspicious = store.query(
        "SELECT d.path, p.analysis, count(*) AS problems, min(p.kind) AS kind, min(p.message) AS example "
        "FROM problems p JOIN dumps d ON d.hash = p.hash WHERE p.analysis IN (%s) AND p.severity = 'error' "
        "GROUP BY d.path, p.analysis ORDER BY problems DESC, d.path LIMIT ?" % placeholders,
        list(SUSPICIOUS_ANALYSES) + [top])
    problem_kinds = store.query(
        "SELECT analysis, kind, severity, count(*) AS problems, count(DISTINCT hash) AS dumps FROM problems "
        "GROUP BY analysis, kind, severity ORDER BY problems DESC, analysis, kind LIMIT ?", [top])
    failures = store.query(
        "SELECT path, reason FROM dumps WHERE status = ? ORDER BY recorded_at, path LIMIT ?", [STATUS_FAILED, top])
    return {
        "schema_version": 1,
        "totals": _plain_rows([totals])[0],
        "buckets": _plain_rows(buckets),
        "stack_hogs": _plain_rows(hogs),
        "suspicious": _plain_rows(suspicious),
        "problem_kinds": _plain_rows(problem_kinds),
        "failures": _plain_rows(failures),
    }


def _timestamp(value):
    return "%08x" % value if value is not None else "-"


def render_report(out, report):
    totals = report["totals"]
    out.line("%d dumps: %d ok, %d failed (first %s, last %s)" % (
        totals["dumps"], totals["ok"], totals["failed"], totals["first_seen"] or "-", totals["last_seen"] or "-"))
    out.line()
    out.table([[b["bucket"], b["bugcheck_name"] or "-", b["basis"], b["image"] or "-",
                _timestamp(b["module_timestamp"]), b["dumps"], b["joined_by_image_build"], b["first_seen"] or "-",
                b["last_seen"] or "-", ", ".join(b["examples"] or [])] for b in report["buckets"]],
              ["bucket", "name", "by", "image", "timestamp", "dumps", "of them without symbols", "first seen",
               "last seen", "examples"], title="Crash buckets")
    out.line()
    out.table([[h["function"], h["biggest_frame"], h["dumps"]] for h in report["stack_hogs"]],
              ["function", "biggest frame (bytes)", "dumps"], title="Top stack hogs")
    out.line()
    out.table([[s["path"], s["analysis"], s["problems"], s["kind"], s["example"]] for s in report["suspicious"]],
              ["dump", "analysis", "problems", "kind", "example"], title="Suspicious trace databases / ETW caches")
    out.line()
    out.table([[k["analysis"], k["kind"], k["severity"], k["problems"], k["dumps"]] for k in report["problem_kinds"]],
              ["analysis", "kind", "severity", "problems", "dumps"], title="Problems by kind")
    out.line()
    out.table([[f["path"], f["reason"]] for f in report["failures"]], ["dump", "reason"], title="Failed dumps")


HOW_FOUND = {"bugcheck_argument": "named by the bug check's arguments (no stack frame)",
             "exception_record": "the exception record's address (no stack frame)"}


def render_record(out, record, pointer_size=8):
    """One dump's triage record as text, laid out like ``!analyze -v``."""
    def address(value):
        return hexaddr(value, pointer_size)

    out.line("DUMP:             %s" % (record.path or "(current target)"))
    if record.size is not None:
        out.line("SIZE:             0x%x bytes, sha256 %s" % (record.size, record.hash))
    out.line("KIND:             %s, %s, build %s, time %s" % (
        record.kind or "?", record.arch or "?", record.build if record.build is not None else "?",
        record.system_time or "?"))
    out.line()
    if record.bugcheck_code is None:
        out.line("(no bug check or exception in this target)")
    else:
        user_mode = record.kind == "minidump"
        out.line("%s (%x)" % (record.bugcheck_name or "UNKNOWN_%s" % ("EXCEPTION" if user_mode else "BUGCHECK"),
                              record.bugcheck_code))
        out.line("Arguments:")
        for index, value in enumerate(record.bugcheck_parameters):
            label = record.bugcheck_labels[index] if index < len(record.bugcheck_labels) else None
            out.line("Arg%d: %s%s" % (index + 1, address(value), ", " + label if label else ""))
    out.line()
    faulting = record.faulting
    if faulting is not None:
        out.line("FAULTING_IP:      %s (%s), %s" % (faulting.name, address(faulting.address),
                                                   HOW_FOUND.get(faulting.how, "stack frame found by %s" % faulting.how)))
        out.line("MODULE_NAME:      %s" % (faulting.module or "-"))
        out.line("IMAGE_NAME:       %s" % (faulting.image or "-"))
        out.line("IMAGE_TIMESTAMP:  %s, size 0x%x" % (_timestamp(faulting.module_timestamp), faulting.module_size or 0))
        out.line("SYMBOL_NAME:      %s" % (faulting.function or "(no symbols: %s)" % faulting.module_relative))
    out.line("BUCKET_ID:        %s (by %s)" % (record.bucket or "-", record.bucket_basis or "-"))
    for key, value in record.dump.items():
        rows = value if isinstance(value, list) else [value]
        out.line("%-17s %s" % (key.upper() + ":", _fact(rows[0], address) if rows else "none"))
        for row in rows[1:]:
            out.line("%-17s %s" % ("", _fact(row, address)))
    if record.frames:
        out.line()
        out.line("STACK_TEXT:")
        for index, frame in enumerate(record.frames):
            out.line("%02x %s %s  (%s)" % (index, address(frame.address), frame.name, frame.how))
    out.line()
    for name, summary in record.analyses.items():
        scalars = [(key, value) for key, value in summary.items() if not isinstance(value, (list, dict))]
        out.line("%-17s %s" % (name.upper() + ":", _fact(OrderedDict(scalars), address) if scalars else ""))
        for key, value in summary.items():
            for row in (value if isinstance(value, list) else [value] if isinstance(value, dict) else []):
                out.line("%-17s %s: %s" % ("", key, _fact(row, address)))
    reason = ": " + record.reason if record.reason else ""
    out.line("STATUS:           %s%s (%.3f s)" % (record.status, reason, record.seconds))
    problems = record.all_problems()
    if problems:
        out.table([[analysis, problem.kind, problem.severity,
                    address(problem.address) if problem.address is not None else "-", problem.message]
                   for analysis, problem in problems], ["analysis", "kind", "severity", "address", "problem"],
                  title="Problems")


SMALL_NUMBER = 0x100000   # counts and byte sizes below this read best in decimal


def _fact(value, address):
    """A fact on one line, numbers as WinDbg shows them: ``name oldfilter.sys, start
    fffff800`13000000, count 12, tag 0x6c6f6f50``."""
    if isinstance(value, dict):
        return ", ".join("%s %s" % (key, _fact(item, address)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return "[%s]" % ", ".join(_fact(item, address) for item in value)
    if isinstance(value, bool) or not isinstance(value, int):
        return "-" if value is None else str(value)
    if value < SMALL_NUMBER:
        return "%d" % value
    return address(value) if value > 0xFFFFFFFF else "0x%x" % value
