"""Optional back end: the instruction flow decoded by Intel's libipt, through ctypes.

``reconstruct_flow(..., decoder="libipt")`` (``ipt flow --decoder libipt``) uses
:class:`LibiptFlowDecoder` in place of flow.FlowDecoder: the same ``decode()``,
filling the same FlowResult, so the JSON and the text are the same
(tests/test_ipt_libipt_agrees.py compares the whole documents).  What libipt does
not say is found as the Python decoder finds it:

* an event's trace offset is the packet that gave it (libipt's decoder is past it,
  often past later packets): libipt's packet decoder reads the trace alongside, and
  each event is named by the next packet of its kind (EVENT_PACKETS), in trace order;
* "sync": decoding (re)starts at a PSB whose PSB+ holds a FUP, at that FUP's IP;
* ``blocks``: the basic blocks the listing's instructions lie in and the ones the
  Python walk stands at (where an event resumes, where the code needs trace past the
  end of the trace) are built in the same BlockCache, so both count alike, but for the
  blocks the Python walk drops (past the last trace data before an OVF or an error);
* an error is libipt's (its message, where its decoder stood), at the instruction it
  stopped at when it had decoded it (listed, as ptxed lists it: pt_insn_next gave its
  class); a packet it cannot decode is a packet error.

libipt reads the code through its image callback (``pt_image_set_callback``) from the
flow's CodeImage: the same target memory and image files the Python decoder reads (the
image files as sections, which libipt reads without a call per instruction).

The library is loaded on first use, never at import (inside WinDbg it is usually
absent), through libipt_api (its declarations, which the tests' harness shares):
``libipt.so.2`` on Linux; on Windows the DLL named by DBGEXT_LIBIPT
(``libipt.dll``/``ipt.dll`` else).  Another major version than 2 is refused.

What it follows is libipt's own: its errata table (``pt_cpu_errata``, which knows
fewer CPUs than upstream's in errata.py), the packets it knows (2.0 has no CFE, EVD
or TRIG), resynchronisation at the next PSB after an error (``resync_on_error``
needs the Python decoder), and at the end of the trace ptxed's rule: no instruction
once libipt reports the end of the trace with its events drained.  The Python
decoder remains the reference.
"""

import ctypes
import os
import tempfile
from bisect import bisect_left

from ..errors import BadInput
from ..target.base import PAGE_SIZE
from .libipt_api import (EVENT_IP_SUPPRESSED, EVENT_STATUS_UPDATE, EVENT_TYPES, EXEC_MODE_16, EXEC_MODE_32, EXEC_MODE_64,
                         INSN_CLASS_ERROR, MODE_LEAF_TSX, PACKET_ERRATA, PACKET_IP_BITS, PACKET_TYPES, PTE_BAD_OPC,
                         PTE_BAD_PACKET, PTE_EOS, PTE_NOMAP, PTS_EOS, PTS_EVENT_PENDING, READ_MEMORY, Event, Insn,
                         Packet, config_for, library_version, load, trace_buffer)
from .flow import FLUSH_SIZE, MODE_16, MODE_32, MODE_64, BlockCache, FlowResult
from .packets import IP_KEPT_BITS, QUIET_PACKETS, decompress_ip, packet_errata

# enum pt_event_type -> (the flow's event kind, its IP: IP_FIRST (the first variant
# word, unless pt_event's ip_suppressed flag is set), IP_AT (the first word, always
# there) or None (no IP), which word is where the Python walk then stands or None):
# the events the Python decoder reports, by the same names.  Others (exec_mode,
# timing, power...) are not flow events there, so they are not here either; nor are
# status updates (a PSB+ restating the state).  An asynchronous event's first word
# (where it happened) is always there: the flag is about its second (where it went).
IP_FIRST, IP_AT = "first", "at"
EVENTS = {
    0: ("enabled", IP_FIRST, 0),        # ptev_enabled {ip, resumed}
    1: ("disabled", IP_FIRST, None),    # ptev_disabled {ip}
    2: ("disabled", IP_AT, None),       # ptev_async_disabled {at, ip}
    3: ("interrupt", IP_AT, 1),         # ptev_async_branch {from, to}
    4: ("paging", None, None),          # ptev_paging {cr3, non_root}
    5: ("paging", None, None),          # ptev_async_paging {cr3, non_root, ip}: with the transfer
    6: ("overflow", IP_FIRST, 0),       # ptev_overflow {ip}: see event()
    8: ("tsx", IP_FIRST, 0),            # ptev_tsx {ip, speculative:1 aborted:1}
    12: ("exstop", IP_FIRST, 0),        # ptev_exstop {ip}
    16: ("ptwrite", IP_FIRST, 0),       # ptev_ptwrite {ip, size, payload}
}
EVENT_OVERFLOW, EVENT_TSX = EVENT_TYPES.index("overflow"), EVENT_TYPES.index("tsx")
# Asynchronous events (their first word: where it happened, which did not run).
EVENTS_ASYNC = (2, 3)
# Events after which tracing is on (the others leave it as it was, but "disabled").
EVENTS_ENABLING = ("enabled", "overflow")


