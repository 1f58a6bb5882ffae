"""The per-block step: follow the code block by block, taking one TNT bit, TIP or
return address for each block's branch, and the driver around it (``run``).

The hot loop (``walk``) keeps the TNT bits, their index and the committed length in
locals and stores them (``save``) before it calls a part that reads them.  Once its
bits are used up (and after a TIP or an event) it peeks at the next item through the
reader (reader.py): a TNT packet or a TIP binds nothing, and the branch that needs
it takes it from the lookahead; any other item, or a FUP held back, goes to
``pending_event`` (events.py), which says where an event is due.  The step also
owns the return stack's use (compressed RETs, calls), what an indirect branch takes
when its TIP is not simply next (``take_ip``: a deferred TIP, a TIP.PGD, errors),
what a conditional branch takes when its TNT packet is not simply next (``refill``),
and what happens when the trace has no TNT bit or TIP for a branch (``stop_at``,
``finish_segment``).
"""

from bisect import bisect_left

from .kinds import B_CALL, B_COND, B_FAR_CALL, B_INDIRECT_CALL, B_JUMP, B_RET, B_STOP, F_FUP, F_MODE, F_OVF, \
    F_PGD, F_TIP, F_TNT, ITEM_NAMES, TNT8_TAKEN
from .resume import Resumer
from .state import FLUSH_SIZE, Resync
# Blocks walked without consuming any trace before we call it a runaway path.
MAX_BLOCKS_WITHOUT_TRACE = 100000


