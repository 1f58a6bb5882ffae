"""No IPT decoder is super-linear: the packet listing, the packet counter, the flow
and the event scan each finish within a budget linear in the input on inputs built
to make them backtrack (tests/fuzzing.py's IPT adversarial family).

At 64 bytes an exponential decoder already takes hours; the 4 KiB and 64 KiB
inputs catch quadratic ones.  The budget (2 s/MB + 1 s) is generous: the decoders
take a small fraction of it."""

import random

import pytest

import fuzzing
from dbgext.ipt.flow import CodeImage, decode_flow
from dbgext.ipt.packets import decode_packets, packet_stats

CODE, TRACE = fuzzing.ipt_adversarial_program()
# The shapes decoded at 64 KiB too: one of each family.
LARGE_SHAPES = ("run-00", "run-02", "run-03", "run-04", "run-07", "run-19", "run-59", "run-99", "run-ff",
                "psb-without-its-last-pair", "psb-cut-then-02", "prefix-cyc-3", "prefix-tnt64-7",
                "prefix-psb-15", "prefix-tsc-7", "tnt8-random", "pad-between-every-byte")


def over_budget(size, shapes=None):
    """Every (shape, decoder, seconds) over the linear budget, with the real trace first."""
    slow = []
    for name, tail in fuzzing.ipt_adversarial_tails(size, random.Random(size)):
        if shapes is not None and name not in shapes:
            continue
        data = TRACE + tail
        for decoder, seconds in fuzzing.ipt_decoder_times(data, CODE).items():
            if seconds > fuzzing.ipt_linear_budget(len(data)):
                slow.append((name, decoder, round(seconds, 2)))
    return slow


@pytest.mark.parametrize("size", [64, 4096])
def test_every_decoder_stays_within_a_linear_budget_on_every_adversarial_shape(size):
    assert over_budget(size) == []


def test_every_decoder_stays_within_a_linear_budget_on_64k_of_each_shape_family():
    names = {name for name, _ in fuzzing.ipt_adversarial_tails(64, random.Random(0))}
    assert set(LARGE_SHAPES) <= names
    assert over_budget(1 << 16, LARGE_SHAPES) == []


def test_the_family_covers_every_byte_value_and_every_cut_of_every_packet():
    names = {name for name, _ in fuzzing.ipt_adversarial_tails(64, random.Random(0))}
    assert {"run-%02x" % value for value in range(256)} <= names
    for packet, encoding in fuzzing.IPT_PACKET_SAMPLES.items():
        assert {"prefix-%s-%d" % (packet, cut) for cut in range(1, len(encoding))} <= names


@pytest.mark.parametrize("zeros", [16, 22, 64, 4096])
def test_a_trace_ending_in_unwritten_zeros_decodes_as_the_trace_alone(zeros):
    """The ring buffer of ipt.sys that is not yet full: the zeros are PAD packets."""
    code = CodeImage(images=[(fuzzing.IPT_ADVERSARIAL_BASE, CODE)])
    alone, padded = decode_flow(TRACE, code), decode_flow(TRACE + bytes(zeros), code)
    assert padded.instructions == alone.instructions and padded.problems == alone.problems == []
    assert packet_stats(TRACE + bytes(zeros)).counts["pad"] == packet_stats(TRACE).counts["pad"] + zeros
    assert len(decode_packets(TRACE + bytes(zeros)).packets) == len(decode_packets(TRACE).packets) + zeros


@pytest.mark.parametrize("run", [b"\x0b", b"\x04\x06", b"\x59\x10\x04"])  # CYC, TNT-8, MTC + TNT-8
def test_the_flow_reads_a_long_run_of_timing_or_tnt_packets_in_bounded_memory(run):
    """Half a megabyte of one run: the tokenizer's memory does not grow with the run."""
    import tracemalloc
    code = CodeImage(images=[(fuzzing.IPT_ADVERSARIAL_BASE, CODE)])
    data = TRACE + run * ((1 << 19) // len(run))
    tracemalloc.start()
    try:
        decode_flow(data, code, max_insns=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 48 << 20