# enum pt_exec_mode -> the flow's mode, for the modes the listing cannot assume (64-bit).
OTHER_MODES = {EXEC_MODE_16: MODE_16, EXEC_MODE_32: MODE_32}
# How far past the end of the trace the blocks the Python walk builds are looked for.
MAX_INSNS_PAST_END = 1 << 12

# -- code --------------------------------------------------------------------------------


class _ImageFiles(object):
    """The CodeImage's image files as libipt sections: each image's bytes in memory
    layout written once to a temporary file (libipt maps sections from files), so
    libipt reads their code itself; the callback serves only target memory."""

    def __init__(self, code):
        self.folder = tempfile.TemporaryDirectory(prefix="dbgext-libipt-")
        self.sections = []   # (path, size, base)
        for number, (base, size, read) in enumerate(code.images):
            data = read(0, size)
            path = os.path.join(self.folder.name, "image%d.bin" % number)
            with open(path, "wb") as handle:
                handle.write(data)
            self.sections.append((path, len(data), base))

    def add_to(self, library, image):
        for path, size, base in self.sections:
            status = library.pt_image_add_file(image, os.fsencode(path), 0, size, None, base)
            if status < 0:
                raise BadInput("libipt cannot map the code image at %#x: %s"
                               % (base, library.pt_errstr(-status).decode()))


class _CodeReader(object):
    """libipt's image callback over a flow.CodeImage: code read a page at a time and
    kept, as libipt asks for each instruction's bytes (15 at a time)."""

    def __init__(self, code):
        self.code = code
        self.pages = {}
        self.callback = READ_MEMORY(self._read)

    def bytes_at(self, address, size):
        page = address & ~(PAGE_SIZE - 1)
        data = self.pages.get(page)
        if data is None:
            data = self.pages[page] = self.code.read_upto(page, PAGE_SIZE)
        offset = address - page
        if offset >= len(data):   # the page is unreadable from its start (an image that starts inside it)
            return self.code.read_upto(address, size)
        piece = data[offset:offset + size]
        if len(piece) < size and len(data) == PAGE_SIZE:   # on into the next page
            piece += self.bytes_at(page + PAGE_SIZE, size - len(piece))
        return piece

    def _read(self, buffer, size, asid, address, context):
        try:
            piece = self.bytes_at(address, size)
        except Exception:  # an exception cannot cross into libipt: an unreadable byte is no code
            piece = b""
        if not piece:
            return -PTE_NOMAP
        ctypes.memmove(buffer, piece, len(piece))
        return len(piece)


# -- where each event is in the trace ------------------------------------------------------

# The flow's event kind -> (the packet types that give it, the packet right before it,
# "after overflow" (after the OVF the last overflow was named by) or None), for the
# offset the Python decoder reports: the packet that gives the event.
# An EXSTOP or PTW with its IP bit ("exstop.ip", "ptw.ip") is named by the FUP after it.
EVENT_PACKETS = {
    "enabled": (("tip.pge",), None), "disabled": (("tip.pgd",), None), "overflow": (("ovf",), None),
    "interrupt": (("tip",), "fup"), "tsx_begin": (("fup", "tip.pge"), "mode.tsx"),
    "tsx_commit": (("fup", "tip.pge"), "mode.tsx"), "tsx_abort": (("fup", "tip.pge"), "mode.tsx"),
    "exstop": (("exstop", "exstop.ip"), None), "ptwrite": (("ptw", "ptw.ip"), None),
    "resumed": (("fup", "tip.pge", "tip", "psb"), "after overflow"),
    "paging": (("pip",), None),
}
# Packets between two packets that go together (timing, padding).
_BETWEEN = frozenset(QUIET_PACKETS) | {"tma", "cbr", "mnt"}
# Packets kept behind the last event named, for the packet-before lookups.
PACKETS_KEPT = 64


