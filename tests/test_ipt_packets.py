"""Layer 1: the packet decoder, by hand-made cases and against libipt's encoder/decoder."""

import random

import pytest

import ipt_support as libipt
from dbgext.ipt import packets
from dbgext.ipt.packets import PSB, decode_packets, packet_stats

needs_libipt = pytest.mark.skipif(libipt.LIB is None, reason=libipt.SKIP_REASON)


def errors(decode):
    """(offset, message) of a decode's problems."""
    return [(problem.offset, problem.message) for problem in decode.problems]

PSBEND = b"\x02\x23"


def types(result):
    return [packet.type for packet in result.packets]


def test_every_packet_type_by_hand():
    trace = (PSB + b"\x99\x01" + b"\x7d\x78\x56\x34\x12\xff\x7f" + PSBEND  # mode.exec 64, fup sext48
             + b"\x1a" + b"\x2d\x34\x12"                                    # tnt8 TNT, tip 16-bit update
             + b"\x02\xa3\x01\x00\x50\x0e\x00\x00"                          # tnt64
             + b"\xc7\x67\x8b\x8d\x08"                                      # cyc 0x12345678
             + b"\x02\x22\x08\x35" + b"\x02\xa2\x12\x09\x00\x00\x00"          # pwre, pwrx
             + b"\x02\x92\x34\x12\x00\x00"                                  # ptw 4 bytes with ip
             + b"\x02\x73\x34\x12\x00\xff\x01"                              # tma
             + b"\x02\x43\x01\x45\x23\x01\x00\x00"                          # pip
             + b"\x02\xc8\x34\x12\x00\x00\x00"                              # vmcs
             + b"\x02\xc3\x88" + (99).to_bytes(8, "little")                 # mnt
             + b"\x02\xc2\x05\x00\x00\x00\x01\x00\x00\x00"                  # mwait
             + b"\x02\xe2" + b"\x02\x83" + b"\x02\xf3" + b"\x02\x03\x21\x00"   # exstop(ip), stop, ovf, cbr
             + b"\x19" + (12345).to_bytes(7, "little") + b"\x59\x07" + b"\x00"  # tsc, mtc, pad
             + b"\x99\x21" + b"\xd1\x00\x10\x00\x00\x00\x00\xff\xff"          # mode.tsx, tip.pge full ip
             + b"\x01")                                                     # tip.pgd suppressed
    result = decode_packets(trace)
    assert errors(result) == []
    assert types(result) == ["psb", "mode.exec", "fup", "psbend", "tnt8", "tip", "tnt64", "cyc", "pwre",
                             "pwrx", "ptw", "tma", "pip", "vmcs", "mnt", "mwait", "exstop", "stop", "ovf",
                             "cbr", "tsc", "mtc", "pad", "mode.tsx", "tip.pge", "tip.pgd"]
    by_type = {packet.type: packet.as_dict() for packet in result.packets}
    assert by_type["mode.exec"]["mode"] == "64bit"
    assert by_type["fup"] == {"offset": 18, "type": "fup", "ip": 0x7FFF12345678, "ipbytes": 3}
    assert by_type["tip"]["ip"] == 0x7FFF12341234  # upper bits from the last IP
    assert by_type["tnt8"]["bits"] == "TNT"
    assert by_type["tnt64"]["bits"] == "TTNNTNTNNNNNNNNNNNNNNNNNNNT"
    assert by_type["cyc"]["value"] == 0x12345678
    assert by_type["pwre"]["hw"] == 1 and by_type["pwre"]["state"] == 3
    assert by_type["pwrx"]["autonomous"] == 1 and by_type["pwrx"]["interrupt"] == 1
    assert by_type["ptw"]["size"] == 4 and by_type["ptw"]["ip"] == 1
    assert by_type["tma"]["fc"] == 0x1FF
    assert by_type["pip"] == {"offset": 68, "type": "pip", "cr3": 0x12345000, "nr": 1}
    assert by_type["vmcs"]["base"] == 0x1234000
    assert by_type["exstop"]["ip"] == 1
    assert by_type["mode.tsx"] == {"offset": by_type["mode.tsx"]["offset"], "type": "mode.tsx", "intx": 1,
                                   "abort": 0}
    assert by_type["tip.pge"]["ip"] == 0xFFFF000000001000
    assert by_type["tip.pgd"]["ip"] is None
    assert [p.size for p in result.packets][:6] == [16, 2, 7, 2, 1, 3]


