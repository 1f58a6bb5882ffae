"""Plain LZ77 XPRESS ([MS-XCA] 2.3-2.4), LZ77+Huffman ([MS-XCA] 2.2) and LZNT1
([MS-XCA] 2.5) decompression, .etl files whose buffers are stored compressed, how the
algorithm is chosen (the file's header, else the buffer), and the bounds on
decompression (decompression bombs)."""

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
from dbgext.etl import lznt1
from dbgext.etl.reader import buffer_algorithm
from dbgext.etl.xpress import XpressError, decompress, decompress_plain
from etl_writer import EtlWriter

from xpress_support import compress, compress_etl, spec_example_literals, spec_example_long_match
from requirements import need_module

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
    assert summary.undecodable + summary.bombs <= summary.buffers
    assert (summary.note() is None) == (summary.undecodable == 0 and summary.bombs == 0)


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
    assert "no LZNT1 chunk signature" in reader.summary.note()   # XPRESS Huffman data read as LZNT1


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


# -- plain LZ77 XPRESS ([MS-XCA] 2.3-2.4) --------------------------------------------------------

PLAIN_MAX_OFFSET = 8192


def plain_stream(tokens):
    """The plain XPRESS encoding of ``tokens`` (ints: literal bytes; (length,
    offset): matches) as [MS-XCA] 2.3's encoder writes it: 32-bit flag words
    reserved ahead, length-7 matches sharing nibble bytes, the unused flag bits of
    the last word set."""
    out = bytearray(4)
    flag_at, flags, count, nibble_at = 0, 0, 0, None
    for token in tokens:
        if count == 32:
            struct.pack_into("<I", out, flag_at, flags)
            flag_at, flags, count = len(out), 0, 0
            out += bytes(4)
        if isinstance(token, int):
            out.append(token)
            flags, count = flags << 1, count + 1
            continue
        length, offset = token
        flags, count = flags << 1 | 1, count + 1
        rest = length - 3
        if rest < 7:
            out += struct.pack("<H", (offset - 1) << 3 | rest)
            continue
        out += struct.pack("<H", (offset - 1) << 3 | 7)
        rest -= 7
        if nibble_at is None:
            nibble_at = len(out)
            out.append(min(rest, 15))
        else:
            out[nibble_at] |= min(rest, 15) << 4
            nibble_at = None
        if rest >= 15:
            rest -= 15
            if rest < 255:
                out.append(rest)
            else:
                out.append(255)
                rest += 15 + 7
                out += struct.pack("<H", rest) if rest < 1 << 16 else struct.pack("<HI", 0, rest)
    struct.pack_into("<I", out, flag_at, (flags << (32 - count)) | ((1 << (32 - count)) - 1))
    return bytes(out)


def plain_compress(data):
    """Greedy LZ77 over ``data`` (last position of each 3-byte prefix, offsets up
    to 8192), encoded by plain_stream."""
    tokens, last, position = [], {}, 0
    while position < len(data):
        key = data[position:position + 3]
        candidate = last.get(key)
        last[key] = position
        if candidate is not None and position - candidate <= PLAIN_MAX_OFFSET and len(key) == 3:
            length = 3
            while position + length < len(data) and data[candidate + length] == data[position + length]:
                length += 1
            tokens.append((length, position - candidate))
            position += length
        else:
            tokens.append(data[position])
            position += 1
    return plain_stream(tokens)


def test_plain_literals_decode_to_themselves():
    assert decompress_plain(plain_stream(list(b"abc")), 3) == b"abc"