def _status_ip(raw):
    """The IP of a FUP right after a PSB (the last IP is zero there), None when suppressed:
    struct pt_packet_ip {ipc, ip}, decompressed as every IP is (packets.decompress_ip)."""
    ipc = raw.payload[0]
    if ipc not in IP_KEPT_BITS:
        return None
    return decompress_ip(ipc, int.from_bytes(bytes(raw.payload[8:16]), "little"), 0)


class _EventPackets(object):
    """The packets of the trace as libipt's packet decoder reads them, read up to where
    the instruction decoder stands as events come: libipt's decoder reads ahead (it is
    past the packet that gave an event, often past later ones), so each event is named
    by the next packet that gives an event of its kind, in trace order, before where
    libipt stands."""

    def __init__(self, lib, trace, errata):
        self.lib = lib
        # The packets as libipt's query decoder reads them with its errata workarounds
        # (its packet decoder applies none): the Python decoder's rewrites.
        trace = packet_errata(trace, 0, len(trace), frozenset(name for name, bit in PACKET_ERRATA.items()
                                                              if errata & bit))[0]
        self.buffer = trace_buffer(trace)
        self.decoder = lib.pt_pkt_alloc_decoder(ctypes.byref(config_for(self.buffer, len(trace))))
        self.packets = []   # (offset, type) in trace order; inside a PSB+ the type is None (status only)
        self.status_fups = {}   # offset of a PSB -> the IP of the FUP in its PSB+
        self.status_modes = {}  # offset of a PSB -> enum pt_exec_mode of the MODE.Exec in its PSB+
        self.psb_at, self.status_fup = None, None
        self.in_psb = False
        self.offset = ctypes.c_uint64()
        self.raw = Packet()
        self.raw_ref = ctypes.byref(self.raw)
        self.status = lib.pt_pkt_sync_forward(self.decoder) if self.decoder else -PTE_EOS
        if self.status >= 0:
            lib.pt_pkt_get_offset(self.decoder, ctypes.byref(self.offset))
        self.next = {}      # (types, before) -> index in packets where the next one may be
        self.floor = 0      # no event before this offset: the last event's, or where decoding resynchronised
        self.overflow_at = 0

    def close(self):
        if self.decoder:
            self.lib.pt_pkt_free_decoder(self.decoder)

    def _read_to(self, position):
        lib, decoder, packets, raw, append = self.lib, self.decoder, self.packets, self.raw, self.packets.append
        packet_next, raw_ref, raw_size, payload = lib.pt_pkt_next, self.raw_ref, ctypes.sizeof(Packet), raw.payload
        offset = self.offset.value
        while self.status >= 0 and (not packets or packets[-1][0] < position):
            self.status = packet_next(decoder, raw_ref, raw_size)
            if self.status < 0:
                if self.status != -PTE_EOS:   # on at the next PSB, where the packet decoder stands
                    self.status = lib.pt_pkt_sync_forward(decoder)
                    lib.pt_pkt_get_offset(decoder, ctypes.byref(self.offset))
                    offset = self.offset.value
                continue
            kind = PACKET_TYPES[raw.type] if raw.type < len(PACKET_TYPES) else "unknown"
            if kind == "psb" or self.in_psb:
                self._status(kind, offset)
            elif kind in PACKET_IP_BITS and payload[PACKET_IP_BITS[kind][0]] & PACKET_IP_BITS[kind][1]:
                kind += ".ip"
            elif kind == "mode":
                kind = "mode.tsx" if payload[0] == MODE_LEAF_TSX else "mode.exec"
            append((offset, None if self.in_psb and kind != "psb" else kind))
            offset += raw.size
        self.offset.value = offset

    def _status(self, kind, offset):
        """Follow a PSB+: the FUP and the execution mode it gives (tracing was on)."""
        payload = self.raw.payload
        if kind == "psb":
            self.in_psb, self.psb_at, self.status_fup = True, offset, None
        elif kind == "mode" and payload[0] != MODE_LEAF_TSX:
            bits = payload[4]   # pt_packet_mode_exec {csl:1, csd:1}
            self.status_modes[self.psb_at] = EXEC_MODE_64 if bits & 1 else EXEC_MODE_32 if bits & 2 else EXEC_MODE_16
        elif kind == "fup":
            self.status_fup = _status_ip(self.raw)
        elif kind in ("psbend", "ovf"):   # an OVF cuts the PSB+ short: tracing's state is unknown
            self.in_psb = False
            if kind == "psbend" and self.status_fup is not None:
                self.status_fups[self.psb_at] = self.status_fup

    def status_ip(self, psb):
        """The IP of the FUP in the PSB+ at offset ``psb`` (tracing was on), or None."""
        self._read_to(psb + 1)
        while self.status >= 0 and self.in_psb:
            self._read_to(self.packets[-1][0] + 1)
        return self.status_fups.get(psb)

    def name(self, kind, position):
        """(offset, type) of the packet that gave an event of ``kind`` (an EXSTOP or PTW
        with its IP bit: its FUP's offset), None when none is found before ``position``
        (where libipt's decoder stands)."""
        rule = EVENT_PACKETS.get(kind)
        if rule is None:
            return None
        self._forget_passed()
        self._read_to(position)
        types, before = rule
        packets = self.packets
        index = max(self.next.get(rule, 0), bisect_left(packets, (self.floor,)))
        if before == "after overflow":
            index = max(index, self.overflow_at)
        while index < len(packets) and packets[index][0] < position:
            offset, packet = packets[index]
            index += 1
            if packet in types and offset >= self.floor and (before in (None, "after overflow")
                                                              or self._before(index - 1) == before):
                self.next[rule] = index
                self.floor = offset   # events come in trace order
                if kind == "overflow":
                    self.overflow_at = index
                if packet.endswith(".ip"):
                    fup = self._fup_after(index)
                    return None if fup is None else (fup, packet)
                return offset, packet
        return None

    def _forget_passed(self):
        """Drop the packets before the last event named (they name no event any more),
        so that what is kept does not grow with the trace."""
        passed = bisect_left(self.packets, (self.floor,)) - PACKETS_KEPT
        if passed < len(self.packets) // 2:
            return
        del self.packets[:passed]
        self.next = {rule: max(index - passed, 0) for rule, index in self.next.items()}
        self.overflow_at = max(self.overflow_at - passed, 0)

    def _fup_after(self, index):
        self._read_to(self.packets[-1][0] + 1)
        while index < len(self.packets) and self.packets[index][1] != "fup":
            index += 1
        return self.packets[index][0] if index < len(self.packets) else None

    def _before(self, index):
        """The type of the packet before ``packets[index]``, timing and padding skipped."""
        while index > 0:
            index -= 1
            if self.packets[index][1] not in _BETWEEN:
                return self.packets[index][1]
        return None