def test_ip_decompression_follows_last_ip_and_psb_resets_it():
    trace = (PSB + b"\xdd" + (0xFFFFF80012345678).to_bytes(8, "little") + PSBEND
             + b"\x4d\x00\x00\x01\x00"          # tip 32-bit update
             + b"\x9d\x11\x22\x33\x44\x55\x66"  # fup 48-bit update, upper bits kept
             + PSB + b"\x2d\x34\x12")           # after PSB last IP is 0
    ips = [p.fields["ip"] for p in decode_packets(trace).packets if "ip" in p.fields]
    assert ips == [0xFFFFF80012345678, 0xFFFFF80000010000, 0xFFFF665544332211, 0x1234]


@pytest.mark.parametrize("ipbytes, payload, expected", [
    (1, 0x1234, 0xFFFFF80012341234),            # the low 16 bits replaced
    (2, 0x00010000, 0xFFFFF80000010000),        # the low 32 bits replaced
    (3, 0x800012345678, 0xFFFF800012345678),    # 48 bits sign-extended: bit 47 set
    (3, 0x7FFF12345678, 0x00007FFF12345678),    # bit 47 clear: the upper bits are zero
    (4, 0x665544332211, 0xFFFF665544332211),    # the low 48 bits replaced, the upper 16 kept
    (6, 0x0000000000401000, 0x0000000000401000),  # the whole IP
])
def test_ip_decompression_replaces_what_ipbytes_says_of_the_last_ip(ipbytes, payload, expected):
    assert packets.decompress_ip(ipbytes, payload, 0xFFFFF80012345678) == expected


def test_decoding_starts_at_first_psb():
    result = decode_packets(b"\x2d\x34" + PSB + b"\x06")
    assert result.packets[0].offset == 2 and types(result) == ["psb", "tnt8"]


def test_no_psb_is_an_error_not_a_crash():
    result = decode_packets(b"\x06\x06\x06")
    assert result.packets == [] and errors(result)[0][0] == 0 and "no PSB" in errors(result)[0][1]


def test_reserved_ipbytes_reports_offset_and_resyncs_at_next_psb():
    trace = PSB + b"\xad\x01\x02" + b"\x06" + PSB + b"\x0a"
    result = decode_packets(trace)
    assert errors(result) == [(16, "tip with reserved IPBytes 5")]
    assert types(result) == ["psb", "psb", "tnt8"]
    assert result.packets[1].offset == 20


@pytest.mark.parametrize("tail, message", [
    (b"\x19\x01\x02", "truncated packet (3 of 8 bytes)"),
    (b"\xdd\x01", "truncated packet (2 of 9 bytes)"),
    (b"\x02", "truncated extended packet (1 byte left)"),
    (b"\x02\xa3\x01", "truncated packet (3 of 8 bytes)"),
    (b"\x07\x01", "truncated cyc packet (2 bytes left)"),
    (b"\x02\x99", "unknown extended opcode 02 99"),
    (b"\x39", "unknown opcode 39"),
])
def test_bad_packets_at_the_end(tail, message):
    result = decode_packets(PSB + b"\x06" + tail)
    assert types(result) == ["psb", "tnt8"]
    assert errors(result) == [(17, message)]


def test_random_bytes_terminate_with_errors_and_never_read_past_the_end():
    generator = random.Random(5)
    for _ in range(50):
        data = bytes(generator.getrandbits(8) for _ in range(300))
        data = data[:100] + PSB + data[100:]
        result = decode_packets(data)
        assert all(p.offset + p.size <= len(data) for p in result.packets)
        stats = packet_stats(data)
        assert stats.packets == len(result.packets) and len(errors(stats)) == len(errors(result))


def test_range_and_max_packets():
    trace = PSB + b"\x06" * 10
    assert len(decode_packets(trace, end=20).packets) == 5
    limited = decode_packets(trace, max_packets=3)
    assert len(limited.packets) == 3 and limited.truncated


