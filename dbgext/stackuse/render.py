"""Rendering of the stack analyses: text tables (with DML links inside WinDbg),
JSON documents and the ``functions --jsonl`` line contract."""

import json

from .callgraph import UNBOUNDED, UNKNOWN


def bound_text(bound):
    if bound.status == UNBOUNDED:
        return "unbounded"
    if bound.status == UNKNOWN:
        return "unknown"
    return ("%d" % bound.value) + ("+" if bound.status == "lower" else "")


def render_functions(out, result, jsonl=False, as_json=False):
    if jsonl:
        for record in result.records():
            out.line(json.dumps(record, sort_keys=False))
        return
    if as_json:
        out.json(result.as_dict())
        return
    module, bounds = result.module, result.bounds
    rows, links = [], {}
    for index, function in enumerate(result.functions):
        frame = "dynamic" if function.dynamic else (
            "?" if function.frame_size is None else "%d" % function.frame_size)
        row = ["0x%x" % function.rva, function.display_name, frame, function.source, function.origin]
        if bounds:
            row.append(bound_text(bounds[function.va]))
        row.append(function.disagreement or (function.problem or ""))
        rows.append(row)
        links[(index, 1)] = "uf 0x%x" % function.va
    headers = ["rva", "function", "frame", "source", "found by"] + (["worst case"] if bounds else []) + ["note"]
    out.table(rows, headers, links=links, title="%s (%s): %d functions" % (module.name, module.arch, len(rows)))


def _first_reason(bound, width=90):
    """The main reason a bound is not exact, short enough for a table cell (the
    JSON output has them all)."""
    if not bound.reasons:
        return ""
    text = bound.reasons[0]
    if len(text) > width:
        text = text[:width - 3] + "..."
    more = len(bound.reasons) - 1
    return text + (" (+%d more)" % more if more else "")


def render_problems(err, problems):
    """The problems, one line each, on the diagnostics stream (stderr)."""
    for problem in problems:
        err.line(str(problem))


def render_chain(out, result, as_json=False):
    if as_json:
        out.json(result.as_dict())
        return
    root = result.bound
    summary = {"exact": "%s bytes", "lower": "at least %s bytes (a lower bound)"}.get(root.status, "%s")
    out.line("worst case from %s: %s" % (result.function.display_name, summary % bound_text(root).rstrip("+")))
    rows, links = [], {}
    for index, (function, site, bound) in enumerate(result.steps):
        rows.append([str(index), function.display_name,
                     "dynamic" if function.dynamic else ("?" if function.frame_size is None else str(function.frame_size)),
                     "-" if site is None else str(site.depth),
                     "-" if site is None else site.kind + (" " + site.import_name if site.import_name else ""),
                     bound_text(bound)])
        links[(index, 1)] = "uf 0x%x" % function.va
    out.table(rows, ["#", "function", "frame", "sp at call", "via", "depth from here"], links=links)
    for reason in root.reasons:
        out.line("  note: " + reason)


def render_thread(out, stack, fmt, as_json=False):
    """``fmt``: addresses as WinDbg prints them (the target's format_address)."""
    if as_json:
        out.json(stack.as_dict())
        return
    out.line("thread %s (%s)" % (fmt(stack.thread) if stack.thread is not None else "?", stack.thread_source))
    out.line("stack: initial %s  limit %s  kernel stack %s" % (
        fmt(stack.initial_stack) if stack.initial_stack is not None else "?",
        fmt(stack.stack_limit) if stack.stack_limit is not None else "?",
        fmt(stack.kernel_stack) if stack.kernel_stack is not None else "?"))
    if stack.used is not None:
        out.line("used %d bytes, %s bytes remaining" % (
            stack.used, stack.remaining if stack.remaining is not None else "?"))
    hogs = stack.hogs()
    rows, links = [], {}
    for index, frame in enumerate(stack.frames):
        estimate = stack.estimate(frame)
        rows.append(["%02x" % frame.index, "" if frame.uses is None else str(frame.uses),
                     "?" if estimate is None else str(estimate), fmt(frame.child_sp), frame.function,
                     ("over threshold " if frame in hogs else "") + ("" if frame.how == "unwind" else frame.how)])
        links[(index, 3)] = "dps 0x%x" % frame.child_sp
    out.table(rows, ["#", "memory", "static", "child-SP", "call site", "note"], links=links)
    if stack.threshold is not None:
        out.line("%d frame(s) use at least %d bytes" % (len(hogs), stack.threshold))


def render_hogs(out, result, as_json=False):
    if as_json:
        out.json(result.as_dict())
        return
    rows, links = [], {}
    for index, function in enumerate(result.largest):
        rows.append([function.display_name, str(function.frame_size), function.source])
        links[(index, 0)] = "uf 0x%x" % function.va
    out.table(rows, ["function", "frame", "source"], links=links,
              title="%s: the %d largest frames" % (result.module.name, len(rows)))
    out.line("")
    rows, links = [], {}
    for index, function in enumerate(result.over_budget):
        bound = result.bounds[function.va]
        rows.append([function.display_name, bound_text(bound), _first_reason(bound)])
        links[(index, 0)] = "uf 0x%x" % function.va
    out.table(rows, ["function", "worst case", "why not exact"], links=links,
              title="worst case over the %d-byte budget (or unbounded): %d function(s)%s" % (
                  result.budget, result.over_budget_count,
                  ", the first %d listed" % len(rows) if result.over_budget_count > len(rows) else ""))
