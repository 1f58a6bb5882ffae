"""The trace-database builder follows Windows' Create/Add/Find algorithm."""

import struct

import pytest

from dbgext.rtltrace.fixtures import TraceDatabaseBuilder, add_sample_database
from dbgext.rtltrace.hashing import pointer_sum_hash
from dbgext.stackhash import stack_trace_hash, stack_trace_hash_frames
from dbgext.rtltrace.layouts import BLOCK_MAGIC, DATABASE_MAGIC, SEGMENT_MAGIC, layout_named
from dbgext.sample.scenario import Scenario

from rtltrace_support import database, scenario_for

NTDLL_X64 = 0x7FFA10000000


def frames_in(module_base, count, salt=0):
    return [module_base + 0x1000 + 0x40 * i + salt for i in range(count)]


def test_default_hash_sums_xor_of_word_pairs():
    # Words (LE) of 0x0000000200000001: 1, 0, 2, 0 -> (1^0) + (2^0) = 3.
    assert stack_trace_hash(struct.pack("<Q", 0x0000000200000001)) == 3
    # One x86 frame 0x12345678 is the pair (0x5678, 0x1234).
    assert stack_trace_hash_frames([0x12345678], 4) == 0x5678 ^ 0x1234
    frames = [0xFFFFF80012345678, 0x7FFA10001234, 0xDEADBEEF]
    words = struct.unpack("<12H", struct.pack("<3Q", *frames))
    assert stack_trace_hash_frames(frames, 8) == sum(words[i] ^ words[i + 1] for i in range(0, 12, 2))


def test_hash_of_nothing_is_zero_and_pointer_sum_truncates():
    assert stack_trace_hash(b"") == 0
    assert pointer_sum_hash([0xFFFFFFFF, 2]) == 1


@pytest.mark.parametrize("layout,header,granularity,flag", [
    ("user-x64", 0xC0, 0x10000, 1), ("kernel-x64", 0xD8, 0x1000, 2), ("user-x86", 0x88, 0x10000, 1)])
def test_create_lays_out_header_first_segment_and_buckets(layout, header, granularity, flag):
    scenario = scenario_for(layout)
    builder = TraceDatabaseBuilder(scenario, layout, buckets=64, flags=4)
    builder.sync()
    shape = layout_named(layout)
    fields = shape.database.unpack(scenario.read(builder.address, shape.database.size))
    assert fields["Magic"] == DATABASE_MAGIC
    assert fields["Flags"] == 4 | flag
    assert fields["SegmentList"] == builder.address + header
    assert fields["CurrentSize"] == granularity
    assert fields["Buckets"] == builder.address + header + shape.segment.size
    assert fields["NoOfTraces"] == fields["NoOfHits"] == 0
    segment = shape.segment.unpack(scenario.read(builder.address + header, shape.segment.size))
    assert segment["Magic"] == SEGMENT_MAGIC
    assert segment["Database"] == segment["SegmentStart"] == builder.address
    assert segment["SegmentEnd"] == builder.address + granularity
    assert segment["TotalSize"] == granularity
    assert segment["SegmentFree"] == fields["Buckets"] + 64 * shape.pointer_size


def test_add_carves_blocks_and_pushes_them_at_the_bucket_head():
    scenario = scenario_for("user-x64")
    builder = TraceDatabaseBuilder(scenario, "user-x64", buckets=16)
    # Swapping the two words of a pair keeps the hash, hence the bucket.
    first = [NTDLL_X64 + 0x10]
    second = [(first[0] & ~0xFFFFFFFF) | ((first[0] & 0xFFFF) << 16) | ((first[0] >> 16) & 0xFFFF)]
    assert builder.bucket_of(first) == builder.bucket_of(second)
    a = builder.add(first)
    b = builder.add(second)
    assert b == a + 0x38 + 8  # carved right after the first block
    assert builder.bucket_chain(builder.bucket_of(first)) == [b, a]  # newest first
    builder.sync()
    block = layout_named("user-x64").block.unpack(scenario.read(b, 0x38))
    assert (block["Magic"], block["Count"], block["Size"]) == (BLOCK_MAGIC, 1, 1)
    assert block["Next"] == a and block["Trace"] == b + 0x38
    assert builder.frames_of(b) == second


def test_a_repeated_trace_counts_a_hit_and_does_not_reorder_the_chain():
    scenario = scenario_for("user-x64")
    builder = TraceDatabaseBuilder(scenario, "user-x64", buckets=16)
    trace = frames_in(NTDLL_X64, 5)
    address = builder.add(trace)
    other = builder.add(frames_in(NTDLL_X64, 5, salt=4))
    assert builder.add(trace) == address
    assert builder.block_count(trace) == 2
    assert (builder.traces, builder.hits) == (2, 1)
    assert builder.find(trace) == address
    assert builder.find(frames_in(NTDLL_X64, 3)) is None
    if builder.bucket_of(trace) == builder.bucket_of(frames_in(NTDLL_X64, 5, salt=4)):
        assert builder.bucket_chain(builder.bucket_of(trace)) == [other, address]


