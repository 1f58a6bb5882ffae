"""The walk's one item reader: every item the walk, its events and its errata
workarounds see comes through ``read()`` (``peek()``, ``item()``, ``next_item()``).

It owns the items (_flow_items' generator, ``trace_items``), the one item read
ahead (``lookahead``: ``peek()`` fills it, ``next_item()`` takes it), the items read
further ahead and put back (``pushed``, last first: ``items_ahead()``,
``drop_items()``; ``item()`` reads past the lookahead), and whether the trace has
ended.  It handles on its own the items that are no step of the walk (WALK_ITEMS):
it records an event without IP where it reads it, hands a PIP to the events
(events.py's ``read_pip``), reports a packet that does not decode (abandoning the
walk), and while walking reads a PSB+ as status (``skip_status_psb``).  An interrupt
item (F_ASYNC: FUP + TIP) is handed out whole only by ``read()``, to the event
binding (events.py); ``peek()`` and ``item()`` hand it out as its FUP and put its
TIP back (``split``), so that everything else sees the two packets' items.
"""

from .. import packets as P
from .kinds import F_ASYNC, F_BAD_CONTEXT, F_END, F_ERROR, F_EVENT, F_FUP, F_MODE, F_PIP, F_PSB, F_PSBEND
from .state import Resync, WalkState

# The items read() does more with than hand them on (walk_item).
WALK_ITEMS = frozenset((F_PSB, F_ERROR, F_END, F_EVENT, F_BAD_CONTEXT, F_PIP))


