"""Layer 3: instruction flow, against the tracer's own path and libipt's decoder."""

import os
import random

import pytest

import ipt_support as libipt
import ipt_tracer as T
from dbgext.ipt import fixtures as F
from dbgext.ipt import flow
from dbgext.ipt import packets as P
from dbgext.ipt.flow import CodeImage, FlowDecoder, decode_flow
from dbgext.ipt.packets import PSB
from dbgext.sample.scenario import Scenario

needs_libipt = pytest.mark.skipif(libipt.LIB is None, reason=libipt.SKIP_REASON)

BASE = 0xFFFFF80012341000
SAMPLE = F.sample_program(BASE)
RANDOM = T.random_program(BASE, functions=80, seed=4)


def image(program):
    return CodeImage(images=[(program.base, program.code)])


def ours(trace, program=SAMPLE, **options):
    return decode_flow(trace, image(program), **options)


def theirs(trace, program=SAMPLE):
    return libipt.instruction_flow(trace, {program.base: program.code})


TRACE_SHAPES = [
    {},
    {"interrupt_every": 25},
    {"uncompressed_ret_every": 3, "psb_every": 48},
    {"use_tnt64": True, "timing": True},
    {"taken_probability": 0.9, "interrupt_every": 60, "psb_every": 100},
]


@pytest.mark.parametrize("shape", TRACE_SHAPES)
def test_sample_program_follows_the_traced_path(shape):
    trace, expected = T.trace_program(SAMPLE, 400, seed=11, **shape)
    result = ours(trace)
    assert result.problems == []
    assert result.instructions == expected


@needs_libipt
@pytest.mark.parametrize("shape", TRACE_SHAPES)
@pytest.mark.parametrize("seed", [1, 2])
def test_random_programs_match_libipt_line_for_line(shape, seed):
    trace, expected = T.trace_program(RANDOM, 3000, seed=seed, **shape)
    ips, errors = theirs(trace, RANDOM)
    result = ours(trace, RANDOM)
    assert errors == [] and result.problems == []
    assert result.instructions == ips == expected


def test_call_to_next_instruction_is_not_a_call():
    """Checksum starts with call $+5; pop rax: its RET must return to ValidateRequest."""
    trace, expected = T.trace_program(SAMPLE, 200, seed=5, taken_probability=0.0)
    checksum = SAMPLE.labels["Checksum"]
    assert checksum in expected
    assert ours(trace).instructions == expected


def writer_at(ip):
    writer = T.PacketWriter()
    writer.psb_plus(ip)
    return writer


def test_compressed_ret_with_not_taken_bit_is_an_error_and_a_warning():
    # Dispatch -> ValidateRequest (jbe taken) -> ret compressed, but the bit says not taken.
    writer = writer_at(SAMPLE.entry)
    writer.tnt(True)    # jbe ValidateRequest_small taken
    writer.tnt(False)   # the RET: a not-taken bit
    result = ours(writer.bytes())
    assert [(problem.kind, problem.address) for problem in result.problems] == [
        ("ipt_flow_error", SAMPLE.labels["ValidateRequest_small"] + 1)]
    assert "not-taken bit: the reconstruction went wrong" in result.problems[0].message


@needs_libipt
def test_compressed_ret_with_empty_return_stack_matches_libipt():
    writer = writer_at(SAMPLE.labels["Checksum_done"])
    writer.tnt(True)
    trace = writer.bytes()
    result = ours(trace)
    assert "empty return stack" in result.problems[0].message
    # as ptxed: libipt had decoded the RET when popping its return address failed
    assert result.instructions == theirs(trace)[0] == [SAMPLE.labels["Checksum_done"]]


@needs_libipt
def test_interrupt_fup_tip_lands_in_the_handler_and_returns():
    writer = writer_at(SAMPLE.entry)
    validate = SAMPLE.labels["ValidateRequest"]
    writer.fup(validate + 1)  # interrupted after push rbx
    writer.tip(SAMPLE.interrupt_handler)
    writer.tip(validate + 1)  # iretq
    writer.tnt(False)
    trace = writer.bytes()
    result = ours(trace)
    assert result.problems == []
    assert result.instructions[:4] == [SAMPLE.entry, SAMPLE.entry + 4, SAMPLE.entry + 9, validate]
    assert result.instructions[4:7] == [SAMPLE.interrupt_handler, SAMPLE.interrupt_handler + 1,
                                        SAMPLE.interrupt_handler + 2]
    assert result.instructions[7] == validate + 1
    assert result.instructions == theirs(trace)[0]


