"""``dbgext triage``: three sub-actions.

* ``dbgext triage run PATH... [--db FILE] [--workers N] [--timeout S] [--analyses A,B] [--dask ADDR]``
  triages every dump under the paths into the database.  ``dbgext triage PATH...``
  (no sub-action word) means the same.
* ``dbgext triage report --db FILE [--top N] [--json] [--parquet DIR]`` prints the fleet view.
* ``dbgext triage record --dump FILE`` offline, or ``!py commands\\triage.py`` inside
  WinDbg (the current target), prints the one per-dump record (``--json`` for
  JSON, ``--out FILE`` to write it).  ``dbgext triage --dump FILE`` means the same.

Outputs never overwrite inputs: ``--out`` or ``--db`` naming a dump (or a symbol
file) is refused, and an existing ``--out`` file or parquet export is replaced only
with ``--force``.  No output is written through a link (dbgext.outputs): a link at
``--out``, ``--db`` (or its ``.wal``), the ``--parquet`` folder or a file in it is
refused.
"""

import argparse
import json
import os

from ..command import Command
from ..errors import EXIT_OK, EXIT_PROBLEMS, BadInput
from ..outputs import check_output, write_text
from .record import build_record, content_hash, load_plugins, select_analyses
from .run import DEFAULT_TIMEOUT
from .store import check_parquet_export

DEFAULT_DB = "triage.duckdb"


def _analysis_names(text):
    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    return names or None


def _database_option(parser, default):
    parser.add_argument("--db", default=default or DEFAULT_DB, metavar="FILE",
                        help="DuckDB results file (default: %s)" % DEFAULT_DB)


def _analysis_options(parser, default):
    parser.add_argument("--analyses", metavar="A,B", default=default,
                        help="analyses to run (default: all installed; known: rtltrace, etwstacks, ipt, stackuse)")
    parser.add_argument("--plugin", action="append", default=default, metavar="MODULE",
                        help="import MODULE (or call MODULE:FUNCTION) to register extra analyses "
                        "(repeatable; it must import on the workers too)")


def _export_option(parser, default):
    parser.add_argument("--parquet", metavar="DIR", default=default,
                        help="also export every table to DIR/<table>.parquet")


def _force_option(parser, default):
    parser.add_argument("--force", action="store_true", default=default or False,
                        help="replace an existing output file (--out) or export (--parquet)")


def _batch_options(parser, default):
    parser.add_argument("--workers", type=int, metavar="N", default=default,
                        help="local worker processes (default: one per core)")
    parser.add_argument("--timeout", type=float, default=default or DEFAULT_TIMEOUT, metavar="S",
                        help="seconds one dump may take before its worker is killed (default: %g; 0 = none)"
                        % DEFAULT_TIMEOUT)
    parser.add_argument("--dask", metavar="tcp://HOST:PORT", default=default,
                        help="run on this Dask scheduler instead of locally")
    parser.add_argument("--retry-failed", action="store_true", default=default or False,
                        help="analyse again dumps recorded as failed")
    parser.add_argument("--no-progress", action="store_true", default=default or False,
                        help="no progress bar on stderr")


def _report_option(parser, default):
    parser.add_argument("--top", type=int, default=default or 10, metavar="N", help="rows per section (default: 10)")


def _record_option(parser, default):
    parser.add_argument("--out", metavar="FILE", default=default, help="also write the record as JSON to FILE")


# Each sub-action's options, declared once per group.
ACTIONS = [
    ("run", "triage every dump under PATHs into the database (the default action)",
     (_database_option, _analysis_options, _export_option, _force_option, _batch_options)),
    ("report", "the fleet view: buckets, stack hogs, suspicious analyses, failures",
     (_database_option, _export_option, _force_option, _report_option)),
    ("record", "one target's record, like !analyze -v (--dump FILE, or WinDbg's target)",
     (_analysis_options, _force_option, _record_option)),
]
OPTION_GROUPS = (_database_option, _analysis_options, _export_option, _force_option, _batch_options,
                 _report_option, _record_option)


class _ActionsAndPaths(object):
    """The sub-action names as argparse's ``choices``, accepting any word (argparse
    checks the first word against them before the action sees it): a path means ``run``."""

    def __init__(self, parsers):
        self.parsers = parsers

    def __contains__(self, word):
        return True

    def __iter__(self):
        return iter(self.parsers)

    def values(self):
        return self.parsers.values()


