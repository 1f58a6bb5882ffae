"""The vocabulary the flow's tokenizer and block cache (dbgext.ipt.flow) share with
the walk: execution modes, block kinds, trace items and the F_TNT bits' format."""

from .. import packets as P

MODE_16, MODE_32, MODE_64 = 16, 32, 64
EXEC_MODES = {"16bit": MODE_16, "32bit": MODE_32, "64bit": MODE_64}

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

# -- trace items the walker consumes --------------------------------------------------

# _flow_items turns the packets into what control flow needs, (kind, offset, value):
# IP packets (value: the IP, None when suppressed), TNT bits, execution modes, MODE.TSX
# with its FUP, PSB, PSBEND, OVF and errors; timing and power packets are left out.
F_TIP, F_PGE, F_PGD, F_FUP = P.K_TIP, P.K_PGE, P.K_PGD, P.K_FUP
F_PSB, F_PSBEND, F_OVF, F_ERROR = P.K_PSB, P.K_PSBEND, P.K_OVF, P.K_ERROR
# F_TNT's value: the bits, oldest first, a byte each (1: taken), so the walk tests a bit as it is.
# F_AT_IP: an event that a FUP binds to an IP (MODE.TSX's, MODE.Exec's, EXSTOP's, PTW's);
# value: (the FUP's IP, the event: tsx_begin, tsx_commit, tsx_abort, interrupts_enabled,
# interrupts_disabled, exstop or ptwrite; None where the FUP binds no event).
F_TNT, F_MODE, F_AT_IP = 20, 21, 22  # value: bits; mode (16/32/64 or None); (IP, event)
F_END = 23  # no more packets (offset: the last packet's); the reader's item() hands out None instead
# F_EVENT: an event without an IP (EXSTOP or PTW with the IP bit clear, MODE.TSX before a
# TIP.PGE, a CFE of an interrupt); value: its kind.
# It binds to no instruction: the walk records it where it reads it (walk_item), on or off.
F_EVENT = 24
F_BAD_CONTEXT = 25  # a packet where it cannot be (an EVD before a CFE that does not take it); value: why
F_PIP = 26  # a PIP outside PSB+ (CR3 changed: libipt's paging event; events.py's read_pip); value: None
# F_ASYNC: an interrupt, a FUP with its IP right before a TIP with its IP, as one item (one
# read and one event binding where the interrupt path would take two items); offset: the
# FUP's; value: (the FUP item, the TIP item).  Only the walk's event binding takes it whole
# (pending_event, take_async); the reader's peek() and item() hand it out as its two items.
F_ASYNC = 27
ITEM_NAMES = {F_TNT: "tnt", F_TIP: "tip", F_PGE: "tip.pge", F_PGD: "tip.pgd", F_FUP: "fup", F_MODE: "mode.exec",
              F_PSB: "psb", F_PSBEND: "psbend", F_OVF: "ovf", F_ERROR: "error", F_AT_IP: "event",
              F_EVENT: "event", F_BAD_CONTEXT: "error", F_PIP: "pip"}
# The transaction states of MODE.TSX (F_AT_IP's events that are no event while tracing is off).
TSX_STATES = frozenset(("tsx_begin", "tsx_commit", "tsx_abort"))

_TAKEN = bytes.maketrans(b"TN", b"\x01\x00")


def taken(bits):
    """F_TNT's bits of a "TNNT..." string (packets.py's)."""
    return bits.encode("ascii").translate(_TAKEN)


TNT8_TAKEN = {byte: taken(bits) for byte, bits in P.TNT8_BITS.items()}


class RunBits(bytes):
    """The bits of a run of TNT-8 packets, and how many of them its last packet holds
    (``last_packet``): libipt's query decoder holds one packet's bits at a time."""
