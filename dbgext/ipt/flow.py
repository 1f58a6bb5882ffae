"""Layer 3: reconstruct the executed instructions from packets plus code bytes.

The walk works on basic blocks, not single instructions: a block (straight-line
instructions up to and including one branch) is disassembled once with capstone and
cached per execution mode, so the steady state is "look up block, append its
addresses, take one TNT bit or TIP for its branch".

This module holds the code image and the block cache (CodeImage, BlockCache), the
tokenizer that reduces the packets to what control flow needs (_flow_items), and
FlowDecoder, which runs the walk over them.  The walk itself is dbgext.ipt.walk:
its decoder state, its one item reader, its event handling (tracing on; tracing
off and resuming) and its per-block step, a module each (see its docstring).

Conventions follow libipt's instruction decoder so the outputs compare line for
line: tests/test_ipt_differential.py checks each class against the installed libipt
(Debian's 2.0.5) and tests/test_ipt_intel_suite.py against Intel's upstream test
suite.  Where they differ, upstream rules:

* the end of the trace: the harness stops, as upstream ptxed does, once libipt
  reports the end of the trace with its events drained, where 2.0.5's decoder would
  list one instruction more after an event that moved the IP;
* the CPU errata table is upstream's (errata.py), which knows more CPUs;
* the instruction an error stops at: listed, as ptxed lists it, when libipt had
  decoded it (pt_insn_next failed after decoding: the query for its branch, its
  return stack, an event after it; the harness counts it the same way, by its
  instruction class), left out where libipt fails before (reading ahead);

* events are bound only once the TNT bits are used up, as libipt's query decoder
  signals them only then;
* end of trace: instructions are reported up to the last one whose outcome
  consumed trace data (a TNT bit, a TIP, an event), no further (ptxed's
  ``[end of trace]``), also where the walk past that reaches code it cannot read;
* a TIP.PGD binds to the next branch: a direct call/jmp only when it goes to the
  TIP.PGD's IP ("disabled at <target>": the branch is reported, its target is not
  executed), any indirect branch, return or conditional branch; with the IP
  suppressed, a far transfer (syscall into an untraced kernel) or a MOV CR3, and a
  near branch that needs trace finds it instead: libipt fails there;
* a PSB+ with FUP while tracing is off does not turn it on (only TIP.PGE does); when
  its status (MODE.Exec) and where tracing stopped differ, libipt cannot go on and
  fails until the next PSB;
* a TIP.PGE while tracing is on is an error as soon as it is due;
* OVF drops what was walked past the last trace data; tracing resumes at the FUP
  (or TIP.PGE) that binds the overflow; a TIP, TIP.PGD or TNT right after it is an
  error (an overflow libipt fails on is no event);
* a FUP followed by TNT waits for the TIP after them, and a due FUP + TIP that
  decoding has not reached when it needs trace is held until it does, the trace
  for the branches before it coming from the packets after the TIP (libipt's query
  decoder reads a trace that is out of step with the code that way);
* a deferred TIP: an indirect branch whose TNT cache is empty takes one TNT packet
  for the branches after it, then its TIP (a second TNT packet is an error);
* MODE.TSX + FUP is a transaction event at the FUP address; an abort's FUP is also
  an asynchronous transfer to the TIP that follows; in PSB+ MODE.TSX only restates;
  MODE.TSX or MODE.Exec followed by another IP packet goes with that packet (MODE.TSX
  before a TIP.PGE: a transaction event without IP before tracing is enabled);
* EXSTOP or PTW with its IP bit + FUP is an event at the FUP's IP (``exstop``: that
  instruction did not run; ``ptwrite``: the PTWRITE there ran): the code up to it
  is traced, also right before an OVF or at the end; so is MODE.Exec + FUP outside
  PSB+ (an interrupt flag change: ``interrupts_enabled``/``interrupts_disabled``,
  only where the IF bit differs from the last MODE.Exec's, as upstream; while tracing
  is off too, an event at the FUP's IP); with ``report_iflags`` (ptxed's
  ``--event:iflags``) also the MODE.Exec before a TIP.PGE, an event without IP
  after the enable;
  a FUP after TRIG with its IP bit or after a CFE of a branching instruction (IRET,
  VMENTRY, UIRET, SYSCALL) is no transfer;
* EXSTOP or PTW without its IP bit is an event at no IP where the walk reads it,
  whether tracing is on or off (ptxed lists each; libipt binds a PTW to the next
  PTWRITE, whose IP it gives); with its IP bit while tracing is off, an event at the
  FUP's IP; an OVF in place of its FUP leaves it an event without IP (upstream
  ptxed; libipt 2.0.5 drops it);
* a PIP outside PSB+ is a ``paging`` event: while tracing is off where it is read;
  after a FUP whose transfer is due, right after that transfer's event; else after
  the first MOV CR3, far branch or VM entry from the last trace data on (one PIP an
  instruction).  While one is unbound libipt does not see the end of the trace: it
  decodes on until a branch needs trace (listed: it decoded it) or the code stops (a
  gap); where another event comes first, libipt holds that event back until the PIP
  binds, the flow binds it where it comes (no suite test has it; libipt 2.0.5 then
  decodes past the event);
* an EVD before a CFE that does not take its type is an error (upstream's
  "unexpected packet context"); a CFE of an interrupt (INTR) is an ``event_interrupt``
  without IP where it is read (ptxed's "[interrupt <vector>]"; the ``interrupt``
  event is the asynchronous transfer its FUP + TIP make);
* a PSB+ read as status may not change the execution mode (a bad status update);
* JMPABS, ERETU, ERETS and UIRET, which the disassembler does not know, are branches;
* a compressed RET takes a TNT bit that must be taken and returns to the most recent
  call's successor (64-entry return stack, like the hardware's);
* ``call $+5`` (a call to the next instruction) is not pushed on the return stack;
* an asynchronous transfer (FUP then TIP / TIP.PGD) happens at the FUP address,
  which did not execute;
* errata workarounds keyed by the CPU (errata.py);
* every error is reported with its trace offset (and code address) and decoding
  resumes at the next PSB (with ``resync_on_error``, as ptxed's option, at the next
  packet that names an IP).

Where libipt stops, dbgext goes on: code that cannot be read (a module not in the
dump, not given as an image) is a reported gap, and decoding resumes at the next
packet that names an IP (libipt resumes only at the next PSB; upstream ptxed's
``--resync-on-error`` as dbgext).  The events in the trace skipped are reported as
ptxed reports them there: FUP + TIP an interrupt, FUP + TIP.PGD or TIP.PGD tracing
disabled, a TIP.PGE tracing disabled (somewhere in the gap) and enabled again, an
event at an IP outside the code at that IP.
"""