def test_stats_count_runs():
    stats = packet_stats(PSB + b"\x06" * 7 + b"\x00" * 3 + PSBEND)
    assert stats.as_dict() == {"bytes": 28, "packets": 12,
                               "types": {"pad": 3, "tnt8": 7, "psb": 1, "psbend": 1}, "errors": 0}


# -- differential against libipt ------------------------------------------------------

def random_packets(generator, count):
    """Random well-formed pt_packets for libipt's encoder."""
    result = [libipt.packet("psb"), libipt.packet("psbend")]
    for _ in range(count):
        kind = generator.choice(["tnt8", "tnt64", "tip", "fup", "tip.pge", "tip.pgd", "pad", "mode", "pip",
                                 "tsc", "mtc", "cyc", "cbr", "tma", "vmcs", "ovf", "stop", "mnt", "exstop",
                                 "mwait", "pwre", "pwrx", "ptw", "psb", "psbend"])
        if kind == "tnt8":
            result.append(libipt.packet(kind, bits="".join(generator.choice("TN") for _ in range(
                generator.randint(1, 6)))))
        elif kind == "tnt64":
            result.append(libipt.packet(kind, bits="".join(generator.choice("TN") for _ in range(
                generator.randint(1, 47)))))
        elif kind in ("tip", "fup", "tip.pge", "tip.pgd"):
            ipc = generator.choice([0, 1, 2, 3, 4, 6])
            width = {0: 0, 1: 16, 2: 32, 3: 48, 4: 48, 6: 64}[ipc]
            ip = generator.getrandbits(width) if width else 0  # getrandbits(0) raises before 3.9
            result.append(libipt.packet(kind, ipc=ipc, ip=ip))
        elif kind == "mode":
            leaf = generator.choice([0, 0x20])
            result.append(libipt.packet(kind, leaf=leaf, bits=generator.choice([1, 2, 0, 5]) if leaf == 0
                                        else generator.randint(0, 3)))
        elif kind == "pip":
            result.append(libipt.packet(kind, cr3=generator.getrandbits(47) << 5, nr=generator.randint(0, 1)))
        elif kind in ("tsc",):
            result.append(libipt.packet(kind, value=generator.getrandbits(56)))
        elif kind == "cyc":
            result.append(libipt.packet(kind, value=generator.getrandbits(generator.randint(1, 40))))
        elif kind == "vmcs":
            result.append(libipt.packet(kind, value=generator.getrandbits(40) << 12))
        elif kind == "mnt":
            result.append(libipt.packet(kind, value=generator.getrandbits(64)))
        elif kind in ("cbr", "mtc"):
            result.append(libipt.packet(kind, value=generator.getrandbits(8)))
        elif kind == "tma":
            result.append(libipt.packet(kind, ctc=generator.getrandbits(16), fc=generator.getrandbits(9)))
        elif kind == "exstop":
            result.append(libipt.packet(kind, ip=generator.randint(0, 1)))
        elif kind == "mwait":
            result.append(libipt.packet(kind, hints=generator.getrandbits(32), ext=generator.getrandbits(32)))
        elif kind == "pwre":
            result.append(libipt.packet(kind, state=generator.getrandbits(4), sub_state=generator.getrandbits(4),
                                        hw=generator.randint(0, 1)))
        elif kind == "pwrx":
            result.append(libipt.packet(kind, last=generator.getrandbits(4), deepest=generator.getrandbits(4),
                                        interrupt=generator.randint(0, 1), store=generator.randint(0, 1),
                                        autonomous=generator.randint(0, 1)))
        elif kind == "ptw":
            plc = generator.randint(0, 1)
            result.append(libipt.packet(kind, plc=plc, payload=generator.getrandbits(32 << plc),
                                        ip=generator.randint(0, 1)))
        else:
            result.append(libipt.packet(kind))
    return result


