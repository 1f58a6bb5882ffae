"""Where command output goes: a text stream, optionally with WinDbg DML links.

Inside WinDbg ``sys.stdout`` is the debugger's (``write(str)`` and ``writedml(str)``,
no ``.buffer``); offline it is an ordinary text stream.  Everything here writes
``str`` only.
"""

import json
import re
import sys

from tabulate import tabulate


def dml_escape(text):
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Output(object):
    def __init__(self, stream=None, dml=None):
        self.stream = stream if stream is not None else sys.stdout
        if dml is None:
            dml = hasattr(self.stream, "writedml")
        self.dml = dml

    def line(self, text=""):
        """One line of plain text (escaped when the stream speaks DML)."""
        self._emit(dml_escape(text) if self.dml else text)

    def lines(self, texts):
        for text in texts:
            self.line(text)

    def link(self, label, command):
        """Markup for a clickable ``label`` running ``command`` (plain label offline)."""
        if not self.dml:
            return label
        return '<link cmd="%s">%s</link>' % (dml_escape(command).replace('"', "&quot;"), dml_escape(label))

    def markup_line(self, markup):
        """A line already built from :meth:`link` pieces and escaped text."""
        self._emit(markup)

    def table(self, rows, headers, links=None, title=None):
        """A tabulate table; ``links`` maps (row index, column index) -> debugger
        command, turning that cell into a DML link inside WinDbg."""
        if title:
            self.line(title)
        if not rows:
            self.line("  (none)")
            return
        text = tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)
        lines = text.split("\n")
        if not self.dml or not links:
            self.lines(lines)
            return
        # The dashes under the headers give each column's character span, so a
        # link goes into exactly its cell even when the same text appears twice.
        spans = [(match.start(), match.end()) for match in re.finditer(r"-+", lines[1])]
        for index, line in enumerate(lines):
            row = index - 2
            cell_links = {column: command for (link_row, column), command in links.items() if link_row == row}
            if not cell_links:
                self._emit(dml_escape(line))
                continue
            pieces = []
            cursor = 0
            for column, (start, end) in enumerate(spans):
                pieces.append(dml_escape(line[cursor:start]))
                cell = line[start:end] if column + 1 < len(spans) else line[start:]
                label = cell.rstrip()
                if column in cell_links and label:
                    pieces.append(self.link(label, cell_links[column]) + cell[len(label):])
                else:
                    pieces.append(dml_escape(cell))
                cursor = end
            self._emit("".join(pieces))

    def json(self, document):
        # Compact: --json is for scripts, and big documents (a maximal ETW cache is
        # a million frames) would triple in size with one value per line.
        self.line(json.dumps(document, separators=(",", ":")))

    def _emit(self, text):
        if self.dml:
            self.stream.writedml(text + "\n")
        else:
            self.stream.write(text + "\n")
