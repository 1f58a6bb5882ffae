"""The walk's events while tracing is on: what the next item means for the code the
step walks, and taking it when the step reaches it.

As libipt's query decoder, an event is due only once the TNT bits are used up
(``pending_event``): a FUP (an asynchronous transfer, with the TIP or TIP.PGD after
it; a FUP right before its TIP comes as one F_ASYNC item, an interrupt), an event a
FUP binds to an IP (F_AT_IP: MODE.TSX, MODE.Exec's interrupt flag, EXSTOP, PTW), or a
TIP.PGD that binds to a direct branch.  The step walks up to the
event's IP and calls ``take_async``.  It owns the FUPs libipt lets wait behind TNT
(``waiting_fups``), the FUP + TIP it holds until decoding reaches the FUP's IP
(``held``), where tracing stopped (``off_ip``), and the errata workarounds that act
while tracing is on (BDM64, SKD022).  Tracing disabled without an IP binds here too
(``unbound_disable``), and so does a PIP outside PSB+ (libipt's paging event:
``read_pip``, ``bind_pips``; state.py holds the PIPs not yet recorded).
"""

from .. import packets as P
from .kinds import B_FAR_CALL, B_FAR_RET, B_INDIRECT, B_INDIRECT_CALL, B_JUMP, B_CALL, F_ASYNC, F_AT_IP, F_FUP, F_MODE, \
    F_OVF, F_PGD, F_PGE, F_TIP, F_TNT, ITEM_NAMES
from .reader import ItemReader

# Erratum BDM64: how far libipt looks for a transaction abort's IP along straight-line code.
BDM64_MAX_STEPS = 0x100
# pending_event's answer when nothing binds: no asynchronous event, no TIP.PGD target.
NOTHING_DUE = (None, -1)


