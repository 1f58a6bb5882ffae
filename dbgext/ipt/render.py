"""Text rendering of ipt results (tables through Output, DML links inside WinDbg).

Renderers format what the result holds; they compute nothing.  Events (enabled,
disabled, overflow, gap, resync...) appear in every flow view: between the rows
of the instruction and path listings, under their node in the call tree, and as a
list after the function counts and the totals."""

from ..render.text import hexaddr
from .analysis import problems_by_kind
from .packets import PTDUMP_NAMES

EVENT_WORDS = {"enabled": "tracing enabled at", "disabled": "tracing disabled", "sync": "synchronized at",
               "overflow": "overflow: packets lost", "resumed": "resumed after the overflow at",
               "interrupt": "asynchronous transfer (interrupt) from",
               "event_interrupt": "interrupt delivered (event trace)", "gap": "gap: no code at",
               "resync": "resynchronized at", "tsx_begin": "transaction begins at",
               "tsx_commit": "transaction commits at", "tsx_abort": "transaction aborts at",
               "exstop": "execution stopped (power event) at", "ptwrite": "ptwrite at",
               "interrupts_enabled": "interrupts enabled at", "interrupts_disabled": "interrupts disabled at",
               "paging": "paging: CR3 changed (PIP)"}


def event_text(event):
    words = EVENT_WORDS.get(event["kind"], event["kind"])
    if event["kind"] == "disabled":
        where = " at %s" % hexaddr(event["ip"]) if event["ip"] is not None else ""
        return "[%s%s, trace offset 0x%x]" % (words, where, event["offset"])
    if event["ip"] is None:  # "ptwrite", not "ptwrite at"
        return "[%s, trace offset 0x%x]" % (words[:-3] if words.endswith(" at") else words, event["offset"])
    return "[%s %s, trace offset 0x%x]" % (words, hexaddr(event["ip"]), event["offset"])


def _details(row):
    parts = []
    for key, value in row.items():
        if key in ("offset", "type"):
            continue
        if key == "ip" and row["type"] in ("tip", "tip.pge", "tip.pgd", "fup"):
            parts.append("ip=%s" % ("suppressed" if value is None else hexaddr(value)))
        elif isinstance(value, int) and key in ("cr3", "base", "payload", "tsc", "hints", "ext"):
            parts.append("%s=0x%x" % (key, value))
        else:
            parts.append("%s=%s" % (key, value))
    return " ".join(parts)


def source_lines(out, buffer):
    text = "trace: %s, %d bytes" % (buffer.origin, len(buffer.data))
    if buffer.address is not None:
        text += " at %s" % hexaddr(buffer.address)
    if buffer.ring_start:
        text += ", ring unrolled from position 0x%x" % buffer.ring_start
    out.line(text)
    for note in buffer.notes:
        out.line("note: %s" % note)


def problems(out, log, title="problems", totals_only=False):
    if totals_only:
        _counts(out, "problems", problems_by_kind(log))
    elif log:
        out.line("%s (%d):" % (title, log.count()))
        for problem in log:
            out.line("  %s" % problem)


def _counts(out, title, counts):
    out.line("%s: %d" % (title, sum(counts.values())))
    for name, count in counts.items():
        out.line("  %-20s %d" % (name, count))


def packets(out, result, windbg=False):
    """The listing names each packet as ptdump does (tnt.8, tnt.64); the JSON keeps
    its ``type`` and the totals count by it."""
    for buffer in result.buffers:
        source_lines(out, buffer.source)
        if buffer.packets is not None:
            rows = [("0x%x" % buffer.source.original_offset(packet.offset),
                     PTDUMP_NAMES.get(packet.type, packet.type), _details(dict(packet.as_dict(), type=packet.type))) for packet in buffer.packets]
            out.table(rows, headers=("offset", "packet", "payload"))
            if buffer.listing_truncated:
                out.line("(listed %d of %d packets: --max-packets N lists more; --stats counts them all)"
                         % (len(buffer.packets), buffer.stats.packets))
        _packet_totals(out, buffer.stats.as_dict())
    problems(out, result.problems, totals_only=result.stats)


def _packet_totals(out, totals):
    out.line("bytes: %d" % totals["bytes"])
    _counts(out, "packets", totals["types"])
    out.line("errors: %d" % totals["errors"])


def _merged(rows, events, row_index):
    """Rows and event lines in instruction order: [(event or None, row or None)]."""
    merged = []
    next_event = 0
    for row in rows:
        while next_event < len(events) and events[next_event]["index"] <= row_index(row):
            merged.append((events[next_event], None))
            next_event += 1
        merged.append((None, row))
    return merged + [(event, None) for event in events[next_event:]]


def _instructions(out, buffer, windbg):
    table = []
    links = {}
    for event, row in _merged(buffer.rows, buffer.events, lambda row: row["index"]):
        if event is not None:
            table.append(("", "", event_text(event)))
            continue
        address = hexaddr(row["ip"])
        if windbg:
            links[(len(table), 0)] = "u %s L1" % address
        table.append((address, row["symbol"], row["text"]))
    out.table(table, headers=("address", "symbol", "instruction"), links=links)
    listing = buffer.listing
    if listing["truncated"]:
        out.line("(listed %d of %d instructions: --max-insns N lists more; --stats and the other views cover "
                 "them all)" % (listing["listed"], buffer.instruction_count))


