"""Layer 1: the Intel PT packet decoder.

Decoding runs on a compiled regular expression: every packet encoding is a fixed
pattern on its first one to three bytes, so one alternation tokenizes the buffer in
C.  Runs of TNT-8 bytes and of PAD bytes come out as one token each, which is what
makes the decoder fast on real traces (TNT-8 bytes dominate them); the consumers
expand a run byte by byte only when they list packets.  Counting (packet_stats)
does not tokenize at all: one match of a second expression covers many packets.

The packet grammar is two tables, ONE_BYTE_PACKETS and EXTENDED_PACKETS (behind the
0x02 prefix): a row gives a packet's opcode bytes, its size, its fields by their JSON
names, the name Intel's ptdump prints and what the flow makes of it.  The
tokenizer's, the counter's and the flow's regular expressions, the counter's keys,
the flow's first-byte dispatch, the listing's sizes, the JSON fields and the list of
packet types come from them: adding a packet is adding a row.

Everything starts at a PSB.  An unknown opcode, a reserved IPBytes value or a packet
cut off by the end of the buffer is reported with its offset and decoding resumes
at the next PSB, so the decoder never reads past the buffer and always terminates.
"""

import re
import sys
from collections import Counter, namedtuple

from ..problems import ProblemLog

PSB = b"\x02\x82" * 8

# Token kinds yielded by tokens().
K_TNT8_RUN = 0   # value: the bytes of a run of TNT-8 packets
K_PAD_RUN = 1    # value: number of PAD bytes
K_TNT64 = 3      # value: bits string
K_PSB = 4
K_PSBEND = 5
K_OVF = 6
K_MODE = 7       # value: fields dict, type name mode.exec / mode.tsx
K_OTHER = 8      # value: (type name, fields dict)
K_ERROR = 9      # value: message
K_TIP, K_PGE, K_PGD, K_FUP = 10, 11, 12, 13  # value: the decompressed IP, None when suppressed

IP_TYPES = {0x01: "tip.pgd", 0x0D: "tip", 0x11: "tip.pge", 0x1D: "fup"}
IP_KINDS = {0x01: K_PGD, 0x0D: K_TIP, 0x11: K_PGE, 0x1D: K_FUP}
IP_KIND_OF_OPCODE = {opcode: IP_KINDS[opcode & 0x1F] for opcode in range(256) if opcode & 0x1F in IP_KINDS}
IP_KIND_NAMES = {K_PGD: "tip.pgd", K_TIP: "tip", K_PGE: "tip.pge", K_FUP: "fup"}
# IPBytes -> payload length; 5 and 7 are reserved.
IP_PAYLOAD = {0: 0, 1: 2, 2: 4, 3: 6, 4: 6, 6: 8}
EXEC_MODE_NAMES = {(0, 0): "16bit", (0, 1): "32bit", (1, 0): "64bit", (1, 1): "invalid"}


def _tnt_bits(value, count):
    """TNT payload bits, oldest first: the highest payload bit is the oldest."""
    return "".join("T" if value >> (count - 1 - i) & 1 else "N" for i in range(count))


def _tnt8_table():
    table = {}
    for byte in range(4, 256, 2):
        payload = byte >> 1
        count = payload.bit_length() - 1
        table[byte] = _tnt_bits(payload & ((1 << count) - 1), count)
    return table


TNT8_BITS = _tnt8_table()  # TNT-8 byte -> "TNNT..." oldest first
_TNT8 = frozenset(TNT8_BITS)  # the TNT-8 bytes: any even byte from 4


_TRIG_ICNT = 0x40  # TRIG flags: the packet carries an instruction count
_TRIG_LONG = frozenset(flags for flags in range(256) if flags & _TRIG_ICNT)
_TRIG_SHORT = frozenset(range(256)) - _TRIG_LONG


def _byte_class(values):
    return b"[" + b"".join(re.escape(bytes([v])) for v in sorted(values)) + b"]"


def _u(data, start, length):
    return int.from_bytes(data[start:start + length], "little")


# A packet's payload fields by their JSON names, from the packet at ``at``: the
# tables' last column.
def _cyc_fields(data, at):
    value = data[at] >> 3
    shift = 5
    index = at
    while data[index] & (4 if index == at else 1):
        index += 1
        value |= (data[index] >> 1) << shift
        shift += 7
    return {"value": value}


def _pip_fields(data, at):
    payload = _u(data, at + 2, 6)
    return {"cr3": (payload >> 1) << 5, "nr": payload & 1}


def _pwrx_fields(data, at):
    wake = data[at + 3] & 0xF
    return {"last": data[at + 2] >> 4, "deepest": data[at + 2] & 0xF,
            "interrupt": wake & 1, "store": wake >> 2 & 1, "autonomous": wake >> 3 & 1}


def _trig_fields(data, at):
    flags = data[at + 1]
    return {"trbv": data[at + 2], "ip": flags >> 7, "mult": flags >> 5 & 1,
            "icnt": _u(data, at + 3, 2) if flags & _TRIG_ICNT else None}


def _no_fields(data, at):
    return {}