# -- the decoder -------------------------------------------------------------------------

class LibiptFlowDecoder(object):
    """flow.FlowDecoder's interface over libipt's instruction decoder.  ``code``: a
    flow.CodeImage; ``cpu``: (family, model[, stepping]) whose errata workarounds
    libipt applies (its own table); ``cache``: the BlockCache the views and the listing
    disassemble with, where the blocks are built as the Python decoder builds them."""

    def __init__(self, code, suspicious=None, cache=None, cpu=None, library=None):
        self.library = library or load()
        self.code = code
        self.cache = cache or BlockCache(code)
        self.suspicious = dict(suspicious or {})
        self.cpu = cpu
        self.version = library_version(self.library)
        self.files = _ImageFiles(code) if code.images else None

    def decode(self, data, start=0, end=None, max_insns=None, sink=None, progress=None, result=None):
        """As flow.FlowDecoder.decode: ``data[start:end]`` to the end; instructions in
        chunks to ``sink``, the first ``max_insns`` kept in ``result.instructions``."""
        result = result if result is not None else FlowResult()
        end = len(data) if end is None else min(end, len(data))
        trace = bytes(data[start:end])
        buffer = trace_buffer(trace)
        config = config_for(buffer, len(trace), self.cpu, self.library)
        lib = self.library
        decoder = lib.pt_insn_alloc_decoder(ctypes.byref(config))
        if not decoder:
            raise BadInput("libipt could not allocate an instruction decoder for this trace")
        image = lib.pt_insn_get_image(decoder)
        if self.files is not None:
            self.files.add_to(lib, image)
        reader = _CodeReader(self.code)
        lib.pt_image_set_callback(image, reader.callback, None)
        packets = _EventPackets(lib, trace, config.errata[0])
        try:
            _Run(self, result, decoder, packets, start, max_insns, sink, progress).run()
        finally:
            packets.close()
            lib.pt_insn_free_decoder(decoder)
        result.blocks_built = self.cache.blocks_built
        return result


