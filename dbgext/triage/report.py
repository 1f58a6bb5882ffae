"""The fleet view over a triage database, like Windows Error Reporting buckets.

:func:`build_report` is SQL over the store returning plain data (one dict, the
``--json`` form); :func:`render_report` prints it as tables.
"""

import datetime

from .record import STATUS_FAILED, STATUS_OK

# Analyses whose problems make a dump "suspicious" in the report.
SUSPICIOUS_ANALYSES = ("rtltrace", "etwstacks")

WHEN = "coalesce(system_time, recorded_at)"


def _plain(value):
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.strftime("%Y-%m-%dT%H:%M:%SZ") if isinstance(value, datetime.datetime) else value.isoformat()
    return value


def _plain_rows(rows):
    return [{key: _plain(value) for key, value in row.items()} for row in rows]


def build_report(store, top=10, examples=3):
    totals = store.query(
        "SELECT count(*) AS dumps, count(*) FILTER (WHERE status = ?) AS ok, "
        "count(*) FILTER (WHERE status = ?) AS failed, min(system_time) AS first_seen, max(system_time) AS last_seen "
        "FROM dumps", [STATUS_OK, STATUS_FAILED])[0]
    buckets = store.query(
        "SELECT bugcheck_code, signature, count(*) AS dumps, min({when}) AS first_seen, max({when}) AS last_seen, "
        "list_slice(list(path ORDER BY {when}), 1, ?) AS examples "
        "FROM dumps WHERE kind IS NOT NULL GROUP BY bugcheck_code, signature "
        "ORDER BY dumps DESC, first_seen, signature LIMIT ?".format(when=WHEN), [examples, top])
    hogs = store.query(
        "SELECT function, max(frame_bytes) AS biggest_frame, count(DISTINCT hash) AS dumps FROM stack_hogs "
        "GROUP BY function ORDER BY biggest_frame DESC, dumps DESC, function LIMIT ?", [top])
    placeholders = ", ".join("?" for _ in SUSPICIOUS_ANALYSES)
    suspicious = store.query(
        "SELECT d.path, p.analysis, count(*) AS problems, min(p.message) AS example "
        "FROM problems p JOIN dumps d ON d.hash = p.hash WHERE p.analysis IN (%s) "
        "GROUP BY d.path, p.analysis ORDER BY problems DESC, d.path LIMIT ?" % placeholders,
        list(SUSPICIOUS_ANALYSES) + [top])
    failures = store.query(
        "SELECT path, reason FROM dumps WHERE status = ? ORDER BY recorded_at, path LIMIT ?", [STATUS_FAILED, top])
    return {
        "totals": _plain_rows([totals])[0],
        "buckets": _plain_rows(buckets),
        "stack_hogs": _plain_rows(hogs),
        "suspicious": _plain_rows(suspicious),
        "failures": _plain_rows(failures),
    }


def bucket_label(code, signature):
    return "%s %s" % ("0x%X" % code if code is not None else "-", signature or "(no stack)")


def render_report(out, report):
    totals = report["totals"]
    out.line("%d dumps: %d ok, %d failed (first %s, last %s)" % (
        totals["dumps"], totals["ok"], totals["failed"], totals["first_seen"] or "-", totals["last_seen"] or "-"))
    out.line()
    out.table([[bucket_label(b["bugcheck_code"], b["signature"]), b["dumps"], b["first_seen"] or "-",
                b["last_seen"] or "-", ", ".join(b["examples"] or [])] for b in report["buckets"]],
              ["bucket (bug check, faulting function)", "dumps", "first seen", "last seen", "examples"],
              title="Crash buckets")
    out.line()
    out.table([[h["function"], h["biggest_frame"], h["dumps"]] for h in report["stack_hogs"]],
              ["function", "biggest frame (bytes)", "dumps"], title="Top stack hogs")
    out.line()
    out.table([[s["path"], s["analysis"], s["problems"], s["example"]] for s in report["suspicious"]],
              ["dump", "analysis", "problems", "example"], title="Suspicious trace databases / ETW caches")
    out.line()
    out.table([[f["path"], f["reason"]] for f in report["failures"]], ["dump", "reason"], title="Failed dumps")


def render_record(out, record):
    """One dump's triage record as text (what ``!py commands\\triage.py`` prints)."""
    out.line("dump       %s" % (record.path or "(current target)"))
    if record.size is not None:
        out.line("size       %d bytes, hash %s" % (record.size, record.hash))
    out.line("kind       %s, %s, build %s, time %s" % (record.kind or "?", record.arch or "?",
                                                     record.build if record.build is not None else "?",
                                                     record.system_time or "?"))
    label = "exception " if record.kind == "minidump" else "bug check "
    if record.bugcheck_code is not None:
        out.line("%s 0x%X (%s)" % (label, record.bugcheck_code,
                                    ", ".join("0x%x" % p for p in record.bugcheck_parameters)))
    else:
        out.line("%s none" % label)
    out.line("signature  %s" % (record.signature or "(no crash context)"))
    for index, frame in enumerate(record.frames):
        out.line("  %02d %s" % (index, frame))
    for name, summary in record.analyses.items():
        out.line("%-10s %s" % (name, ", ".join("%s=%s" % (key, _short(value)) for key, value in summary.items())))
    reason = ": " + record.reason if record.reason else ""
    out.line("status     %s%s (%.3f s)" % (record.status, reason, record.seconds))
    if record.problems:
        out.table([[p["analysis"], "0x%x" % p["address"] if p.get("address") is not None else "-", p["message"]]
                   for p in record.problems], ["analysis", "address", "problem"], title="Problems")


def _short(value, limit=60):
    text = str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
