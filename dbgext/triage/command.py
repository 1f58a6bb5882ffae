"""``dbgext triage``: one command name, three uses.

* ``dbgext triage PATH... [--workers N] [--db FILE] [--timeout S] [--analyses A,B] [--dask ADDR]``
  triages every dump under the paths into the database.
* ``dbgext triage report --db FILE [--top N] [--json] [--parquet DIR]`` prints the fleet view.
* ``dbgext triage --dump FILE`` offline, or ``!py commands\\triage.py`` inside WinDbg (no
  paths: the current target), prints the one per-dump record (``--json`` for JSON).

The first positional word ``report`` selects the report (a directory named
``report`` is given as ``./report``).
"""

import argparse
import io
import json
import os

from ..command import Command
from ..errors import BadInput
from .record import build_record, content_hash, load_plugins, select_analyses
from .run import DEFAULT_TIMEOUT

DEFAULT_DB = "triage.duckdb"


def _analysis_names(text):
    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    return names or None


USES = """uses:
  dbgext triage PATH... [--db FILE] [--workers N] [--timeout S] [--dask tcp://HOST:PORT]
  dbgext triage report --db FILE [--top N] [--json] [--parquet DIR]
  dbgext triage --dump FILE [--json] [--out FILE]     (inside WinDbg: !py commands\\triage.py)
see docs/triage.md"""


def add_arguments(parser):
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = USES
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="dump files, directories (searched recursively) or globs; or the word "
                        "'report' for the aggregate view")
    parser.add_argument("--db", default=DEFAULT_DB, metavar="FILE",
                        help="DuckDB results file (default: %s)" % DEFAULT_DB)
    parser.add_argument("--workers", type=int, metavar="N", help="local worker processes (default: one per core)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                        help="seconds one dump may take before its worker is killed (default: %g; 0 = none)"
                        % DEFAULT_TIMEOUT)
    parser.add_argument("--analyses", metavar="A,B", help="analyses to run (default: all installed; known: "
                        "rtltrace, etwstacks, ipt, stackuse)")
    parser.add_argument("--dask", metavar="tcp://HOST:PORT", help="run on this Dask scheduler instead of locally")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE (or call MODULE:FUNCTION) to register extra analyses "
                        "(repeatable; it must import on the workers too)")
    parser.add_argument("--retry-failed", action="store_true", help="analyse again dumps recorded as failed")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument("--top", type=int, default=10, metavar="N", help="report: rows per section (default: 10)")
    parser.add_argument("--parquet", metavar="DIR", help="also export every table to DIR/<table>.parquet")
    parser.add_argument("--out", metavar="FILE", help="one target's record: also write it as JSON to FILE")


def run(ctx, args):
    if args.paths and args.paths[0] == "report":
        return _report(ctx, args)
    if args.paths:
        if args.dump:
            raise BadInput("give dump PATHs or --dump FILE, not both")
        return _batch(ctx, args)
    if ctx.has_target_source():
        return _one_target(ctx, args)
    raise BadInput("give dump PATHs to triage, 'report --db FILE' for the fleet view, or --dump FILE for one record")


def _batch(ctx, args):
    from .progress import Progress
    from .run import expand_paths, run_batch
    from .store import TriageStore

    if args.workers is not None and args.workers < 1:
        raise BadInput("--workers must be at least 1")
    files, unmatched = expand_paths(args.paths)
    if not files:
        raise BadInput("; ".join(unmatched) or "no dump files under %s" % " ".join(args.paths))
    progress = None if (args.no_progress or args.json) else Progress()
    with TriageStore(args.db) as store:
        result = run_batch(files, store, workers=args.workers, timeout=args.timeout,
                           analyses=_analysis_names(args.analyses), plugins=args.plugin, symbols=args.symbols,
                           dask_address=args.dask, retry_failed=args.retry_failed, progress=progress)
        if args.parquet:
            store.export_parquet(args.parquet)
    result.unreadable = unmatched + result.unreadable
    if args.json:
        ctx.out.json({"db": args.db, "found": result.found, "skipped": result.skipped, "analysed": result.analysed,
                      "failed": result.failed, "problems": result.unreadable, "seconds": round(result.seconds, 3)})
        return 0
    for message in result.unreadable:
        ctx.out.line("skipped: %s" % message)
    rate = result.analysed / result.seconds * 60.0 if result.seconds > 0 else 0.0
    ctx.out.line("%d dumps found, %d already recorded, %d analysed (%d failed) in %.1f s (%.1f dumps/min) -> %s"
                 % (result.found, result.skipped, result.analysed, result.failed, result.seconds, rate, args.db))
    if result.analysed:
        ctx.out.line("see: dbgext triage report --db %s" % args.db)
    return 0


def _report(ctx, args):
    from .report import build_report, render_report
    from .store import TriageStore

    if len(args.paths) > 1:
        raise BadInput("'triage report' takes no paths (got %s)" % " ".join(args.paths[1:]))
    if args.top < 1:
        raise BadInput("--top must be at least 1")
    with TriageStore(args.db, read_only=True) as store:
        report = build_report(store, top=args.top)
        if args.parquet:
            store.export_parquet(args.parquet)
    if args.json:
        ctx.out.json(report)
    else:
        render_report(ctx.out, report)
    return 0


def _one_target(ctx, args):
    from .report import render_record

    load_plugins(args.plugin)
    analyses = select_analyses(_analysis_names(args.analyses))
    path = args.dump
    size = os.path.getsize(path) if path else None
    content_key = content_hash(path) if path else None
    record = build_record(ctx.target, path, size, content_key, analyses)
    if args.out:
        try:
            with io.open(args.out, "w", encoding="utf-8") as handle:
                json.dump(record.as_dict(), handle, indent=2, default=str)
        except OSError as error:
            raise BadInput("cannot write %s: %s" % (args.out, error.strerror or error))
    if args.json:
        ctx.out.json(record.as_dict())
    else:
        render_record(ctx.out, record)
    return 0


COMMAND = Command("triage", "Triage many crash/live dumps into a DuckDB file, report WER-like buckets, "
                  "or print one dump's triage record", add_arguments, run)
