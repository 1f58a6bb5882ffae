"""WinDbg's text layouts for the basic commands (unreadable units print as ``?``)."""

BYTES_PER_LINE = 16


def format_pointer(value, pointer_size):
    if value is None:
        return "????????`????????" if pointer_size == 8 else "????????"
    if pointer_size == 8:
        return "%08x`%08x" % (value >> 32, value & 0xFFFFFFFF)
    return "%08x" % value


def _printable(value):
    if value is None:
        return "?"
    return chr(value) if 0x20 <= value < 0x7F else "."


def byte_lines(display, format_address):
    """``db``: 16 bytes a line, ``-`` between the 8th and 9th, then an ASCII column."""
    lines = []
    values = display.values
    for start in range(0, len(values), BYTES_PER_LINE):
        row = values[start:start + BYTES_PER_LINE]
        cells = []
        for index in range(BYTES_PER_LINE):
            if index < len(row):
                cells.append("??" if row[index] is None else "%02x" % row[index])
            else:
                cells.append("  ")
        hex_text = ""
        for index, cell in enumerate(cells):
            if index:
                joined = index == 8 and index < len(row)
                hex_text += "-" if joined else " "
            hex_text += cell
        ascii_text = "".join(_printable(value) for value in row)
        lines.append("%s  %s  %s" % (format_address(display.address + start), hex_text, ascii_text))
    return lines


UNITS_PER_LINE = {4: 4, 8: 2}


def _unit_text(value, unit):
    """dq always shows the backtick, even on a 32-bit target."""
    return format_pointer(value, unit)


def unit_lines(display, format_address):
    """``dd`` (4 dwords a line) and ``dq`` (2 qwords a line, with the backtick)."""
    per_line = UNITS_PER_LINE[display.unit]
    lines = []
    for start in range(0, len(display.values), per_line):
        row = display.values[start:start + per_line]
        text = " ".join(_unit_text(value, display.unit) for value in row)
        lines.append("%s  %s" % (format_address(display.address + start * display.unit), text))
    return lines


def pointer_line_parts(entry, pointer_size, format_address):
    """(address text, value text, symbol text or "") of one ``dps`` line."""
    return (format_address(entry.address), format_pointer(entry.value, pointer_size), entry.symbol or "")


def clamp_note(requested, shown, unit):
    return "note: length clamped to 0x%x bytes (0x%x units of %d bytes were asked for)" % (
        shown * unit, requested, unit)
