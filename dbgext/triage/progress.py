"""A progress bar for triage batches: done / failed / remaining and throughput.

On a terminal the bar redraws in place; on a pipe or log file it prints a full line
at most every ``interval`` seconds (and once at the end), so logs stay readable.
"""

import sys
import time

BAR_WIDTH = 24


def format_duration(seconds):
    seconds = int(round(seconds))
    if seconds < 60:
        return "%ds" % seconds
    if seconds < 3600:
        return "%dm%02ds" % divmod(seconds, 60)
    hours, rest = divmod(seconds, 3600)
    return "%dh%02dm" % (hours, rest // 60)


def progress_line(total, done, failed, elapsed):
    """``[#####-----] 12/40  failed 2  remaining 28  18.5 dumps/min  eta 1m31s``."""
    filled = BAR_WIDTH * done // total if total else BAR_WIDTH
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    remaining = total - done
    text = "[%s] %d/%d  failed %d  remaining %d" % (bar, done, total, failed, remaining)
    if done and elapsed > 0:
        rate = done / elapsed * 60.0
        text += "  %.1f dumps/min" % rate
        if remaining:
            text += "  eta %s" % format_duration(remaining * elapsed / done)
    return text


class Progress(object):
    def __init__(self, stream=None, interval=5.0, clock=time.time):
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.clock = clock
        self.in_place = bool(getattr(self.stream, "isatty", lambda: False)())
        self.total = 0
        self.done = 0
        self.failed = 0
        self._started = None
        self._last_drawn = None
        self._drawn_width = 0

    def start(self, total):
        self.total = total
        self.done = self.failed = 0
        self._started = self.clock()
        self._last_drawn = None
        self._draw(force=True)

    def advance(self, failed=False):
        self.done += 1
        self.failed += 1 if failed else 0
        self._draw(force=self.done == self.total)

    def finish(self):
        if self.in_place:
            self.stream.write("\n")
            self.stream.flush()

    def line(self):
        return progress_line(self.total, self.done, self.failed, self.clock() - (self._started or self.clock()))

    def _draw(self, force=False):
        now = self.clock()
        if self.in_place:
            line = self.line()
            # Pad over the tail of a longer previous line.
            self.stream.write("\r" + line.ljust(self._drawn_width))
            self._drawn_width = len(line)
        elif force or self._last_drawn is None or now - self._last_drawn >= self.interval:
            self.stream.write(self.line() + "\n")
        else:
            return
        self._last_drawn = now
        self.stream.flush()
