"""LZ77+Huffman ([MS-XCA] 2.2) decompression, and .etl files whose buffers are
stored compressed as xperf and PerfView store them."""

import io
import json
import os
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbgext.cli import main
from dbgext.errors import BadInput
from dbgext.etl import EtlReader, looks_like_etl
from dbgext.etl import format as fmt
from dbgext.etl.stackwalk import stack_walk_records
from dbgext.etl.xpress import XpressError, decompress
from etl_writer import EtlWriter

from xpress_support import compress, compress_etl, spec_example_literals, spec_example_long_match

KERNEL = [0xFFFFF80000001000, 0xFFFFF80000002000, 0xFFFFF80000003000]


# -- [MS-XCA] 3.2's worked examples ---------------------------------------------------------


def test_the_spec_literals_example_decodes_to_the_alphabet():
    assert decompress(spec_example_literals(), 26) == b"abcdefghijklmnopqrstuvwxyz"


def test_the_spec_match_example_decodes_to_abc_a_hundred_times():
    # One match of length 297 at offset 3: its length is stored as the bytes ff 26 01.
    assert decompress(spec_example_long_match(), 300) == b"abc" * 100


def test_the_compressor_round_trips_the_spec_inputs():
    for text in (b"abcdefghijklmnopqrstuvwxyz", b"abc" * 100):
        assert decompress(compress(text), len(text)) == text


# -- round trips -------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 2, 3, 17, 18, 19, 270, 271, 0xFFFF, 0x10000, 0x10001, 0x10003, 0x25000])
def test_round_trips_across_block_boundaries(size):
    rng = random.Random(size)
    data = bytes(rng.choice(b"abcdefgh") for _ in range(size))
    assert decompress(compress(data), size) == data


def test_round_trips_random_and_repetitive_data():
    rng = random.Random(3)
    noise = bytes(rng.getrandbits(8) for _ in range(0x14000))
    runs = b"\x00" * 0x30000 + b"\xff" * 5 + b"z" * 70000   # lengths needing the u16 and u32 forms
    mixed = b"".join(noise[i:i + 50] * rng.randint(1, 9) for i in range(0, 4000, 50))
    for data in (noise, runs, mixed):
        assert decompress(compress(data), len(data)) == data


def test_a_match_may_reach_into_the_previous_block():
    rng = random.Random(63)
    noise = rng.getrandbits(8 * 0x8100).to_bytes(0x8100, "little")
    data = noise[:0x8000] + bytes(0x8000) + noise[0x8000:]
    data = data + data[:0x1000]   # the repeat starts in block 2 and points into block 1
    assert decompress(compress(data), len(data)) == data


# -- corrupt input -------------------------------------------------------------------------------


def test_a_code_table_that_is_not_a_prefix_code_is_an_error_naming_the_buffer():
    damaged = bytearray(spec_example_literals())
    damaged[48] = 0x11    # two more 1-bit codes: over-subscribed
    with pytest.raises(XpressError, match="buffer 7: .*prefix code"):
        decompress(bytes(damaged), 26, "buffer 7")


def test_an_empty_code_table_is_an_error():
    with pytest.raises(XpressError, match="prefix code"):
        decompress(bytes(256) + bytes(8), 10, "buffer 1")


