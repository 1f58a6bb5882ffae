"""Adapters from each analysis package to a compact triage summary.

This one file holds all the coupling between triage and the analyses: each
adapter calls its package's public API and boils the result down to a small dict
(counts, a few top items) plus the problems the analysis reported, as
:class:`~dbgext.problems.Problem` objects with their kinds and addresses.  Every
analysis package is part of dbgext: one that fails to import fails its analysis
(the record says so), it is never silently left out.  (Each adapter imports its
package when it runs: a triage worker starts fresh for every dump.)

Scans over all memory need a target that can list its memory (a dump); on a live
session the scanning analyses say they were skipped instead of probing 2^64 bytes.
"""

from ..errors import BadInput, SymbolNotFound, UnreadableMemory
from ..problems import Problem, ProblemLog
from .record import register_analysis

TOP = 5                       # top items kept per list in a summary
MAX_IPT_EVENTS = 256
CANNOT_SCAN = "the target cannot list its memory (a debugger session): triage the dump file offline to scan it"


def _located(where, problem):
    """``problem`` with the structure it was found in named in its message."""
    return Problem(problem.kind, problem.address, "%s: %s" % (where, problem.message), problem.severity,
                   problem.offset)


def _cannot_list_memory(target):
    return not target.can_list_memory()


def _frames(target, frames, count=3):
    return [target.symbolize(frame) for frame in list(frames or ())[:count]]


# -- rtltrace: RTL stack-trace databases ------------------------------------------------

def summarize_rtltrace(target):
    from ..rtltrace import find

    if _cannot_list_memory(target):
        return {"skipped": CANNOT_SCAN}
    search = find(target, walk=True)
    problems = ProblemLog(search.problems)
    databases = []
    blocks = []
    for candidate, database in zip(search.candidates, search.databases):
        databases.append({"address": candidate.address, "traces": candidate.traces, "hits": candidate.hits,
                          "segments": candidate.segments, "problems": len(database.problems),
                          "complete": database.complete})
        blocks.extend((block, candidate.address) for block in database.blocks if block.count)
        problems.extend(_located("database %s" % target.format_address(candidate.address), problem)
                        for problem in database.problems)
    blocks.sort(key=lambda item: -item[0].count)
    candidates = search.candidates
    return {
        "databases": len(candidates),
        "traces": sum(c.traces or 0 for c in candidates),
        "hits": sum(c.hits or 0 for c in candidates),
        "suspicious": sum(1 for d in databases if d["problems"]),
        "per_database": databases[:TOP],
        "top_traces": [{"database": database, "address": block.address, "count": block.count,
                        "frames": _frames(target, block.frames)} for block, database in blocks[:TOP]],
        "problems": problems,
    }


register_analysis("rtltrace", summarize_rtltrace,
                  description="RTL stack-trace databases: count, traces, hits, top traces")


# -- etwstacks: ETW stack caches -----------------------------------------------------------

def summarize_etwstacks(target):
    from ..etwcache import analyze

    if (target.info() or {}).get("mode") == "user":
        return {"skipped": "user-mode dump: ETW loggers live in the kernel"}
    try:
        analysis = analyze(target)
    except (SymbolNotFound, BadInput) as error:
        return {"skipped": str(error)}
    except UnreadableMemory as error:
        return {"caches": 0, "problems": [Problem("unreadable_memory", error.address, str(error))]}
    problems = ProblemLog(analysis.problems)
    caches = []
    for report in analysis.caches:
        state = report.state
        problems.extend(_located(report.label, problem) for problem in report.problems)
        caches.append({"logger": report.label, "cache": state.address, "variant": state.variant,
                       "stacks": len(state.entries), "free_pieces": len(state.free_pieces),
                       "total_pieces": state.total_pieces if state.readable else 0,
                       "problems": report.problems.errors})
    return {
        "caches": len(caches),
        "stacks": sum(c["stacks"] for c in caches),
        "free_pieces": sum(c["free_pieces"] for c in caches),
        "suspicious": sum(1 for c in caches if c["problems"]),
        "per_cache": sorted(caches, key=lambda c: (-c["problems"], -c["stacks"]))[:TOP],
        "problems": problems,
    }


register_analysis("etwstacks", summarize_etwstacks,
                  description="ETW stack caches: loggers, stacks, free pieces, problems")


# -- ipt: Intel PT events ------------------------------------------------------------------

def summarize_ipt(target):
    from ..ipt import scan_events
    from ..ipt.analysis import NO_INTEL_PT_ON_ARM64

    if target.arch == "arm64":
        return {"skipped": NO_INTEL_PT_ON_ARM64}
    if _cannot_list_memory(target):
        return {"skipped": CANNOT_SCAN}
    scan = scan_events(target, max_events=MAX_IPT_EVENTS)
    events = scan.events
    return {
        "events": len(events),
        "trace_bytes": sum(event["trace_size"] for event in events),
        "top_events": [{"address": event["address"], "process": event["process"], "thread": event["thread"],
                        "trace_size": event["trace_size"]}
                       for event in sorted(events, key=lambda e: -e["trace_size"])[:TOP]],
        "problems": scan.problems,
    }


register_analysis("ipt", summarize_ipt,
                  description="Intel PT trace events found in memory")


# -- stackuse: the faulting thread's stack usage ----------------------------------------------

def _function_name(text):
    """``module!name+0x1c`` -> ``module!name`` (the fleet-wide key for a function)."""
    return text.split("+0x", 1)[0] if text else text


def summarize_stackuse(target):
    """The faulting thread's stack use from its real frames (the unwinder's, the same
    walk ``k`` shows): used and remaining bytes, and the biggest frames.  The walk's
    problems are the signature's (reported once, there)."""
    from ..stacks import MAX_FRAMES
    from .signature import faulting_thread_stack

    try:
        stack = faulting_thread_stack(target, MAX_FRAMES)
    except BadInput as error:
        return {"skipped": str(error)}
    frames = stack.frames
    used = limit = None
    if frames and stack.stack_base is not None:
        used = stack.stack_base - frames[0].child_sp
        if stack.stack_limit is not None:
            limit = stack.stack_base - stack.stack_limit
    # kf's memory column: a frame's child-SP minus the inner frame's is the stack the
    # inner frame's function uses.
    sizes = [(_function_name(callee.function), caller.memory)
             for callee, caller in zip(frames, frames[1:]) if caller.memory is not None]
    biggest = sorted(sizes, key=lambda item: -item[1])[:TOP]
    return {
        "thread": stack.kernel_thread if stack.kernel_thread is not None else stack.thread_id,
        "used": used,
        "limit": limit,
        "remaining": limit - used if limit is not None and used is not None else None,
        "frames": len(frames),
        "biggest_frames": [{"function": function, "bytes": size} for function, size in biggest],
    }


register_analysis("stackuse", summarize_stackuse,
                  description="stack usage of the faulting thread: used, limit, biggest frames")