@needs_libipt
def test_overflow_drops_straight_line_code_and_resumes_at_fup():
    writer = writer_at(SAMPLE.entry)
    writer.tnt(True)          # jbe taken; then pop rbx; ret ... walked but not confirmed
    writer.ovf()
    writer.fup(SAMPLE.labels["Dispatch_skip"])
    writer.tnt(False)         # jnz not taken
    trace = writer.bytes()
    result = ours(trace)
    ips, errors = theirs(trace)
    assert result.problems == [] and errors == []
    validate_small = SAMPLE.labels["ValidateRequest_small"]
    assert validate_small not in result.instructions  # straight-line code before the OVF is dropped
    assert result.instructions == ips
    assert result.instructions[-2:] == [SAMPLE.labels["Dispatch_skip"], SAMPLE.labels["Dispatch_skip"] + 2]


@needs_libipt
def test_tracing_enabled_by_tip_pge_and_disabled_by_tip_pgd():
    writer = T.PacketWriter()
    writer.psb_plus(None)               # PSB+ without FUP: tracing is off
    writer.ip_packet(0x11, SAMPLE.labels["CompleteRequest"])  # TIP.PGE
    writer.tnt(True)                    # ... would be a compressed RET: stack empty
    trace = writer.bytes()
    assert ours(trace).instructions == theirs(trace)[0]
    writer = T.PacketWriter()
    writer.psb_plus(None)
    writer.ip_packet(0x11, SAMPLE.entry)
    writer.tnt(True)                    # jbe taken: no Checksum
    writer.tnt(True)                    # ret
    writer.tnt(False)                   # jz not taken: the indirect call follows
    writer.pgd(0xFFFFF80099990000)      # off at the indirect call: its target is outside the filter
    trace = writer.bytes()
    result = ours(trace)
    assert result.problems == []
    assert result.instructions == theirs(trace)[0]


def test_tnt_bits_with_no_branch_to_consume_them_are_an_error():
    writer = writer_at(SAMPLE.labels["CompleteRequest"])
    writer.tnt(True)
    writer.tnt(True)      # one for a RET that has no call, the next never used
    writer.tip(SAMPLE.entry)
    result = ours(writer.bytes())
    assert result.problems and "empty return stack" in result.problems[0].message
    assert result.instructions == SAMPLE_COMPLETE_REQUEST_BODY  # up to the RET, which libipt decoded


SAMPLE_COMPLETE_REQUEST_BODY = [SAMPLE.labels["CompleteRequest"] + offset for offset in (0, 7, 14, 15)]


@needs_libipt
def test_tip_where_a_tnt_bit_is_needed_reports_offset():
    writer = writer_at(SAMPLE.entry)
    writer.tip(SAMPLE.entry)
    trace = writer.bytes()
    result = ours(trace)
    branch = SAMPLE.labels["ValidateRequest_small"] - 13
    assert [(p.kind, p.offset, p.address, p.message) for p in result.problems] == [
        ("ipt_flow_error", 27, branch, "expected a TNT bit for the conditional branch at 0x%x, found tip" % branch)]
    # as ptxed: what was walked stays, the branch too (libipt decoded it, then its query failed)
    assert result.instructions == theirs(trace)[0]


def test_decoding_resumes_at_the_next_psb_after_an_error():
    bad = writer_at(SAMPLE.entry)
    bad.tip(SAMPLE.entry)
    good, expected = T.trace_program(SAMPLE, 100, seed=3)
    before_error = ours(bad.bytes()).instructions
    result = ours(bad.bytes() + good)
    assert len(result.problems) == 1
    assert result.instructions == before_error + expected