def as_libipt(packet):
    """Our packet in libipt's packet-decoder terms (raw IP payloads, mode as leaf+bits)."""
    fields = packet.fields
    name = packet.type
    if name in ("tip", "fup", "tip.pge", "tip.pgd"):
        return name, {"ipc": fields["ipbytes"]}
    if name.startswith("mode."):
        if name == "mode.exec":
            return "mode", {"leaf": 0, "bits": fields["csl"] | fields["csd"] << 1 | fields["if"] << 2}
        return "mode", {"leaf": 0x20, "bits": fields["intx"] | fields["abort"] << 1}
    renamed = {"tsc": "tsc", "cyc": "value", "mtc": "ctc", "cbr": "ratio", "vmcs": "base", "mnt": "payload"}
    if name in renamed and name != "tsc":
        return name, {"value": fields[renamed[name]]}
    if name == "tsc":
        return name, {"value": fields["tsc"]}
    if name == "ptw":
        return name, {"payload": fields["payload"], "plc": 0 if fields["size"] == 4 else 1, "ip": fields["ip"]}
    return name, dict(fields)


def libipt_view(packets):
    view = []
    for offset, name, fields in packets:
        if name in ("tip", "fup", "tip.pge", "tip.pgd"):
            fields = {"ipc": fields["ipc"]}
        view.append((offset, name, fields))
    return view


@needs_libipt
@pytest.mark.parametrize("seed", range(8))
def test_random_streams_decode_like_libipt(seed):
    generator = random.Random(seed)
    trace = libipt.encode(random_packets(generator, 400))
    ours = decode_packets(trace)
    theirs, their_errors = libipt.decode_packets(trace)
    assert errors(ours) == [] and their_errors == []
    assert [(p.offset,) + as_libipt(p) for p in ours.packets] == libipt_view(theirs)


@needs_libipt
def test_decompressed_ips_match_libipt_payloads():
    generator = random.Random(99)
    trace = libipt.encode(random_packets(generator, 600))
    last_ip = 0
    expected = []
    for _, name, fields in libipt.decode_packets(trace)[0]:
        if name in ("psb", "ovf"):
            last_ip = 0
        if name in ("tip", "fup", "tip.pge", "tip.pgd"):
            ipc, payload = fields["ipc"], fields["payload"]
            if ipc == 0:
                expected.append(None)
                continue
            if ipc == 3:
                last_ip = payload | (0xFFFF << 48) if payload >> 47 & 1 else payload
            else:
                keep = {1: ~0xFFFF, 2: ~0xFFFFFFFF, 4: ~0xFFFFFFFFFFFF, 6: 0}[ipc]
                last_ip = (last_ip & keep & 0xFFFFFFFFFFFFFFFF) | payload
            expected.append(last_ip)
    ours = [p.fields["ip"] for p in decode_packets(trace).packets if p.type in ("tip", "fup", "tip.pge", "tip.pgd")]
    assert ours == expected


@needs_libipt
@pytest.mark.parametrize("seed", range(6))
def test_corrupted_streams_resync_like_libipt(seed):
    generator = random.Random(100 + seed)
    trace = bytearray(libipt.encode(random_packets(generator, 300)))
    for _ in range(6):
        trace[generator.randrange(len(trace))] = generator.getrandbits(8)
    trace = bytes(trace)
    ours = decode_packets(trace)
    theirs, their_errors = libipt.decode_packets(trace)
    assert [(p.offset,) + as_libipt(p) for p in ours.packets] == libipt_view(theirs)
    assert [offset for offset, _ in errors(ours)] == [offset for offset, _ in their_errors]


def count_types(result):
    counts = {}
    for packet in result.packets:
        counts[packet.type] = counts.get(packet.type, 0) + 1
    return counts


@needs_libipt
@pytest.mark.parametrize("seed", range(4))
def test_fast_stats_agree_with_the_full_decode(seed):
    trace = libipt.encode(random_packets(random.Random(200 + seed), 500))
    assert packet_stats(trace).as_dict()["types"] == count_types(decode_packets(trace))


def test_stats_of_a_corrupt_buffer_report_errors_like_the_full_decode():
    trace = PSB + b"\x06\x0a" + b"\xad\x01" + PSB + b"\x99\x01\x00\x00"
    stats = packet_stats(trace)
    assert errors(stats) == errors(decode_packets(trace)) == [(18, "tip with reserved IPBytes 5")]
    assert stats.as_dict()["types"] == count_types(decode_packets(trace))