class _DefaultsToRun(argparse._SubParsersAction):
    """``dbgext triage PATH...`` keeps working: a first word that is not a
    sub-action is a path, and the sub-action is ``run``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.choices = _ActionsAndPaths(self._name_parser_map)

    def __call__(self, parser, namespace, values, option_string=None):
        if values and values[0] not in self._name_parser_map:
            values = ["run"] + list(values)
        super().__call__(parser, namespace, values, option_string)


def add_arguments(parser):
    # Every sub-action's options are accepted before the sub-action word too, with
    # suppressed defaults so a value given there survives: options go in any order.
    for declare in OPTION_GROUPS:
        declare(parser, argparse.SUPPRESS)
    parser.register("action", "parsers_defaulting_to_run", _DefaultsToRun)
    subparsers = parser.add_subparsers(dest="action", metavar="ACTION", action="parsers_defaulting_to_run")
    for name, help_text, groups in ACTIONS:
        action_parser = subparsers.add_parser(name, help=help_text, description=help_text)
        if name == "run":
            action_parser.add_argument("paths", nargs="+", metavar="PATH",
                                       help="dump files, directories (searched recursively) or globs")
        for declare in groups:
            declare(action_parser, argparse.SUPPRESS)


def _fill_defaults(args):
    defaults = argparse.ArgumentParser(add_help=False)
    for declare in OPTION_GROUPS:
        declare(defaults, None)
    for name, value in vars(defaults.parse_args([])).items():
        if not hasattr(args, name):
            setattr(args, name, value)
    if not hasattr(args, "paths"):
        args.paths = []


def run(ctx, args):
    _fill_defaults(args)
    action = args.action
    if action is None:
        if not ctx.has_target_source():
            raise BadInput("give dump PATHs to triage, 'report --db FILE' for the fleet view, "
                           "or --dump FILE for one record")
        action = "record"
    if action == "run":
        if args.dump:
            raise BadInput("give dump PATHs or --dump FILE, not both")
        return _batch(ctx, args)
    if action == "report":
        return _report(ctx, args)
    if not ctx.has_target_source():
        raise BadInput("triage record needs --dump FILE (or a WinDbg session)")
    return _one_target(ctx, args)


def _same_file(first, second):
    return os.path.realpath(first) == os.path.realpath(second)


def _inputs(args):
    return [args.dump] if args.dump else []


def _refuse_overwriting_inputs(option, path, inputs):
    for source in inputs:
        if _same_file(path, source):
            raise BadInput("%s %s is one of the inputs: refusing to overwrite it" % (option, path))


def _batch(ctx, args):
    from .progress import Progress
    from .run import expand_paths, run_batch
    from .store import TriageStore

    if args.workers is not None and args.workers < 1:
        raise BadInput("--workers must be at least 1")
    files, unmatched = expand_paths(args.paths)
    if not files:
        raise BadInput("; ".join(unmatched) or "no dump files under %s" % " ".join(args.paths))
    _refuse_overwriting_inputs("--db", args.db, files)
    if args.parquet:
        check_parquet_export(args.parquet, replace=args.force)
    progress = None if (args.no_progress or args.json) else Progress(stream=ctx.err.stream)
    with TriageStore(args.db) as store:
        result = run_batch(args.paths, store, workers=args.workers, timeout=args.timeout,
                           analyses=_analysis_names(args.analyses), plugins=args.plugin or (),
                           symbols=args.symbols, dask_address=args.dask, retry_failed=args.retry_failed,
                           progress=progress, exclude=[args.db, args.db + ".wal"], expanded=(files, unmatched))
        if args.parquet:
            store.export_parquet(args.parquet, replace=args.force)
    document = result_document(args.db, result)
    if args.json:
        ctx.out.json(document)
    else:
        for message in result.unreadable:
            ctx.warn("skipped: %s" % message)
        ctx.out.line("%d dumps found, %d already recorded, %d analysed (%d failed) in %.1f s (%.1f dumps/min) -> %s"
                     % (result.found, result.skipped, result.analysed, result.failed, result.seconds,
                        document["dumps_per_minute"], args.db))
        if result.analysed:
            ctx.out.line("see: dbgext triage report --db %s" % args.db)
    return EXIT_PROBLEMS if (result.failed or result.unreadable) else EXIT_OK


def result_document(db, result):
    rate = result.analysed / result.seconds * 60.0 if result.seconds > 0 else 0.0
    return {"schema_version": 1, "db": db, "found": result.found, "skipped": result.skipped,
            "analysed": result.analysed, "failed": result.failed, "unreadable": result.unreadable,
            "seconds": round(result.seconds, 3), "dumps_per_minute": round(rate, 1)}


def _report(ctx, args):
    from .report import build_report, render_report
    from .store import TriageStore

    if args.top < 1:
        raise BadInput("--top must be at least 1")
    if args.parquet:
        check_parquet_export(args.parquet, replace=args.force)
    with TriageStore(args.db, read_only=True) as store:
        report = build_report(store, top=args.top)
        if args.parquet:
            store.export_parquet(args.parquet, replace=args.force)
    if args.json:
        ctx.out.json(report)
    else:
        render_report(ctx.out, report)
    return EXIT_OK


def _one_target(ctx, args):
    from .report import render_record

    load_plugins(args.plugin or ())
    analyses = select_analyses(_analysis_names(args.analyses))
    if args.out:
        _refuse_overwriting_inputs("--out", args.out, _inputs(args) + list(args.symbols or ()))
        check_output(args.out, args.force)
    path = args.dump
    size = os.path.getsize(path) if path else None
    content_key = content_hash(path) if path else None
    record = build_record(ctx.target, path, size, content_key, analyses)
    if args.out:
        write_json_file(args.out, record.as_dict(), args.force)
    if args.json:
        ctx.out.json(record.as_dict())
    else:
        render_record(ctx.out, record, ctx.target.pointer_size)
    return EXIT_OK


def write_json_file(path, document, force=True):
    """Write ``document`` to ``path`` as every output is written (dbgext.outputs:
    a temporary file and a rename, never through a link): ``path`` is either
    replaced whole or left as it was."""
    write_text(path, json.dumps(document, indent=2, default=str), force)


COMMAND = Command("triage", "Triage many crash/live dumps into a DuckDB file, report WER-like buckets, "
                  "or print one dump's triage record", add_arguments, run)