def test_max_insns_caps_the_listing_not_the_decode():
    trace, expected = T.trace_program(RANDOM, 2000, seed=9)
    result = ours(trace, RANDOM, max_insns=100)
    assert result.instructions == expected[:100] and result.truncated
    assert result.instruction_count == len(expected)


def test_a_sink_gets_every_instruction_in_chunks():
    trace, expected = T.trace_program(RANDOM, 3000, seed=9)
    chunks = []
    result = FlowDecoder(image(RANDOM)).decode(trace, max_insns=0, sink=chunks.append)
    assert result.instructions == [] and result.instruction_count == len(expected)
    assert [ip for chunk in chunks for ip in chunk] == expected


def test_unreadable_code_page_is_reported_with_its_address_and_keeps_what_decoded():
    scenario = Scenario("x64", "kernel")
    scenario.add_module("demo", SAMPLE.base - 0x1000, 0x3000)
    scenario.write(SAMPLE.base, SAMPLE.code)
    scenario.unmap(SAMPLE.base, 1)  # the code page is gone from the dump
    trace, _ = T.trace_program(SAMPLE, 100, seed=3)
    result = decode_flow(trace, CodeImage(scenario.target()))
    assert result.instructions == []
    assert [(p.kind, p.address, p.severity) for p in result.problems] == [("ipt_gap", SAMPLE.entry, "warning")]
    assert "0x%x is unreadable" % SAMPLE.entry in result.problems[0].message


def test_code_in_memory_beats_the_file_for_import_optimized_calls():
    """The file has call [__imp_X] (needs a TIP); memory has mov r10,[__imp_X]; call X."""
    base = 0xFFFFF80020001000
    target_function = base + 0x100
    file_code = bytearray(b"\x90" * 0x200)
    file_code[0:6] = b"\xff\x15\xfa\x00\x00\x00"              # call [rip+0xfa]
    file_code[6:11] = b"\x0f\x1f\x44\x00\x00"                 # nop dword [rax+rax]
    file_code[11:13] = b"\x75\x00"                            # jnz +0
    file_code[13] = 0xC3
    memory_code = bytearray(file_code)
    memory_code[0:7] = b"\x4c\x8b\x15\xf9\x00\x00\x00"        # mov r10, [rip+0xf9]
    memory_code[7:12] = b"\xe8" + (target_function - (base + 12)).to_bytes(4, "little", signed=True)
    memory_code[12:15] = b"\x75\x00\xc3"                        # jnz +0; ret
    memory_code[0x100] = 0xC3                                  # X: ret
    writer = T.PacketWriter()
    writer.psb_plus(base)
    writer.tnt(True)   # X's ret, compressed
    writer.tnt(False)  # jnz
    trace = writer.bytes()
    from_memory = decode_flow(trace, CodeImage(images=[(base, bytes(memory_code))]))
    assert from_memory.problems == []
    assert from_memory.instructions == [base, base + 7, target_function, base + 12]
    from_file = decode_flow(trace, CodeImage(images=[(base, bytes(file_code))]))
    # the file's call [__imp_X] waits for a TIP (the TNT could precede a deferred one) that never comes
    assert from_file.instructions == []


def test_path_into_kebugcheckex_warns():
    trace, expected = T.trace_program(SAMPLE, 100, seed=3)
    result = decode_flow(trace, image(SAMPLE), suspicious={SAMPLE.labels["Checksum"]: "nt!KeBugCheckEx"})
    assert [(p.kind, p.address, p.severity) for p in result.problems] == [
        ("ipt_suspicious_path", SAMPLE.labels["Checksum"], "warning")]
    assert "nt!KeBugCheckEx" in result.problems[0].message


def test_random_bytes_never_hang_or_crash():
    import random
    generator = random.Random(1)
    for _ in range(30):
        data = PSB + b"\x99\x01\xdd" + SAMPLE.entry.to_bytes(8, "little") + b"\x02\x23" + bytes(
            generator.getrandbits(8) for _ in range(200))
        result = ours(data, max_insns=10000)
        assert len(result.instructions) <= 10000


