"""Triage at scale: one compact record per crash/live dump or minidump (identity,
bug check, faulting stack signature, a summary from every installed analysis),
stored in DuckDB and aggregated into WER-like buckets.  See docs/triage.md."""

from .record import DumpRecord, build_record, content_hash, register_analysis

__all__ = ["DumpRecord", "build_record", "content_hash", "register_analysis"]