class Walk(Resumer):
    """One decode: ``Walk(decoder, result, items, sink, progress, data).run()``."""

    __slots__ = ("warned",)

    def __init__(self, *args):
        Resumer.__init__(self, *args)
        self.warned = set()      # suspicious functions entered (warned about once)

    def run(self):
        """Decode to the end: await tracing, walk, and after an error resynchronise."""
        resume = None  # where decoding goes on after an error (resync_on_error)
        while not self.ended or self.lookahead is not None:
            try:
                ip, resume = resume if resume is not None else self.await_enable(), None
                if ip is None:
                    break
                self.walking = True
                self.walk(ip)
            except Resync:
                self.walking = False
                self.synced = False
                if self.resync_on_error:
                    resume = self.skip_to_ip()
                else:
                    self.skip_to_psb()
            self.walking = False
        self.committed = len(self.out)
        self.flush()
        self.result.instruction_count = self.flushed

    def refill(self):
        """Make TNT bits available, or leave the next non-TNT item in lookahead.  (The
        step takes a TNT packet already read ahead itself.)"""
        if self.committed >= FLUSH_SIZE:
            self.flush()
        while self.bit_index >= len(self.bits):
            item = self.peek()
            if item is None or item[0] != F_TNT:
                if item is not None and item[0] == F_FUP and (self.fup_waits() or self.hold_async_branch()):
                    continue
                return False
            self.lookahead = None
            self.bits = item[2]
            self.bit_index = 0
        return True

    def take_ip(self, address, wanted):
        """Consume the TIP an indirect transfer at ``address`` needs: returns the new IP
        or None when tracing stops there (TIP.PGD or the end of the trace).  (The step
        takes a TIP already read ahead itself.)"""
        if self.committed >= FLUSH_SIZE:
            self.flush()
        left = len(self.bits) - self.bit_index
        if 0 < left and getattr(self.bits, "last_packet", left) < left:
            # A deferred TIP after bits still held: libipt fails on the TNT packets that
            # come before the TIP after the packet it holds (merged here into one run).
            self.error(self.last_offset, "TNT packets before the TIP of the %s at 0x%x follow the bits left"
                       % (wanted, address), address)
        item = self.peek()
        after_mode = item is not None and item[0] == F_MODE
        item = self.peek_past_modes()
        if item is not None and item[0] == F_FUP and self.hold_async_branch():
            item = self.peek_past_modes()
        if item is not None and item[0] == F_TNT and self.bit_index >= len(self.bits):
            if after_mode:
                # libipt binds a MODE.Exec to the TIP right after it: TNT there fails the branch.
                self.error(item[1], "MODE.Exec followed by TNT where the %s at 0x%x needs a TIP" % (wanted, address),
                           address, decoded=False)
            # A deferred TIP: the TNT bits of the branches after this one come first,
            # one TNT packet of them (libipt fails on a second).
            first = self.data[item[1]]
            if first != 0x02 and len(item[2]) > len(TNT8_TAKEN.get(first, b"")):
                self.error(item[1], "more than one TNT packet before the TIP of the %s at 0x%x" % (wanted, address),
                           address)
            self.lookahead = None
            self.bits, self.bit_index = item[2], 0
            item = self.peek_past_modes()
        if item is None:
            return None
        kind, offset, value = item
        if kind == F_TIP and self.waiting_fups:
            self.error(offset, "the TIP for the %s at 0x%x is the asynchronous branch of the FUP at offset %d"
                       % (wanted, address, self.waiting_fups[0][1]), address)
        if kind == F_TIP and value is not None:
            self.lookahead = None
            return value
        if kind == F_TIP:
            self.error(offset, "TIP with a suppressed IP for the %s at 0x%x" % (wanted, address), address)
        if kind == F_PGD:
            if value is None and not self.is_far_transfer(address):
                return self.unbound_disable(offset, address, wanted)
            self.lookahead = None
            self.committed = len(self.out)
            self.event("disabled", offset, value)
            return None
        if kind == F_OVF:
            return None
        self.error(offset, "expected a TIP for the %s at 0x%x, found %s" % (wanted, address, ITEM_NAMES[kind]),
                   address)

    def walk(self, ip, *, len=len, bisect_left=bisect_left, B_COND=B_COND, B_JUMP=B_JUMP, B_CALL=B_CALL,
             B_RET=B_RET, B_INDIRECT_CALL=B_INDIRECT_CALL, B_STOP=B_STOP, F_TIP=F_TIP, F_TNT=F_TNT,
             BINDS_NOTHING=frozenset((F_TIP, F_TNT)), FLUSH_SIZE=FLUSH_SIZE,
             MAX_BLOCKS_WITHOUT_TRACE=MAX_BLOCKS_WITHOUT_TRACE):
        """Follow the code from ``ip`` until the trace ends, tracing stops, or an error.

        See the module docstring.  The reader needs ``committed`` for a PSB+ it reads
        as status.  The parts the loop calls for every item are bound methods in
        locals, and the globals it reads are keyword-only defaults (locals): on Python
        3.8 every attribute lookup counts, and 3.8 caches global lookups only for
        functions called often, not for one frame that loops for a whole trace."""
        out = self.out
        cache = self.cache
        retstack = self.retstack
        suspicious = self.suspicious
        extend = out.extend
        read, pending_event, take_async = self.read, self.pending_event, self.take_async
        bits, bi = self.bits, self.bit_index
        nbits = len(bits)
        self.committed = self.resumed_at = len(out)
        async_ip, disable_target = pending_event(bi < nbits)
        # The mode changes only with items read: it is looked at again after each
        # step that may have read some (the helpers, the item read when the bits are used up).
        mode = self.mode
        rows = cache.rows(mode)
        bdm64 = "bdm64" in self.errata
        idle_blocks = 0

        def save():
            self.bits, self.bit_index, self.committed = bits, bi, committed

        committed = self.committed
        bits_used_up = False
        while True:
            if bits_used_up:
                # What the next item binds now.  A TIP or TNT binds nothing while no FUP
                # is held or waiting: the branch that needs it takes it.
                bits_used_up = False
                self.committed = committed
                if self.held is None and not self.waiting_fups:
                    item = read(False)  # peek() (reading changes no mode)
                    due = item is not None and item[0] not in BINDS_NOTHING
                else:
                    due = True
                if due:
                    async_ip, disable_target = pending_event(bi < nbits)
                    if self.mode != mode:
                        mode = self.mode
                        rows = cache.rows(mode)
                else:
                    async_ip, disable_target = None, -1
            try:
                row = rows[ip]
            except KeyError:
                cache.build(ip, mode)
                row = rows[ip]
                if ip in suspicious and ip not in self.warned:
                    self.warned.add(ip)
                    self.problems.add("ipt_suspicious_path", ip, "the path enters %s: a real trace rarely runs "
                                      "it; check the reconstruction" % suspicious[ip], "warning", self.last_offset)
            start, insns, kind, target, fallthrough, end, block = row
            if async_ip is not None:
                at_event = start <= async_ip <= end
                if bdm64 and not at_event and self.bdm64_redirects(ip, async_ip):
                    ip = async_ip
                    continue
                if at_event:
                    # The trace moves the IP: an asynchronous event at async_ip.
                    extend(insns[:bisect_left(insns, async_ip)])
                    ip = take_async(async_ip)
                    if ip is None:
                        self.bits, self.bit_index = bits, bi
                        return
                    committed = self.committed
                    bits_used_up = True  # an event comes only with the bits used up
                    idle_blocks = 0
                    continue
            if kind == B_COND:
                extend(insns)
                if bi >= nbits:
                    item = self.lookahead
                    if item is not None and item[0] == F_TNT and item[2] and committed < FLUSH_SIZE:
                        self.lookahead = None  # the TNT is already read ahead (refill)
                        bits, bi = item[2], 0
                        nbits = len(bits)
                    else:
                        save()
                        if not self.refill():
                            self.stop_at(block, "conditional branch")
                            return
                        bits, bi = self.bits, self.bit_index
                        nbits = len(bits)
                        if self.mode != mode:
                            mode = self.mode
                            rows = cache.rows(mode)
                ip = target if bits[bi] else fallthrough
                bi += 1
                committed = len(out)
                idle_blocks = 0
                bits_used_up = bi >= nbits
            elif kind == B_JUMP or kind == B_CALL:
                extend(insns)
                if target == disable_target:
                    # TIP.PGD bound to this direct branch: its target left the traced
                    # range; the branch is reported, the target is not executed.
                    save()
                    self.disable_at(block)
                    return
                ip = target
                if kind == B_CALL:
                    retstack.append(fallthrough)
                idle_blocks += 1
                if idle_blocks > MAX_BLOCKS_WITHOUT_TRACE:
                    save()
                    self.error(self.last_offset, "%d blocks without trace data from 0x%x: the path loops"
                               % (idle_blocks, ip))
            elif kind == B_STOP:
                # A gap in the code: the trace moves the IP.
                extend(insns)
                save()
                ip = self.skip_gap(block)
                if ip is None:
                    return
                retstack = self.retstack
                bits, bi, committed = self.bits, self.bit_index, self.committed
                nbits = len(bits)
                bits_used_up = True  # a gap drops the bits
                idle_blocks = 0
            else:  # returns, indirect and far transfers
                extend(insns)
                item = self.lookahead
                if item is not None and item[0] == F_TIP and item[2] is not None and committed < FLUSH_SIZE \
                        and (bi >= nbits or kind != B_RET):
                    # The TIP is already read ahead.  TNT bits still cached stay for the
                    # branches after this one, as in libipt.
                    ip = item[2]
                    if kind == B_INDIRECT_CALL:
                        retstack.append(fallthrough)
                    committed = len(out)
                    idle_blocks = 0
                    self.lookahead = None
                    if bi < nbits:
                        async_ip, disable_target = None, -1
                    else:
                        bits_used_up = True
                    continue
                if kind == B_RET and bi >= nbits:
                    save()
                    if self.refill():  # a compressed RET after all
                        bits, bi = self.bits, self.bit_index
                        nbits = len(bits)
                        if self.mode != mode:
                            mode = self.mode
                            rows = cache.rows(mode)
                if kind == B_RET and bi < nbits:
                    bit = bits[bi]
                    bi += 1
                    if not bit:
                        save()
                        self.error(self.last_offset, "compressed RET at 0x%x with a not-taken bit: the "
                                   "reconstruction went wrong before it" % end, end)
                    if not retstack:
                        save()
                        self.error(self.last_offset, "compressed RET at 0x%x with an empty return stack" % end, end)
                    ip = retstack.pop()
                    committed = len(out)
                    bits_used_up = bi >= nbits
                else:
                    if kind == B_RET:
                        ip = self.take_ip(end, "ret")
                        if ip is None:
                            self.finish_segment(block)
                            return
                        bits, bi = self.bits, self.bit_index  # a deferred TIP's TNT bits come first
                        nbits = len(bits)
                        committed = len(out)
                        save()
                    else:
                        save()
                        ip = self.take_ip(end, "indirect branch")
                        if ip is None:
                            self.finish_segment(block)
                            return
                        bits, bi = self.bits, self.bit_index
                        nbits = len(bits)
                        if kind == B_INDIRECT_CALL:
                            retstack.append(fallthrough)
                        committed = self.committed = len(out)
                    async_ip, disable_target = pending_event(bi < nbits)
                    if self.mode != mode:
                        mode = self.mode
                        rows = cache.rows(mode)
                idle_blocks = 0

    def stop_at(self, block, what):
        """The trace has no TNT bit for ``block``'s branch: the end or an OVF (walked code
        is dropped), TIP.PGD (tracing stops after the branch), or an error."""
        item = self.peek()
        if item is None:
            self.drop_uncommitted(at_end=True)
            return
        if item[0] == F_OVF:
            self.drop_uncommitted()
            return
        kind, offset, value = item
        if kind == F_PGD:
            if value is None:
                self.unbound_disable(offset, block.end, what)
                return
            self.lookahead = None
            self.committed = len(self.out)
            self.off_ip = 0
            self.event("disabled", offset, value)
            return
        self.error(offset, "expected a TNT bit for the %s at 0x%x, found %s" % (what, block.end, ITEM_NAMES[kind]),
                   block.end)

    def finish_segment(self, block):
        """An indirect transfer found no TIP: the trace ended or overflowed (TIP.PGD was committed)."""
        # After a TIP.PGD libipt stands after a call (it expects the return there), else nowhere.
        self.off_ip = block.fallthrough if block.kind in (B_INDIRECT_CALL, B_FAR_CALL) else 0
        if self.lookahead is None:
            self.drop_uncommitted(at_end=True)
        elif self.lookahead[0] == F_OVF:
            self.drop_uncommitted()