def test_plain_matches_of_every_length_form_decode():
    # 3-bit lengths, two nibbles sharing one byte, a byte, a u16 and a u32 length.
    for length in (3, 9, 10, 11, 24, 25, 40, 279, 280, 300, 0xFFFF, 0x10020):
        data = b"xy" + b"xy" * (length // 2) + b"x" * (length % 2)
        assert decompress_plain(plain_stream([ord("x"), ord("y"), (length, 2)]), 2 + length) == data, length
    tokens = [ord("a"), (12, 1), ord("b"), (30, 1), ord("c"), (13, 1)]
    assert decompress_plain(plain_stream(tokens), 58) == b"a" * 13 + b"b" * 31 + b"c" * 14


@pytest.mark.parametrize("size", [1, 31, 32, 33, 1000, 0x10000 + 5])
def test_plain_round_trips_random_and_repetitive_data(size):
    rng = random.Random(size)
    words = [bytes(rng.randrange(256) for _ in range(rng.randint(1, 9))) for _ in range(40)]
    data = b"".join(rng.choice(words) for _ in range(size))[:size]
    assert decompress_plain(plain_compress(data), len(data)) == data
    noise = bytes(rng.randrange(256) for _ in range(size))
    assert decompress_plain(plain_compress(noise), size) == noise


def test_plain_errors_name_the_buffer():
    stream = plain_stream([ord("a"), (20, 1)])
    with pytest.raises(XpressError, match="buffer 7: the compressed data ends"):
        decompress_plain(stream[:6], 21, "buffer 7")
    with pytest.raises(XpressError, match="before the start"):
        decompress_plain(plain_stream([ord("a"), (5, 2)]), 6, "buffer 7")
    with pytest.raises(XpressError, match="output byte 0x3 reaches back 0x5 bytes, before the start"):
        decompress_plain(plain_stream(list(b"abc") + [(3, 5)]), 6, "buffer 7")   # a copy that does not overlap
    with pytest.raises(XpressError, match="past the expected size"):
        decompress_plain(stream, 10, "buffer 7")


@settings(max_examples=60, deadline=None, database=None)
@given(data=st.binary(min_size=1, max_size=300), flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)),
                                                                 max_size=6), cut=st.integers(0, 400))
def test_mutated_plain_input_raises_only_xpress_errors(data, flips, cut):
    stream = bytearray(plain_compress(data))
    for position, value in flips:
        stream[position % len(stream)] = value
    try:
        out = decompress_plain(bytes(stream[:cut or None]), len(data), "buffer 1")
    except XpressError as error:
        assert "buffer 1" in str(error)
    else:
        assert len(out) == len(data)


# -- which algorithm, and the bounds ----------------------------------------------------------------


def packed_trace(data, compressor=None, announced=fmt.COMPRESSION_FORMAT_XPRESS, bomb=None):
    """``data`` (uncompressed buffers from EtlWriter) with every buffer but the
    first stored compressed by ``compressor`` (default: plain XPRESS), the header
    announcing the format ``announced`` (None: no announcement); ``bomb``:
    {buffer index: (compressed payload, SavedOffset)} stored instead of that
    buffer's own."""
    compressor = compressor or plain_compress
    buffers, offset = [], 0
    while offset < len(data):
        size = struct.unpack_from("<I", data, offset)[0]
        buffers.append(bytearray(data[offset:offset + size]))
        offset += size
    if announced is not None:
        first = buffers[0]
        struct.pack_into("<I", first, fmt.BUFFER_STATE_OFFSET, announced)
        mode_at = fmt.BUFFER_HEADER_SIZE + 0x20 + fmt.LOGFILE_HEADER_MODE
        struct.pack_into("<I", first, mode_at, struct.unpack_from("<I", first, mode_at)[0]
                         | fmt.EVENT_TRACE_COMPRESSED_MODE)
    out = bytearray(buffers[0])
    for index, buffer in enumerate(buffers[1:], 1):
        used = struct.unpack_from("<I", buffer, 4)[0]
        packed, saved = (bomb or {}).get(index, (compressor(bytes(buffer[fmt.BUFFER_HEADER_SIZE:used])), used))
        header = bytearray(buffer[:fmt.BUFFER_HEADER_SIZE])
        disk_size = (fmt.BUFFER_HEADER_SIZE + len(packed) + 7) & ~7
        struct.pack_into("<II", header, 0, disk_size, saved)
        struct.pack_into("<H", header, 0x34, struct.unpack_from("<H", header, 0x34)[0] | fmt.BUFFER_FLAG_COMPRESSED)
        out += header + packed + bytes(disk_size - fmt.BUFFER_HEADER_SIZE - len(packed))
    return bytes(out)


def events_of(data, **options):
    reader = EtlReader(data, **options)
    return [(e.opcode, e.thread_id, e.payload) for e in reader.events()], reader.summary