@pytest.mark.parametrize("body", [
    b"\x06" * 5,                               # ends in a TNT-8 run
    b"\x06\x2d\x01\x02",                       # ends on a keyed packet
    b"\x06\x19\x01\x02",                       # truncated TSC at the end
    b"\x06\x02\xa3\x00\x00\x00\x00\x00\x00\x06",  # TNT-64 without stop bit
    b"\x02\xc3\x77" + b"\x00" * 8,             # MNT with a wrong third byte
    b"\x39\x06" + PSB + b"\x06",               # undefined opcode, then resync
    b"\x04" * 200000,                          # one long TNT-8 run
    b"\x07\x01\x03\x05",                       # CYC whose last byte says "more"
])
def test_fast_stats_edge_cases_agree_with_the_full_decode(body):
    trace = PSB + body
    full = decode_packets(trace)
    stats = packet_stats(trace)
    assert stats.as_dict()["types"] == count_types(full)
    assert errors(stats) == errors(full)


# Hand-encoded packets, weighted like real traces: mostly the kinds packet_stats counts
# without capturing (TNT-8, TIP with two IP bytes), between every other shape of key.
STREAM_PIECES = [
    (30, lambda g: bytes([g.randrange(4, 256, 2)])),                               # tnt8
    (1, lambda g: bytes(g.randrange(4, 256, 2) for _ in range(g.choice([15, 63, 64, 65, 200])))),  # tight loops
    (1, lambda g: bytes(g.choice([63, 64, 65, 300]))),                              # long PAD runs
    (20, lambda g: b"\x2d" + bytes(g.getrandbits(8) for _ in range(2))),          # tip, 2 IP bytes
    (8, lambda g: b"\x59" + bytes([g.getrandbits(8)])),                            # mtc
    (4, lambda g: b"\x00" * g.randint(1, 5)),                                      # pad runs, back to back too
    (3, lambda g: g.choice([b"\x3d", b"\x21", b"\x31"]) + bytes(2)),  # FUP, TIP.PGD, TIP.PGE with 2 IP bytes
    (2, lambda g: g.choice([b"\x01", b"\x0d", b"\x11", b"\x1d"])),                   # suppressed IPs
    (1, lambda g: g.choice([b"\x6d", b"\x7d"]) + bytes(6)),                        # 6 IP bytes
    (3, lambda g: bytes([g.choice([0x4d, 0x51, 0x41, 0x5d])]) + bytes(4)),          # 4-byte IP packets
    (3, lambda g: g.choice([b"\x03", b"\x0b", b"\x07\x02", b"\x07\x01\x03\x00",  # CYC of 1 to 9 bytes
                            b"\x0f" + b"\x01" * 7 + b"\x02"])),
    (2, lambda g: b"\x99" + bytes([g.choice([0x00, 0x01, 0x02, 0x23, 0x21])])),     # mode, payloads like keys
    (2, lambda g: b"\x19" + bytes(7)),                                             # tsc
    (1, lambda g: PSB + PSBEND),
    (1, lambda g: b"\x02\xf3"),                                                    # ovf
    (1, lambda g: b"\x02\x73\x34\x12\x00\x56\x01"),                                # tma
    (1, lambda g: b"\x02\xa3\x01\x00\x50\x0e\x00\x00"),                            # tnt64
]


def random_stream(generator, count):
    weights = [weight for weight, _ in STREAM_PIECES]
    makers = [make for _, make in STREAM_PIECES]
    return PSB + b"".join(generator.choices(makers, weights)[0](generator) for _ in range(count))


@pytest.mark.parametrize("variant", [packets._PLAIN, packets._MTC_CAPTURED, packets._TIP_FIRST, packets._TIP_RUNS,
                                     packets._MTC_SILENT])