# The packets behind the 0x02 prefix, one row each: name (the tokenizer's group), JSON
# type, the name Intel's ptdump prints, second bytes, size, the regex of the bytes after
# the second, fields (by their JSON names; None: a token of its own, no fields).  The
# tokenizer's alternatives (tried in this order, the most frequent first), the
# counter's keys, the flow's opcode table (_EXTENDED), the listing's sizes and fields
# and the error messages all come from it.
ExtendedPacket = namedtuple("ExtendedPacket", "name type ptdump seconds size rest fields")
EXTENDED_OPCODE = 0x02
EXTENDED_PACKETS = tuple(ExtendedPacket(*row) for row in (
    ("psb", "psb", "psb", (0x82,), 16, b"(?:\\x02\\x82){7}", None),
    ("psbend", "psbend", "psbend", (0x23,), 2, b"", None),
    ("tnt64", "tnt64", "tnt.64", (0xA3,), 8, b"(?!\\x00{6}).{6}", None),
    ("pip", "pip", "pip", (0x43,), 8, b".{6}", _pip_fields),
    ("cbr", "cbr", "cbr", (0x03,), 4, b"..", lambda data, at: {"ratio": data[at + 2]}),
    # CTC, a reserved byte, FC[7:0], FC[8]: libipt rejects a TMA with any reserved bit set.
    ("tma", "tma", "tma", (0x73,), 7, b"..\\x00.[\\x00\\x01]",
     lambda data, at: {"ctc": _u(data, at + 2, 2), "fc": data[at + 5] | (data[at + 6] & 1) << 8}),
    ("ovf", "ovf", "ovf", (0xF3,), 2, b"", None),
    ("vmcs", "vmcs", "vmcs", (0xC8,), 7, b".{5}", lambda data, at: {"base": _u(data, at + 2, 5) << 12}),
    ("stop", "stop", "stop", (0x83,), 2, b"", _no_fields),
    ("mnt", "mnt", "mnt", (0xC3,), 11, b"\\x88.{8}", lambda data, at: {"payload": _u(data, at + 3, 8)}),
    ("exstop", "exstop", "exstop", (0x62, 0xE2), 2, b"",
     lambda data, at: {"ip": 1 if data[at + 1] & 0x80 else 0}),
    ("mwait", "mwait", "mwait", (0xC2,), 10, b".{8}",
     lambda data, at: {"hints": _u(data, at + 2, 4), "ext": _u(data, at + 6, 4)}),
    ("pwre", "pwre", "pwre", (0x22,), 4, b"..",
     lambda data, at: {"state": data[at + 3] >> 4, "sub_state": data[at + 3] & 0xF, "hw": data[at + 2] >> 3 & 1}),
    ("pwrx", "pwrx", "pwrx", (0xA2,), 7, b".{5}", _pwrx_fields),
    ("ptw4", "ptw", "ptw", (0x12, 0x92), 6, b".{4}",
     lambda data, at: {"payload": _u(data, at + 2, 4), "size": 4, "ip": data[at + 1] >> 7}),
    ("ptw8", "ptw", "ptw", (0x32, 0xB2), 10, b".{8}",
     lambda data, at: {"payload": _u(data, at + 2, 8), "size": 8, "ip": data[at + 1] >> 7}),
    ("cfe", "cfe", "cfe", (0x13,), 4, b"..",
     lambda data, at: {"cfe_type": data[at + 2] & 0x1F, "vector": data[at + 3], "ip": data[at + 2] >> 7}),
    ("evd", "evd", "evd", (0x53,), 11, b".{9}",
     lambda data, at: {"evd_type": data[at + 2] & 0x3F, "payload": _u(data, at + 3, 8)}),
))
# Second byte of an extended packet -> (JSON type, size).
_EXTENDED = {second: (row.type, row.size) for row in EXTENDED_PACKETS for second in row.seconds}


def _ip_opcodes(payload_length):
    """The opcodes of the IP packets (TIP, TIP.PGE, TIP.PGD, FUP) with that many payload bytes."""
    return {low | ipbytes << 5 for low in IP_TYPES for ipbytes, length in IP_PAYLOAD.items()
            if length == payload_length}


# What the flow makes of a packet with a one-byte opcode (the "flow" column below).
FLOW_TIMING = "timing"  # nothing: read as part of the TNT-8 run it interrupts
FLOW_IP = "ip"          # an IP packet: TIP, TIP.PGE, TIP.PGD, FUP
FLOW_MODE = "mode"
FLOW_TRIG = "trig"

_ODD, _EVEN = _byte_class(range(1, 256, 2)), _byte_class(range(0, 256, 2))

# The packets without the 0x02 prefix (TNT-8 apart: its runs are one token), one row
# each: name (the tokenizer's group); JSON type (None: from the opcode, IP_TYPES, for
# an IP packet, from the leaf, mode_fields, for MODE); the name ptdump prints (None:
# that of its JSON type); opcodes, its first bytes; seconds, the second bytes where they too
# name its type or size (None: the opcode alone does); the regex of the bytes after
# those (rest); size (None: the rest decides); flow (FLOW_*); fields.
#
# A packet's key is its opcode and its second byte where seconds names them: what
# names its type and size, and what the counter captures (a packet whose rest decides
# its size is its own key).  The rows are the tokenizer's alternatives in the order sre
# tries them, the most frequent first.  IP packets, MODE and PAD are tokens of their
# own (no fields).
OneBytePacket = namedtuple("OneBytePacket", "name type ptdump opcodes seconds rest size flow fields")
ONE_BYTE_PACKETS = tuple(OneBytePacket(*row) for row in (
    ("ip2", None, None, _ip_opcodes(2), None, b"..", 3, FLOW_IP, None),
    ("mtc", "mtc", "mtc", (0x59,), None, b".", 2, FLOW_TIMING, lambda data, at: {"ctc": data[at + 1]}),
    ("ip4", None, None, _ip_opcodes(4), None, b".{4}", 5, FLOW_IP, None),
    ("cyc", "cyc", "cyc", [b for b in range(256) if b & 7 == 3], None, b"", 1, FLOW_TIMING, _cyc_fields),
    # A CYC whose first byte says "more": bytes up to the first whose low bit says none.
    ("cyc_more", "cyc", "cyc", [b for b in range(256) if b & 7 == 7], None, _ODD + b"{0,7}" + _EVEN, None,
     FLOW_TIMING, _cyc_fields),
    ("ip6", None, None, _ip_opcodes(6), None, b".{6}", 7, FLOW_IP, None),
    ("ip0", None, None, _ip_opcodes(0), None, b"", 1, FLOW_IP, None),
    ("tsc", "tsc", "tsc", (0x19,), None, b".{7}", 8, FLOW_TIMING, lambda data, at: {"tsc": _u(data, at + 1, 7)}),
    ("mode", None, None, (0x99,), range(0x40), b"", 2, FLOW_MODE, None),
    ("ip8", None, None, _ip_opcodes(8), None, b".{8}", 9, FLOW_IP, None),
    # A PAD run is all of it: "(?!\\x00)" keeps a run from also matching as two
    # shorter ones, which inside a repeated group would backtrack exponentially.
    ("pad", "pad", "pad", (0x00,), None, b"\\x00*(?!\\x00)", 1, FLOW_TIMING, None),
    # TRIG: flags (IP, ICNT valid, MULT), TRBV, then a 2-byte ICNT when its flag is set.
    ("trig", "trig", "trig", (0xD9,), _TRIG_SHORT, b".", 3, FLOW_TRIG, _trig_fields),
    ("trig_icnt", "trig", "trig", (0xD9,), _TRIG_LONG, b"...", 5, FLOW_TRIG, _trig_fields),
))
# JSON type -> the name Intel's ptdump prints, for every packet type.
PTDUMP_NAMES = dict(
    [("tnt8", "tnt.8")] + [(packet_type, packet_type) for packet_type in IP_TYPES.values()]
    + [(row.type, row.ptdump) for table in (ONE_BYTE_PACKETS, EXTENDED_PACKETS) for row in table if row.type]
    + [("mode.exec", "mode.exec"), ("mode.tsx", "mode.tsx")])
# Tokenizer name -> (JSON type, its fields) of the packets the tokenizer yields as K_OTHER.
_FIELDS = {row.name: (row.type, row.fields) for row in ONE_BYTE_PACKETS + EXTENDED_PACKETS if row.fields}
# TRIG flags -> size.
_TRIG_SIZES = {flags: row.size for row in ONE_BYTE_PACKETS if row.flow == FLOW_TRIG for flags in row.seconds}


