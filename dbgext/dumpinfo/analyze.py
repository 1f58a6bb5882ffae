"""Collect what a dump is from its backend, and where kernel structure offsets
come from on it."""

import datetime

from ..problems import Problem, ProblemLog
from .result import DumpInfoResult

# The kernel structures whose offsets analyses look up (dbgext.layouts.lookup_layout).
KERNEL_TYPES = ("_KTHREAD", "_ETHREAD", "_EPROCESS", "_KPRCB", "_KPCR")
FILETIME_EPOCH = 116444736000000000   # 1601-01-01 to 1970-01-01 in 100 ns units
FILETIME_LIMIT = 0x0800000000000000   # past year 30000: a garbage or "PAGE"-filled field


def analyze(target):
    """A :class:`~dbgext.dumpinfo.result.DumpInfoResult` for ``target``."""
    facts = dict(target.info())
    problems = ProblemLog(Problem.from_dict(p) for p in facts.get("problems") or () if isinstance(p, dict))
    layouts = [layout_source(target, name) for name in KERNEL_TYPES] if facts.get("mode") == "kernel" else []
    moment = (filetime_iso(facts.get("system_time")) if "system_time" in facts
              else unix_time_iso(facts.get("time_date_stamp")))
    return DumpInfoResult(facts, layouts, moment, problems.finish())


def layout_source(target, type_name):
    """{"type", "source", "fields"}: where ``type_name``'s offsets come from, in
    lookup_layout's order (type information, then KDDEBUGGER_DATA64)."""
    if target.type_size("nt!" + type_name) is not None:
        return {"type": type_name, "source": target.type_source("nt!" + type_name), "fields": None}
    hints = target.layout_hints(type_name)
    if hints:
        return {"type": type_name, "source": "KDDEBUGGER_DATA64", "fields": sorted(hints["fields"])}
    if target.arch == "arm64":   # the built-in kernel structure tables are x64's and x86's
        return {"type": type_name, "source": "none (no type information, no KDDEBUGGER_DATA64 offsets, no "
                "built-in ARM64 table)", "fields": None}
    return {"type": type_name, "source": "built-in tables (by build)", "fields": None}


def unix_time_iso(value):
    """A minidump header's TimeDateStamp (seconds since 1970) in ISO 8601, or None."""
    if not value:
        return None
    moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=value)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def filetime_iso(value):
    if not value or value >= FILETIME_LIMIT or value < FILETIME_EPOCH:
        return None
    moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(microseconds=(value - FILETIME_EPOCH) // 10)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
