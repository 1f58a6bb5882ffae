"""The walk's decoder state: where execution is and what of it is confirmed.

It owns the trace position (the offset of the last item read), the execution mode,
the TNT bits not yet used (``bits`` from ``bit_index`` on), the return stack, and
the instructions walked: ``out`` holds those not yet handed to the sink, of which
``out[:committed]`` are confirmed by trace data consumed (a TNT bit, a TIP, an
event); the rest were walked on straight-line code and direct branches past the
last trace data, and an end of trace, an overflow or an error drops them.  It
records events (at the index of the next instruction; handed to the result in
batches, hand_over_events) and reports errors, which abandon the PSB segment
(Resync).  It also holds the PIPs (paging events) not yet
recorded: those waiting for the instruction they bind to (``pips``, bound by
events.py's ``bind_pips`` before any other event is recorded and before a flush)
and those that go with the transfer of the FUP before them (``async_pips``).

The per-block step (step.py) keeps ``bits``, ``bit_index`` and ``committed`` in
locals while it runs and stores them here before it calls a part that reads them.
"""

from collections import deque

from .kinds import MODE_64

# The return stack's depth, as the hardware's: a call beyond it drops the oldest entry.
RETSTACK_DEPTH = 64
# Committed instructions are handed on in chunks of at least this many.
FLUSH_SIZE = 1 << 16
# Events are handed to the result in batches of at most this many (and at each flush).
EVENT_BATCH = 1 << 10


class Resync(Exception):
    """Raised inside the walk to abandon the current PSB segment after an error."""


class WalkState(object):
    """The state of one decode (see the module docstring)."""

    # Slots: the walk reads and writes its state once per packet, and on 3.8 a slot
    # is cheaper to reach than an instance dict entry.  Each part declares its own.
    __slots__ = ("cache", "suspicious", "errata", "resync_on_error", "result", "problems", "out", "flushed",
                 "committed", "resumed_at", "sink", "progress", "mode", "retstack", "bits", "bit_index",
                 "last_offset", "walking", "pips", "paging_kept", "async_pips", "recorded", "record")

    def __init__(self, decoder, result, sink, progress):
        self.cache = decoder.cache
        self.suspicious = decoder.suspicious
        self.errata = decoder.errata
        self.resync_on_error = decoder.resync_on_error
        self.result = result
        self.problems = result.problems
        self.out = []            # instructions walked and not yet handed to the sink
        self.flushed = 0         # instructions handed to the sink before out[0]
        self.committed = 0       # out[:committed] are confirmed by consumed trace
        self.resumed_at = -1     # len(out) when an event last moved the IP (enable, FUP, OVF)
        self.sink = sink
        self.progress = progress
        self.mode = MODE_64
        self.retstack = deque(maxlen=RETSTACK_DEPTH)
        self.bits = b""
        self.bit_index = 0
        self.last_offset = 0     # the trace offset of the last item read: where decoding is
        self.walking = False     # inside walk(): PSB+ is then status only
        self.pips = []           # PIPs read while walking and not bound yet: (offset, where binding starts)
        self.paging_kept = 0     # the instructions up to the last one a PIP bound to stay (absolute count)
        self.async_pips = []     # PIPs that go with the transfer of the FUP before them (their offsets)
        self.recorded = []       # events recorded and not yet handed to the result (hand_over_events)
        self.record = self.recorded.append

    def event(self, kind, offset, ip):
        """Record an event before the next instruction: (instruction index, kind, trace offset, IP).
        The PIPs bound before it come first; those that go with a transfer follow it."""
        if self.pips:
            self.bind_pips()
        self.record((self.flushed + len(self.out), kind, offset, ip))
        if self.async_pips and (kind == "interrupt" or kind == "disabled"):
            for pip_offset in self.async_pips:
                self.record((self.flushed + len(self.out), "paging", pip_offset, None))
            self.async_pips = []
        if len(self.recorded) >= EVENT_BATCH:
            self.hand_over_events()

    def hand_over_events(self):
        """Hand the events recorded to the result, in order: in batches (a list append
        costs less than the result's counting, one call per event), at the latest
        before the instructions they come before go to the sink (flush)."""
        self.result.add_events(self.recorded)
        del self.recorded[:]

    def flush(self):
        """Hand the committed instructions to the sink (in chunks of FLUSH_SIZE or more,
        and at the end), so a decode of any size holds one chunk at a time."""
        if self.pips:
            self.bind_pips()
        if self.recorded:
            self.hand_over_events()
        count = self.committed
        if count == 0:
            return
        out = self.out
        chunk = out[:count]
        del out[:count]
        self.flushed += count
        self.committed = 0
        self.resumed_at = self.resumed_at - count if self.resumed_at >= count else -1
        self.sink(chunk)
        if self.progress is not None:
            self.progress(self.last_offset, self.flushed)

    def reset(self):
        """Forget the TNT bits, the return stack and the PIPs not recorded (after an error,
        at a gap)."""
        self.bits = b""
        self.bit_index = 0
        self.retstack = deque(maxlen=RETSTACK_DEPTH)
        self.pips, self.async_pips = [], []

    def error(self, offset, message, failed_at=None, decoded=True):
        """Report and abandon this PSB segment.  Like ptxed, the instructions walked so far
        stay, and so does the instruction that could not proceed (``failed_at``) when
        libipt had decoded it (``decoded``: the query for its branch failed); where libipt
        fails before it decodes that instruction (reading ahead), it is left out."""
        self.problems.add("ipt_flow_error", failed_at, message, offset=offset)
        if not decoded and failed_at is not None and self.out and self.out[-1] == failed_at:
            self.out.pop()
        raise Resync()