def _class_of(values):
    """The regex of a set of bytes, written as \\xNN (readable in a dump of the pattern)."""
    values = sorted(values)
    escaped = b"".join(b"\\x%02x" % value for value in values)
    return escaped if len(values) == 1 else b"[" + escaped + b"]"


def one_byte_key(row):
    """The regex of a one-byte-opcode packet's key (see ONE_BYTE_PACKETS)."""
    return _class_of(row.opcodes) + (b"" if row.seconds is None else _class_of(row.seconds))


def timing_pattern(one_byte_packets):
    """The timing packets (PAD, MTC, CYC, TSC) as one alternation: what control
    flow reads past (the tokenizer's QUIET_RE, the flow's TNT-8 runs)."""
    return b"|".join(one_byte_key(row) + row.rest for row in one_byte_packets if row.flow == FLOW_TIMING)


def extended_pattern(extended_packets):
    """The extended packets behind their one 0x02 prefix, so that other bytes skip
    all of them with one comparison (the counter's and the flow's tokens)."""
    return _class_of([EXTENDED_OPCODE]) + b"(?:" + b"|".join(
        _class_of(row.seconds) + row.rest for row in extended_packets) + b")"


def _build_pattern(one_byte_packets, extended_packets):
    """The tokenizer's regex, QUIET_RE and the reserved IP opcodes, from the packet tables."""
    reserved_ip = {low | ipbytes << 5 for low in IP_TYPES for ipbytes in range(8) if ipbytes not in IP_PAYLOAD}
    # (name, key, rest).  Extended packets sit behind one 0x02 prefix so other bytes
    # skip all of them with one comparison.
    common = [(row.name, one_byte_key(row), row.rest) for row in one_byte_packets]
    extended = [(row.name, _class_of(row.seconds), row.rest) for row in extended_packets]
    tnt_run = _byte_class(_TNT8) + b"+"

    def named(entries):
        return b"|".join(b"(?P<" + name.encode() + b">" + key + rest + b")" for name, key, rest in entries)

    rest = named(common) + b"|" + _class_of([EXTENDED_OPCODE]) + b"(?:" + named(extended) + b")|(?P<bad>.)"
    source = b"(?P<tnt8>" + tnt_run + b")|" + rest
    # The timing packets (PAD, MTC, CYC, TSC) mean nothing to control flow: the flow
    # reads them as part of the TNT-8 run they interrupt (QUIET_RE takes them out).
    quiet_re = b"(?:" + timing_pattern(one_byte_packets) + b")+"
    return re.compile(source, re.DOTALL), re.compile(quiet_re, re.DOTALL), reserved_ip


# The JSON types of the timing packets.
QUIET_PACKETS = tuple(sorted(set(row.type for row in ONE_BYTE_PACKETS if row.flow == FLOW_TIMING)))
PACKET_RE, QUIET_RE, RESERVED_IP_OPCODES = _build_pattern(ONE_BYTE_PACKETS, EXTENDED_PACKETS)
G = PACKET_RE.groupindex
G_TNT8, G_PAD, G_IP0, G_IP2, G_IP4, G_IP6, G_IP8 = (
    G["tnt8"], G["pad"], G["ip0"], G["ip2"], G["ip4"], G["ip6"], G["ip8"])
G_PSB, G_PSBEND, G_OVF, G_MODE, G_TNT64, G_BAD = (
    G["psb"], G["psbend"], G["ovf"], G["mode"], G["tnt64"], G["bad"])

def _error_message(data, offset, end):
    """Why the packet at ``offset`` does not decode."""
    byte = data[offset]
    remaining = end - offset
    if byte in RESERVED_IP_OPCODES:
        return "%s with reserved IPBytes %d" % (IP_TYPES[byte & 0x1F], byte >> 5)
    if byte & 0x1F in IP_TYPES:
        need = 1 + IP_PAYLOAD[byte >> 5]
    elif byte == 0x19:
        need = 8
    elif byte == 0xD9:
        need = _TRIG_SIZES[data[offset + 1]] if remaining >= 2 else 3
    elif byte == 0x99 and remaining >= 2:
        return "mode packet with unknown leaf %d" % (data[offset + 1] >> 5)
    elif byte in (0x59, 0x99):
        need = 2
    elif byte & 3 == 3:
        need = None
        for index in range(offset + 1, min(end, offset + 9)):
            if not data[index] & 1:
                break
        else:
            if end - offset <= 8:
                return "truncated cyc packet (%d bytes left)" % remaining
            return "cyc packet longer than 64 bits"
    elif byte == 0x02:
        if remaining < 2:
            return "truncated extended packet (1 byte left)"
        need = _EXTENDED.get(data[offset + 1], (None, None))[1]
        if data[offset + 1] == 0x82 and remaining >= 16:
            return "malformed psb"
        if data[offset + 1] == 0xA3 and remaining >= 8:
            return "tnt64 packet without stop bit"
        if data[offset + 1] == 0x73 and remaining >= 7:
            return "tma packet with reserved bits set (%s)" % data[offset + 4:offset + 7].hex()
        if data[offset + 1] == 0xC3 and remaining >= 3 and data[offset + 2] != 0x88:
            return "unknown opcode 02 c3 %02x" % data[offset + 2]
        if need is None:
            return "unknown extended opcode 02 %02x" % data[offset + 1]
    else:
        return "unknown opcode %02x" % byte
    if need is not None and remaining < need:
        return "truncated packet (%d of %d bytes)" % (remaining, need)
    return "malformed packet starting %s" % data[offset:offset + 4].hex()


def mode_fields(payload):
    """MODE payload (leaf 0 or 1; the tokenizer rejects the others)."""
    if payload >> 5 == 0:
        csl, csd = payload & 1, payload >> 1 & 1
        return "mode.exec", {"csl": csl, "csd": csd, "if": payload >> 2 & 1,
                             "mode": EXEC_MODE_NAMES[(csl, csd)]}
    return "mode.tsx", {"intx": payload & 1, "abort": payload >> 1 & 1}


# IP compression: IPBytes -> the bits of the last IP a packet keeps; its payload
# replaces the others (3: 48 bits sign-extended from bit 47, nothing kept).
IP_KEPT_BITS = {1: 0xFFFFFFFFFFFF0000, 2: 0xFFFFFFFF00000000, 3: 0, 4: 0xFFFF000000000000, 6: 0}
_SIGN_BIT_47 = 1 << 47
_SIGN_EXTENSION = 0xFFFF << 48


