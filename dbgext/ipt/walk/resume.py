"""Where tracing is off, lost or abandoned, and where the walk resumes.

Tracing off (``await_enable``): TIP.PGE, a PSB+ after a resync, the FUP after an
overflow, and the events read meanwhile (no instruction runs).  A PSB+ is read here
as the state it gives (``read_psb_plus``); an overflow resolves as libipt finds the
packet it binds to, with the errata workarounds of that moment (APL11, APL12,
SKD010; BDM70 for a PSB+ before TIP.PGE).  After an error decoding skips to the next
PSB (``skip_to_psb``) or, with ``resync_on_error``, to the next packet that names
an IP (``skip_to_ip``); code that cannot be read is a gap the trace is skipped over
(``skip_gap``).  It owns whether decoding is synchronised (``synced``) and what the
last PSB+ held (``psb_mode``).
"""

from .kinds import F_AT_IP, F_FUP, F_MODE, F_OVF, F_PGD, F_PGE, F_PSB, F_PSBEND, F_TIP, F_TNT, ITEM_NAMES, \
    TSX_STATES
from .events import EventBinder

# skd010_resume, fup_then_transfer: tracing is (or stays) off.
STAYS_OFF = -1


class Resumer(EventBinder):
    """Tracing off, resynchronising, gaps (see the module docstring)."""

    __slots__ = ("synced", "psb_mode")

    def __init__(self, *args):
        EventBinder.__init__(self, *args)
        self.synced = False      # a PSB+ was read since decoding (re)started: tracing off is then "disabled"
        self.psb_mode = False    # the last PSB+ read held a MODE.Exec

    def await_enable(self):
        """Consume items while tracing is off; return the IP where it resumes (or None at the end)."""
        while True:
            item = self.next_item()
            if item is None:
                return None
            kind, offset, value = item
            if kind == F_PSB:
                ip = self.read_psb_plus()
                if ip is not None and not self.bdm70_ignores_fup():
                    if not self.synced:
                        self.synced = True
                        self.event("sync", offset, ip)
                        return ip
                    self.fup_while_disabled(ip)
                self.synced = True
            elif kind == F_FUP and self.bound_by_cfe(offset):
                continue  # an event's IP (event trace) while tracing is off: nothing ran
            elif kind == F_PGE or kind == F_FUP:
                # FUP with tracing off: the resume point after an OVF.
                if value is None:
                    self.error(offset, "%s without an IP" % ITEM_NAMES[kind])
                self.event("enabled" if kind == F_PGE else "resumed", offset, value)
                return value
            elif kind == F_MODE:
                if value is not None:
                    self.mode = value
            elif kind == F_AT_IP and value[1] is not None and value[1] not in TSX_STATES:
                self.event(value[1], offset, value[0])  # nothing ran: no instruction is listed
            elif kind == F_OVF:
                self.reset()
                self.off_ip = 0
                ip = self.resolve_overflow(offset)
                if ip is not None:
                    return ip
            elif kind == F_TNT or kind == F_TIP:
                self.error(offset, "%s while tracing is disabled" % ITEM_NAMES[kind])

    def bound_by_cfe(self, offset):
        """Whether the FUP at ``offset`` comes right after a CFE with its IP bit: the IP
        of an event (an interrupt, a VM exit...), not where tracing resumes."""
        cfe = self.data[offset - 4:offset]
        return len(cfe) == 4 and cfe[:2] == b"\x02\x13" and cfe[2] & 0x80 != 0

    def read_psb_plus(self):
        """The PSB+ after its PSB: applies its MODE.Exec, returns its FUP's IP (None without)."""
        ip = None
        self.psb_mode = False
        while True:
            item = self.next_item()
            if item is None:
                return None
            kind, offset, value = item
            if kind == F_PSBEND:
                return ip
            if kind == F_PSB:  # decoding resynced at a PSB after a packet error: PSB+ starts again
                ip = None
                self.psb_mode = False
            elif kind == F_FUP:
                ip = value
            elif kind == F_MODE:
                self.psb_mode = True
                if value is not None:
                    self.mode = value
            elif kind == F_OVF:
                self.lookahead = item
                return None
            else:
                self.error(offset, "unexpected %s inside PSB+" % ITEM_NAMES[kind])

    def fup_while_disabled(self, ip):
        """A PSB+ with a FUP while tracing is off does not turn tracing on (TIP.PGE does).
        libipt gives its status (MODE.Exec) the FUP's IP, which it then awaits where
        tracing stopped (``off_ip``): when they differ, it is stuck and fails at the next
        packet."""
        following = self.peek()
        if self.psb_mode and ip != self.off_ip and following is not None:
            self.error(following[1], "FUP at 0x%x in a PSB+ while tracing is off (libipt cannot go on until the next "
                       "PSB)" % ip)

    def bdm70_ignores_fup(self):
        """Erratum BDM70: a PSB+ right before a TIP.PGE may hold a FUP (and MODE.Exec)
        although tracing is off.  libipt ignores such a FUP, IP and all; without the
        erratum it is an error."""
        if "bdm70" not in self.errata:
            return False
        following = self.peek()
        if following is not None and following[0] != F_MODE:
            if following[0] != F_PGE:
                return False
            self.lookahead = self.ip_from_zero(following)
            return True
        ahead = self.items_past_modes()
        if not ahead or ahead[-1][0] != F_PGE:
            return False
        self.pushed[len(self.pushed) - len(ahead)] = self.ip_from_zero(ahead[-1])
        return True

    def resolve_overflow(self, offset):
        """After an OVF (with tracing off): where it resumes, as libipt finds the packet the
        OVF binds to.  A FUP: tracing resumes there (await_enable) unless erratum APL12
        makes it spurious.  No FUP: the overflow resolved with tracing off, unless SKD010
        dropped the FUP (then tracing resumes at the next TIP, FUP or PSB+ FUP); a TIP.PGD,
        TIP or TNT first is an error unless APL11 or SKD010 explain it.  Returns the IP
        where tracing resumes now, or None.  An overflow libipt fails on is no event."""
        following = self.peek()
        kind = None if following is None else following[0]
        if kind == F_FUP:
            self.event("overflow", offset, None)
            if "apl12" in self.errata:
                self.apl12_skip_fup()
            return None
        if kind is not None and "skd010" in self.errata:
            resumed = self.skd010_resume(offset)
            if resumed is not None:
                return None if resumed == STAYS_OFF else resumed
        if kind in (F_TIP, F_PGD, F_TNT, F_PSBEND) and not (kind == F_PGD and "apl11" in self.errata):
            # libipt fails the step that ran into the overflow: its instruction goes too
            self.error(following[1], "%s right after an overflow%s" % (
                ITEM_NAMES[kind], " (an erratum of some parts: give --cpu to apply its workaround)"
                if kind == F_PGD else ""), self.out[-1] if self.out else None)
        self.event("overflow", offset, None)
        if kind == F_PGD:
            self.lookahead = None
        return None

    def apl12_skip_fup(self):
        """Erratum APL12: an OVF may be followed by a FUP although tracing is off.  libipt
        looks on for what tracing was (TIP.PGE or a PSB+ without FUP: off; TNT, TIP,
        TIP.PGD, a PSB+ with FUP, OVF or the end: on) and when it was off skips the FUP."""
        in_psb = []

        def decides(item):
            if in_psb:
                return item[0] in (F_PSBEND, F_FUP, F_OVF)
            if item[0] == F_PSB:
                in_psb.append(item)
                return False
            return item[0] in (F_PGE, F_TNT, F_TIP, F_PGD, F_OVF)

        ahead = self.items_ahead(decides)
        if not ahead:
            return
        kind = ahead[-1][0]
        if kind != F_PGE and not (in_psb and kind == F_PSBEND):
            return
        self.lookahead = None
        if kind == F_PGE and all(item[0] == F_MODE for item in ahead[:-1]):
            self.pushed[len(self.pushed) - len(ahead)] = self.ip_from_zero(ahead[-1])

    def skd010_resume(self, overflow_offset):
        """Erratum SKD010: the FUP after an OVF may be dropped.  As libipt, look on for a
        sign of tracing: a TIP.PGD (tracing went off: decoding goes on after it), a TIP, a
        FUP or a PSB+ with a FUP (tracing resumes at its IP).  Returns that IP,
        STAYS_OFF when tracing is off past the TIP.PGD, None when the erratum does not
        apply."""
        ahead = [self.lookahead]
        if ahead[0][0] == F_MODE:
            ahead += self.items_past_modes()
        for index, (kind, offset, value) in enumerate(ahead):
            if kind == F_MODE:
                continue
            if kind in (F_PGD, F_TIP, F_FUP, F_AT_IP, F_PSB):
                self.event("overflow", overflow_offset, None)
            if kind in (F_PGD, F_TIP):
                self.drop_items(index + 1)
                if kind == F_PGD:
                    return STAYS_OFF
                self.event("resumed", offset, value)
                return value
            if kind in (F_FUP, F_AT_IP):
                # Decoding goes on from the FUP (or its MODE.TSX): it binds as it would.
                self.drop_items(index)
                ip = value if kind == F_FUP else value[0]
                self.event("resumed", offset, ip)
                return ip
            if kind == F_PSB:
                self.drop_items(index + 1)
                ip = self.read_psb_plus()
                if ip is not None:
                    self.event("resumed", offset, ip)
                    return ip
                return STAYS_OFF
            return None
        return None

    def skip_to_psb(self):
        """After an error: drop items up to the next PSB (left as lookahead), or up to
        the PSB after it where libipt had read past that one (psb_follows)."""
        self.reset()
        past_psb, self.resync_past_psb = self.resync_past_psb, False
        while True:
            item = self.next_item()
            if item is None:
                return
            if item[0] == F_PSB:
                if past_psb:
                    past_psb = False
                    continue
                self.lookahead = item
                return

    def skip_to_ip(self):
        """After an error (resync_on_error): drop items up to the next that names where
        execution is; returns that IP, or None where tracing is off or a PSB or OVF
        (left as lookahead) says it."""
        held, held_after = self.held, self.held_after
        self.reset()
        if held is not None and held_after[-1][0] == F_TIP:  # a FUP + TIP already read: an interrupt
            self.event("interrupt", held[1], held[2])
            return held_after[-1][2]
        while True:
            item = self.next_item()
            if item is None:
                return None
            kind, offset, value = item
            if kind in (F_PSB, F_OVF):
                self.lookahead = item
                return None
            if kind == F_PGD:
                self.event("disabled", offset, value)
                return None
            if kind == F_MODE and value is not None:
                self.mode = value
            elif (kind == F_TIP or kind == F_PGE) and value is not None:
                self.event("resync", offset, value)
                return value
            elif kind == F_AT_IP:
                self.lookahead = item
                return value[0]
            elif kind == F_FUP and value is not None:
                resume = self.fup_then_transfer(value)
                if resume is None:
                    return value
                return None if resume == STAYS_OFF else resume

    def skip_gap(self, block):
        """No code at ``block.end`` (unreadable or undecodable): report a gap and skip
        the trace to the next packet that names an IP (TIP, TIP.PGE, FUP + TIP, PSB+)
        whose code can be read; returns that IP, or None when tracing stops first.

        The return stack is kept down to the frame the IP returns to (code beyond
        the gap usually returns into the code that called it).

        Past the end of the trace or before an OVF there is no gap: what was walked
        without trace data is dropped, as at any end of the trace or overflow; but for
        a PIP libipt has not bound, with which it decodes on to the gap."""
        if self.bit_index >= len(self.bits):
            item = self.peek()
            if item is None:
                self.drop_uncommitted(at_end=True)
                if not self.pips:
                    return None
            elif item[0] == F_OVF:  # no gap either: what was walked after the last trace data is lost
                self.drop_uncommitted()
                return None
            elif item[0] == F_PGD and item[2] is None:  # tracing stopped at a MOV CR3 on the way
                return self.unbound_disable(item[1], block.end, "code")
        start = self.last_offset
        self.event("gap", start, block.end)
        self.bits, self.bit_index = b"", 0
        self.walking = False
        resume = None
        kind = None
        try:
            while resume is None:
                item = self.next_item()
                if item is None:
                    break
                kind, offset, value = item
                if kind == F_TIP:
                    resume = value
                elif kind == F_PGE:  # tracing was disabled in the gap (ptxed's events)
                    self.event("disabled", offset, None)
                    self.event("enabled", offset, value)
                    resume = value
                elif kind == F_FUP and value is not None:
                    resume = self.fup_then_transfer(value)
                    if resume == STAYS_OFF:
                        resume = None
                        break
                elif kind == F_PSB:
                    resume = self.read_psb_plus()
                elif kind == F_MODE and value is not None:
                    self.mode = value
                elif kind == F_AT_IP:  # an event at an IP (PTW, EXSTOP, MODE.TSX): execution is there
                    resume = value[0]
                elif kind == F_PGD:
                    self.event("disabled", offset, value)
                    break
                elif kind == F_OVF:
                    self.lookahead = item
                    break
                if resume is not None and not self.cache.code.read_upto(resume, 1):
                    resume = None  # still outside the code we have
                    if kind == F_AT_IP and value[1] is not None:
                        self.event(value[1], offset, value[0])
                elif kind == F_AT_IP:
                    self.lookahead = item  # the walk binds it where it resumes
        finally:
            self.walking = True
        self.problems.add("ipt_gap", block.end, "%s: trace skipped to offset %d" % (block.problem, self.last_offset),
                          "warning", start)
        if resume is None:
            return None
        if kind != F_PGE:  # a TIP.PGE's "enabled" says where
            self.event("resync", self.last_offset, resume)
        if resume in self.retstack:  # down to the frame it returns to, that one too
            while self.retstack.pop() != resume:
                pass
        self.committed = self.resumed_at = len(self.out)
        return resume

    def fup_then_transfer(self, fup_ip):
        """A FUP read while skipping trace (after an error, over a gap), and the TIP or
        TIP.PGD after it (MODE.Exec aside): an interrupt at the FUP's IP, returning the
        TIP's IP where execution goes on, or tracing disabled there (STAYS_OFF).  None
        when neither follows (the item after the FUP is then left in lookahead)."""
        following = self.peek_past_modes()
        if following is not None and following[0] == F_TIP and following[2] is not None:
            self.lookahead = None
            self.event("interrupt", following[1], fup_ip)
            return following[2]
        if following is not None and following[0] == F_PGD:
            self.lookahead = None
            self.event("disabled", following[1], fup_ip)
            return STAYS_OFF
        return None