@needs_libipt
@pytest.mark.parametrize("mode_64", [True, False])
def test_mode_exec_selects_the_instruction_set(mode_64):
    """0x48 is a REX prefix in 64-bit code and dec eax in 32-bit code."""
    base = 0x401000
    code = b"\x48\x74\x02\x90\x90\x48\x75\xf8\xc3"  # [dec eax;] jz +2; nop; nop; [dec eax;] jnz -8
    writer = T.PacketWriter()
    writer.psb_plus(base, mode_64=mode_64)
    for taken in (False, True, True, False):
        writer.tnt(taken)
    trace = writer.bytes()
    result = decode_flow(trace, CodeImage(images=[(base, code)]))
    ips, errors = libipt.instruction_flow(trace, {base: code})
    assert result.problems == [] and errors == []
    assert result.instructions == ips
    assert (base + 1 in result.instructions) != mode_64


def test_unreadable_second_code_page_keeps_the_path_up_to_it():
    scenario = Scenario("x64", "kernel")
    scenario.write(RANDOM.base, RANDOM.code)
    hole = (RANDOM.base & ~0xFFF) + 0x1000
    assert RANDOM.base + len(RANDOM.code) > hole
    scenario.unmap(hole, 0x1000)
    trace, expected = T.trace_program(RANDOM, 3000, seed=6)
    first_missing = next(index for index, ip in enumerate(expected) if hole <= ip < hole + 0x1000)
    result = decode_flow(trace, CodeImage(scenario.target()))
    gap = result.problems[0]
    assert gap.kind == "ipt_gap" and "is unreadable" in gap.message
    assert hole <= gap.address < hole + 0x1000
    assert result.instructions[:first_missing] == expected[:first_missing]


def test_corrupt_packet_in_the_middle_costs_only_its_psb_segment():
    first, first_expected = T.trace_program(SAMPLE, 150, seed=1)
    second, second_expected = T.trace_program(SAMPLE, 150, seed=2)
    corrupt = first[:-3] + b"\xad" + first[-2:]  # a TIP with reserved IPBytes near the end
    result = ours(corrupt + second)
    assert [(p.kind, p.offset, p.message) for p in result.problems] == [
        ("ipt_packet_error", len(first) - 3, "tip with reserved IPBytes 5")]
    assert result.instructions[-len(second_expected):] == second_expected
    assert result.instructions[:50] == first_expected[:50]


@needs_libipt
def test_prefixed_branches_are_branches():
    """repz ret (old AMD-friendly returns), bnd call, notrack jmp rax."""
    base = 0x140001000
    code = (b"\xf2\xe8\x0a\x00\x00\x00"      # 1000: bnd call 1010
            b"\x48\x8d\x05\xf9\xff\xff\xff"  # 1006: lea rax, [rip-7] -> 1006
            b"\x90\x90\x90"                  # 100d: padding
            b"\x85\xc0"                      # 1010: test eax, eax
            b"\x74\x01"                      # 1012: jz 1015
            b"\x90"                          # 1014: nop
            b"\xf3\xc3")                     # 1015: repz ret
    writer = T.PacketWriter()
    writer.psb_plus(base)
    writer.tnt(False)   # jz not taken
    writer.tnt(True)    # repz ret, compressed
    trace = writer.bytes()
    result = decode_flow(trace, CodeImage(images=[(base, code)]))
    assert result.problems == []
    assert result.instructions == [base, base + 0x10, base + 0x12, base + 0x14, base + 0x15]
    assert result.instructions == libipt.instruction_flow(trace, {base: code})[0]
    jump = b"\x3e\xff\xe0"           # notrack jmp rax
    writer = T.PacketWriter()
    writer.psb_plus(base)
    writer.tip(base)
    result = decode_flow(writer.bytes(), CodeImage(images=[(base, jump)]))
    assert result.problems == [] and result.instructions == [base]


def test_newer_packets_do_not_stop_the_flow():
    """CFE, EVD and TRIG (event trace, triggers) carry no control flow of their own."""
    plain, expected = T.trace_program(SAMPLE, 200, seed=3)
    marked = plain.replace(b"\x02\x23", b"\x02\x23\x02\x13\x01\x0e\x02\x53\x01" + bytes(8) + b"\xd9\x05\x10\x00", 1)
    result = ours(marked)
    assert result.problems == [] and result.instructions == expected