def test_hash_counter_counts_every_lookup_and_every_new_trace():
    scenario = scenario_for("user-x64")
    builder = TraceDatabaseBuilder(scenario, "user-x64", buckets=32)  # 2 buckets per slot
    trace = frames_in(NTDLL_X64, 3)
    full_hash = stack_trace_hash_frames(trace, 8)
    builder.add(trace)
    builder.add(trace)
    builder.find(trace)
    expected = [0] * 16
    expected[full_hash & 0xF] += 3                     # three lookups
    expected[(full_hash % 32) // 2] += 1               # one new trace
    assert builder.hash_counter == expected


def test_hash_counter_slot_16_overflows_into_the_first_segment_magic():
    scenario = scenario_for("user-x64")
    builder = TraceDatabaseBuilder(scenario, "user-x64", buckets=6263)
    overflowed = 0
    salt = 0
    while overflowed < 3:
        trace = frames_in(NTDLL_X64, 4, salt=salt)
        salt += 4
        builder.add(trace)
        if builder.bucket_of(trace) >= 6256:
            overflowed += 1
    assert builder.first_segment_magic == SEGMENT_MAGIC + 3
    assert sum(builder.hash_counter) + 3 == 2 * builder.traces + builder.hits


def test_new_segments_have_the_layout_size_and_are_prepended():
    scenario, builder = database("kernel-x64", distinct=120, adds=120, buckets=64)
    assert len(builder.segments) > 2
    shape = layout_named("kernel-x64")
    newest = shape.segment.unpack(scenario.read(builder.segments[0], shape.segment.size))
    assert newest["TotalSize"] == 0x1000
    assert newest["SegmentStart"] == builder.segments[0]
    assert newest["NextSegment"] == builder.segments[1]
    assert builder.current_size == 0x1000 * len(builder.segments)


def test_a_big_bucket_array_runs_past_the_first_segment_end():
    scenario = scenario_for("user-x64")
    builder = TraceDatabaseBuilder(scenario, "user-x64", buckets=9000)
    address = builder.add(frames_in(NTDLL_X64, 4))
    builder.sync()
    shape = layout_named("user-x64")
    first = shape.segment.unpack(scenario.read(builder.address + 0xC0, shape.segment.size))
    assert first["SegmentFree"] == builder.address + 0xF8 + 9000 * 8 > first["SegmentEnd"]
    assert address == builder.segments[0] + shape.segment.size  # the block went to a new segment
    assert builder.current_size == 0x20000


def test_maximum_size_stops_growth_but_lookups_still_count():
    scenario = scenario_for("kernel-x64")
    builder = TraceDatabaseBuilder(scenario, "kernel-x64", buckets=16, maximum_size=0x1000)
    added = [builder.add(frames_in(0xFFFFF80000000000, 30, salt=4 * i)) for i in range(40)]
    assert None in added
    assert builder.current_size == 0x2000  # one segment past MaximumSize, then no more
    # Failed adds were still lookups: they show up as "external finds".
    assert sum(builder.hash_counter) > 2 * builder.traces + builder.hits


def test_refused_traces_and_bad_create_arguments():
    scenario = scenario_for("user-x86")
    builder = TraceDatabaseBuilder(scenario, "user-x86", buckets=16)
    assert builder.add([]) is None
    assert builder.add([0x77A01000] * 257) is None
    assert builder.traces == 0
    with pytest.raises(ValueError):
        TraceDatabaseBuilder(scenario, "user-x86", buckets=15)
    with pytest.raises(ValueError):
        TraceDatabaseBuilder(scenario, "user-x86", buckets=0x100001)
    with pytest.raises(ValueError):
        TraceDatabaseBuilder(scenario, "user-x64")  # an x86 scenario
    with pytest.raises(ValueError):
        TraceDatabaseBuilder(Scenario("x64", "user"), "user-x64")  # no ntdll for the default hash


def test_database_frames_come_from_named_functions_and_hits_accumulate():
    scenario, builder = database("user-x64", distinct=50, adds=200)
    target = scenario.target()
    assert builder.traces == 50 and builder.hits == 150
    block = builder.bucket_chain(next(b for b in range(6263) if builder.bucket_chain(b)))[0]
    for frame in builder.frames_of(block):
        assert "!" in target.symbolize(frame)


def test_add_sample_database_brings_its_own_driver_and_leaves_others_alone():
    scenario = Scenario("x64", "kernel")
    scenario.add_module("nt", 0xFFFFF80000000000, 0x100000, image="ntoskrnl.exe")
    other = scenario.add_module("otherdrv", 0xFFFFF80012340000, 0x4000, image="otherdrv.sys")
    address = add_sample_database(scenario)
    target = scenario.target()
    assert target.u32(address) == DATABASE_MAGIC
    tracedrv = target.module_named("tracedrv")
    assert tracedrv is not None and tracedrv.base >= other.end
    assert scenario.module_symbols["otherdrv"].symbols == {}
    assert scenario.read(other.base, other.size) == bytes(other.size)
    assert target.pointer(target.symbol_address("tracedrv!g_TraceDatabase")) == address
    with pytest.raises(ValueError):
        add_sample_database(scenario_for("user-x64"))


def test_the_default_hash_is_the_same_for_frames_and_their_bytes_on_both_architectures():
    import struct
    from dbgext.stackhash import stack_trace_hash, stack_trace_hash_frames
    frames64 = [0xFFFFF80000123456, 0x00007FF612345678, 0xFFFFF801ABCDEF01]
    frames32 = [0x80123456, 0x7712ABCD, 0x0040F00D]
    # w0^w1 + w2^w3 per 64-bit frame, w0^w1 per 32-bit frame
    expected64 = sum(((f & 0xFFFF) ^ (f >> 16 & 0xFFFF)) + ((f >> 32 & 0xFFFF) ^ (f >> 48)) for f in frames64)
    expected32 = sum((f & 0xFFFF) ^ (f >> 16) for f in frames32)
    assert stack_trace_hash_frames(frames64, 8) == expected64 & 0xFFFFFFFF
    assert stack_trace_hash(struct.pack("<3Q", *frames64)) == expected64 & 0xFFFFFFFF
    assert stack_trace_hash_frames(frames32, 4) == expected32