import os
import re
from collections import namedtuple

from ..disasm import Disassembler, base_mnemonic
from ..errors import BadInput, UnreadableMemory
from ..pe import PEImage
from ..problems import ProblemLog
from . import packets as P
# The walk's vocabulary, also dbgext.ipt.flow's (libipt.py and views.py import it from here).
from .walk.kinds import (B_CALL, B_COND, B_FAR_CALL, B_FAR_RET, B_INDIRECT, B_INDIRECT_CALL, B_JUMP,  # noqa: F401
                         B_RET, B_STOP, EXEC_MODES, F_ASYNC, F_AT_IP, F_BAD_CONTEXT, F_END, F_ERROR, F_EVENT, F_FUP,
                         F_MODE, F_OVF, F_PGE, F_PIP, F_PSB, F_PSBEND, F_TIP, F_TNT, MODE_16, MODE_32,
                         MODE_64)
# (under the names the tokenizer below uses)
from .walk.kinds import TNT8_TAKEN as _TNT8_TAKEN, TSX_STATES as _TSX_STATES, RunBits as _RunBits, taken as _taken
from .walk.state import FLUSH_SIZE, RETSTACK_DEPTH  # noqa: F401 (dbgext.ipt.libipt's, the tests' tracer's)
from .walk.step import Walk

_FAR_CALLS = {"syscall", "sysenter", "int", "int1", "int3", "into", "lcall", "vmcall", "vmmcall"}
_FAR_RETURNS = {"iret", "iretd", "iretq", "retf", "retfq", "sysret", "sysretq", "sysexit", "sysexitq",
                "vmlaunch", "vmresume"}
_COND_EXTRA = {"loop", "loope", "loopne", "jrcxz", "jecxz", "jcxz"}

MAX_BLOCK_BYTES = 0x1000
# Events kept in a result (a trace can hold millions of interrupts); the rest are counted.
MAX_EVENTS = 100000


# A basic block: straight-line instruction addresses (a tuple) up to and including one
# branch.  ``target``: the direct branch target; ``fallthrough``: the address after the
# last instruction; ``end``: the address of the last instruction (or of the problem);
# ``problem``: why a B_STOP block stops.  A tuple, so the walk unpacks it in one step.
Block = namedtuple("Block", "start insns kind target fallthrough end problem", defaults=(None,))


class CodeImage(object):
    """Code bytes by address: a Target (live or dump) and/or images placed at bases.

    ``images``: [(base, bytes already in memory layout, or a dbgext.pe.PEImage)]."""

    def __init__(self, target=None, images=()):
        self.target = target
        self.images = []  # (base, size, read(offset, size))
        for base, image in sorted(images, key=lambda entry: entry[0]):
            if isinstance(image, PEImage):
                self.images.append((base, image.size_of_image, image.read_partial))
            else:
                self.images.append((base, len(image), _slicer(image)))

    def read_upto(self, address, size):
        """Up to ``size`` bytes at ``address``, stopping at the first unreadable byte."""
        for base, length, read in self.images:
            if base <= address < base + length:
                return read(address - base, min(size, base + length - address))
        if self.target is None:
            return b""
        try:
            return self.target.read(address, size)
        except UnreadableMemory as error:
            if error.address <= address:
                return b""
            try:
                return self.target.read(address, error.address - address)
            except UnreadableMemory:
                return b""


def _slicer(data):
    return lambda offset, size: data[offset:offset + size]