@needs_libipt
def test_transactions_begin_commit_and_abort_as_events():
    """MODE.TSX + FUP: begin and commit change nothing in the flow; an abort is a
    transfer (FUP + TIP) to the abort handler.  In PSB+ MODE.TSX only restates."""
    validate = SAMPLE.labels["ValidateRequest"]
    writer = T.PacketWriter()
    writer.psb_plus(SAMPLE.entry, intx=0)
    writer.tsx(1)
    writer.fup(validate)                 # begins at ValidateRequest's first instruction
    writer.tsx(0)
    writer.fup(validate + 1)             # commits after push rbx
    writer.tsx(1)
    writer.fup(validate + 3)             # begins again
    writer.tsx(0, abort=True)
    writer.fup(validate + 6)             # aborts before the jbe
    writer.tip(SAMPLE.entry)             # to the abort handler: Dispatch
    trace = writer.bytes()
    result = ours(trace)
    assert result.problems == []
    assert result.instructions == theirs(trace)[0]
    assert [(kind, ip) for _, kind, _, ip in result.events] == [
        ("sync", SAMPLE.entry), ("tsx_begin", validate), ("tsx_commit", validate + 1), ("tsx_begin", validate + 3),
        ("tsx_abort", validate + 6), ("interrupt", validate + 6)]


def test_erratum_skd007_takes_only_a_cyc_cut_by_an_overflow_for_an_overflow():
    """With SKD007 a CYC whose second byte starts an OVF (07 02 F3) is the OVF; the same
    bytes inside another packet (a TSC's payload) stay what they are."""
    plain, expected = T.trace_program(SAMPLE, 200, seed=3)
    inside_tsc = plain.replace(b"\x02\x23", b"\x02\x23\x19\x07\x02\xf3\x00\x00\x00\x00", 1)
    assert ours(inside_tsc, errata={"skd007"}).instructions == expected

    def overflowing(cyc_byte):
        writer = writer_at(SAMPLE.entry)
        writer.tnt(True)
        writer.raw(cyc_byte)
        writer.ovf()
        writer.fup(SAMPLE.labels["Dispatch_skip"])
        writer.tnt(False)
        return writer.bytes()

    cut, whole = ours(overflowing(b"\x07"), errata={"skd007"}), ours(overflowing(b""))
    assert cut.problems == [] and cut.instructions == whole.instructions
    assert [(index, kind) for index, kind, _, _ in cut.events] == [(index, kind) for index, kind, _, _ in whole.events]
    assert "overflow" not in [kind for _, kind, _, _ in ours(overflowing(b"\x07")).events]


def test_erratum_skz84_skips_a_corrupted_tma_and_the_byte_after_it():
    """A TMA with reserved bits set stops decoding until the next PSB; with SKZ84 it and
    the bogus byte after it are skipped."""
    plain, expected = T.trace_program(SAMPLE, 200, seed=3)
    corrupted = plain.replace(b"\x02\x23", b"\x19" + bytes(7) + b"\x02\x73\x01\x00\x00\x05\xfe\x59\x02\x23", 1)
    assert ours(corrupted).problems.errors
    result = ours(corrupted, errata={"skz84"})
    assert result.problems == [] and result.instructions == expected


@pytest.mark.parametrize("shape", TRACE_SHAPES)
def test_the_tables_of_ip_packets_and_tnt_runs_seen_only_remember(monkeypatch, shape):
    """With tables of two entries (dropped again and again) the flow is the traced path."""
    trace, expected = T.trace_program(RANDOM, 4000, seed=8, **shape)
    monkeypatch.setattr(flow, "TABLE_SIZE", 2)
    result = ours(trace, RANDOM)
    assert result.problems == []
    assert result.instructions == expected