def decompress_ip(ipbytes, payload, last_ip):
    """The IP an IP packet names, from its IPBytes field, its payload (an int read
    little-endian) and the last IP: IPBytes 1, 2 and 4 replace the last IP's low 16,
    32 and 48 bits, 3 sign-extends 48 bits, 6 gives all 64.  IP compression is
    written here only: the packet decoder and the flow both call it."""
    if ipbytes == 3 and payload & _SIGN_BIT_47:
        return payload | _SIGN_EXTENSION
    return (last_ip & IP_KEPT_BITS[ipbytes]) | payload


def tokens(data, start=0, end=None, at_packet=False):
    """Tokenize ``data[start:end]`` from its first PSB on (from ``start`` itself when
    ``at_packet`` says a packet starts there).

    Yields ``(kind, offset, value)`` (kinds K_*).  Errors come as K_ERROR tokens
    naming the offset; the tokenizer then resumes, as libipt does, at the PSB that
    holds the bad byte (a packet read into a PSB's bytes: it is one after all) or
    else the next PSB, never at or before the PSB it last synchronised on.  The
    first token is an error when the range holds no PSB at all.
    """
    if end is None:
        end = len(data)
    end = min(end, len(data))
    position = start if at_packet else data.find(PSB, start, end)
    if position < 0:
        yield K_ERROR, start, "no PSB in the %d bytes from offset %d" % (max(end - start, 0), start)
        return
    last_ip = 0
    last_psb = position - 1
    finditer = PACKET_RE.finditer
    # The names compared or called once per packet, as locals (faster than globals on 3.8).
    g_tnt8, g_ip0, g_pad, g_psb, g_psbend, g_mode = G_TNT8, G_IP0, G_PAD, G_PSB, G_PSBEND, G_MODE
    ip_groups = frozenset((G_IP2, G_IP4, G_IP6, G_IP8))  # the IP packets with a payload
    k_tnt8_run, ip_kind_of_opcode, decompress, from_bytes = K_TNT8_RUN, IP_KIND_OF_OPCODE, decompress_ip, int.from_bytes
    fields_of = _FIELDS
    while position >= 0:
        resume = -1
        for match in finditer(data, position, end):
            group = match.lastindex
            offset = match.start()
            if group == g_tnt8:
                yield k_tnt8_run, offset, match.group()
            elif group in ip_groups:
                payload = from_bytes(data[offset + 1:match.end()], "little")
                ip = last_ip = decompress(data[offset] >> 5, payload, last_ip)
                yield ip_kind_of_opcode[data[offset]], offset, ip
            elif group == g_ip0:
                yield ip_kind_of_opcode[data[offset]], offset, None
            elif group == g_pad:
                yield K_PAD_RUN, offset, match.end() - offset
            elif group == g_psb:
                last_ip = 0
                last_psb = offset
                yield K_PSB, offset, None
            elif group == g_psbend:
                yield K_PSBEND, offset, None
            elif group == g_mode:
                yield K_MODE, offset, mode_fields(data[offset + 1])
            elif group == G_TNT64:
                payload = int.from_bytes(data[offset + 2:offset + 8], "little")
                count = payload.bit_length() - 1
                yield K_TNT64, offset, _tnt_bits(payload, count)
            elif group == G_OVF:
                last_ip = 0  # as libipt: the IP after an overflow does not build on older IPs
                yield K_OVF, offset, None
            elif group == G_BAD:
                yield K_ERROR, offset, _error_message(data, offset, end)
                resume = max(last_psb + 1, offset - len(PSB) + 1)
                break
            else:
                packet_type, fields = fields_of[match.lastgroup]
                yield K_OTHER, offset, (packet_type, fields(data, offset))
        if resume < 0:
            return
        position = data.find(PSB, resume, end)


class Packet(object):
    """One decoded packet: offset in the buffer, type name, size in bytes, payload fields."""

    __slots__ = ("offset", "type", "size", "fields")

    def __init__(self, offset, type, size, fields):
        self.offset = offset
        self.type = type
        self.size = size
        self.fields = fields

    def as_dict(self):
        document = {"offset": self.offset, "type": self.type}
        document.update(self.fields)
        return document

    def __repr__(self):
        return "Packet(%d, %r, %r)" % (self.offset, self.type, self.fields)


class PacketDecode(object):
    """Result of decode_packets: packets in order, and the packets that did not decode."""

    __slots__ = ("packets", "problems", "truncated")

    def __init__(self):
        self.packets = []
        self.problems = ProblemLog()
        self.truncated = False  # stopped at max_packets


_IP_SIZES = {ipbytes: 1 + length for ipbytes, length in IP_PAYLOAD.items()}  # IPBytes -> packet size
# The one-byte-opcode packets of one size, by JSON type (the extended ones: _EXTENDED).
_ONE_BYTE_SIZES = {row.type: row.size for row in ONE_BYTE_PACKETS if row.type and row.size}
# The tokens with no value.
_SIMPLE_NAMES = {K_PSB: "psb", K_PSBEND: "psbend", K_OVF: "ovf"}


# -- the packet-layer errata (errata.py) ---------------------------------------------------

# The bytes an erratum may have hit (searched for first: most traces hold none).
# SKD007: a CYC that goes on past its first byte (bits 0-2 set), then 02 F3.
_SKD007_CANDIDATE = re.compile(_byte_class(range(7, 256, 8)) + b"\x02\xf3")
# SKZ84: a TMA whose reserved bits are set (its reserved byte, or FC above bit 8).
_SKZ84_CANDIDATE = re.compile(b"\x02\x73(?:..[^\x00]|....[^\x00\x01])", re.DOTALL)


def packet_errata(data, start=0, end=None, errata=frozenset()):
    """Where the packet-layer errata among ``errata`` hit ``data[start:end]``, read as
    libipt's packet decoder (and ptdump, the flow through libipt's query decoder) reads
    them.  Returns (``data`` with the bytes they hit made PADs, so that the packets after
    them tokenize and offsets stay; {offset: the :class:`Packet` libipt reads there}):

    * SKD007: an OVF may come after the first byte of a multi-byte CYC, in place of its
      other bytes.  A 2-byte CYC whose second byte and the byte after it read 02 F3 is
      that first byte and the OVF: one ``ovf`` packet of 3 bytes (the CYC's byte is the PAD);
    * SKZ84: with VMX TSC offsetting or scaling a TMA is corrupted and a bogus byte
      follows it.  A TMA with reserved bits set and the byte after it are one
      ``invalid`` packet of 8 bytes (ptdump's ``<invalid>``; all 8 are PADs)."""
    end = len(data) if end is None else min(end, len(data))
    hits = {}
    if "skd007" in errata and _SKD007_CANDIDATE.search(data, start, end):
        patched = None
        for kind, offset, value in tokens(data, start, end):
            if kind == K_OTHER and value[0] == "cyc" and data[offset] & 4 and offset + 2 < end \
                    and data[offset + 1] == 0x02 and data[offset + 2] == 0xF3:
                if patched is None:
                    patched = bytearray(data)
                patched[offset] = 0
                hits[offset] = Packet(offset, "ovf", 3, {"erratum": "skd007"})
        data = data if patched is None else bytes(patched)
    if "skz84" in errata and _SKZ84_CANDIDATE.search(data, start, end):
        patched = bytearray(data)
        changed = False
        position = start
        while position is not None:
            segment, position = position, None
            for kind, offset, value in tokens(patched, segment, end):
                if kind == K_PSB:
                    segment = offset
                corrupted = (kind == K_OTHER and value[0] == "tma" and patched[offset + 4]) or \
                    (kind == K_ERROR and value.startswith("tma packet with reserved bits"))
                if corrupted and offset + 8 <= end:
                    patched[offset:offset + 8] = bytes(8)
                    hits[offset] = Packet(offset, "invalid", 8, {"erratum": "skz84"})
                    changed = True
                    position = segment  # decode that stretch again past the PADs
                    break
        data = bytes(patched) if changed else data
    return data, hits