class EventBinder(ItemReader):
    """Events while tracing is on (see the module docstring)."""

    __slots__ = ("waiting_fups", "held", "held_after", "off_ip", "bdm64_checked", "resync_past_psb",
                 "fup_in_flight")

    def __init__(self, *args):
        ItemReader.__init__(self, *args)
        self.waiting_fups = []   # FUPs followed by TNT: each binds to a TIP after them (pending_event)
        self.held = None         # a FUP libipt holds with the items up to its TIP (held_after) until its IP
        self.held_after = None
        self.off_ip = 0          # where libipt's decoder stands while tracing is off (fup_while_disabled)
        self.bdm64_checked = None  # the MODE.TSX abort whose IP was found on the straight-line path
        self.resync_past_psb = False  # after this error, libipt resyncs past the next PSB (psb_follows)
        self.fup_in_flight = False  # take_async reads what follows a FUP

    def reset(self):
        ItemReader.reset(self)
        self.waiting_fups = []
        self.held = self.held_after = None

    def pending_event(self, bits_left):
        """What the next item means once the TNT bits are used up (``bits_left``: the
        step's are not), as libipt's query decoder signals it only then: (address where
        an asynchronous event binds (FUP, MODE.TSX...) or None, target of a TIP.PGD that
        binds to the direct branch going there (-1: none)).  The step asks where the
        next item is no TNT or TIP (they bind nothing), or where a FUP is held or waiting.

        A FUP followed by TNT (a trace libipt misreads, e.g. past an erratum it does
        not know) waits, as in libipt, for the TIP it binds to: the TNT bits come first."""
        if self.held is not None:
            return self.held[2], -1
        if bits_left:
            return NOTHING_DUE
        if self.waiting_fups:
            self.release_waiting_fup()
        item = self.lookahead or self.read(False)  # (peek(): the step has usually read it ahead)
        if item is None:
            return NOTHING_DUE
        kind = item[0]
        if kind == F_ASYNC:
            # An interrupt (FUP + TIP) binds now.  Its TIP counts as read (as below).
            fup, tip = item[2]
            self.last_offset = tip[1]
            return fup[2], -1
        if kind == F_FUP:
            # A FUP right before a TIP binds now; fup_waits looks further.
            following = self.item()
            if following is not None:
                self.pushed.append(following)
                if following[0] == F_TIP:
                    return item[2], -1
            if self.fup_waits():
                return NOTHING_DUE
            return item[2], -1
        if kind == F_AT_IP:
            return item[2][0], -1
        if kind == F_PGD and item[2] is not None:
            return None, item[2]
        if kind == F_PGE:
            # libipt handles it as soon as it is due, and tracing is already on.
            self.resync_past_psb = self.psb_follows(item[1])
            self.error(item[1], "tip.pge while tracing is enabled")
        return NOTHING_DUE

    def fup_waits(self):
        """The FUP in lookahead is followed by TNT: it waits for the TIP after them."""
        ahead = self.items_past_modes()
        if not ahead or ahead[-1][0] != F_TNT:
            return False
        self.waiting_fups.append(self.lookahead)
        self.lookahead = None
        return True

    def hold_async_branch(self):
        """A due FUP + TIP (an asynchronous branch) where decoding needs TNT or TIP before
        reaching the FUP's IP (a trace libipt misreads): libipt has taken both as its
        event and holds it until decoding reaches that IP; the trace for the branches
        before it comes from the packets after the TIP."""
        if self.held is not None:
            return False
        ahead = self.items_past_modes()
        if not ahead or ahead[-1][0] != F_TIP or ahead[-1][2] is None:
            return False
        self.held, self.held_after = self.lookahead, ahead
        self.drop_items(len(ahead) + 1)
        return True

    def release_waiting_fup(self):
        """The TNT bits after a waiting FUP are used up: the first one binds to the TIP or
        TIP.PGD that comes now (put back in front of it); anything else drops them."""
        following = self.peek()
        if following is not None and following[0] == F_TNT:
            return
        if following is not None and following[0] in (F_TIP, F_PGD, F_MODE):
            self.pushed.append(following)
            self.lookahead = self.waiting_fups.pop(0)
        else:
            del self.waiting_fups[:]

    def psb_follows(self, offset):
        """Whether the packet at ``offset`` is followed by a PSB, timing packets aside.
        libipt's query decoder reads on to the next packet that is a branch or an event
        before its instruction decoder handles the one at ``offset``: through the
        timing packets and through that PSB+.  After an error there it resyncs at the
        PSB after that one."""
        following = P.tokens(self.data, offset, at_packet=True)
        next(following)  # the packet at offset
        for kind, _, value in following:
            if kind != P.K_PAD_RUN and not (kind == P.K_OTHER and value[0] in P.QUIET_PACKETS):
                return kind == P.K_PSB
        return False

    def take_async(self, address):
        """At the FUP address: consume FUP + TIP (transfer) or FUP + TIP.PGD (tracing
        off); at the address of an event a FUP binds (MODE.TSX, EXSTOP, PTW): consume it
        and go on from there (after the PTWRITE)."""
        self.committed = self.resumed_at = len(self.out)
        if self.held is not None:
            (_, fup_offset, _), ahead = self.held, self.held_after
            self.held = self.held_after = None
            for _, _, mode in ahead[:-1]:
                if mode is not None:
                    self.mode = mode
            self.event("interrupt", fup_offset, address)
            return ahead[-1][2]
        kind = self.lookahead[0]
        if kind == F_ASYNC:  # an interrupt: the TIP after the FUP
            _, (_, offset, value) = self.lookahead[2]
            self.lookahead = None
            self.event("interrupt", offset, address)
            return value
        if kind == F_AT_IP:
            item, self.lookahead = self.lookahead, None
            if item[2][1] == "ptwrite":
                # The PTWRITE at the FUP's IP ran (it is no branch): it is traced, the
                # event follows it, and the walk goes on after it.
                size = self.cache.instruction_size(address, self.mode)
                if size:
                    self.out.append(address)
                    self.committed = self.resumed_at = len(self.out)
                    self.event("ptwrite", item[1], address)
                    return address + size
            if item[2][1] is not None:
                self.event(item[2][1], item[1], address)
            return address
        # A FUP: the TIP (or TIP.PGD) after it, MODE.Exec aside.  First: the TIP
        # pending_event read right after the FUP and put back.
        self.lookahead = None
        pushed = self.pushed
        if pushed and pushed[-1][0] == F_TIP and pushed[-1][2] is not None:
            _, offset, value = pushed.pop()
            self.event("interrupt", offset, address)
            return value
        self.fup_in_flight = True  # a PIP before its TIP goes with the transfer (read_pip)
        try:
            item = self.peek_past_modes()
        finally:
            self.fup_in_flight = False
        if item is None:
            return None
        kind, offset, value = item
        if kind == F_TIP and value is not None:
            self.lookahead = None
            self.event("interrupt", offset, address)
            return value
        if kind == F_PGD:
            self.lookahead = None
            if "skd022" in self.errata and self.cache.disassemble(address).startswith(("vmlaunch", "vmresume")):
                # Erratum SKD022: the VM entry cleared TraceEn; it ran, and tracing stopped after it.
                self.out.append(address)
                self.committed = len(self.out)
                self.off_ip = 0
                self.event("disabled", offset, value)
            else:
                self.off_ip = address
                self.event("disabled", offset, address)
            return None
        if kind == F_OVF:
            return None
        self.error(offset, "FUP at 0x%x is followed by %s instead of a TIP" % (address, ITEM_NAMES[kind]))

    def bdm64_redirects(self, ip, abort_ip):
        """Erratum BDM64: a transaction abort right after a branch may corrupt that branch's
        trace.  As libipt: when the abort is due after a branch and its IP cannot be
        reached from the branch's destination along straight-line code (direct jumps and
        calls, BDM64_MAX_STEPS instructions), the branch went to the abort IP."""
        if "bdm64" not in self.errata or len(self.out) == self.resumed_at:
            return False
        item = self.lookahead
        if item is None or item[0] != F_AT_IP or item[2][1] != "tsx_abort" or item is self.bdm64_checked:
            return False
        steps = BDM64_MAX_STEPS
        blocks = self.cache.blocks(self.mode)
        while True:
            block = blocks.get(ip) or self.cache.build(ip, self.mode)
            if abort_ip in block.insns:
                if block.insns.index(abort_ip) <= steps:
                    self.bdm64_checked = item
                    return False
                return True
            steps -= len(block.insns)
            if steps < 0 or (block.kind != B_JUMP and block.kind != B_CALL):
                return True
            ip = block.target

    def drop_uncommitted(self, at_end=False):
        """Drop what was walked past the last trace data, but for the instructions up to
        the last one a PIP bound to.  At the end of the trace, while libipt holds an
        event (hold_async_branch) or a PIP it has not bound, it does not see the end
        coming: everything up to the branch that found no data stays, that branch too
        (libipt had decoded it when its query met the end, and ptxed lists it)."""
        if self.pips:
            self.bind_pips()
        if not (at_end and (self.held is not None or self.pips)):
            del self.out[max(self.committed, self.paging_kept - self.flushed):]

    def disable_at(self, block):
        """A TIP.PGD binds to ``block``'s direct branch: report it and stop."""
        self.lookahead = None
        self.committed = len(self.out)
        self.off_ip = block.target
        self.event("disabled", self.last_offset, block.target)

    def is_far_transfer(self, address):
        """Far branches (and with them the CPL changes), where a TIP.PGD without an IP binds."""
        kind = self.cache.ends.get(address)
        if kind == B_INDIRECT or kind == B_INDIRECT_CALL:
            # jmp/call through a far pointer: "ljmp [rax]", or "jmp ptr [rax]" without a size
            return self.cache.disassemble(address).startswith(("ljmp", "lcall", "jmp ptr", "call ptr"))
        return kind == B_FAR_CALL or kind == B_FAR_RET

    def unbound_disable(self, offset, address, what):
        """A TIP.PGD without an IP found by a branch that needs trace (``address``).  libipt
        binds it only to a far transfer or a MOV CR3: the first MOV CR3 walked since the
        last trace data is where tracing stopped; else libipt fails the branch (which it
        had decoded: it stays listed), silently when the TIP.PGD ends the trace."""
        out = self.out
        for index in range(self.committed, len(out)):
            if out[index] != address and self.cache.disassemble(out[index]).startswith("mov cr3"):
                del out[index + 1:]
                self.lookahead = None
                self.committed = len(out)
                self.off_ip = 0
                self.event("disabled", offset, None)
                return None
        if self.items_ahead(lambda item: True):
            self.error(offset, "tip.pgd without an IP where the %s at 0x%x needs trace (it binds only to a far "
                       "transfer)" % (what, address), address)
        self.lookahead = None
        self.committed = len(out)
        return None


    # -- paging (PIP) ---------------------------------------------------------------

    def read_pip(self, offset):
        """A PIP outside PSB+ (the reader hands it here), libipt's paging event.  While
        tracing is off it is an event where it is read; after a FUP whose transfer is due
        it goes with that transfer (after its ``interrupt`` or ``disabled``); else it
        binds to the next MOV CR3, far branch or VM entry from the last trace data on
        (bind_pips)."""
        if not self.walking:
            self.event("paging", offset, None)
        elif self.fup_in_flight or self.held is not None or (self.lookahead is not None
                                                             and self.lookahead[0] in (F_FUP, F_ASYNC)):
            self.async_pips.append(offset)
        else:
            self.pips.append((offset, self.flushed + self.committed))
            self.bind_pips()

    def bind_pips(self):
        """Bind each pending PIP, in order, to the first MOV CR3, far branch or VM entry
        walked from where it binds on (one PIP an instruction): a ``paging`` event after
        that instruction, which stays listed (libipt had decoded it and reports the event
        before it sees the end of the trace)."""
        out, flushed = self.out, self.flushed
        while self.pips:
            offset, start = self.pips[0]
            for index in range(max(start - flushed, 0), len(out)):
                address = out[index]
                if self.is_far_transfer(address) or self.cache.disassemble(address).startswith("mov cr3"):
                    break
            else:
                self.pips[0] = (offset, flushed + len(out))  # what was walked does not bind it
                return
            del self.pips[0]
            self.paging_kept = flushed + index + 1
            self.record((self.paging_kept, "paging", offset, None))
            if self.pips:
                self.pips[0] = (self.pips[0][0], max(self.pips[0][1], self.paging_kept))
