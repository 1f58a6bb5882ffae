"""Triage at scale: one compact record per crash/live dump or minidump (identity,
the bug check named with its arguments labelled, the faulting frame and bucket like
``!analyze -v``, a summary from every installed analysis), stored in DuckDB and
aggregated into WER-like buckets.  See docs/triage.md.

    record = dbgext.triage.analyze(target)                 # one open target
    record.bucket, record.faulting.image, record.as_dict()
    with TriageStore("results.duckdb") as store:           # many dump files
        run_batch(["/dumps"], store)
        report = build_report(store)
"""

from .record import DumpRecord, build_record, content_hash, load_plugins, register_analysis, select_analyses
from .report import build_report
from .run import run_batch
from .signature import CrashFrame
from .store import StorageError, TriageStore


def analyze(target, analyses=None, plugins=()):
    """The triage record (a DumpRecord) of an open target; ``analyses``: names to
    run (default: every installed one); ``plugins``: modules registering more."""
    load_plugins(plugins)
    return build_record(target, analyses=select_analyses(analyses))


__all__ = ["analyze", "DumpRecord", "CrashFrame", "TriageStore", "StorageError", "run_batch", "build_report",
           "content_hash", "register_analysis"]