def _listing_errata_packets(append, hits):
    """decode_packets' ``append`` where an erratum hit: the packet libipt reads there
    ({offset: Packet}) in place of what the tokenizer reads in its bytes."""
    listed_to = 0  # the end of the last erratum packet listed

    def add(packet):
        nonlocal listed_to
        hit = hits.get(packet.offset)
        if hit is not None:
            append(hit)
            listed_to = hit.offset + hit.size
        elif packet.offset >= listed_to:
            append(packet)
    return add


def decode_packets(data, start=0, end=None, max_packets=None, errata=frozenset()):
    """Every packet of ``data[start:end]`` as :class:`Packet` objects (from the first PSB).
    ``errata``: the traced CPU's (errata.cpu_errata); the packet-layer ones (SKD007,
    SKZ84: packet_errata) list the packets they hit as libipt's packet decoder reads them."""
    result = PacketDecode()
    packets = result.packets
    append = packets.append
    data, hits = packet_errata(data, start, end, errata) if errata else (data, None)
    if hits:
        append = _listing_errata_packets(append, hits)
    limit = max_packets if max_packets is not None else -1
    for kind, offset, value in tokens(data, start, end):
        if kind == K_TNT8_RUN:
            for index, byte in enumerate(value):
                append(Packet(offset + index, "tnt8", 1, {"bits": TNT8_BITS[byte]}))
        elif kind == K_PAD_RUN:
            for index in range(value):
                append(Packet(offset + index, "pad", 1, {}))
        elif kind in IP_KIND_NAMES:
            ipbytes = data[offset] >> 5
            append(Packet(offset, IP_KIND_NAMES[kind], _IP_SIZES[ipbytes], {"ip": value, "ipbytes": ipbytes}))
        elif kind == K_TNT64:
            append(Packet(offset, "tnt64", 8, {"bits": value}))
        elif kind == K_MODE:
            append(Packet(offset, value[0], 2, value[1]))
        elif kind == K_OTHER:
            name, fields = value
            if name == "cyc":
                size = 1
                while data[offset + size - 1] & (4 if size == 1 else 1):
                    size += 1
            elif name == "trig":
                size = _TRIG_SIZES[data[offset + 1]]
            elif data[offset] == 0x02:
                size = _EXTENDED[data[offset + 1]][1]
            else:
                size = _ONE_BYTE_SIZES[name]
            append(Packet(offset, name, size, fields))
        elif kind == K_ERROR:
            result.problems.add("ipt_packet_error", None, value, offset=offset)
        else:  # psb, psbend, ovf
            name, size = _EXTENDED[data[offset + 1]]
            append(Packet(offset, name, size, {}))
        if 0 <= limit < len(packets):
            del packets[limit:]
            result.truncated = True
            break
    return result


PACKET_TYPES = tuple(PTDUMP_NAMES)  # every JSON type


class PacketStats(object):
    """Totals of a decode: packets per type, bytes covered, the packets that did not decode."""

    __slots__ = ("counts", "bytes", "problems")

    def __init__(self, size):
        self.counts = dict.fromkeys(PACKET_TYPES, 0)
        self.bytes = size
        self.problems = ProblemLog()

    @property
    def packets(self):
        return sum(self.counts.values())

    def as_dict(self):
        return {"bytes": self.bytes, "packets": self.packets,
                "types": {name: count for name, count in self.counts.items() if count},
                "errors": self.problems.count()}


# -- counting ----------------------------------------------------------------------
#
# Counting is what `ipt packets --stats` and every event scan do over whole buffers,
# so it does not pay for a regex match per packet (sre's fixed cost of a match is
# about 900 machine instructions, a packet's own matching a small part of that).  One
# match covers _SLOTS slots; a slot is the TNT-8 bytes before a packet, then the
# packet.  The commonest packets, TNT-8 (1 byte) and the silent packet (TIP with two
# IP bytes, or MTC), capture nothing; every other packet captures its key
# (ONE_BYTE_PACKETS: the bytes that name its type and size) through a lookahead, and
# TNT-64 an empty one.  The slots the captures leave are the silent packets, and the
# bytes they leave the TNT-8 packets (in _TIP_RUNS, where a slot is silent packets,
# then a TNT-8 byte or a keyed packet, the other way round).
#
# Every slot has exactly one way to match, so a match that fails backtracks in time
# linear in what it covered.  Runs of _LONG_RUN or more TNT-8 or PAD bytes (a tight
# loop, the unwritten end of a buffer) are counted apart, without the regex.

_SLOTS = 32
_WINDOW = 1 << 20   # bytes per split() at most: bounds the lists it builds
_FIRST_WINDOW = 1 << 14
# The packets a slot matches without a capture, the commoner in the window before:
# TIP with IPBytes 1, or MTC where timing packets are on.
_SILENT_TIP, _SILENT_MTC = 0x2D, 0x59
# The packet whose key the counter captures empty: TNT-64 (long runs of conditional
# branches between TIPs).  An empty key costs a slot no second split of the joined
# keys, as a two-byte key does; the empty captures are counted (only where the window
# holds its two bytes at all: a count looks at every capture).
_EMPTY_KEYED = "tnt64"
_LONG_RUN = 4096  # shorter runs cost less in the regex than a window cut at them
# Where a run of TNT-8 or PAD bytes starts, the packet around it ends within 16
# bytes (no packet is longer); from there on, every byte of the run is a packet of
# its own.  So a run is cut 16 bytes in, at a packet start.
_RUN_CUT = 16
_RUN_BYTES = bytes(ord("T") if byte in _TNT8 else ord(".") for byte in range(256))
# The repeats in a slot (its TNT-8 bytes; the silent packets of a _TIP_RUNS slot) are
# of bytes or packets that what follows them never starts with, so the run a slot
# starts with is all of it, and a possessive repeat (Python 3.11 on) matches what a
# greedy one does.  It saves sre a backtracking frame per slot (a sixth of a slot's
# time), and a repeated packet a repeat context; 3.8 has no possessive repeats.
_POSSESSIVE = sys.version_info >= (3, 11)
_REPEAT = b"*+" if _POSSESSIVE else b"*"
_TNT_CLASSES, _ZEROS = re.compile(b"T+"), re.compile(b"\x00+")