def _path(out, data, events, windbg):
    table = []
    links = {}
    for event, entry in _merged(data["entries"], events, lambda entry: entry["index"]):
        if event is not None:
            table.append(("", event_text(event), ""))
            continue
        address = hexaddr(entry["first"])
        if windbg:
            links[(len(table), 0)] = "u %s" % address
        table.append((address, entry["function"], "%d" % entry["instructions"]))
    out.table(table, headers=("entered at", "function", "instructions"), links=links)
    if data["truncated"]:
        out.line("(listed %d of %d path entries)" % (len(data["entries"]), data["total_entries"]))


def call_tree(out, root):
    if root is None:
        out.line("(no instructions)")
        return
    lines = []

    def visit(node, depth):
        via = "" if node["via"] in ("root", "call") else " [%s]" % node["via"]
        lines.append("%s%s%s  calls=%d insns=%d" % ("  " * depth, node["function"], via, node["calls"],
                                                   node["instructions"]))
        for event in node["events"]:
            lines.append("%s  %s" % ("  " * depth, event_text(event)))
        for child in node["children"]:
            visit(child, depth + 1)

    # Depth is bounded by views.MAX_TREE_DEPTH, well under WinDbg's recursion limit of 500.
    visit(root, 0)
    out.lines(lines)


def _event_list(out, events):
    if events:
        out.line("events (%d):" % len(events))
        for event in events:
            out.line("  before instruction %d: %s" % (event["index"], event_text(event)))


def _events_cut(out, buffer):
    if buffer.decode.event_count > len(buffer.events):
        out.line("(listed %d of %d events)" % (len(buffer.events), buffer.decode.event_count))


def flow_buffer(out, buffer, windbg, view):
    source_lines(out, buffer.source)
    if buffer.stats:
        _packet_totals(out, buffer.packet_stats.as_dict())
        out.line("instructions: %d" % buffer.instruction_count)
        out.line("blocks: %d" % buffer.decode.blocks_built)
        _counts(out, "events", dict(sorted(buffer.events_by_kind.items())))
        return
    _events_cut(out, buffer)
    if view == "instructions":
        _instructions(out, buffer, windbg)
    elif view == "path":
        _path(out, buffer.view_data, buffer.events, windbg)
    elif view == "calltree":
        call_tree(out, buffer.view_data)
        _event_list(out, buffer.events)
    else:
        out.table([(row["function"], "%d" % row["instructions"]) for row in buffer.view_data],
                  headers=("function", "instructions"))
        _event_list(out, buffer.events)
    out.line("%d instructions" % buffer.instruction_count)


def flow(out, result, windbg=False):
    if result.errata:
        out.line("errata workarounds for CPU %s: %s" % ("/".join(str(part) for part in result.cpu),
                                                       ", ".join(sorted(result.errata))))
    for buffer in result.buffers:
        flow_buffer(out, buffer, windbg, result.view)
    problems(out, result.problems, totals_only=result.stats)


def event_header(out, header):
    out.line("IntelProcessorTrace event")
    for key in ("EventTimeStamp", "Process", "Thread", "TraceSize", "TracePosition"):
        out.line("  %-16s %s" % (key, header[key]))
    option = header["IptOptionFields"]
    out.line("  %-16s 0x%x" % ("IptOption", header["IptOption"]))
    out.line("    TraceMode        %d" % option["TraceMode"])
    out.line("    TimeMode         %d (%s)" % (option["TimeMode"], option["TimeModeText"]))
    out.line("    MTCFreq          %d" % option["MTCFreq"])
    out.line("    CycThresh        %d" % option["CycThresh"])
    out.line("    BufferSize       %d (%d bytes)" % (option["BufferSize"], option["BufferBytes"]))
    out.line("    TraceSessionMode %d (%s)" % (option["TraceSessionMode"], option["TraceSessionModeText"]))
    out.line("    TraceChild       %d" % option["TraceChild"])
    out.line("    TraceCodeMode    %d (%s)" % (option["TraceCodeMode"], option["TraceCodeModeText"]))


def event(out, result, windbg=False):
    event_header(out, result.header)
    source_lines(out, result.source)
    _counts(out, "packets", result.stats.as_dict()["types"])
    if result.flow is not None:
        out.line("path (%d instructions):" % result.flow.instruction_count)
        _path(out, result.flow.view_data, result.flow.events, windbg)
    problems(out, result.problems)


def scan(out, result, windbg=False):
    if result.source != "memory":
        table = [("%d" % row["index"], "%d" % row["process"], "%d" % row["thread"], "%d" % row["trace_size"],
                  "%d" % row["trace_position"], "%d" % row["packets"], "%d" % row["errors"]) for row in result.events]
        out.table(table, headers=("event", "process", "thread", "trace size", "position", "packets", "errors"))
    else:
        table = []
        links = {}
        for index, row in enumerate(result.events):
            address = hexaddr(row["address"])
            table.append((address, "%d" % row["process"], "%d" % row["thread"], "%d" % row["trace_size"],
                          "%d" % row["trace_position"], "yes" if row["psb_at_start"] else "no"))
            links[(index, 0)] = "!py ipt.py event --address %s" % address
        out.table(table, headers=("event", "process", "thread", "trace size", "position", "PSB first"),
                  links=links if windbg else None)
    problems(out, result.problems, "notes")


RENDERERS = {"packets": packets, "flow": flow, "event": event, "scan": scan}