class ItemReader(WalkState):
    """The item reader (see the module docstring)."""

    __slots__ = ("trace_items", "data", "pushed", "lookahead", "ended", "in_status")

    def __init__(self, decoder, result, items, sink, progress, data):
        WalkState.__init__(self, decoder, result, sink, progress)
        # _flow_items: the items read on (F_END at the end).  Read with next(): on 3.11 a
        # generator's bound __next__ costs a third more per call.
        self.trace_items = items
        self.data = data         # the trace the items come from (for errata that re-read a packet)
        self.pushed = []         # items to hand out again before reading on (last first): item(), items_ahead()
        self.lookahead = None    # one item read ahead (kind, offset, value) or None at the end
        self.ended = False
        self.in_status = False   # reading a PSB+ as status (skip_status_psb)

    def read(self, past_lookahead):
        """The reader: the next item (see _flow_items), read ahead into ``lookahead``
        (``peek()``), or None at the end; with ``past_lookahead``, the item after the
        lookahead (which stays), handed out (``item()``).  The one place the items are
        read.  (No default argument: on 3.8 a method with one is called the slow way.)

        A packet that does not decode is reported and, while walking, abandons the
        walk (Resync); a PSB+ while walking is read as status (skip_status_psb)."""
        item = self.lookahead
        if item is not None and not past_lookahead:
            return item
        pushed = self.pushed
        if pushed:
            item = pushed.pop()
            if item[1] > self.last_offset:  # an interrupt's TIP (split): read as it is handed out
                self.last_offset = item[1]
        else:
            item = next(self.trace_items)
            self.last_offset = item[1]
            if item[0] in WALK_ITEMS:
                item = self.walk_item(item)
        if not past_lookahead:
            self.lookahead = item
        return item

    def peek(self):
        """The next item, read ahead into ``lookahead`` (None at the end)."""
        item = self.read(False)
        if item is not None and item[0] == F_ASYNC:
            item = self.lookahead = self.split(item)
        return item

    def item(self):
        """The item after the lookahead (which stays), or None at the end."""
        item = self.read(True)
        if item is not None and item[0] == F_ASYNC:
            item = self.split(item)
        return item

    def split(self, interrupt):
        """An interrupt item (F_ASYNC) as its FUP item, its TIP item put back to be read
        next.  (The TIP's offset becomes ``last_offset`` when it is handed out, as if
        read then, unless it was read past already: pending_event.)"""
        fup, tip = interrupt[2]
        self.pushed.append(tip)
        return fup

    def walk_item(self, item):
        """read() for the items of WALK_ITEMS, and what it reads on from them."""
        while True:
            kind = item[0]
            if kind == F_END:
                self.ended = True
                return None
            if kind == F_PSB:
                if not self.walking or self.in_status:
                    return item
                # What skip_status_psb leaves in lookahead is the item after the PSB+; a
                # lookahead set before (by a caller reading ahead) stays as it was.
                caller_lookahead, self.lookahead = self.lookahead, None
                self.skip_status_psb()
                item, self.lookahead = self.lookahead, caller_lookahead
                if item is not None:
                    return item
            elif kind == F_EVENT:
                self.event(item[2], item[1], None)
            elif kind == F_PIP:
                self.read_pip(item[1])
            elif kind == F_ERROR or kind == F_BAD_CONTEXT:
                self.problems.add("ipt_packet_error" if kind == F_ERROR else "ipt_flow_error", None, item[2],
                                  offset=item[1])
                self.reset()
                if self.walking:
                    raise Resync()
            else:
                return item
            item = next(self.trace_items)
            self.last_offset = item[1]

    def next_item(self):
        """The next item, taken (the lookahead, or the one read now)."""
        item = self.peek()
        self.lookahead = None
        return item

    def items_ahead(self, last):
        """The items after the lookahead up to the first one for which ``last(item)`` is
        true (or the end of the trace), read and put back: errata workarounds look ahead
        as libipt's do, and decoding then goes on from where it was."""
        ahead = []
        while True:
            item = self.item()
            if item is None:
                break
            ahead.append(item)
            if last(item):
                break
        if ahead:
            self.pushed.extend(reversed(ahead))
            self.ended = False
        return ahead

    def items_past_modes(self):
        """items_ahead() up to the first item that is not a MODE.Exec."""
        return self.items_ahead(_not_a_mode)

    def drop_items(self, count):
        """Drop the lookahead and the ``count - 1`` items after it (put back by items_ahead):
        libipt skips those packets and decodes on after them."""
        if count == 0:
            return
        self.lookahead = None
        if count > 1:
            del self.pushed[len(self.pushed) - (count - 1):]

    def peek_past_modes(self):
        """The next item that is not a MODE.Exec, applying the modes passed over."""
        item = self.peek()
        while item is not None and item[0] == F_MODE:
            self.lookahead = None
            if item[2] is not None:
                self.mode = item[2]
            item = self.peek()
        return item

    def ip_from_zero(self, item):
        """``item`` (an IP packet) with its IP built on no earlier IP, as libipt decodes the
        first IP packet after a PSB or OVF when an erratum workaround skipped the FUP
        before it (the tokenizer built it on that FUP's IP)."""
        kind, offset, ip = item
        ipbytes = self.data[offset] >> 5
        if ip is not None and P.IP_KEPT_BITS.get(ipbytes):
            ip &= ~P.IP_KEPT_BITS[ipbytes]
        return kind, offset, ip

    def skip_status_psb(self):
        """A PSB+ in the middle of a traced stretch only restates the state (IP, mode);
        the first item after it is left in lookahead.  Like any event libipt
        processes, it makes the next instruction the first after an event
        (``resumed_at``, for erratum BDM64)."""
        if self.committed == len(self.out):
            self.resumed_at = self.committed
        self.in_status = True
        try:
            while True:
                item = self.item()
                if item is None or item[0] == F_PSBEND:
                    return
                kind, value = item[0], item[2]
                if kind == F_MODE and value is not None:
                    if value != self.mode:  # status only: it cannot change the mode
                        self.error(item[1], "PSB+ gives the execution mode as %d-bit where decoding is in %d-bit "
                                   "mode (a bad status update)" % (value, self.mode))
                elif kind != F_FUP and kind != F_PSB:
                    self.lookahead = item
                    return
        finally:
            self.in_status = False


def _not_a_mode(item):
    return item[0] != F_MODE