def test_a_trace_announcing_plain_xpress_reads_like_the_uncompressed_trace():
    plain = stackwalk_trace(events=300)
    packed = packed_trace(plain)
    assert EtlReader(packed).compression_format == fmt.COMPRESSION_FORMAT_XPRESS
    events, summary = events_of(packed)
    assert events[1:] == events_of(plain)[0][1:]    # all but the logfile header, whose LogFileMode differs
    assert summary.compressed == summary.buffers - 1 and summary.note() is None


def test_without_an_announced_format_each_buffer_decides():
    plain = stackwalk_trace(events=300)
    for packed, algorithm in ((packed_trace(plain, announced=None), fmt.COMPRESSION_FORMAT_XPRESS),
                              (compress_etl(plain), fmt.COMPRESSION_FORMAT_XPRESS_HUFF)):
        head = bytearray(packed)
        mode_at = fmt.BUFFER_HEADER_SIZE + 0x20 + fmt.LOGFILE_HEADER_MODE
        struct.pack_into("<I", head, mode_at, struct.unpack_from("<I", head, mode_at)[0]
                         & ~fmt.EVENT_TRACE_COMPRESSED_MODE)
        reader = EtlReader(bytes(head))
        assert reader.compression_format is None
        second = struct.unpack_from("<I", head, 0)[0]
        assert buffer_algorithm(bytes(head[second + fmt.BUFFER_HEADER_SIZE:second + 0x200])) == algorithm
        events, summary = events_of(bytes(head))
        assert events[1:] == events_of(plain)[0][1:] and summary.note() is None


def run_of(byte, count):
    """A plain XPRESS stream of one literal and one match: ``count`` copies of ``byte``."""
    return plain_stream([byte, (count - 1, 1)])


def test_a_buffer_past_the_ratio_bound_is_skipped_as_a_bomb_without_decoding():
    plain = stackwalk_trace(events=300)
    stream = run_of(0x41, 0x100000)            # ~13 bytes that would decode to 1 MiB
    packed = packed_trace(plain, bomb={2: (stream, 0x100000 + fmt.BUFFER_HEADER_SIZE)})
    events, summary = events_of(packed)
    assert summary.bombs == 1 and summary.undecodable == 0
    assert "more than %d times" % fmt.MAX_COMPRESSION_RATIO in summary.bomb_example.message
    note = summary.note()
    assert "1 of %d compressed buffers were skipped as decompression bombs (first: buffer 2:" % summary.buffers in note
    assert "\n" not in note
    assert 0 < len(events) < len(events_of(plain)[0])
    assert [p.kind for p in summary.finish().problems] == ["etl_decompression_bombs"]


def test_a_buffer_decoding_to_one_repeated_byte_is_skipped_and_counted():
    plain = stackwalk_trace(events=300)
    bombs = {2: (run_of(0, 0xF00) + bytes(64), 0xF00 + fmt.BUFFER_HEADER_SIZE),
             4: (run_of(0xFF, 0xE00) + bytes(64), 0xE00 + fmt.BUFFER_HEADER_SIZE)}
    events, summary = events_of(packed_trace(plain, bomb=bombs))
    assert summary.bombs == 2
    assert summary.bomb_example.message == "buffer 2: decodes to 3840 copies of byte 0x00"
    assert summary.as_dict()["bomb_buffers"] == 2


def test_the_per_file_bound_stops_decompression_and_says_so_once():
    plain = stackwalk_trace(events=400)
    packed = packed_trace(plain)
    events, summary = events_of(packed, max_decompressed=3 * 0x1000)
    assert summary.compressed == 3 and summary.bombs == summary.buffers - 4
    assert "per-file bound" in summary.bomb_example.message
    assert summary.decompressed_bytes <= 3 * 0x1000
    assert summary.note().count("decompression bombs") == 1


# -- LZNT1 ([MS-XCA] 2.5) ---------------------------------------------------------------------------