def read_code_file(path):
    """(code image, {rva: exported name}) of a code image file: a PE file (MZ) as
    the loader maps it (dbgext.pe), anything else as raw bytes already in memory
    layout."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise BadInput("cannot read %s: %s" % (path, error.strerror or error))
    if not data.startswith(b"MZ"):
        return data, {}
    image = PEImage.from_bytes(data, os.path.basename(path))
    return image, dict(image.exports)


class BlockCache(object):
    """Decoded blocks, one dict per execution mode (the key is (address, mode)).

    ``rows``: the same blocks as the walk reads them, plain tuples (start, insns, kind,
    target, fallthrough, end, the Block): Python unpacks a tuple in one step, a
    namedtuple through an iterator (about three times the work)."""

    def __init__(self, code):
        self.code = code
        self.by_mode = {}
        self.rows_by_mode = {}
        self._disassemblers = {}
        self.blocks_built = 0
        self.ends = {}  # address of each block's last instruction -> block kind (for the views)
        self._modes = {}
        self._modes_at = -1
        self._texts = {}

    def blocks(self, mode):
        table = self.by_mode.get(mode)
        if table is None:
            table = self.by_mode[mode] = {}
        return table

    def rows(self, mode):
        table = self.rows_by_mode.get(mode)
        if table is None:
            table = self.rows_by_mode[mode] = {}
        return table

    def _disassembler(self, mode):
        disassembler = self._disassemblers.get(mode)
        if disassembler is None:
            disassembler = self._disassemblers[mode] = Disassembler(mode)
        return disassembler

    def build(self, address, mode):
        block = self._decode(address, mode)
        self.blocks(mode)[address] = block
        self.rows(mode)[address] = block[:6] + (block,)
        self.blocks_built += 1
        if block.insns and block.kind != B_STOP:
            self.ends[block.insns[-1]] = block.kind
        return block

    def instruction_size(self, address, mode):
        """Size of the instruction at ``address``, 0 when it cannot be decoded."""
        insn = self._disassembler(mode).one(self.code.read_upto(address, 15), address)
        return insn[1] if insn is not None else 0

    def disassemble(self, address):
        """``mnemonic operands`` of the instruction at ``address`` in the mode the
        decode walked it in (64-bit when it was not walked)."""
        text = self._texts.get(address)
        if text is not None:
            return text
        if self._modes_at != self.blocks_built:
            self._modes = {insn: mode for mode, table in self.by_mode.items() for block in table.values()
                           for insn in block.insns}
            self._modes_at = self.blocks_built
        mode = self._modes.get(address, MODE_64)
        code = self.code.read_upto(address, 15)
        insn = self._disassembler(mode).one(code, address)
        raw = _raw_branch(code) if mode == MODE_64 and (insn is None or insn[2] == "clac") else None
        if raw is not None:
            text = raw[2]
        elif insn is not None:
            text = ("%s %s" % (insn[2], insn[3])).strip()
        else:
            text = "(undecodable)"
        self._texts[address] = text
        return text

    def _decode(self, start, mode):
        cs = self._disassembler(mode)
        mask = (1 << mode) - 1 if mode != MODE_64 else 0xFFFFFFFFFFFFFFFF
        insns = []
        cursor = start
        while cursor - start < MAX_BLOCK_BYTES:
            chunk = self.code.read_upto(cursor, 256)
            if not chunk:
                return Block(start, tuple(insns), B_STOP, None, cursor, cursor,
                             "code at 0x%x is unreadable" % cursor)
            decoded_to = cursor
            for address, size, mnemonic, operands in cs.decode(chunk, cursor):
                insns.append(address)
                decoded_to = address + size
                kind = _classify(mnemonic, operands)
                if kind is None:
                    if mnemonic == "clac" and mode == MODE_64:
                        raw = _raw_branch(chunk[address - cursor:])
                        if raw is not None:
                            return Block(start, tuple(insns), raw[1], None, decoded_to, address)
                    continue
                target = None
                if kind in (B_COND, B_JUMP, B_CALL):
                    target = int(operands, 16) & mask
                    if kind == B_CALL and target == decoded_to:
                        kind = B_JUMP  # call $+5 reads the IP; it is not a call
                return Block(start, tuple(insns), kind, target, decoded_to, address)
            if decoded_to == cursor:
                raw = _raw_branch(chunk) if mode == MODE_64 else None
                if raw is not None:
                    insns.append(cursor)
                    return Block(start, tuple(insns), raw[1], None, cursor + raw[0], cursor)
                if len(chunk) < 15 and len(self.code.read_upto(cursor, 15)) < 15:
                    return Block(start, tuple(insns), B_STOP, None, cursor, cursor,
                                 "code at 0x%x is unreadable" % (cursor + len(chunk)))
                return Block(start, tuple(insns), B_STOP, None, cursor, cursor,
                             "cannot decode the instruction at 0x%x" % cursor)
            cursor = decoded_to
        return Block(start, tuple(insns), B_STOP, None, cursor, cursor,
                     "no branch within 0x%x bytes from 0x%x" % (MAX_BLOCK_BYTES, start))


# Branches the disassembler does not know, or reads as CLAC: (encoding, size, block
# kind, mnemonic).  JMPABS (APX: REX2 with no payload bits, opcode A1, a 64-bit target)
# takes its TIP as an indirect jump does (libipt does not use the encoded target);
# ERETU, ERETS (FRED) and UIRET return as far returns do.
_RAW_BRANCHES = ((b"\xd5\x00\xa1", 11, B_INDIRECT, "jmpabs"), (b"\xf3\x0f\x01\xca", 4, B_FAR_RET, "eretu"),
                 (b"\xf2\x0f\x01\xca", 4, B_FAR_RET, "erets"), (b"\xf3\x0f\x01\xec", 4, B_FAR_RET, "uiret"))


def _raw_branch(code):
    """(size, block kind, text) of a _RAW_BRANCHES branch at the start of ``code``, or None."""
    for encoding, size, kind, mnemonic in _RAW_BRANCHES:
        if code.startswith(encoding) and len(code) >= size:
            if mnemonic == "jmpabs":
                return size, kind, "jmpabs 0x%x" % int.from_bytes(code[3:size], "little")
            return size, kind, mnemonic
    return None


def _classify(mnemonic, operands):
    """Block kind of a branch instruction, None for everything else."""
    if " " in mnemonic:  # prefixed: "repz ret", "bnd call", "notrack jmp"
        mnemonic = base_mnemonic(mnemonic)
    first = mnemonic[0]
    if first == "j":
        if mnemonic == "jmp":
            return B_JUMP if operands.startswith("0x") else B_INDIRECT
        return B_COND
    if first == "c" and mnemonic == "call":
        if operands.startswith("0x"):
            return B_CALL
        # "call ptr [rax]" (no operand size) is a far call through memory, as "lcall [rax]"
        return B_FAR_CALL if operands.startswith("ptr ") else B_INDIRECT_CALL
    if first == "r" and mnemonic in ("ret", "retq"):
        return B_RET
    if mnemonic in _COND_EXTRA:
        return B_COND
    if mnemonic in _FAR_CALLS:
        return B_FAR_CALL
    if mnemonic == "ljmp":
        return B_INDIRECT
    if mnemonic in _FAR_RETURNS:
        return B_FAR_RET
    return None


def _run_bits(run):
    """F_TNT's bits of a run of TNT-8 and timing packets."""
    if len(run) == 1:
        return _TNT8_TAKEN.get(run[0], b"")
    packets = P.QUIET_RE.sub(b"", run)
    if len(packets) <= 1:
        return _TNT8_TAKEN[packets[0]] if packets else b""
    bits = _RunBits(b"".join([_TNT8_TAKEN[byte] for byte in packets]))
    bits.last_packet = len(_TNT8_TAKEN[packets[-1]])
    return bits


