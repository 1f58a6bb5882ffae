"""Text rendering of the ipt views (tables through Output, DML links inside WinDbg)."""

MAX_TEXT_ROWS = 100000


def _details(row):
    skip = ("offset", "type")
    parts = []
    for key, value in row.items():
        if key in skip:
            continue
        if key == "ip":
            parts.append("ip=%s" % ("suppressed" if value is None else "0x%x" % value))
        elif isinstance(value, int) and key in ("cr3", "base", "payload", "tsc", "hints", "ext"):
            parts.append("%s=0x%x" % (key, value))
        else:
            parts.append("%s=%s" % (key, value))
    return " ".join(parts)


def source_lines(out, buffer):
    text = "trace: %s, %d bytes" % (buffer.origin, len(buffer.data))
    if buffer.address is not None:
        text += " at 0x%x" % buffer.address
    if buffer.ring_start:
        text += ", ring unrolled from position %d" % buffer.ring_start
    out.line(text)
    for note in buffer.notes:
        out.line("note: %s" % note)


def errors(out, rows, title="errors"):
    if rows:
        out.line("%s (%d):" % (title, len(rows)))
        for row in rows[:MAX_TEXT_ROWS]:
            out.line("  offset %d: %s" % (row["offset"], row["message"]))


def packets(out, buffer, rows, error_rows, truncated):
    source_lines(out, buffer)
    table = [("%d" % row["offset"], row["type"], _details(row)) for row in rows[:MAX_TEXT_ROWS]]
    out.table(table, headers=("offset", "packet", "payload"))
    if truncated or len(rows) > MAX_TEXT_ROWS:
        out.line("(listing cut; use --max-packets or --json)")
    errors(out, error_rows)


def stats(out, document):
    for key, value in document.items():
        if isinstance(value, dict):
            out.line("%s:" % key)
            for name, count in value.items():
                out.line("  %-10s %d" % (name, count))
        else:
            out.line("%s: %s" % (key, value))


def instructions(out, rows, format_address, windbg_links=True):
    table = []
    links = {}
    for index, row in enumerate(rows[:MAX_TEXT_ROWS]):
        address = format_address(row["ip"])
        table.append((address, row["symbol"]))
        if windbg_links:
            links[(index, 0)] = "u %s L1" % address
    out.table(table, headers=("address", "symbol"), links=links)


def path(out, entries, format_address):
    table = []
    links = {}
    for index, entry in enumerate(entries[:MAX_TEXT_ROWS]):
        address = format_address(entry["first"])
        table.append((address, entry["function"], "%d" % entry["instructions"]))
        links[(index, 0)] = "u %s" % address
    out.table(table, headers=("entered at", "function", "instructions"), links=links)


def call_tree(out, root):
    if root is None:
        out.line("(no instructions)")
        return
    lines = []

    def visit(node, depth):
        if len(lines) >= MAX_TEXT_ROWS:
            return
        lines.append("%s%s  calls=%d insns=%d" % ("  " * depth, node["function"], node["calls"],
                                                 node["instructions"]))
        for child in node["children"]:
            visit(child, depth + 1)

    # Depth is bounded by views.MAX_TREE_DEPTH, well under WinDbg's recursion limit of 500.
    visit(root, 0)
    out.lines(lines)


def function_counts(out, rows):
    out.table([(row["function"], "%d" % row["instructions"]) for row in rows[:MAX_TEXT_ROWS]],
              headers=("function", "instructions"))


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