def lznt1_compress(data, store=()):
    """Greedy LZNT1 of ``data``: one chunk per 4 KiB, matches within the chunk
    (offset and length fields split by the position, as the format says); chunks
    whose index is in ``store`` are stored uncompressed."""
    out = bytearray()
    for index, chunk_start in enumerate(range(0, len(data), lznt1.CHUNK_SIZE)):
        chunk = data[chunk_start:chunk_start + lznt1.CHUNK_SIZE]
        if index in store:
            out += struct.pack("<H", (len(chunk) - 1) | lznt1.SIGNATURE << 12) + chunk
            continue
        body, position, last = bytearray(), 0, {}
        while position < len(chunk):
            flags_at, flags = len(body), 0
            body.append(0)
            for bit in range(8):
                if position >= len(chunk):
                    break
                length_bits = 16 - lznt1.OFFSET_BITS[position] if position else 0
                key = chunk[position:position + 3]
                candidate = last.get(key)
                last[key] = position
                if position and candidate is not None and len(key) == 3 and \
                        position - candidate <= 1 << lznt1.OFFSET_BITS[position]:
                    length = 3
                    limit = min(len(chunk) - position, (1 << length_bits) + 2)
                    while length < limit and chunk[candidate + length] == chunk[position + length]:
                        length += 1
                    body += struct.pack("<H", (position - candidate - 1) << length_bits | (length - 3))
                    flags |= 1 << bit
                    position += length
                else:
                    body.append(chunk[position])
                    position += 1
            body[flags_at] = flags
        out += struct.pack("<H", (len(body) + 2 - 3) | lznt1.SIGNATURE << 12 | 0x8000) + body
    return bytes(out)


@pytest.mark.parametrize("size", [1, 17, 0x1000, 0x1001, 0x2800])
def test_lznt1_round_trips_random_and_repetitive_data(size):
    rng = random.Random(size)
    words = [bytes(rng.randrange(256) for _ in range(rng.randint(1, 9))) for _ in range(30)]
    data = b"".join(rng.choice(words) for _ in range(size))[:size]
    assert lznt1.decompress(lznt1_compress(data), size) == data
    assert lznt1.decompress(lznt1_compress(data, store={0, 2}), size) == data
    assert lznt1.decompress(lznt1_compress(b"z" * size), size) == b"z" * size


def test_lznt1_agrees_with_dissect_util():
    dissect_lznt1 = need_module("dissect.util.compression.lznt1", "dissect.util")
    data = b"".join(b"%d:%s;" % (index, b"abc" * (index % 7)) for index in range(2000))
    packed = lznt1_compress(data)
    assert dissect_lznt1.decompress(io.BytesIO(packed)) == data == lznt1.decompress(packed, len(data))


def test_lznt1_errors_name_the_buffer():
    packed = lznt1_compress(b"abcabcabcabc" * 100)
    with pytest.raises(XpressError, match="buffer 3: no LZNT1 chunk signature"):
        lznt1.decompress(b"\xff\x0f" + packed, 1200, "buffer 3")
    with pytest.raises(XpressError, match="buffer 3: the LZNT1 chunk at byte 0x0 runs past the input"):
        lznt1.decompress(packed[:-1], 1200, "buffer 3")
    with pytest.raises(XpressError, match="buffer 3: the compressed data ends"):
        lznt1.decompress(packed, 2000, "buffer 3")
    early = struct.pack("<HBH", 0xB002, 0x01, 0x0010)     # a copy before any byte is out
    with pytest.raises(XpressError, match="nothing to copy from"):
        lznt1.decompress(early, 10, "buffer 3")


@settings(max_examples=60, deadline=None, database=None)
@given(data=st.binary(min_size=1, max_size=600), flips=st.lists(st.tuples(st.integers(0, 800), st.integers(0, 255)),
                                                                 max_size=6))
def test_mutated_lznt1_input_raises_only_xpress_errors_and_stays_bounded(data, flips):
    packed = bytearray(lznt1_compress(data))
    for position, value in flips:
        packed[position % len(packed)] = value
    try:
        out = lznt1.decompress(bytes(packed), len(data), "buffer 1")
    except XpressError as error:
        assert "buffer 1" in str(error)
    else:
        assert len(out) == len(data)


def test_a_trace_announcing_lznt1_is_decompressed():
    plain = stackwalk_trace(events=200)
    reader = EtlReader(packed_trace(plain, lznt1_compress, fmt.COMPRESSION_FORMAT_LZNT1))
    assert reader.compression_format == fmt.COMPRESSION_FORMAT_LZNT1
    events = [(e.opcode, e.thread_id, e.payload) for e in reader.events()]
    assert events[1:] == events_of(plain)[0][1:] and reader.summary.note() is None
    assert reader.summary.compressed == reader.summary.buffers - 1