# TNT-8 runs longer than this are not remembered (_flow_items).
TNT_RUN_KEPT = 64


def _mode_item(payload):
    """(F_MODE, execution mode) or (F_AT_IP, transaction state) of a MODE packet's payload."""
    name, fields = P.mode_fields(payload)
    if name == "mode.exec":
        return F_MODE, EXEC_MODES.get(fields["mode"])
    return F_AT_IP, "tsx_abort" if fields["abort"] else "tsx_begin" if fields["intx"] else "tsx_commit"


_MODE_ITEMS = [_mode_item(payload) for payload in range(0x40)]  # the MODE leaves 0 and 1
# Compressed IP packets remembered per value of the IP bits they keep, and TNT-8 runs
# (_flow_items), up to this many in a table: a trace takes the same paths again and again.
TABLE_SIZE = 1 << 16
# _flow_items reads the trace a window at a time with one split() of this regex: each
# match takes up to _SLOTS packets, each captured whole, so reading costs no regex
# match and no match object per packet.  A run of TNT-8 and timing packets (PAD, MTC,
# CYC, TSC: they mean nothing to control flow) is one capture, always all of it (the
# next packet is not part of any run); a byte that is no packet is captured alone and
# ends the match with the rest unread.
#
# A match never backtracks: a packet's first byte names its alternative and its size
# is fixed by its bytes (CYC: up to its first even byte), a PAD run takes all of
# itself (negative lookahead), and the slots after the first are optional, so fewer
# than _SLOTS packets before the end or a bad byte end the match instead of failing
# it (a slot that finds no packet leaves the others none either: they try the same
# bytes).  With nothing after a slot that can fail, the engine never goes back into
# one.  (Slots that all had to match made sre retry every shorter split of a run at
# the end of a buffer: time exponential in a run of zeros.)
#
# A TNT/timing run is at most _RUN_PACKETS packets, greedily (a longer run is several
# items, read one after the other as one): sre keeps state for each repetition of the
# run's group until the match ends, over a kilobyte each in the last slots, so an
# unbounded run of a megabyte took a gigabyte.
_SLOTS = 64
_RUN_PACKETS = 256
_WINDOW = 1 << 20  # bytes per split(), at most about