# A counted repeat of one byte or of a group of literal bytes, as the packet tables write
# a payload (".{6}", "(?:\\x02\\x82){7}").
_COUNTED_REPEAT = re.compile(rb"(\.|\\x[0-9a-f]{2}|\(\?:((?:\\x[0-9a-f]{2})+)\))\{(\d+)\}")


def _unrolled(rest):
    """``rest`` with each counted repeat written out (".{3}" -> "..."): sre matches a
    counted repeat with a call and a backtracking frame, written-out bytes with an
    instruction each, which costs a keyed TNT-64 or PSB half its time."""
    return _COUNTED_REPEAT.sub(lambda match: (match.group(2) or match.group(1)) * int(match.group(3)), rest)


def row_type(row, key):
    """The JSON type of the ONE_BYTE_PACKETS ``row`` packet whose key is ``key`` (bytes)."""
    if row.type:
        return row.type
    return IP_TYPES[key[0] & 0x1F] if row.flow == FLOW_IP else mode_fields(key[1])[0]


def _row(name, rows):
    return next(row for row in rows if row.name == name)


def count_keys(one_byte_packets, extended_packets):
    """The counter's keys, from the packet tables: ({opcode: (JSON type, size)} of the
    packets their opcode names, {two-byte key: (JSON type, size)}, {opcode: JSON type}
    of the packets that are their own key).  PAD is counted by its runs."""
    one_byte, two_byte, whole = {}, {}, {}
    for row in one_byte_packets:
        for opcode in row.opcodes:
            if row.type == "pad":
                continue
            if row.size is None:
                whole[opcode] = row.type
            elif row.seconds is None:
                one_byte[opcode] = row_type(row, bytes((opcode,))), row.size
            else:
                two_byte.update((bytes((opcode, second)), (row_type(row, bytes((opcode, second))), row.size))
                                for second in row.seconds)
    two_byte.update((bytes((EXTENDED_OPCODE, second)), (row.type, row.size))
                    for row in extended_packets for second in row.seconds)
    return one_byte, two_byte, whole


# What a slot is: TNT-8 bytes, then a packet; the same, a silent packet tried first;
# silent packets, then a TNT-8 byte or a keyed packet.
_TNT8_THEN_PACKET, _SILENT_FIRST, _SILENT_RUNS = "tnt8 then packet", "silent first", "silent runs"
# The variants: (the silent packet's opcode, what a slot is, whether an MTC has a group
# of its own).
_PLAIN, _TIP_FIRST, _TIP_RUNS, _MTC_CAPTURED, _MTC_SILENT = (
    (_SILENT_TIP, _TNT8_THEN_PACKET, False), (_SILENT_TIP, _SILENT_FIRST, False), (_SILENT_TIP, _SILENT_RUNS, False),
    (_SILENT_TIP, _TNT8_THEN_PACKET, True), (_SILENT_MTC, _TNT8_THEN_PACKET, False))
# The variant for few TNT-8 bytes among many TIPs: silent runs cost a repeat context
# per packet without possessive repeats, more than a slot.
_TIP_HEAVY = _TIP_RUNS if _POSSESSIVE else _TIP_FIRST


