"""The packet tables (ONE_BYTE_PACKETS, EXTENDED_PACKETS) are the one grammar: the
tokenizer, the counter and the flow's tokenizer and first-byte dispatch all come
from them, so a packet is added by adding a row."""

import re
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from dbgext.ipt import flow
from dbgext.ipt import packets as P

PSB_PLUS = P.PSB + b"\x02\x23"
TNT8 = b"\x04"  # one TNT-8 packet: something that no row's packet runs into

# Two packets no table has: one behind an unused one-byte opcode (05 is no IP packet:
# its low five bits are none of IP_TYPES'), one behind an unused extended opcode (02 33).
FAKE_ONE_BYTE = P.OneBytePacket("fake", "fake", "fake", (0x05,), None, b"..", 3, P.FLOW_TIMING,
                                lambda data, at: {"value": data[at + 1]})
FAKE_EXTENDED = P.ExtendedPacket("fake_ext", "fake_ext", "fake-ext", (0x33,), 5, b"...",
                                 lambda data, at: {"value": data[at + 2]})
ONE_BYTE_ROWS = P.ONE_BYTE_PACKETS + (FAKE_ONE_BYTE,)
EXTENDED_ROWS = P.EXTENDED_PACKETS + (FAKE_EXTENDED,)
FAKES = b"\x05\x10\x20" + b"\x2d\x01\x02" + b"\x02\x33\x07\x08\x09" + b"\x59\x01" + b"\x06" * 3


def packet_of(row, data):
    """A packet of the row ``row`` (drawn from its regex)."""
    if isinstance(row, P.OneBytePacket):
        pattern = P.one_byte_key(row) + row.rest
    else:
        pattern = P._class_of([P.EXTENDED_OPCODE]) + P._class_of(row.seconds) + row.rest
    return data.draw(st.from_regex(re.compile(pattern, re.DOTALL), fullmatch=True), label=row.name)


def json_types(row, packet):
    """The JSON types the decoder lists for ``packet`` of the row ``row``."""
    if isinstance(row, P.ExtendedPacket):
        return [row.type]
    if row.type == "pad":
        return ["pad"] * len(packet)
    return [P.row_type(row, packet)]


@settings(max_examples=25)
@given(data=st.data())
def test_every_packet_of_the_tables_is_listed_counted_and_read_by_the_flow(data):
    for row in P.ONE_BYTE_PACKETS + P.EXTENDED_PACKETS:
        packet = packet_of(row, data)
        trace = PSB_PLUS + packet + TNT8
        listed = P.decode_packets(trace)
        assert [p.type for p in listed.packets] == ["psb", "psbend"] + json_types(row, packet) + ["tnt8"], row.name
        assert not list(listed.problems), row.name
        stats = P.packet_stats(trace)
        assert stats.as_dict()["types"] == dict(Counter(p.type for p in listed.packets)), row.name
        # The flow's tokenizer reads every byte (its last column is a byte that is no packet).
        pieces = flow._token_regex().split(trace)
        assert set(pieces[1 + flow._BAD_COLUMN::flow._token_regex().groups + 1]) == {None}, row.name
        assert flow._FIRST_BYTE[packet[0]] != flow._UNUSED, row.name


def test_a_packet_added_to_the_tables_is_tokenized_counted_and_read_by_the_flow():
    trace = PSB_PLUS + FAKES
    tokenizer = P._build_pattern(ONE_BYTE_ROWS, EXTENDED_ROWS)[0]
    assert [match.lastgroup for match in tokenizer.finditer(trace)] == [
        "psb", "psbend", "fake", "ip2", "fake_ext", "mtc", "tnt8"]
    for variant in (P._PLAIN, P._MTC_CAPTURED, P._TIP_FIRST, P._MTC_SILENT):
        counter = P._Counter(variant, ONE_BYTE_ROWS, EXTENDED_ROWS)
        found, _ = counter.count(trace, 0, len(trace))
        assert {name: count for name, count in found.items() if count} == {
            "psb": 1, "psbend": 1, "fake": 1, "tip": 1, "fake_ext": 1, "mtc": 1, "tnt8": 3}, variant
    # The flow reads the one-byte packet as a timing packet, inside the TNT-8 run after it.
    assert flow.first_byte_table(ONE_BYTE_ROWS)[0x05] == flow._RUN
    assert flow.first_byte_table(P.ONE_BYTE_PACKETS)[0x05] == flow._UNUSED
    tokens = flow.token_regex(ONE_BYTE_ROWS, EXTENDED_ROWS).split(trace)
    assert [token for token in tokens if token] == [
        P.PSB, b"\x02\x23", b"\x05\x10\x20", b"\x2d\x01\x02", b"\x02\x33\x07\x08\x09", b"\x59\x01\x06\x06\x06"]


def test_every_first_byte_starts_at_most_one_kind_of_counter_key():
    """The counter tells its keys apart in the joined captures by their first byte: a
    byte names one packet, or starts the two-byte keys, or a whole-packet key, or PAD."""
    one_byte, two_byte, whole = P.count_keys(P.ONE_BYTE_PACKETS, P.EXTENDED_PACKETS)
    two_byte_firsts = set(key[0] for key in two_byte)
    kinds = [set(one_byte), two_byte_firsts, set(whole), {0x00}]
    assert sum(len(kind) for kind in kinds) == len(set().union(*kinds))
    assert not set().union(*kinds) & P._TNT8  # TNT-8 bytes are never captured