@pytest.mark.parametrize("window, long_run", [(61, 64), (250, 4096), (1 << 20, 64), (1 << 20, 4096)])
@pytest.mark.parametrize("seed", range(12))
def test_counts_agree_with_the_full_decode_across_windows_and_corruption(monkeypatch, seed, window, long_run,
                                                                          variant):
    counter = packets._counter
    monkeypatch.setattr(packets, "_counter", lambda _: counter(variant))  # each variant on every window
    monkeypatch.setattr(packets, "_WINDOW", window)  # many windows, each ending at a PSB
    monkeypatch.setattr(packets, "_FIRST_WINDOW", min(window, packets._FIRST_WINDOW))
    monkeypatch.setattr(packets, "_LONG_RUN", long_run)  # runs counted apart, the windows cut at them
    generator = random.Random(300 + seed)
    trace = bytearray(random_stream(generator, 3000))
    for _ in range(seed % 4 * 3):  # none, then 3, 6, 9 corrupted bytes
        trace[generator.randrange(len(trace))] = generator.getrandbits(8)
    trace = bytes(trace[:len(trace) - seed % 3])  # and a last packet cut short
    start = generator.randrange(20) if seed % 2 else 0
    full = decode_packets(trace, start)
    stats = packet_stats(trace, start)
    assert stats.as_dict()["types"] == count_types(full)
    assert errors(stats) == errors(full)


@pytest.mark.parametrize("payback, variants", [(1 << 30, {packets._PLAIN}),
                                                (0, {packets._PLAIN, packets._MTC_CAPTURED})])
def test_a_variant_is_compiled_only_for_a_buffer_long_enough_to_win_its_compile_back(monkeypatch, payback,
                                                                                       variants):
    monkeypatch.setattr(packets, "_COUNTERS", {})
    monkeypatch.setattr(packets, "_PAYBACK", payback)
    generator = random.Random(7)
    timed = PSB + PSBEND + b"".join(b"\x59" + bytes([generator.getrandbits(8)]) + b"\x2d\x01\x02"
                                    for _ in range(20000))  # MTCs are half the slots
    stats = packet_stats(timed)
    assert set(packets._COUNTERS) == variants
    assert stats.as_dict()["types"] == count_types(decode_packets(timed))


def test_counts_without_any_psb_report_it():
    stats = packet_stats(b"\x06\x2d\x01\x02")
    assert stats.packets == 0 and errors(stats) == [(0, "no PSB in the 4 bytes from offset 0")]


@needs_libipt
@pytest.mark.parametrize("reserved, shown", [
    (b"\x02\x73\x34\x12\x00\x56\x03", "005603"),   # a reserved bit next to FC[8]
    (b"\x02\x73\x34\x12\x80\x56\x01", "805601")])  # the reserved byte between CTC and FC
def test_tma_with_reserved_bits_is_rejected_like_libipt(reserved, shown):
    valid = b"\x02\x73\x34\x12\x00\x56\x01"     # CTC 0x1234, FC 0x156
    trace = PSB + valid + b"\x02\x23" + reserved + PSB + b"\x02\x23"
    ours = decode_packets(trace)
    theirs, their_errors = libipt.decode_packets(trace)
    assert [offset for offset, _ in errors(ours)] == [offset for offset, _ in their_errors] == [25]
    assert "tma packet with reserved bits set (%s)" % shown in errors(ours)[0][1]
    assert [p.fields for p in ours.packets if p.type == "tma"] == [{"ctc": 0x1234, "fc": 0x156}]
    assert errors(packet_stats(trace)) == errors(ours)