class _Counter(object):
    """The slot regex and the tables that turn its captures into counts (built on
    first use), all from the packet tables.

    Each window is counted by the variant that suits the window before (_variant_for):
    - _MTC_SILENT: MTC is the silent packet, matched without a capture, and TIP is
      keyed: where MTCs are a quarter of the slots or more and TIPs fewer (a capture
      costs a slot about as much as the rest of it);
    - _MTC_CAPTURED: a slot captures an MTC's header in a group of its own instead of
      through the key's lookahead.  That halves what an MTC costs and costs every
      slot a group more, so it pays where MTCs and TIPs are each a quarter of the
      slots or more (timing packets on, as in most Windows traces), and no TNT-64
      is about: counting the empty keys compares every capture, the MTCs' too;
    - _TIP_HEAVY, where TNT-8 bytes are fewer than a third of the slots (a TIP-heavy
      trace), is one of
      - _TIP_RUNS (Python 3.11 on): a slot is a run of silent TIPs, then a TNT-8
        byte or a keyed packet.  A silent TIP costs a repeat, not a slot, and each
        TNT-8 byte a slot.  The slots count the TNT-8 bytes and the keyed packets,
        and the bytes left the silent TIPs.  A failed match (at the end of a
        window) reads its slots again, long runs too, at most _SLOTS + 1 times;
      - _TIP_FIRST: a silent TIP is tried before the TNT-8 bytes in front of a
        packet are counted.  A silent TIP with no TNT-8 byte before it then costs
        less, and a packet after TNT-8 bytes pays for a failed try;
    - _PLAIN otherwise."""

    def __init__(self, variant, one_byte_packets=ONE_BYTE_PACKETS, extended_packets=EXTENDED_PACKETS):
        silent, form, mtc_group = variant
        one_byte_packets = [row._replace(rest=_unrolled(row.rest)) for row in one_byte_packets]
        extended_packets = [row._replace(rest=_unrolled(row.rest)) for row in extended_packets]
        silent_row = next(row for row in one_byte_packets if silent in row.opcodes)
        one_byte, two_byte, whole = count_keys(one_byte_packets, extended_packets)
        mtc, pad, empty = _row("mtc", one_byte_packets), _row("pad", one_byte_packets), _row(_EMPTY_KEYED,
                                                                                             extended_packets)
        empty_keys = [bytes((EXTENDED_OPCODE, second)) for second in empty.seconds]
        for key in empty_keys:
            del two_byte[key]
        # An extended packet whose second byte is a TNT-8 byte (PSB, PTW...) is keyed by
        # that byte alone: no other key starts with a TNT-8 byte, and a one-byte key is
        # counted with the others in one table pass, not split out of the joined keys.
        by_second = sorted(key[1] for key in two_byte if key[0] == EXTENDED_OPCODE and key[1] in _TNT8)
        for second in by_second:
            one_byte[second] = two_byte.pop(bytes((EXTENDED_OPCODE, second)))
        tnt8 = _byte_class(_TNT8)
        keyed = []
        # The packet's alternatives: those of one opcode among the timing packets (MTC,
        # TSC, PAD: sre rejects a literal with a comparison, a class with a call) first,
        # then in the table's order.
        for row in sorted(one_byte_packets, key=lambda row: not (row.flow == FLOW_TIMING and len(row.opcodes) == 1)):
            if set(row.opcodes) - {silent} and not (row is mtc and mtc_group):  # (their own alternatives)
                keyed.append(one_byte_key(row._replace(opcodes=set(row.opcodes) - {silent})) + row.rest)
        extended = sorted(extended_packets, key=lambda row: row is not empty)
        packet = extended_pattern(extended) + b"|" + b"|".join(keyed)
        # A PAD run's key goes on into the next byte, so that two runs stay two keys.
        pad_byte = _class_of(pad.opcodes)
        pad_after = pad_byte + b"*[^" + pad_byte + b"]?"  # what follows its first byte
        pad_key = pad_byte + pad_after
        # The key's alternatives start with bytes of their own (the empty keys and the
        # other two-byte keys of their first byte: second bytes of their own), and each
        # goes on one way (PAD: the whole run), so a key matches in one way only.
        seconds = {}  # the first byte of a two-byte key -> its second bytes
        for key in two_byte:
            seconds.setdefault(key[0], set()).add(key[1])
        key = b"|".join([_class_of(set(one_byte) - {silent} - set(mtc.opcodes))]
                        + [b"(?=" + b"".join(_class_of([byte]) for byte in key) + b")" for key in empty_keys]
                        + [_class_of([first]) + _class_of(seconds[first]) for first in sorted(seconds)]
                        + [pad_key] + [one_byte_key(row) + row.rest for row in one_byte_packets if row.size is None])
        if silent not in mtc.opcodes and not mtc_group:
            key = one_byte_key(mtc) + b"|" + key  # MTC as a literal: sre tries one without a call
        # The prefix of a key of its second byte: the one way there is ("|": a branch,
        # which sre tries faster than an optional group).
        second_keyed = _class_of([EXTENDED_OPCODE]) + b"(?=" + _class_of(by_second) + b")|"
        keyed_packet = b"(?=(?:" + second_keyed + b")(" + key + b"))(?:" + packet + b")"
        quiet = _class_of([silent]) + silent_row.rest
        tnt_run = tnt8 + _REPEAT
        if mtc_group:
            slot = tnt_run + b"(?:" + quiet + b"|(" + one_byte_key(mtc) + b")" + mtc.rest + b"|" + keyed_packet + b")"
        elif form == _SILENT_FIRST:
            slot = b"(?:" + quiet + b"|" + tnt8 + tnt_run + quiet + b"|" + tnt_run + keyed_packet + b")"
        elif form == _SILENT_RUNS:
            slot = b"(?:" + quiet + b")" + _REPEAT + b"(?:" + tnt8 + b"|" + keyed_packet + b")"
        else:
            slot = tnt_run + b"(?:" + quiet + b"|" + keyed_packet + b")"
        # Fewer than _SLOTS slots left: one per match, marked by an empty capture; what
        # ends the range after the last slot (TNT-8 bytes; silent packets where a slot
        # ends with a TNT-8 byte) and a byte that is no packet are captured (the rest of
        # the range is then left unread).
        self.runs = form == _SILENT_RUNS
        trailing = b"(?:" + quiet + b")+" if self.runs else tnt8 + b"+"
        single = b"()(?:" + slot + b"|(" + trailing + b")\\Z|(.).*)"
        # On text (the buffer decoded as latin-1): joining str keys is much cheaper than bytes.
        self.regex = re.compile((slot * _SLOTS + b"|" + single).decode("latin-1"), re.DOTALL)
        # split() gives per match its groups (per slot its key, after its MTC in
        # _MTC_CAPTURED; then the marker, the slot's groups, the trailing bytes and bad
        # byte of a single-slot match), then the empty text up to the next match.
        self.stride = self.regex.groups + 1
        groups = 2 if mtc_group else 1  # per slot
        self.marker = groups * _SLOTS
        self.trailing, self.bad = self.marker + groups + 1, self.marker + groups + 2
        # Keys longer than a byte, in the joined keys: the pattern starts with a
        # character class, so split() skips the other characters fast; a lookbehind
        # at the key's first byte picks the one way its key goes on.
        after = [(pad.opcodes, pad_after), (set(seconds), b".")] + [
            (row.opcodes, row.rest) for row in one_byte_packets if row.size is None]
        longer = b"(" + _class_of(set().union(*(firsts for firsts, _ in after))) + b"(?:" + b"|".join(
            b"(?<=" + _class_of(firsts) + b")" + rest for firsts, rest in after) + b"))"
        self.longer_keys = re.compile(longer.decode("latin-1"), re.DOTALL)
        # A one-byte key -> the index of its (type, size) among the kinds: the keys of one
        # kind are counted together.
        self.one_byte_kinds = sorted(set(one_byte.values()))
        self.kind_of_key = bytes(self.one_byte_kinds.index(one_byte[opcode]) if opcode in one_byte else 0
                                 for opcode in range(256))
        self.two_byte_types = {key.decode("latin-1"): found for key, found in two_byte.items()}
        self.whole_types = {chr(opcode): name for opcode, name in whole.items()}
        self.pad = chr(pad.opcodes[0])
        # sre finds a literal with memchr: faster than bytes.find for a two-byte needle.
        self.empty_key_search = re.compile(b"|".join(map(re.escape, empty_keys))).search
        self.empty_type, self.empty_size = empty.type, empty.size
        self.silent_type, self.silent_size = row_type(silent_row, bytes((silent,))), silent_row.size

    def longer_key_type(self, key):
        """(type, packets, bytes) of a key longer than one byte."""
        if key[0] == self.pad:
            pads = len(key) - (key[-1] != self.pad)
            return "pad", pads, pads
        found = self.two_byte_types.get(key)
        if found:
            return found[0], 1, found[1]
        return self.whole_types[key[0]], 1, len(key)

    def count(self, data, start, end):
        """(packets per type, packets other than TNT-8: the slots but in _TIP_RUNS) of
        ``data[start:end]``, where a packet must start at ``start``; None unless every
        byte up to ``end`` decodes."""
        pieces = self.regex.split(str(memoryview(data)[start:end], "latin-1"))
        stride = self.stride
        matches = len(pieces) // stride
        if pieces[1 + self.bad::stride].count(None) != matches:
            return None
        trailing = list(filter(None, pieces[1 + self.trailing::stride]))
        if trailing:
            pieces[1 + self.trailing::stride] = [None] * matches
        singles = matches - pieces[1 + self.marker::stride].count(None)
        slots = _SLOTS * (matches - singles) + singles
        keys = list(filter(None, pieces))
        parts = self.longer_keys.split("".join(keys))
        # As bytes: deleting a kind from bytes is one table pass, from text a search per key.
        kinds = "".join(parts[0::2]).encode("latin-1").translate(self.kind_of_key)
        keyed_slots = len(kinds) + len(parts) // 2
        keyed_bytes = 0
        found = Counter()
        while kinds:
            kind = kinds[0]
            number = kinds.count(kind)
            name, size = self.one_byte_kinds[kind]
            found[name] += number
            keyed_bytes += number * size
            kinds = kinds.translate(None, bytes((kind,)))
        for key, number in Counter(parts[1::2]).items():
            name, packets, size = self.longer_key_type(key)
            found[name] += number * packets
            keyed_bytes += number * size
        if self.empty_key_search(data, start, end):
            # The empty captures: all but those of the splits (one before each match
            # and one after the last) and of the single-slot markers.
            empty = len(pieces) - pieces.count(None) - len(keys) - (matches + 1) - singles
            found[self.empty_type] += empty
            keyed_slots += empty
            keyed_bytes += empty * self.empty_size
        # The single-slot matches of the trailing bytes hold no slot's packet.
        slots -= len(trailing)
        if self.runs:  # a slot: a TNT-8 byte or a keyed packet
            tnt8 = slots - keyed_slots
            silent = (end - start - keyed_bytes - tnt8) // self.silent_size
            found[self.silent_type] += silent
            found["tnt8"] += tnt8
            return found, silent + keyed_slots
        silent = slots - keyed_slots
        found[self.silent_type] += silent
        found["tnt8"] += end - start - keyed_bytes - self.silent_size * silent
        return found, slots