def _token_regex():
    """The regex, compiled on first use (it takes a quarter of a second on Python 3.8)."""
    if not _TOKENS:
        _TOKENS.append(token_regex(P.ONE_BYTE_PACKETS, P.EXTENDED_PACKETS))
    return _TOKENS[0]


def token_regex(one_byte_packets, extended_packets):
    """_flow_items' regex, from the packet tables."""
    element = b"(?:" + P._byte_class(P._TNT8) + b"|" + P.timing_pattern(one_byte_packets) + b")"
    packet = b"|".join([element + b"{1,%d}" % _RUN_PACKETS]
                       + [P.one_byte_key(row) + row.rest for row in one_byte_packets if row.flow != P.FLOW_TIMING]
                       + [P.extended_pattern(extended_packets)])
    token = b"(" + packet + b")"
    # "(?:token|)", not "token?": the same match, and sre runs it as a plain branch (20% faster).
    return re.compile(token + (b"(?:" + token + b"|)") * (_SLOTS - 1) + b"|(.).*", re.DOTALL)


_TOKENS = []  # _token_regex(), once compiled
_BAD_COLUMN = _SLOTS  # in split()'s rows: a packet per slot, then the bad byte
# What a packet's first byte makes it, for _flow_items: from the packet tables' flow column.
_RUN, _IP0, _IP2, _IP4, _IP6, _IP8, _MODE, _EXTENDED, _TRIG, _UNUSED = range(10)
_IP_OF_SIZE = {1: _IP0, 3: _IP2, 5: _IP4, 7: _IP6, 9: _IP8}  # an IP packet's size: its item
_OF_FLOW = {P.FLOW_TIMING: _RUN, P.FLOW_MODE: _MODE, P.FLOW_TRIG: _TRIG}


def first_byte_table(one_byte_packets):
    """[first byte: what _flow_items makes of the packet] from the packets' flow column."""
    table = [_UNUSED] * 256
    for row in one_byte_packets:
        for opcode in row.opcodes:
            table[opcode] = _IP_OF_SIZE[row.size] if row.flow == P.FLOW_IP else _OF_FLOW[row.flow]
    for opcode in P._TNT8:
        table[opcode] = _RUN
    table[P.EXTENDED_OPCODE] = _EXTENDED
    return table


_FIRST_BYTE = first_byte_table(P.ONE_BYTE_PACKETS)
# Extended opcodes (PTW, EXSTOP) whose IP bit says the next FUP is theirs, not a control
# transfer's: the event they name binds to its IP.  (TRIG's flags byte, bit 7, says the
# same for TRIG, which changes nothing in the flow.)
# CFE types of an instruction that transfers control (IRET, VMENTRY, UIRET, SYSCALL): with
# its IP bit, the FUP after the CFE names that instruction, which runs and takes the TIP
# (or TIP.PGD) that follows as any far transfer does.
_CFE_OF_A_BRANCH = frozenset((2, 7, 13, 15))
# The EVD types (0: PFA, the page fault's CR2; 1: VMXQ, the exit qualification; 2: VMXR,
# the exit reason) each CFE type takes: INTR, VMEXIT, VMEXIT_INTR.  An EVD before another
# CFE is out of context (upstream libipt fails there; the suite's ptet-evd-* tests show
# which pairs).  Other EVD types are not known and taken by any CFE.
_EVD_TYPES = frozenset((0, 1, 2))
_CFE_INTR = 1  # an interrupt delivered: an event without IP where it is read ("event_interrupt")
_EVD_OF_CFE = {1: frozenset((0,)), 8: frozenset((1, 2)), 9: frozenset((1, 2))}
_EVENT_AT_FUP = {opcode: {"ptw": "ptwrite", "exstop": "exstop"}[name] for opcode, (name, _) in P._EXTENDED.items()
                 if name in ("ptw", "exstop") and opcode & 0x80}
# MODE.Exec's IF bit -> the event when it changes; a MODE.Exec + FUP that leaves it as it
# was binds the FUP to no event (_NO_EVENT, an F_AT_IP item's event None), as upstream.
_IF_EVENTS = {4: "interrupts_enabled", 0: "interrupts_disabled"}
_NO_EVENT = ""
_IF_EVENT_KINDS = frozenset(_IF_EVENTS.values())
_EVENTS_OF_PACKETS = frozenset(_EVENT_AT_FUP.values())  # exstop, ptwrite
# The same with the IP bit clear: an event at no IP (F_EVENT).
_EVENT_WITHOUT_IP = {opcode: {"ptw": "ptwrite", "exstop": "exstop"}[name] for opcode, (name, _) in P._EXTENDED.items()
                     if name in ("ptw", "exstop") and not opcode & 0x80}