class _Run(object):
    """One decode: libipt's loop as ptxed runs it (events drained before each
    instruction; after an error, on at the next PSB; stop at the end of the trace)."""

    def __init__(self, owner, result, decoder, packets, start, max_insns, sink, progress):
        self.owner = owner
        self.lib = owner.library
        self.result = result
        self.decoder = decoder
        self.packets = packets
        self.exec_mode = EXEC_MODE_64   # enum pt_exec_mode of the last instruction or PSB+
        self.standing = []              # where the Python walk stood, with no instruction listed since
        self.tracing = False            # as the events say: where the walk stands after one depends on it
        self.start = start
        self.max_insns = max_insns
        self.sink = sink
        self.progress = progress
        self.out = []
        self.flushed = 0
        self.offset = ctypes.c_uint64()

    def trace_offset(self):
        self.lib.pt_insn_get_offset(self.decoder, ctypes.byref(self.offset))
        return self.start + self.offset.value

    def flush(self):
        chunk, self.out = self.out, []
        if not chunk:
            return
        listing = self.result.instructions
        room = len(chunk) if self.max_insns is None else self.max_insns - len(listing)
        if room > 0:
            listing.extend(chunk[:room])
        if room < len(chunk):
            self.result.truncated = True
        self.flushed += len(chunk)
        if self.sink is not None:
            self.sink(chunk)
        if self.progress is not None:
            self.progress(self.trace_offset(), self.flushed)

    def error(self, status, ip):
        """A packet libipt cannot decode is a packet error, at no instruction (as the
        Python decoder's); anything else a flow error."""
        packet = -status in (PTE_BAD_OPC, PTE_BAD_PACKET)
        self.result.problems.add("ipt_packet_error" if packet else "ipt_flow_error", None if packet else ip,
                                 "libipt: %s" % self.lib.pt_errstr(-status).decode(), offset=self.trace_offset())

    def synchronised(self):
        """Decoding (re)starts at a PSB: when its PSB+ has a FUP, tracing was on there:
        the Python decoder's "sync" event, at the FUP's IP."""
        self.lib.pt_insn_get_sync_offset(self.decoder, ctypes.byref(self.offset))
        psb = self.packets.floor = self.offset.value
        ip = self.packets.status_ip(psb)
        if ip is not None:
            self.exec_mode = self.packets.status_modes.get(psb, self.exec_mode)
            self.tracing = True
            self.stands_at(ip)
            self.result.add_event((self.flushed + len(self.out), "sync", self.start + psb, ip))

    def event_offset(self, kind):
        """(where the event is in the trace: the packet that gave it (as the Python
        decoder says), else where libipt's decoder stands; that packet's type or None)."""
        self.lib.pt_insn_get_offset(self.decoder, ctypes.byref(self.offset))
        named = self.packets.name(kind, self.offset.value)
        if named is None:
            return self.start + self.offset.value, None
        return self.start + named[0], named[1]

    def stands_at(self, ip):
        """The Python walk builds the block where it stands (code it may not run: where
        the trace ends, where an event resumes or tracing stops): built here too, unless
        the next instruction listed starts there (see run), so the blocks agree."""
        if self.standing:
            self.build_standing()
        self.standing.append(ip)

    def build_standing(self, listed=None):
        """Build the blocks stood at, but one that the instruction listed at ``listed`` starts."""
        mode = OTHER_MODES.get(self.exec_mode, MODE_64)
        blocks = self.owner.cache.blocks(mode)
        for ip in self.standing:
            if ip != listed and ip not in blocks:
                self.owner.cache.build(ip, mode)
        self.standing = []

    def walk_past_end(self, insn, block, position):
        """Listing nothing more, build the blocks the Python walk builds past the end of
        the trace: it walks on (and drops what it walked) until the code needs trace,
        building the block that needs it; libipt's decoder goes on as far, and fails on
        that block's instruction (still decoding it: its class is not ptic_error)."""
        insn_next, ref, size = self.lib.pt_insn_next, ctypes.byref(insn), ctypes.sizeof(Insn)
        for _ in range(MAX_INSNS_PAST_END):
            insn.iclass = INSN_CLASS_ERROR
            status = insn_next(self.decoder, ref, size)
            if insn.iclass == INSN_CLASS_ERROR:
                return
            position += 1
            if position >= len(block) or block[position] != insn.ip:
                block, position = self.enter(insn.ip, insn.mode), 0
            if status < 0:
                return

    def enter(self, ip, exec_mode):
        """A block of the Python walk starts at ``ip``: built (and counted) as it builds
        it, in the instruction's mode.  Returns its instructions."""
        self.exec_mode = exec_mode
        mode = OTHER_MODES.get(exec_mode, MODE_64)
        cache = self.owner.cache
        return (cache.blocks(mode).get(ip) or cache.build(ip, mode)).insns

    def event(self, event, block_ended):
        """Record a libipt event under the flow's name for it, before the next
        instruction; ``block_ended``: the last instruction listed ends its block."""
        known = EVENTS.get(event.type)
        if known is None or event.flags & EVENT_STATUS_UPDATE:
            return
        kind, has_ip, stands = known
        suppressed = event.flags & EVENT_IP_SUPPRESSED
        ip = None if has_ip is None or has_ip == IP_FIRST and suppressed else event.variant[0]
        index = self.flushed + len(self.out)
        if event.type == EVENT_TSX:
            bits = event.variant[1]
            kind = "tsx_abort" if bits & 2 else "tsx_begin" if bits & 1 else "tsx_commit"
        offset, packet = self.event_offset("overflow" if event.type == EVENT_OVERFLOW else kind)
        # The walk stands where the event says execution is, while tracing (an EXSTOP or
        # PTW without its IP bit says nothing: libipt gives the next PTWRITE's IP).
        if event.type in EVENTS_ASYNC and block_ended:   # the walk went on to the next block, and found the event
            self.stands_at(event.variant[0])
        if (stands is not None and not suppressed and (self.tracing or kind in EVENTS_ENABLING)
                and packet not in ("exstop", "ptw")):
            at = event.variant[stands]
            if kind == "ptwrite":   # the PTWRITE ran: the walk goes on after it
                at += self.owner.cache.instruction_size(at, OTHER_MODES.get(self.exec_mode, MODE_64))
            self.stands_at(at)
        self.tracing = kind in EVENTS_ENABLING or self.tracing and kind != "disabled"
        if event.type == EVENT_OVERFLOW:
            self.result.add_event((index, "overflow", offset, None))
            if ip is not None:
                self.result.add_event((index, "resumed", self.event_offset("resumed")[0], ip))
            return
        self.result.add_event((index, kind, offset, ip))

    def run(self):
        lib, decoder = self.lib, self.decoder
        insn_next, insn_event = lib.pt_insn_next, lib.pt_insn_event
        insn, event = Insn(), Event()
        insn_ref, insn_size = ctypes.byref(insn), ctypes.sizeof(Insn)
        event_ref, event_size = ctypes.byref(event), ctypes.sizeof(Event)
        suspicious, warned = self.owner.suspicious, set()
        out = self.out
        last_ip = None
        block, position = (), 0   # the instructions of the block being listed, and where in it
        status = lib.pt_insn_sync_forward(decoder)
        if status >= 0:
            self.synchronised()
        while True:
            if status < 0:
                if status == -PTE_EOS:
                    break
                # At the instruction libipt stopped at when it had decoded it (as the Python
                # decoder names the branch that found no trace), else the last one listed.
                self.error(status, insn.ip if insn.iclass != INSN_CLASS_ERROR else last_ip)
                block, self.standing = (), []   # the Python walk fails where it stood, before building there
                status = lib.pt_insn_sync_forward(decoder)
                if status >= 0:
                    self.synchronised()
                continue
            while status & PTS_EVENT_PENDING:
                status = insn_event(decoder, event_ref, event_size)
                if status < 0:
                    break
                self.event(event, position == len(block) - 1)
            if status < 0:
                continue
            if status & PTS_EOS:
                self.walk_past_end(insn, block, position)   # as ptxed: the end of the trace, its events drained
                break
            insn.iclass = INSN_CLASS_ERROR   # pt_insn_next may fail before it writes insn
            status = insn_next(decoder, insn_ref, insn_size)
            if status < 0 and insn.iclass == INSN_CLASS_ERROR:
                continue   # as ptxed, the instruction an error stopped at is listed when libipt had decoded it
            ip = last_ip = insn.ip
            out.append(ip)
            position += 1
            if position >= len(block) or block[position] != ip:
                if self.standing:
                    self.build_standing(ip)
                block, position = self.enter(ip, insn.mode), 0
            if ip in suspicious and ip not in warned:
                warned.add(ip)
                self.result.problems.add("ipt_suspicious_path", ip, "the path enters %s: a real trace rarely runs "
                                         "it; check the reconstruction" % suspicious[ip], "warning",
                                         self.trace_offset())
            if len(out) >= FLUSH_SIZE:
                self.flush()
                out = self.out
        self.build_standing()
        self.flush()
        self.result.instruction_count = self.flushed