_COUNTERS = {}  # variant: its _Counter, once built
# Compiling a variant's regex takes 0.1-0.17 s on Python 3.8; what a variant saves
# pays that back over tens of megabytes, so a shorter buffer keeps the one it has.
_PAYBACK = 32 << 20


def _counter(variant):
    if variant not in _COUNTERS:
        _COUNTERS[variant] = _Counter(variant)
    return _COUNTERS[variant]


def compile_counters():
    """Compile every packet_stats variant now (a process that counts much, a
    benchmark): otherwise each is compiled when first worth it."""
    for variant in (_PLAIN, _TIP_HEAVY, _MTC_CAPTURED, _MTC_SILENT):
        _counter(variant)


def _variant_for(found, slots):
    """The _Counter variant for a window like the one that gave ``found`` in ``slots``."""
    if 4 * found["mtc"] > slots:
        if 4 * found["tip"] <= slots:
            return _MTC_SILENT
        return _PLAIN if found[_EMPTY_KEYED] else _MTC_CAPTURED
    return _TIP_HEAVY if 3 * found["tnt8"] < slots else _PLAIN


def _count_tokens(stats, stream, stop):
    """Count ``stream``'s tokens into ``stats`` up to the first one at or after ``stop``
    or after an error (where the stream resynced); that token's offset, or None when
    the stream ends first."""
    counts = stats.counts
    resynced = False
    for kind, offset, value in stream:
        if offset >= stop or resynced:
            return offset
        if kind == K_TNT8_RUN:
            counts["tnt8"] += len(value)
        elif kind in IP_KIND_NAMES:
            counts[IP_KIND_NAMES[kind]] += 1
        elif kind == K_PAD_RUN:
            counts["pad"] += value
        elif kind == K_TNT64:
            counts["tnt64"] += 1
        elif kind == K_MODE or kind == K_OTHER:
            counts[value[0]] += 1
        elif kind == K_ERROR:
            stats.problems.add("ipt_packet_error", None, value, offset=offset)
            resynced = True
        else:
            counts[_SIMPLE_NAMES[kind]] += 1
    return None


def _long_runs(data, start, end):
    """(start, end, packet type) of each run of _LONG_RUN or more TNT-8 or PAD bytes
    in ``data[start:end]``, in order.

    PAD runs are found as they are.  TNT-8 bytes are any even byte from 4, so finding
    their runs means classifying bytes; only every (_LONG_RUN / 8)th byte is, and
    where 8 samples in a row are TNT-8 the stretch between their non-TNT-8
    neighbours is classified in full (a long run covers 8 samples at least)."""
    runs = []
    pad_run = bytes(_LONG_RUN)
    at = data.find(pad_run, start, end)
    while at >= 0:
        stop = _ZEROS.match(data, at, end).end()
        runs.append((at, stop, "pad"))
        at = data.find(pad_run, stop, end)
    step = _LONG_RUN // 8
    samples = data[start:end:step].translate(_RUN_BYTES)
    tnt_run = b"T" * _LONG_RUN
    sample = samples.find(b"T" * 8)
    while sample >= 0:
        past = _TNT_CLASSES.match(samples, sample).end()
        low, high = max(start, start + (sample - 1) * step), min(end, start + past * step)
        classes = data[low:high].translate(_RUN_BYTES)
        at = classes.find(tnt_run)
        while at >= 0:
            stop = _TNT_CLASSES.match(classes, at).end()
            runs.append((low + at, low + stop, "tnt8"))
            at = classes.find(tnt_run, stop)
        sample = samples.find(b"T" * 8, past)
    return sorted(runs)


def packet_stats(data, start=0, end=None):
    """Decode everything, keep only totals (what the benchmark times).

    The slot regex counts windows that end at a PSB or inside a long run.  A window
    with a byte that does not decode is counted again by the token loop up to that
    byte, which it reports, and counting goes on at the PSB where the loop resynced.
    Windows start small after an error and double with each clean one, up to a
    megabyte: corrupt buffers cost little more than the token loop, clean ones few
    windows.  Each window is counted by the _Counter variant that suits the window
    before it."""
    if end is None:
        end = len(data)
    end = min(end, len(data))
    stats = PacketStats(max(0, end - start))
    position = data.find(PSB, start, end)
    if position < 0:
        _count_tokens(stats, tokens(data, start, end), end)  # reports the missing PSB
        return stats
    counter = _counter(_PLAIN)
    runs = iter(_long_runs(data, position, end))
    run = next(runs, None)
    size = _FIRST_WINDOW
    while position is not None and position < end:
        while run is not None and run[0] < position:
            run = next(runs, None)
        window_end = data.find(PSB, position + size, end)
        if window_end < 0:
            window_end = end
        cut = run is not None and run[0] < window_end
        if cut:
            window_end = run[0] + _RUN_CUT
        counted = counter.count(data, position, window_end)
        if counted is not None:
            for name, number in counted[0].items():
                stats.counts[name] += number
            variant = _variant_for(*counted)
            if variant in _COUNTERS or end - window_end >= _PAYBACK:
                counter = _counter(variant)
            position = window_end
            size = min(2 * size, _WINDOW)
            if cut:
                stats.counts[run[2]] += run[1] - window_end
                position = run[1]
        else:
            position = _count_tokens(stats, tokens(data, position, end, at_packet=True), window_end)
            size = _FIRST_WINDOW
    return stats