class FlowResult(object):
    """What one decode found.

    ``instructions``: the executed instruction addresses, the first ``max_insns``
    of them when the caller capped the listing (``truncated`` then says so);
    ``instruction_count``: all of them, always decoded to the end of the trace;
    ``events``: (instruction index, kind, trace offset, IP) of enabled, disabled,
    sync, overflow, resumed, interrupt, gap, resync and transaction events, in
    order, the first MAX_EVENTS of them (``event_count`` counts them all, and
    ``event_kinds`` by kind; every one goes to the ``listeners``); ``problems``: a ProblemLog (trace offsets are
    offsets in the decoded data)."""

    __slots__ = ("instructions", "instruction_count", "truncated", "problems", "events", "event_count",
                 "event_kinds", "listeners", "blocks_built")

    def __init__(self):
        self.instructions = []
        self.instruction_count = 0
        self.truncated = False
        self.problems = ProblemLog()
        self.events = []
        self.event_count = 0
        self.event_kinds = {}  # kind: how many, of every event
        self.listeners = []
        self.blocks_built = 0

    def add_event(self, event):
        """One event (add_events)."""
        self.add_events((event,))

    def add_events(self, events):
        """Count ``events`` (in order), keep them while fewer than MAX_EVENTS are kept,
        and hand each to the listeners."""
        self.event_count += len(events)
        kinds = self.event_kinds
        for event in events:
            kinds[event[1]] = kinds.get(event[1], 0) + 1
        room = MAX_EVENTS - len(self.events)
        if room > 0:
            self.events.extend(events[:room])
        for listener in self.listeners:
            for event in events:
                listener(event)


class FlowDecoder(object):
    """Walks the code along a trace.  ``code`` is a :class:`CodeImage`.

    ``suspicious``: {address: name} of functions a real trace should not enter
    (nt!KeBugCheckEx...); entering one adds a warning.  ``resync_on_error`` (ptxed's
    ``--resync-on-error``): after an error decoding resumes at the next packet that
    names an IP (TIP, TIP.PGE, FUP + TIP, an OVF's resume point), not at the next PSB.
    ``report_iflags`` (ptxed's ``--event:iflags``): the interrupt flag tracing is enabled
    with (the MODE.Exec before a TIP.PGE) is an event when no MODE.Exec said it before;
    off by default: on a trace without event tracing the IF bit is always clear, and
    that would be an ``interrupts_disabled`` at the first TIP.PGE after every PSB+ taken
    while tracing was off."""

    def __init__(self, code, suspicious=None, cache=None, errata=frozenset(), resync_on_error=False,
                 report_iflags=False):
        self.cache = cache or BlockCache(code)
        self.suspicious = dict(suspicious or {})
        self.errata = frozenset(errata)
        self.resync_on_error = resync_on_error
        self.report_iflags = report_iflags

    def decode(self, data, start=0, end=None, max_insns=None, sink=None, progress=None, result=None):
        """Decode ``data[start:end]`` to the end.  Committed instructions go, in chunks,
        to ``sink(chunk)`` when given; the first ``max_insns`` (all when None) are also
        kept in ``result.instructions``.  ``progress(trace offset, instructions)`` is
        called after each chunk.  ``result``: a FlowResult to fill (a view listening to
        its events holds it before the decode starts)."""
        result = result if result is not None else FlowResult()
        listing = result.instructions
        limit = max_insns

        def keep(chunk):
            room = len(chunk) if limit is None else limit - len(listing)
            if room > 0:
                listing.extend(chunk[:room] if room < len(chunk) else chunk)
            if room < len(chunk):
                result.truncated = True
            if sink is not None:
                sink(chunk)

        data = P.packet_errata(data, start, end, self.errata)[0]
        Walk(self, result, _flow_items(data, start, end, self.report_iflags), keep, progress, data).run()
        result.blocks_built = self.cache.blocks_built
        return result


def _ip_table(tables, kept_bits):
    """_flow_items' table of the IP packets that keep ``kept_bits`` (a table dropped when
    there are too many is made again: the packets in it are only remembered)."""
    table = tables.get(kept_bits)
    if table is None:
        if len(tables) >= TABLE_SIZE:
            tables.clear()
        table = tables[kept_bits] = {}
    return table