def test_input_that_ends_early_is_an_error_naming_the_buffer():
    text = bytes(random.Random(5).getrandbits(8) for _ in range(10000))
    data = compress(text)
    with pytest.raises(XpressError, match="buffer 3 at offset 0x4000: the compressed data ends"):
        decompress(data[:len(data) // 2], len(text), "buffer 3 at offset 0x4000")
    with pytest.raises(XpressError, match="ends"):
        decompress(b"", 1, "buffer 3")


def test_a_match_before_the_start_is_an_error():
    # The spec's match example with its three literals made unused: the first symbol is the match.
    damaged = bytearray(spec_example_long_match())
    damaged[48] = damaged[49] = 0
    damaged[128] = 0x01   # EOF: 1 bit
    damaged[143] = 0x10   # the match: 1 bit
    stream = struct.pack("<HH", 0x0000, 0) + b"\xff\x26\x01"
    with pytest.raises(XpressError, match="before the start"):
        decompress(bytes(damaged[:256]) + stream, 300, "buffer 9")


def test_output_longer_than_expected_is_an_error():
    with pytest.raises(XpressError, match="past the expected size"):
        decompress(spec_example_long_match(), 100, "buffer 2")


FUZZ_SEED = compress(b"".join(bytes([random.Random(11).randrange(6)]) * (1 + index % 40) for index in range(3000))
                     + b"abc" * 200)


@settings(max_examples=int(os.environ.get("DBGEXT_FUZZ_EXAMPLES", "12")) * 10, deadline=None, database=None)
@given(flips=st.lists(st.tuples(st.integers(0, len(FUZZ_SEED) - 1), st.integers(0, 255)), max_size=8),
       cut=st.integers(0, len(FUZZ_SEED)), size=st.integers(0, 0x30000))
def test_mutated_input_raises_only_xpress_errors_naming_the_buffer(flips, cut, size):
    data = bytearray(FUZZ_SEED)
    for position, value in flips:
        data[position] = value
    try:
        decompress(bytes(data[:cut]), size, "buffer 0")
    except XpressError as error:
        assert str(error).startswith("buffer 0: ")


# -- compressed .etl files ---------------------------------------------------------------------


PACKED_SEED = None


def packed_seed():
    global PACKED_SEED
    if PACKED_SEED is None:
        PACKED_SEED = compress_etl(stackwalk_trace(events=300))
    return PACKED_SEED


@settings(max_examples=int(os.environ.get("DBGEXT_FUZZ_EXAMPLES", "12")) * 5, deadline=None, database=None)
@given(flips=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=12))
def test_a_mutated_compressed_trace_is_read_with_its_damage_reported(flips):
    data = bytearray(packed_seed())
    for position, value in flips:
        data[position % len(data)] = value
    try:
        reader = EtlReader(bytes(data))
    except BadInput:
        return
    for _ in reader.events():
        pass
    summary = reader.summary
    assert summary.undecodable <= summary.buffers
    assert (summary.note() is None) == (summary.undecodable == 0)


def stackwalk_trace(events=400, buffer_size=0x1000):
    writer = EtlWriter(buffer_size=buffer_size)
    for index in range(events):
        writer.add_stack_walk(KERNEL + [0xFFFFF80000010000 + 16 * (index % 37)], process_id=4, thread_id=8 + index)
    return writer.to_bytes()


def test_compressed_buffers_read_like_the_uncompressed_trace():
    plain = stackwalk_trace()
    packed = compress_etl(plain)
    assert len(packed) < len(plain) // 2
    same_buffers_stored_plain = compress_etl(plain, skip=range(len(plain)))
    expected = [(e.opcode, e.thread_id, e.payload) for e in EtlReader(same_buffers_stored_plain).events()]
    reader = EtlReader(packed)
    assert [(e.opcode, e.thread_id, e.payload) for e in reader.events()] == expected
    summary = reader.summary
    assert summary.buffers == len(plain) // 0x1000
    assert summary.compressed == summary.buffers - 1 and summary.undecodable == 0
    assert summary.note() is None and list(summary.problems) == []


def test_the_header_buffer_names_the_compression_format():
    packed = compress_etl(stackwalk_trace(events=50))
    assert EtlReader(packed).compression_format == fmt.COMPRESSION_FORMAT_XPRESS_HUFF
    head = bytearray(packed)
    struct.pack_into("<H", head, fmt.BUFFER_STATE_OFFSET, fmt.COMPRESSION_FORMAT_LZNT1)
    reader = EtlReader(bytes(head))
    assert reader.compression_format == fmt.COMPRESSION_FORMAT_LZNT1
    list(reader.events())
    assert reader.summary.undecodable == reader.summary.buffers - 1
    assert "LZNT1 is not supported" in reader.summary.note()


def test_undecodable_buffers_are_one_count_with_one_example():
    plain = stackwalk_trace()
    packed = compress_etl(plain, corrupt=(2, 3, 5))
    reader = EtlReader(packed)
    events = list(reader.events())
    assert 0 < len(events) < len(list(EtlReader(plain).events()))
    summary = reader.summary
    assert summary.undecodable == 3
    assert summary.example.kind == "etl_buffer_undecodable"
    assert summary.example.message.startswith("buffer 2:") and "prefix code" in summary.example.message
    note = summary.note()
    assert "3 of %d buffers could not be decoded" % summary.buffers in note and "\n" not in note
    # In the problems: one entry for all three, not one per buffer.
    assert [p.kind for p in summary.problems] == ["etl_buffers_undecodable"]
    assert summary.problems[0].offset == summary.example.offset
    document = summary.as_dict()
    assert document["undecodable_buffers"] == 3 and document["undecodable_example"]["offset"] == summary.example.offset
    json.dumps(document)


def test_an_impossible_decompressed_size_makes_the_buffer_undecodable():
    packed = bytearray(compress_etl(stackwalk_trace(events=100)))
    second = struct.unpack_from("<I", packed, 0)[0]
    struct.pack_into("<I", packed, second + 4, 0x10)   # SavedOffset below the header size
    reader = EtlReader(bytes(packed))
    list(reader.events())
    assert reader.summary.undecodable == 1 and "SavedOffset" in reader.summary.note()


def test_stack_walk_records_of_a_compressed_trace(tmp_path):
    plain = stackwalk_trace()
    path = tmp_path / "packed.etl"
    path.write_bytes(compress_etl(plain))
    records, summary = stack_walk_records(str(path))
    assert [r.frames for r in records] == [r.frames for r in stack_walk_records(plain)[0]]
    assert summary.compressed > 0


# -- a file that changes under the reader ---------------------------------------------------------


def test_a_trace_that_shrinks_while_read_ends_with_a_problem_naming_the_file(tmp_path):
    path = tmp_path / "shrinking.etl"
    data = stackwalk_trace(events=400, buffer_size=0x400)
    path.write_bytes(data)
    reader = EtlReader(str(path))
    buffers = reader.buffers()
    next(buffers)
    with open(str(path), "r+b") as handle:
        handle.truncate(0x400 * 3 + 10)
    rest = list(buffers)
    assert len(rest) == 2
    [problem] = list(reader.problems)
    assert problem.kind == "etl_file_changed" and str(path) in problem.message
    assert problem.offset == 0x400 * 3


# -- recognising an .etl by its signature ---------------------------------------------------------


def test_the_signature_is_the_first_buffer_and_the_logfile_header_event():
    data = stackwalk_trace(events=5)
    assert looks_like_etl(data[:fmt.SIGNATURE_SIZE])
    assert looks_like_etl(compress_etl(data))
    assert not looks_like_etl(b"0xfffff80000001000 0xfffff80000002000\n")
    assert not looks_like_etl(b"MDMP" + bytes(200))
    assert not looks_like_etl(data[:fmt.SIGNATURE_SIZE - 1])


def run_cli(argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stream=out, error_stream=err)
    return code, out.getvalue(), err.getvalue()


def test_etwstacks_simulate_stacks_recognises_a_compressed_etl(tmp_path):
    path = tmp_path / "trace.bin"          # not named .etl: the signature decides
    plain = stackwalk_trace()
    path.write_bytes(compress_etl(plain, corrupt=(4,)))
    code, out, err = run_cli(["etwstacks", "--simulate", "--stacks", str(path), "--json"])
    assert code == 0, err
    document = json.loads(out)
    text = json.dumps(document)
    assert "1 of %d buffers could not be decoded" % (len(plain) // 0x1000) in text
    assert text.count("could not be decoded") == 1