def test_newer_packets_cfe_evd_trig_are_decoded_with_their_own_field_names():
    cfe = b"\x02\x13\x81\x0e"                               # CFE: IP bit, type 1 (INTR), vector 14
    evd = b"\x02\x53\x01" + (0x1234).to_bytes(8, "little")  # EVD: type 1, payload 0x1234
    trig = b"\xd9\x00\x01"                                  # TRIG: TRBV 1, no flags: 3 bytes
    trig_icnt = b"\xd9\xe0\xa1\x10\x00"                     # TRIG: IP, ICNT (16), MULT flags; TRBV a1
    trace = PSB + b"\x02\x23" + cfe + evd + trig + trig_icnt + b"\x04"
    result = decode_packets(trace)
    assert errors(result) == []
    assert [(p.type, p.size, p.fields) for p in result.packets[2:6]] == [
        ("cfe", 4, {"cfe_type": 1, "vector": 14, "ip": 1}), ("evd", 11, {"evd_type": 1, "payload": 0x1234}),
        ("trig", 3, {"trbv": 1, "ip": 0, "mult": 0, "icnt": None}),
        ("trig", 5, {"trbv": 0xA1, "ip": 1, "mult": 1, "icnt": 16})]
    assert [p.type for p in result.packets[6:]] == ["tnt8"]  # the next packet right after each TRIG
    # The payload's own type never replaces the packet's in the JSON row.
    assert [p.as_dict()["type"] for p in result.packets[2:4]] == ["cfe", "evd"]
    stats = packet_stats(trace)
    assert errors(stats) == [] and (stats.counts["cfe"], stats.counts["evd"], stats.counts["trig"]) == (1, 1, 2)
    assert stats.counts["tnt8"] == 1


def test_a_trig_cut_short_is_reported_with_the_size_its_flags_give():
    for trig, need in ((b"\xd9\x00", 3), (b"\xd9\x40\x01\x02", 5)):
        result = decode_packets(PSB + b"\x02\x23" + trig)
        assert errors(result) == [(18, "truncated packet (%d of %d bytes)" % (len(trig), need))]
        assert errors(packet_stats(PSB + b"\x02\x23" + trig)) == errors(result)


@pytest.mark.parametrize("body", [
    b"\x02\x23" + b"\x2d\x01\x02" * 70 + b"\x00" * 100000,   # the unwritten end of a buffer
    b"\x02\x23" + b"\x06" * 100000 + b"\x2d\x01\x02" * 70,   # a tight loop
    b"\x02\x23" + b"\x2d\x01\x02" * 70 + b"\x06" * 100000,
])
def test_counting_long_runs_agrees_with_the_full_decode(body):
    trace = PSB + body
    assert packet_stats(trace).as_dict() == {
        "bytes": len(trace), "packets": len(decode_packets(trace).packets),
        "types": count_types(decode_packets(trace)), "errors": 0}


def test_a_packet_read_into_a_psb_resyncs_at_that_psb_in_the_listing_and_the_flow():
    """02 c3 88 starts an MNT that takes 8 bytes of the PSB after it; the byte after the
    MNT does not decode, and decoding resumes at the PSB that holds it (as libipt)."""
    from dbgext.ipt.flow import CodeImage, decode_flow
    fup = b"\x7d\x00\x10\x00\xa0\x00\x00"  # FUP, IPBytes 3: a0001000
    trace = PSB + b"\x02\xc3\x88" + PSB + fup + b"\x02\x23"
    listed = decode_packets(trace)
    assert [p.type for p in listed.packets] == ["psb", "mnt", "psb", "fup", "psbend"]
    assert [p.offset for p in listed.packets][2] == 19
    assert [offset for offset, _ in errors(listed)] == [27]
    flow = decode_flow(trace, CodeImage(images=[(0xA0001000, b"\x90" * 4 + b"\xff\xe0")]))
    assert [(event[1], event[3]) for event in flow.events] == [("sync", 0xA0001000)]
    assert [problem.kind for problem in flow.problems] == ["ipt_packet_error"]


def test_every_packet_type_has_the_name_intel_ptdump_prints():
    assert set(packets.PTDUMP_NAMES) == set(packets.PACKET_TYPES)
    assert packets.PTDUMP_NAMES["tnt8"] == "tnt.8" and packets.PTDUMP_NAMES["tnt64"] == "tnt.64"
    assert packets.PTDUMP_NAMES["tip.pge"] == "tip.pge"


def test_the_tokenizer_tries_the_packet_tables_rows_in_their_order():
    """TNT-8 runs first, then the one-byte packets, then the extended packets behind 0x02."""
    rows = [row[0] for row in packets.ONE_BYTE_PACKETS + packets.EXTENDED_PACKETS]
    groups = sorted((index, name) for name, index in packets.PACKET_RE.groupindex.items())
    assert [name for _, name in groups] == ["tnt8"] + rows + ["bad"]