def _flow_items(data, start, end, report_iflags=False):
    """The items of ``data[start:end]`` from its first PSB on, then F_END forever.

    The packets (see _token_regex), reduced to what control flow keeps of them: TNT-8
    runs become F_TNT items (timing packets inside them are left out); a FUP that
    belongs to a TRIG or a CFE of a branching instruction (not to a control transfer) is
    left out; MODE.TSX, MODE.Exec outside PSB+, EXSTOP or PTW with its IP bit and the
    FUP that binds it become one F_AT_IP item (value: the IP and the event) and, as in
    libipt, the FUP of an abort also stays, as an asynchronous transfer to the TIP that
    follows; in PSB+ MODE.TSX is status, and the FUP is PSB+'s.  A FUP with its IP
    right before a TIP with its IP (an interrupt) is one F_ASYNC item.  A packet that
    does not decode is an F_ERROR item, and the items go on from the next PSB.
    ``report_iflags``: a MODE.Exec before a TIP.PGE whose IF bit differs from the last
    MODE.Exec's (or no MODE.Exec came before) is an F_EVENT after the TIP.PGE."""
    end = len(data) if end is None else min(end, len(data))
    position = data.find(P.PSB, start, end)
    offset = start
    if position < 0:
        yield F_ERROR, start, "no PSB in the %d bytes from offset %d" % (max(end - start, 0), start)
    last_ip = 0
    skip_fup = False     # the next FUP belongs to a TRIG or a CFE of a branching instruction
    bound = None         # the event the next FUP binds (MODE.TSX or MODE.Exec outside PSB+, EXSTOP, PTW)
    fup_bound = False    # skip_fup or bound: the next FUP is not a plain one
    in_psb = False
    interrupted = None   # a FUP item whose packet a TIP with its IP follows (one F_ASYNC item with it)
    evd_types = frozenset()  # the types of the EVDs since the last CFE (that it must take)
    exec_mode = None     # the last MODE.Exec's
    interrupt_flag = None  # the last MODE.Exec's IF bit (4 or 0)
    last_psb = position - 1
    # {the IP bits a 2-byte (4-byte) IP packet keeps: {packet: (kind, IP[, the 2-byte table of that IP])}}
    ip2_tables, ip4_tables = {}, {}
    ip2_table, ip4_table = _ip_table(ip2_tables, 0), _ip_table(ip4_tables, 0)
    tnt_runs = {}  # TNT-8 run: its bits
    tokens = _token_regex()
    split, first_byte, bad_column, stride = tokens.split, _FIRST_BYTE, _BAD_COLUMN, tokens.groups + 1
    ip_kind_of_opcode, decompress_ip = P.IP_KIND_OF_OPCODE, P.decompress_ip
    mode_items, table_size = _MODE_ITEMS, TABLE_SIZE
    f_tnt, f_fup = F_TNT, F_FUP
    while position >= 0:
        stop = data.find(P.PSB, position + _WINDOW, end)
        if stop < 0:
            stop = end
        pieces = split(data[position:stop])
        bad = pieces[1 + bad_column::stride]
        if bad.count(None) != len(bad):  # only the packets before the bad byte
            pieces = pieces[:1 + (len(bad) - 1) * stride + bad_column]
        next_offset = position
        for packet in filter(None, pieces):
            offset = next_offset
            next_offset += len(packet)
            what = first_byte[packet[0]]
            # An IP packet: the 2- and 4-byte ones come from tables of the packets seen
            # since the bits they keep last changed.
            if what == _IP2:  # first: the most frequent packets are 2-byte TIPs, then TNT
                known = ip2_table.get(packet)
                if known is None:
                    if len(ip2_table) >= table_size:
                        ip2_table.clear()
                    known = ip2_table[packet] = (ip_kind_of_opcode[packet[0]],
                                                 decompress_ip(1, int.from_bytes(packet[1:], "little"), last_ip))
                kind, ip = known
                last_ip = ip
            elif what == _RUN:
                bits = tnt_runs.get(packet)
                if bits is None:
                    bits = _run_bits(packet)
                    if len(packet) <= TNT_RUN_KEPT:
                        if len(tnt_runs) >= table_size:
                            tnt_runs.clear()
                        tnt_runs[packet] = bits
                if bits:
                    yield f_tnt, offset, bits
                continue
            elif what == _IP4:
                known = ip4_table.get(packet)
                if known is None:
                    if len(ip4_table) >= table_size:
                        ip4_table.clear()
                    ip = decompress_ip(2, int.from_bytes(packet[1:], "little"), last_ip)
                    known = ip4_table[packet] = ip_kind_of_opcode[packet[0]], ip, _ip_table(ip2_tables, ip >> 16)
                kind, ip, ip2_table = known
                last_ip = ip
            elif what == _IP0:
                kind, ip = ip_kind_of_opcode[packet[0]], None
            elif what == _IP6 or what == _IP8:
                ip = decompress_ip(packet[0] >> 5, int.from_bytes(packet[1:], "little"), last_ip)
                kind, last_ip = ip_kind_of_opcode[packet[0]], ip
                ip2_table, ip4_table = _ip_table(ip2_tables, ip >> 16), _ip_table(ip4_tables, ip >> 32)
            else:
                if what == _MODE:
                    kind, value = mode_items[packet[1]]
                    if kind == F_MODE:
                        # Outside PSB+ a MODE.Exec that restates the mode with a FUP right
                        # after it (an interrupt flag change) is no F_MODE item: it would
                        # stand between the walk and the FUP or TIP it waits for.  (Followed by
                        # anything else, it binds to the TIP that comes: libipt fails on TNT.)
                        fup_next = next_offset < stop and data[next_offset] & 0x1F == 0x1D
                        if in_psb or value != exec_mode or not fup_next:
                            yield kind, offset, value
                        exec_mode = value
                        if not in_psb:  # a FUP right after it: where the interrupt flag changed
                            bound = _IF_EVENTS[packet[1] & 4] if packet[1] & 4 != interrupt_flag else _NO_EVENT
                            fup_bound = True
                        interrupt_flag = packet[1] & 4
                    elif not in_psb:
                        bound = value
                        fup_bound = True
                elif what == _EXTENDED:
                    opcode = packet[1]
                    if opcode == 0x82:  # PSB
                        last_ip = 0
                        last_psb = offset
                        ip2_table, ip4_table = _ip_table(ip2_tables, 0), _ip_table(ip4_tables, 0)
                        in_psb = True
                        evd_types = frozenset()
                        yield F_PSB, offset, None
                    elif opcode == 0x23:  # PSBEND
                        in_psb = False
                        yield F_PSBEND, offset, None
                    elif opcode == 0xA3:  # TNT-64
                        payload = int.from_bytes(packet[2:8], "little")
                        yield f_tnt, offset, _taken(P._tnt_bits(payload, payload.bit_length() - 1))
                    elif opcode == 0xF3:  # OVF
                        last_ip = 0  # as libipt: the IP after an overflow does not build on older IPs
                        ip2_table, ip4_table = _ip_table(ip2_tables, 0), _ip_table(ip4_tables, 0)
                        if bound in _EVENTS_OF_PACKETS:  # its FUP was lost: an event without IP
                            yield F_EVENT, offset, bound
                            bound, fup_bound = None, skip_fup
                        yield F_OVF, offset, None
                    elif opcode in _EVENT_AT_FUP:
                        bound = _EVENT_AT_FUP[opcode]
                        fup_bound = True
                    elif opcode == 0x43 and not in_psb:  # PIP (in PSB+ it only restates CR3)
                        yield F_PIP, offset, None
                    elif opcode in _EVENT_WITHOUT_IP:
                        yield F_EVENT, offset, _EVENT_WITHOUT_IP[opcode]
                    elif opcode == 0x13:  # CFE: the EVDs before it are its data
                        cfe_type = packet[2] & 0x1F
                        if evd_types and not evd_types <= _EVD_OF_CFE.get(cfe_type, frozenset()):
                            yield F_BAD_CONTEXT, offset, "unexpected packet context: EVD of type %s before a CFE " \
                                "of type %d" % (", ".join(map(str, sorted(evd_types))), cfe_type)
                        elif cfe_type == _CFE_INTR:
                            yield F_EVENT, offset, "event_interrupt"
                        evd_types = frozenset()
                        if packet[2] & 0x80 and cfe_type in _CFE_OF_A_BRANCH:
                            skip_fup = fup_bound = True
                    elif opcode == 0x53 and packet[2] & 0x3F in _EVD_TYPES:  # EVD: data of the CFE to come
                        evd_types |= {packet[2] & 0x3F}
                elif what == _TRIG and packet[1] & 0x80:
                    skip_fup = fup_bound = True
                continue
            if not fup_bound:
                if interrupted is not None:  # the TIP after it
                    yield F_ASYNC, interrupted[1], (interrupted, (kind, offset, ip))
                    interrupted = None
                elif kind == f_fup and ip is not None and next_offset < stop \
                        and ip_kind_of_opcode.get(data[next_offset]) == F_TIP and data[next_offset] >> 5:
                    interrupted = kind, offset, ip  # a TIP next, its IP bits not 0: its IP is not suppressed
                else:
                    yield kind, offset, ip
            elif kind != f_fup:
                # Another IP packet first: the MODE.Exec or MODE.TSX went with it (a far
                # transfer, tracing enabled in a transaction), and no FUP is theirs.  The
                # transaction state tracing is enabled in is an event without IP (ptxed's).
                if kind == F_PGE and bound in _TSX_STATES:
                    yield F_EVENT, offset, bound
                enabled_with = bound if report_iflags and kind == F_PGE and bound in _IF_EVENT_KINDS else None
                skip_fup = fup_bound = False
                bound = None
                yield kind, offset, ip
                if enabled_with is not None:  # the interrupt flag tracing is enabled with (ptxed's --event:iflags)
                    yield F_EVENT, offset, enabled_with
            elif skip_fup:
                skip_fup = False
                fup_bound = bound is not None
            else:
                state, bound = bound, None
                fup_bound = False
                yield F_AT_IP, offset, (ip, state or None)
                if state == "tsx_abort":
                    yield kind, offset, ip
        if next_offset == stop:
            position = stop if stop < end else -1
        elif next_offset + 16 > stop and stop < end:
            position = next_offset  # a packet cut by the window: read it in the next one
        else:
            offset = next_offset
            if interrupted is not None:  # the TIP after it does not decode
                yield interrupted
                interrupted = None
            yield F_ERROR, offset, P._error_message(data, offset, end)
            # As the packet decoder (packets.tokens): at the PSB that holds the bad byte, or the next.
            position = data.find(P.PSB, max(last_psb + 1, offset - len(P.PSB) + 1), end)
    while True:
        yield F_END, offset, None


def decode_flow(data, code, start=0, end=None, max_insns=None, suspicious=None, errata=frozenset(),
                resync_on_error=False, report_iflags=False):
    """Convenience: decode ``data`` over ``code`` (a CodeImage)."""
    return FlowDecoder(code, suspicious, errata=errata, resync_on_error=resync_on_error,
                       report_iflags=report_iflags).decode(data, start, end, max_insns)
