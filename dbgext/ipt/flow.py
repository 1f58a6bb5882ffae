"""Layer 3: reconstruct the executed instructions from packets plus code bytes.

The walk works on basic blocks, not single instructions: a block (straight-line
instructions up to and including one branch) is disassembled once with capstone and
cached per execution mode, so the steady state is "look up block, append its
addresses, take one TNT bit or TIP for its branch".

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
from bisect import bisect_left
from collections import namedtuple

from ..disasm import Disassembler, base_mnemonic
from ..errors import BadInput, UnreadableMemory
from ..pe import PEImage
from ..problems import ProblemLog
from . import packets as P

MODE_16, MODE_32, MODE_64 = 16, 32, 64
EXEC_MODES = {"16bit": MODE_16, "32bit": MODE_32, "64bit": MODE_64}
RETSTACK_DEPTH = 64

# Block kinds: how the block's last instruction decides where execution goes next.
B_COND = 0       # jcc/loop/jrcxz: one TNT bit
B_JUMP = 1       # direct jmp (and call $+5): nothing from the trace
B_CALL = 2       # direct call: push the return address
B_RET = 3        # near ret: compressed (TNT bit) or TIP
B_INDIRECT_CALL = 4
B_INDIRECT = 5   # indirect jmp, far jmp: a TIP
B_FAR_CALL = 6   # syscall, sysenter, int n, far call, vmcall: a TIP
B_FAR_RET = 7    # iret, sysret, sysexit, far ret, vmlaunch/vmresume: a TIP
B_STOP = 8       # undecodable or unreadable code at block.end

_FAR_CALLS = {"syscall", "sysenter", "int", "int1", "int3", "into", "lcall", "vmcall", "vmmcall"}
_FAR_RETURNS = {"iret", "iretd", "iretq", "retf", "retfq", "sysret", "sysretq", "sysexit", "sysexitq",
                "vmlaunch", "vmresume"}
_COND_EXTRA = {"loop", "loope", "loopne", "jrcxz", "jecxz", "jcxz"}

# Erratum BDM64: how far libipt looks for a transaction abort's IP along straight-line code.
BDM64_MAX_STEPS = 0x100

MAX_BLOCK_BYTES = 0x1000
# Committed instructions are handed on in chunks of at least this many.
FLUSH_SIZE = 1 << 16
# Events kept in a result (a trace can hold millions of interrupts); the rest are counted.
MAX_EVENTS = 100000
# Blocks walked without consuming any trace before we call it a runaway path.
MAX_BLOCKS_WITHOUT_TRACE = 100000


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


# -- trace items the walker consumes --------------------------------------------------

# _flow_items turns the packets into what control flow needs, (kind, offset, value):
# IP packets (value: the IP, None when suppressed), TNT bits, execution modes, MODE.TSX
# with its FUP, PSB, PSBEND, OVF and errors; timing and power packets are left out.
F_TIP, F_PGE, F_PGD, F_FUP = P.K_TIP, P.K_PGE, P.K_PGD, P.K_FUP
F_PSB, F_PSBEND, F_OVF, F_ERROR = P.K_PSB, P.K_PSBEND, P.K_OVF, P.K_ERROR
# F_TNT's value: the bits, oldest first, a byte each (1: taken), so the walk tests a bit as it is.
# F_AT_IP: an event that a FUP binds to an IP (MODE.TSX's, MODE.Exec's, EXSTOP's, PTW's);
# value: (the FUP's IP, the event: tsx_begin, tsx_commit, tsx_abort, interrupts_enabled,
# interrupts_disabled, exstop or ptwrite).
F_TNT, F_MODE, F_AT_IP = 20, 21, 22  # value: bits; mode (16/32/64 or None); (IP, event)
F_END = 23  # no more packets (offset: the last packet's); _Walk.item() hands out None instead
# F_EVENT: an event without an IP (EXSTOP or PTW with the IP bit clear, MODE.TSX before a
# TIP.PGE, a CFE of an interrupt); value: its kind.
# It binds to no instruction: the walk records it where it reads it (walk_item), on or off.
F_EVENT = 24
F_BAD_CONTEXT = 25  # a packet where it cannot be (an EVD before a CFE that does not take it); value: why
F_PIP = 26  # a PIP outside PSB+ (CR3 changed: libipt's paging event; _Walk.read_pip); value: None
ITEM_NAMES = {F_TNT: "tnt", F_TIP: "tip", F_PGE: "tip.pge", F_PGD: "tip.pgd", F_FUP: "fup", F_MODE: "mode.exec",
              F_PSB: "psb", F_PSBEND: "psbend", F_OVF: "ovf", F_ERROR: "error", F_AT_IP: "event",
              F_EVENT: "event", F_BAD_CONTEXT: "error", F_PIP: "pip"}
# The items _Walk.item() does more with than hand them on (walk_item).
_WALK_ITEMS = frozenset((F_PSB, F_ERROR, F_END, F_EVENT, F_BAD_CONTEXT, F_PIP))
_TAKEN = bytes.maketrans(b"TN", b"\x01\x00")


def _taken(bits):
    """F_TNT's bits of a "TNNT..." string (packets.py's)."""
    return bits.encode("ascii").translate(_TAKEN)


_TNT8_TAKEN = {byte: _taken(bits) for byte, bits in P.TNT8_BITS.items()}


class _RunBits(bytes):
    """The bits of a run of TNT-8 packets, and how many of them its last packet holds
    (``last_packet``): libipt's query decoder holds one packet's bits at a time."""


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
    quiet = b"|".join(P.one_byte_key(row) + row.rest for row in one_byte_packets if row.flow == P.FLOW_TIMING)
    element = b"(?:" + P._byte_class(P._TNT8) + b"|" + quiet + b")"
    packet = b"|".join([element + b"{1,%d}" % _RUN_PACKETS]
                       + [P.one_byte_key(row) + row.rest for row in one_byte_packets if row.flow != P.FLOW_TIMING]
                       + [P._class_of([P.EXTENDED_OPCODE]) + b"(?:"
                          + b"|".join(P._class_of(row.seconds) + row.rest for row in extended_packets) + b")"])
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
_TSX_STATES = frozenset(("tsx_begin", "tsx_commit", "tsx_abort"))
# MODE.Exec's IF bit -> the event when it changes; a MODE.Exec + FUP that leaves it as it
# was binds the FUP to no event (_NO_EVENT, an F_AT_IP item's event None), as upstream.
_IF_EVENTS = {4: "interrupts_enabled", 0: "interrupts_disabled"}
_NO_EVENT = ""
_IF_EVENT_KINDS = frozenset(_IF_EVENTS.values())
_EVENTS_OF_PACKETS = frozenset(_EVENT_AT_FUP.values())  # exstop, ptwrite
# The same with the IP bit clear: an event at no IP (F_EVENT).
_EVENT_WITHOUT_IP = {opcode: {"ptw": "ptwrite", "exstop": "exstop"}[name] for opcode, (name, _) in P._EXTENDED.items()
                     if name in ("ptw", "exstop") and not opcode & 0x80}
# skd010_resume: the overflow resolved with tracing off after all.
_STAYS_OFF = -1
# IPBytes of a compressed IP -> the bits its payload gives (the rest comes from the last IP).
_IP_BYTES_KEPT = {1: 0xFFFF, 2: 0xFFFFFFFF, 4: 0xFFFFFFFFFFFF}


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
        self.event_count += 1
        self.event_kinds[event[1]] = self.event_kinds.get(event[1], 0) + 1
        if len(self.events) < MAX_EVENTS:
            self.events.append(event)
        for listener in self.listeners:
            listener(event)


class _Resync(Exception):
    """Raised inside the walk to abandon the current PSB segment after an error."""


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
        _Walk(self, result, _flow_items(data, start, end, self.report_iflags), keep, progress, data).run()
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
    follows; in PSB+ MODE.TSX is status, and the FUP is PSB+'s.  A packet that does
    not decode is an F_ERROR item, and the items go on from the next PSB.
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
            yield F_ERROR, offset, P._error_message(data, offset, end)
            # As the packet decoder (packets.tokens): at the PSB that holds the bad byte, or the next.
            position = data.find(P.PSB, max(last_psb + 1, offset - len(P.PSB) + 1), end)
    while True:
        yield F_END, offset, None


class _Walk(object):
    """The state of one decode: trace position, IP, mode, TNT bits, return stack."""

    # Slots: the walk reads and writes its state once per packet, and on 3.8 a slot
    # is cheaper to reach than an instance dict entry.
    __slots__ = ("cache", "suspicious", "errata", "resync_on_error", "result", "problems", "out", "flushed",
                 "sink", "progress", "next_trace_item", "data", "pushed", "in_status", "mode", "retstack", "bits",
                 "bit_index", "lookahead", "ended", "committed", "resumed_at", "last_offset", "warned", "walking", "synced",
                 "off_ip", "psb_mode", "bdm64_checked", "waiting_fups", "held", "held_after",
                 "resync_past_psb", "pips", "paging_kept", "async_pips", "fup_in_flight")

    def __init__(self, decoder, result, items, sink, progress=None, data=b""):
        self.cache = decoder.cache
        self.suspicious = decoder.suspicious
        self.errata = decoder.errata
        self.resync_on_error = decoder.resync_on_error
        self.result = result
        self.problems = result.problems
        self.out = []            # instructions walked and not yet handed to the sink
        self.flushed = 0         # instructions handed to the sink before out[0]
        self.sink = sink
        self.progress = progress
        self.next_trace_item = items.__next__  # _flow_items: the items read on (F_END at the end)
        self.data = data         # the trace the items come from (for errata that re-read a packet)
        self.pushed = []         # items to hand out again before reading on (last first): item(), items_ahead()
        self.in_status = False   # reading a PSB+ as status (skip_status_psb)
        self.mode = MODE_64
        self.retstack = []
        self.bits = b""
        self.bit_index = 0
        self.lookahead = None    # one item read ahead (kind, offset, value) or None at the end
        self.ended = False
        self.committed = 0       # out[:committed] are confirmed by consumed trace
        self.resumed_at = -1     # len(out) when an event last moved the IP (enable, FUP, OVF)
        self.last_offset = 0
        self.warned = set()
        self.walking = False     # inside walk(): PSB+ is then status only
        self.synced = False      # a PSB+ was read since decoding (re)started: tracing off is then "disabled"
        self.off_ip = 0          # where libipt's decoder stands while tracing is off (fup_while_disabled)
        self.psb_mode = False    # the last PSB+ read held a MODE.Exec
        self.bdm64_checked = None  # the MODE.TSX abort whose IP was found on the straight-line path
        self.waiting_fups = []   # FUPs followed by TNT: each binds to a TIP after them (pending_event)
        self.held = None         # a FUP libipt holds with the items up to its TIP (held_after) until its IP
        self.held_after = None
        self.resync_past_psb = False  # after this error, libipt resyncs past the next PSB (psb_follows)
        self.pips = []           # PIPs read while walking and not bound yet: (offset, where binding starts)
        self.paging_kept = 0     # the instructions up to the last one a PIP bound to stay (absolute count)
        self.async_pips = []     # PIPs that go with the transfer of the FUP before them (their offsets)
        self.fup_in_flight = False  # take_async reads what follows a FUP

    # -- items --------------------------------------------------------------------

    def item(self):
        """The next item (see _flow_items), or None at the end.

        A packet that does not decode is reported and, while walking, abandons the
        walk (_Resync); a PSB+ while walking is read as status (skip_status_psb).
        walk() has this inline."""
        if self.pushed:
            return self.pushed.pop()
        item = self.next_trace_item()
        self.last_offset = item[1]
        if item[0] in _WALK_ITEMS:
            return self.walk_item(item)
        return item

    def walk_item(self, item):
        """item() for the items of _WALK_ITEMS, and what it reads on from them."""
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
                    raise _Resync()
            else:
                return item
            item = self.next_trace_item()
            self.last_offset = item[1]

    def next_item(self):
        item = self.lookahead
        if item is not None:
            self.lookahead = None
            return item
        return self.item()

    def peek(self):
        if self.lookahead is None and not self.ended:
            self.lookahead = self.item()
        return self.lookahead

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

    def ip_from_zero(self, item):
        """``item`` (an IP packet) with its IP built on no earlier IP, as libipt decodes the
        first IP packet after a PSB or OVF when an erratum workaround skipped the FUP
        before it (the tokenizer built it on that FUP's IP)."""
        kind, offset, ip = item
        ipbytes = self.data[offset] >> 5
        if ip is not None and ipbytes in _IP_BYTES_KEPT:
            ip &= _IP_BYTES_KEPT[ipbytes]
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

    def event(self, kind, offset, ip):
        """Record an event before the next instruction: (instruction index, kind, trace offset, IP).
        The PIPs bound before it come first; those that go with a transfer follow it."""
        if self.pips:
            self.bind_pips()
        self.result.add_event((self.flushed + len(self.out), kind, offset, ip))
        if self.async_pips and (kind == "interrupt" or kind == "disabled"):
            for pip_offset in self.async_pips:
                self.result.add_event((self.flushed + len(self.out), "paging", pip_offset, None))
            self.async_pips = []

    # -- paging (PIP) ---------------------------------------------------------------

    def read_pip(self, offset):
        """A PIP outside PSB+, libipt's paging event.  While tracing is off it is an event
        where it is read; after a FUP whose transfer is due it goes with that transfer
        (after its ``interrupt`` or ``disabled``); else it binds to the next MOV CR3, far
        branch or VM entry from the last trace data on (bind_pips)."""
        if not self.walking:
            self.event("paging", offset, None)
        elif self.fup_in_flight or self.held is not None or (self.lookahead is not None
                                                             and self.lookahead[0] == F_FUP):
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
            self.result.add_event((self.paging_kept, "paging", offset, None))
            if self.pips:
                self.pips[0] = (self.pips[0][0], max(self.pips[0][1], self.paging_kept))

    def flush(self):
        """Hand the committed instructions to the sink (in chunks of FLUSH_SIZE or more,
        and at the end), so a decode of any size holds one chunk at a time."""
        if self.pips:
            self.bind_pips()
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
        self.bits = b""
        self.bit_index = 0
        self.retstack = []
        self.waiting_fups = []
        self.held = self.held_after = None
        self.pips, self.async_pips = [], []

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

    def error(self, offset, message, failed_at=None, decoded=True):
        """Report and abandon this PSB segment.  Like ptxed, the instructions walked so far
        stay, and so does the instruction that could not proceed (``failed_at``) when
        libipt had decoded it (``decoded``: the query for its branch failed); where libipt
        fails before it decodes that instruction (reading ahead), it is left out."""
        self.problems.add("ipt_flow_error", failed_at, message, offset=offset)
        if not decoded and failed_at is not None and self.out and self.out[-1] == failed_at:
            self.out.pop()
        raise _Resync()

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
                following = self.peek_past_modes()
                if following is not None and following[0] == F_TIP and following[2] is not None:
                    self.lookahead = None
                    self.event("interrupt", following[1], value)
                    return following[2]
                if following is not None and following[0] == F_PGD:
                    self.lookahead = None
                    self.event("disabled", following[1], value)
                    return None
                return value

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

    # -- driver -------------------------------------------------------------------

    def run(self):
        resume = None  # where decoding goes on after an error (resync_on_error)
        while not self.ended or self.lookahead is not None:
            try:
                ip, resume = resume if resume is not None else self.await_enable(), None
                if ip is None:
                    break
                self.walking = True
                self.walk(ip)
            except _Resync:
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
            elif kind == F_AT_IP and (value[1] in _EVENTS_OF_PACKETS or value[1] in _IF_EVENT_KINDS):
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
        ahead = self.items_ahead(lambda item: item[0] != F_MODE)
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
                return None if resumed == _STAYS_OFF else resumed
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
        _STAYS_OFF when tracing is off past the TIP.PGD, None when the erratum does not
        apply."""
        ahead = [self.lookahead]
        if ahead[0][0] == F_MODE:
            ahead += self.items_ahead(lambda item: item[0] != F_MODE)
        for index, (kind, offset, value) in enumerate(ahead):
            if kind == F_MODE:
                continue
            if kind in (F_PGD, F_TIP, F_FUP, F_AT_IP, F_PSB):
                self.event("overflow", overflow_offset, None)
            if kind in (F_PGD, F_TIP):
                self.drop_items(index + 1)
                if kind == F_PGD:
                    return _STAYS_OFF
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
                return _STAYS_OFF
            return None
        return None

    def drop_items(self, count):
        """Drop the lookahead and the ``count - 1`` items after it (put back by items_ahead):
        libipt skips those packets and decodes on after them."""
        if count == 0:
            return
        self.lookahead = None
        if count > 1:
            del self.pushed[len(self.pushed) - (count - 1):]

    def refill(self):
        """Make TNT bits available, or leave the next non-TNT item in lookahead."""
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

    def peek_past_modes(self):
        """The next item that is not a MODE.Exec, applying the modes passed over."""
        item = self.peek()
        while item is not None and item[0] == F_MODE:
            self.lookahead = None
            if item[2] is not None:
                self.mode = item[2]
            item = self.peek()
        return item

    def take_ip(self, address, wanted):
        """Consume the TIP an indirect transfer at ``address`` needs: returns the new IP
        or None when tracing stops there (TIP.PGD or the end of the trace)."""
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
            if first != 0x02 and len(item[2]) > len(_TNT8_TAKEN.get(first, b"")):
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

    # -- the walk -----------------------------------------------------------------

    def walk(self, ip, *, len=len, bisect_left=bisect_left, B_COND=B_COND, B_JUMP=B_JUMP, B_CALL=B_CALL,
             B_RET=B_RET, B_INDIRECT_CALL=B_INDIRECT_CALL, B_STOP=B_STOP, F_TIP=F_TIP, F_TNT=F_TNT, F_FUP=F_FUP,
             WALK_ITEMS=_WALK_ITEMS, BINDS_NOTHING=frozenset((F_TIP, F_TNT)),
             FLUSH_SIZE=FLUSH_SIZE, RETSTACK_DEPTH=RETSTACK_DEPTH, MAX_BLOCKS_WITHOUT_TRACE=MAX_BLOCKS_WITHOUT_TRACE):
        """Follow the code from ``ip`` until the trace ends, tracing stops, or an error.

        The hot loop keeps the TNT bits, their index and the committed length in
        locals; ``save()`` hands them to the helpers that need them.  The common
        steps run inline (a TNT or TIP already read ahead, a next item that binds
        no event): on Python 3.8 every call and attribute lookup counts.  For the
        same reason the globals the loop reads are keyword-only defaults (locals):
        3.8 caches global lookups only for functions called often, not for one
        frame that loops for a whole trace."""
        out = self.out
        cache = self.cache
        retstack = self.retstack
        suspicious = self.suspicious
        extend = out.extend
        next_item = self.item
        next_trace_item = self.next_trace_item
        pushed = self.pushed
        bits, bi = self.bits, self.bit_index
        nbits = len(bits)
        self.committed = self.resumed_at = len(out)
        async_ip, disable_target = self.pending_event()
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
                # What the next item binds now (pending_event), inline for the items that
                # bind nothing (TIP, TNT, the end) while no FUP is held or waiting.
                # A FUP directly followed by a TIP (an interrupt) does not wait: it binds
                # at its IP (the TIP is put back for take_async).
                bits_used_up = False
                if self.held is None and not self.waiting_fups:
                    item = self.lookahead
                    if item is None:  # peek(), inline
                        if not pushed:
                            # item(), inline; past the end that is F_END again (self.ended stays as it is)
                            item = next_trace_item()
                            self.last_offset = item[1]
                            if item[0] in WALK_ITEMS:
                                self.committed = committed
                                item = self.walk_item(item)
                        elif not self.ended:
                            item = pushed.pop()
                        self.lookahead = item
                    if item is None or item[0] in BINDS_NOTHING:
                        async_ip, disable_target = None, -1
                    else:
                        following = None
                        if item[0] == F_FUP and bi >= nbits:
                            self.committed = committed
                            following = next_item()
                            if following is not None:
                                pushed.append(following)
                        if following is not None and following[0] == F_TIP:
                            async_ip, disable_target = item[2], -1
                        else:
                            save()
                            async_ip, disable_target = self.pending_event()
                else:
                    save()
                    async_ip, disable_target = self.pending_event()
                if self.mode != mode:
                    mode = self.mode
                    rows = cache.rows(mode)
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
                    item = self.lookahead
                    if self.held is None and item[0] == F_FUP and pushed and pushed[-1][0] == F_TIP \
                            and pushed[-1][2] is not None:
                        # FUP + TIP, as take_async takes them: an interrupt.
                        self.lookahead = None
                        tip = pushed.pop()
                        committed = self.committed = self.resumed_at = len(out)
                        self.event("interrupt", tip[1], async_ip)
                        ip = tip[2]
                        bits_used_up = True
                        idle_blocks = 0
                        continue
                    save()
                    ip = self.take_async(async_ip)
                    if ip is None:
                        return
                    retstack = self.retstack
                    bits, bi, committed = self.bits, self.bit_index, self.committed
                    nbits = len(bits)
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
                    if len(retstack) > RETSTACK_DEPTH:
                        del retstack[0]
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
                        if len(retstack) > RETSTACK_DEPTH:
                            del retstack[0]
                    committed = len(out)
                    idle_blocks = 0
                    if bi < nbits:
                        self.lookahead = None
                        async_ip, disable_target = None, -1
                    elif pushed or self.held is not None or self.waiting_fups:
                        self.lookahead = None
                        bits_used_up = True
                    else:
                        # The bits are used up: the top of the loop, inline for the TIP or
                        # TNT that usually comes next (it binds nothing).
                        item = next_trace_item()
                        self.last_offset = item[1]
                        if item[0] in BINDS_NOTHING:
                            async_ip, disable_target = None, -1
                        else:
                            if item[0] in WALK_ITEMS:
                                self.committed, self.lookahead = committed, None
                                item = self.walk_item(item)
                            bits_used_up = True
                        self.lookahead = item
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
                            if len(retstack) > RETSTACK_DEPTH:
                                del retstack[0]
                        committed = self.committed = len(out)
                    async_ip, disable_target = self.pending_event()
                    if self.mode != mode:
                        mode = self.mode
                        rows = cache.rows(mode)
                idle_blocks = 0

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
                    following = self.peek_past_modes()
                    if following is not None and following[0] == F_TIP and following[2] is not None:
                        self.lookahead = None
                        self.event("interrupt", following[1], value)
                        resume = following[2]
                    elif following is not None and following[0] == F_PGD:
                        self.lookahead = None
                        self.event("disabled", following[1], value)
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
        if resume in self.retstack:
            del self.retstack[len(self.retstack) - 1 - self.retstack[::-1].index(resume):]
        self.committed = self.resumed_at = len(self.out)
        return resume

    def pending_event(self):
        """What the next item means once the TNT bits are used up, as libipt's query
        decoder signals it only then: (address where an asynchronous event binds (FUP,
        MODE.TSX) or None, target of a TIP.PGD that binds to the direct branch going
        there (-1: none)).

        A FUP followed by TNT (a trace libipt misreads, e.g. past an erratum it does
        not know) waits, as in libipt, for the TIP it binds to: the TNT bits come first."""
        if self.held is not None:
            return self.held[2], -1
        if self.bit_index < len(self.bits):
            return None, -1
        if self.waiting_fups:
            self.release_waiting_fup()
        item = self.lookahead
        if item is None:
            if self.ended:
                return None, -1
            item = self.lookahead = self.item()
            if item is None:
                return None, -1
        kind = item[0]
        if kind == F_FUP:
            if self.fup_waits():
                return None, -1
            return item[2], -1
        if kind == F_AT_IP:
            return item[2][0], -1
        if kind == F_PGD and item[2] is not None:
            return None, item[2]
        if kind == F_PGE:
            # libipt handles it as soon as it is due, and tracing is already on.
            self.resync_past_psb = self.psb_follows(item[1])
            self.error(item[1], "tip.pge while tracing is enabled")
        return None, -1

    def hold_async_branch(self):
        """A due FUP + TIP (an asynchronous branch) where decoding needs TNT or TIP before
        reaching the FUP's IP (a trace libipt misreads): libipt has taken both as its
        event and holds it until decoding reaches that IP; the trace for the branches
        before it comes from the packets after the TIP."""
        if self.held is not None:
            return False
        ahead = self.items_ahead(lambda item: item[0] != F_MODE)
        if not ahead or ahead[-1][0] != F_TIP or ahead[-1][2] is None:
            return False
        self.held, self.held_after = self.lookahead, ahead
        self.drop_items(len(ahead) + 1)
        return True

    def fup_waits(self):
        """The FUP in lookahead is followed by TNT: it waits for the TIP after them."""
        ahead = self.items_ahead(lambda following: following[0] != F_MODE)
        if not ahead or ahead[-1][0] != F_TNT:
            return False
        self.waiting_fups.append(self.lookahead)
        self.lookahead = None
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
        if self.lookahead[0] == F_AT_IP:
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
        self.lookahead = None
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


def decode_flow(data, code, start=0, end=None, max_insns=None, suspicious=None, errata=frozenset(),
                resync_on_error=False, report_iflags=False):
    """Convenience: decode ``data`` over ``code`` (a CodeImage)."""
    return FlowDecoder(code, suspicious, errata=errata, resync_on_error=resync_on_error,
                       report_iflags=report_iflags).decode(data, start, end, max_insns)