@pytest.mark.parametrize("window", [17, 300])
@pytest.mark.parametrize("damage", [False, True])
def test_reading_the_trace_a_window_at_a_time_changes_nothing(monkeypatch, window, damage):
    """Packets cut by a window's end, and bytes that are no packet, read the same with
    tiny windows as with the default one."""
    trace, _ = T.trace_program(RANDOM, 3000, seed=11, interrupt_every=30, psb_every=64, timing=True)
    if damage:
        trace = bytearray(trace)
        for offset in range(100, len(trace), 997):
            trace[offset] = 0x39  # an undefined opcode where a packet starts, or inside one
        trace = bytes(trace)
    whole = ours(trace, RANDOM)
    monkeypatch.setattr(flow, "_WINDOW", window)
    windowed = ours(trace, RANDOM)
    assert windowed.instructions == whole.instructions and windowed.events == whole.events
    assert [problem.as_dict() for problem in windowed.problems] == [problem.as_dict() for problem in whole.problems]
    assert bool(whole.problems.errors) == damage


ALL_ERRATA = frozenset(["bdm70", "bdm64", "skd007", "skd022", "skd010", "skl014", "skl168", "skz84", "apl12", "apl11"])


@pytest.mark.parametrize("errata", [frozenset(), ALL_ERRATA], ids=["no errata", "every erratum"])
@pytest.mark.parametrize("name, problem", [
    # a FUP without an IP waits for a TIP that turns out to be its own
    ("ipt-fup-without-ip-waits-for-a-tip.bin", "is the asynchronous branch of the FUP at offset 29"),
    # a PSB+ read while an erratum looks ahead past a FUP: the FUP stays where it was
    ("ipt-psb-while-a-fup-is-read-ahead.bin", "unknown opcode 15"),
])
def test_fuzzed_traces_decode_to_problems_not_exceptions(name, problem, errata):
    """Random packet streams over random code (the fuzzer's finds) end in problems."""
    base = 0xFFFFF80012341000
    program = T.random_program(base, functions=40, seed=5, syscalls=True)
    with open(os.path.join(os.path.dirname(__file__), "data", "fuzz", name), "rb") as handle:
        trace = handle.read()
    result = FlowDecoder(CodeImage(images=[(base, program.code)]), errata=errata).decode(trace, max_insns=None)
    assert any(problem in entry.message for entry in result.problems)


def pad_after_each_fup(trace):
    """``trace`` with a PAD after every FUP packet: no FUP is then right before its TIP."""
    tokens = list(P.tokens(trace))
    out, last = bytearray(), 0
    for (kind, _, _), (_, following, _) in zip(tokens, tokens[1:]):
        if kind == P.K_FUP:
            out += trace[last:following] + b"\x00"
            last = following
    return bytes(out + trace[last:])


@pytest.mark.parametrize("damage", [False, True])
@pytest.mark.parametrize("errata", [frozenset(), ALL_ERRATA], ids=["no errata", "every erratum"])
@pytest.mark.parametrize("shape", [
    {"interrupt_every": 5},
    {"interrupt_every": 7, "psb_every": 40, "deferred_tip_every": 9},
    {"interrupt_every": 9, "overflow_every": 50, "disable_every": 40, "tsx_every": 30},
    {"interrupt_every": 6, "extras": ("power", "exstop", "ptw_ip", "psb"), "extras_where": ("branch",)},
])
def test_an_interrupt_read_as_one_item_decodes_as_its_fup_and_tip_apart(shape, errata, damage):
    """A FUP right before its TIP is one item to the walk (an interrupt); in every
    state it decodes as the two packets apart (a PAD between them) do, also where
    random bytes (fixed seed) make the decoder misread the trace."""
    trace, _ = T.trace_program(RANDOM, 3000, seed=5, **shape)
    if damage:
        generator = random.Random(3)
        trace = bytearray(trace)
        for offset in range(150, len(trace), 211):
            trace[offset] = generator.randrange(256)
        trace = bytes(trace)
    padded = pad_after_each_fup(trace)
    assert len(padded) > len(trace)
    together, apart = ours(trace, RANDOM, errata=errata), ours(padded, RANDOM, errata=errata)
    assert together.instructions == apart.instructions
    assert [event[:2] + event[3:] for event in together.events] == [event[:2] + event[3:] for event in apart.events]
    assert [(problem.kind, problem.address) for problem in together.problems] == \
        [(problem.kind, problem.address) for problem in apart.problems]
