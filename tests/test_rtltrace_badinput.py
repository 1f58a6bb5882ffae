"""Corrupt databases and bad arguments: problems with addresses, clean exits,
bounded work."""

import random

import pytest

from dbgext.render.text import hexaddr
from dbgext.rtltrace.layouts import layout_named
from dbgext.target.base import Target
from dbgext.target.image import ImageBackend

from rtltrace_support import database, problem_kinds, run, run_json

USER = layout_named("user-x64")
KERNEL = layout_named("kernel-x64")


def corrupt(layout="user-x64", **options):
    scenario, builder = database(layout, distinct=options.pop("distinct", 200),
                                 adds=options.pop("adds", 400), **options)
    return scenario, builder


def analyse(scenario, builder, *extra):
    return run_json(["0x%x" % builder.address] + list(extra), target=scenario.target())


def problems_of(document, kind):
    return [p for p in document["problems"] if p["kind"] == kind]


def first_block(builder):
    bucket = next(b for b in range(builder.buckets) if builder.bucket_chain(b))
    return bucket, builder.bucket_chain(bucket)[0]


def longest_bucket(builder):
    return max(range(builder.buckets), key=lambda b: len(builder.bucket_chain(b)))


def test_a_wrong_database_magic_is_refused_in_one_line_naming_what_is_there():
    scenario, builder = corrupt()
    scenario.pack(builder.address, "<I", 0x12345678)
    code, text = run(["0x%x" % builder.address], target=scenario.target())
    assert code == 1 and text.count("\n") == 1
    assert "no RTL_TRACE_DATABASE at %s: found 0x12345678" % hexaddr(builder.address) in text
    assert "--force" in text


def test_a_segment_address_given_for_the_database_is_named_as_a_segment():
    scenario, builder = corrupt()
    code, text = run(["0x%x" % builder.segments[0]], target=scenario.target())
    assert code == 1 and "the magic of an RTL_TRACE_SEGMENT" in text


def test_force_walks_a_wrong_magic_reporting_it_and_going_on():
    scenario, builder = corrupt()
    scenario.pack(builder.address, "<I", 0x12345678)
    document = analyse(scenario, builder, "--layout", "user-x64", "--force")
    assert document["magic_ok"] is False
    assert problems_of(document, "bad_magic")[0]["address"] == builder.address
    assert document["blocks_found"] == 200


def test_bad_segment_magic_names_the_segment():
    scenario, builder = corrupt()
    scenario.pack(builder.segments[0], "<I", 0)
    document = analyse(scenario, builder)
    assert [p["address"] for p in problems_of(document, "bad_magic")] == [builder.segments[0]]


def test_a_first_segment_magic_beyond_the_overflow_count_is_bad():
    scenario, builder = corrupt()
    scenario.pack(builder.address + 0xC0, "<I", 0xABCDBBBB + 1000)
    document = analyse(scenario, builder)
    assert problems_of(document, "bad_magic")[0]["address"] == builder.address + 0xC0


def test_bad_block_magic_stops_that_chain_only():
    scenario, builder = corrupt()
    bucket, block = first_block(builder)
    scenario.pack(block, "<I", 0xDEADBEEF)
    document = analyse(scenario, builder)
    assert problems_of(document, "bad_magic")[0]["address"] == block
    assert document["blocks_found"] == 200 - len(builder.bucket_chain(bucket)) + 1


def test_a_cycle_in_a_bucket_chain_is_detected():
    scenario, builder = corrupt("kernel-x64")
    bucket = longest_bucket(builder)
    chain = builder.bucket_chain(bucket)
    assert len(chain) >= 2
    scenario.write_pointer(chain[-1] + 0x28, chain[0])  # last Next -> head
    document = analyse(scenario, builder)
    cycle = problems_of(document, "bucket_cycle")
    assert cycle and cycle[0]["address"] == chain[0]
    assert document["blocks_found"] == 200


def test_a_chain_running_into_another_bucket_is_a_cross_link():
    scenario, builder = corrupt("kernel-x64")
    buckets = [b for b in range(builder.buckets) if builder.bucket_chain(b)]
    first, second = builder.bucket_chain(buckets[0]), builder.bucket_chain(buckets[1])
    scenario.write_pointer(second[-1] + 0x28, first[0])
    document = analyse(scenario, builder)
    assert problems_of(document, "bucket_cross_link")[0]["address"] == first[0]


def test_a_cycle_in_the_segment_list_is_detected():
    scenario, builder = corrupt("kernel-x64")
    oldest = builder.address + 0xD8
    scenario.write_pointer(oldest + 0x10, builder.segments[0])
    document = analyse(scenario, builder)
    assert problems_of(document, "segment_cycle")[0]["address"] == builder.segments[0]
    assert len(document["segments"]) == len(builder.segments)


def test_a_block_pointer_into_unreadable_memory_is_reported_with_its_address():
    scenario, builder = corrupt()
    bucket, _ = first_block(builder)
    nowhere = 0x00007FF000000000
    scenario.write_pointer(builder.buckets_address + 8 * bucket, nowhere)
    document = analyse(scenario, builder)
    unreadable = problems_of(document, "unreadable")
    assert unreadable[0]["address"] == nowhere
    assert "bucket %d" % bucket in unreadable[0]["message"]
    assert "count_mismatch" in problem_kinds(document)


@pytest.mark.parametrize("count", [0, 2 ** 31])
def test_absurd_bucket_counts_are_reported_and_bounded(count):
    scenario, builder = corrupt(distinct=20, adds=20)
    scenario.pack(builder.address + USER.database.offsets["NoOfBuckets"], "<I", count)
    document = analyse(scenario, builder)
    assert problems_of(document, "bad_bucket_count")[0]["address"] == builder.address + 0x58
    assert document["buckets"] == count


def test_a_block_claiming_a_billion_frames_is_not_read():
    scenario, builder = corrupt()
    _, block = first_block(builder)
    scenario.pack(block + 8, "<I", 10 ** 9)
    document = analyse(scenario, builder)
    assert problems_of(document, "bad_block_size")[0]["address"] == block
    assert document["blocks_found"] == 200  # its Next was still followed


def test_a_buckets_pointer_to_unreadable_memory():
    scenario, builder = corrupt()
    scenario.write_pointer(builder.address + USER.database.offsets["Buckets"], 0x00007FF000000000)
    document = analyse(scenario, builder)
    assert problems_of(document, "unreadable")[0]["address"] == 0x00007FF000000000
    assert document["blocks_found"] == 0


def test_pages_missing_from_the_dump_are_reported_and_the_rest_walked():
    scenario, builder = corrupt("kernel-x64")
    missing = builder.segments[2]
    scenario.unmap(missing, 0x1000)
    document = analyse(scenario, builder)
    unreadable = problems_of(document, "unreadable")
    assert unreadable and all(missing <= p["address"] < missing + 0x1000 for p in unreadable)
    assert 0 < document["blocks_found"] < 200
    assert "count_mismatch" in problem_kinds(document)


def test_an_unreadable_header_is_refused_in_one_line_and_force_gives_one_problem():
    scenario, _ = corrupt(distinct=5, adds=5)
    target = scenario.target()
    code, text = run(["0x7ff000000000"], target=target)
    assert code == 1 and text.count("\n") == 1
    assert "no RTL_TRACE_DATABASE header can be read at 00007ff0`00000000" in text
    document = run_json(["0x7ff000000000", "--layout", "user-x64", "--force"], target=target)
    assert problem_kinds(document) == ["unreadable"]


def test_garbage_memory_is_walked_without_a_hang():
    scenario, _ = corrupt(distinct=5, adds=5)
    garbage = scenario.alloc_pages(0x4000)
    scenario.write(garbage, random.Random(181).getrandbits(8 * 0x4000).to_bytes(0x4000, "little"))
    document = run_json(["0x%x" % garbage, "--force"], target=scenario.target())
    assert "assuming" in document["layout_reason"]
    assert "bad_magic" in problem_kinds(document)


def test_a_block_in_the_wrong_bucket_is_reported():
    scenario, builder = corrupt()
    buckets = [b for b in range(builder.buckets) if builder.bucket_chain(b)]
    moved = builder.bucket_chain(buckets[0])[-1]
    # Splice the oldest block of one bucket to the end of another bucket's chain.
    scenario.write_pointer(builder.bucket_chain(buckets[1])[-1] + 0x28, moved)
    before = builder.bucket_chain(buckets[0])
    if len(before) > 1:
        scenario.write_pointer(before[-2] + 0x28, 0)
    else:
        scenario.write_pointer(builder.buckets_address + 8 * buckets[0], 0)
    document = analyse(scenario, builder)
    wrong = problems_of(document, "wrong_bucket")
    assert [p["address"] for p in wrong] == [moved]
    assert document["hash_function"]["kind"] == "default"


def test_counts_that_disagree_with_the_blocks():
    scenario, builder = corrupt()
    scenario.pack(builder.address + USER.database.offsets["NoOfTraces"], "<Q", 201)
    scenario.pack(builder.address + USER.database.offsets["NoOfHits"], "<Q", 7)
    document = analyse(scenario, builder)
    mismatches = sorted(p["address"] - builder.address for p in problems_of(document, "count_mismatch"))
    assert mismatches == [0x70, 0x78]


def test_a_hash_counter_below_the_blocks_lookups():
    scenario, builder = corrupt()
    slot = max(range(16), key=lambda k: builder.hash_counter[k])
    scenario.pack(builder.address + 0x80 + 4 * slot, "<I", 0)
    document = analyse(scenario, builder)
    addresses = [p["address"] for p in problems_of(document, "hash_counter_mismatch")]
    assert builder.address + 0x80 + 4 * slot in addresses


def test_a_block_outside_every_segment():
    scenario, builder = corrupt()
    bucket, block = first_block(builder)
    size = 0x38 + 8 * len(builder.frames_of(block))
    stray = scenario.alloc(size)
    scenario.write(stray, scenario.read(block, size))
    scenario.write_pointer(stray + 0x30, stray + 0x38)
    scenario.write_pointer(builder.buckets_address + 8 * bucket, stray)
    document = analyse(scenario, builder)
    assert problems_of(document, "block_outside_segments")[0]["address"] == stray


def test_many_identical_problems_are_summarised():
    scenario, builder = corrupt("kernel-x64", distinct=400, adds=400)
    for block in [b for bucket in range(builder.buckets) for b in builder.bucket_chain(bucket)]:
        scenario.pack(block + 0x30, "<Q", 1)  # every Trace pointer wrong
    document = analyse(scenario, builder)
    assert len(problems_of(document, "bad_trace_pointer")) == 200
    assert "200 more bad_trace_pointer" in problems_of(document, "problems_truncated")[0]["message"]


@pytest.mark.parametrize("argv,message", [
    ([], "give the database address"),
    (["not-an-address"], "unknown symbol 'not'"),
    (["nt!+"], "bad token"),
    (["--bucket", "99999"], "outside"),
    (["--bucket", "0n12x"], "bad token"),
    (["--module", "nosuch"], "no module named"),
    (["--range", "0", "10"], "--find only"),
    (["--find", "--range", "10", "0"], "must end above its start"),
    (["--trace", "0x7ff000000000"], "unreadable"),
])
def test_bad_arguments_give_one_line_and_exit_one(argv, message):
    scenario, builder = corrupt(distinct=5, adds=5)
    if argv and argv[0].startswith("--") and argv[0] != "--find":
        argv = ["0x%x" % builder.address] + argv
    code, text = run(argv, target=scenario.target())
    assert code == 1
    assert message in text and "Traceback" not in text


def test_find_without_a_memory_map_needs_a_range():
    class LiveLike(ImageBackend):
        def mapped_ranges(self):
            return None

    scenario, builder = corrupt(distinct=5, adds=5)
    pages = {address: bytes(page) for address, page in scenario.pages.items()}
    target = Target(LiveLike(pages, "x64", scenario.modules, scenario.symbol_table()))
    code, text = run(["--find"], target=target)
    assert code == 1 and "--range" in text
    found = run_json(["--find", "--range", "0x%x" % builder.address, "0x%x" % (builder.address + 0x2000)],
                     target=target)
    assert [c["address"] for c in found["candidates"]] == [builder.address]


SEGMENT_FIELDS = layout_named("kernel-x64").segment.offsets


@pytest.mark.parametrize("field,value,kind", [
    ("Database", 0xFFFFC08012345000, "segment_database_mismatch"),
    ("TotalSize", 0x2000, "segment_size_mismatch"),
    ("SegmentFree", 0x10, "segment_free_before_start"),
    ("SegmentFree", None, "segment_free_past_end"),
    ("NextSegment", 0, "first_segment_missing"),
])
def test_segment_header_corruption(field, value, kind):
    scenario, builder = corrupt("kernel-x64")
    segment = builder.segments[1]
    if value is None:
        value = segment + 0x2000  # past SegmentEnd
    scenario.write_pointer(segment + SEGMENT_FIELDS[field], value)
    document = analyse(scenario, builder)
    assert kind in problem_kinds(document)
    assert problems_of(document, kind)[0]["address"] in (segment, builder.segments[1])


def test_current_size_and_maximum_size_are_checked():
    scenario, builder = corrupt("kernel-x64")
    scenario.write_pointer(builder.address + KERNEL.database.offsets["CurrentSize"], 0x1000)
    scenario.write_pointer(builder.address + KERNEL.database.offsets["MaximumSize"], 0x1000)
    kinds = problem_kinds(analyse(scenario, builder))
    assert "current_size_mismatch" in kinds and "maximum_size_exceeded" not in kinds
    scenario.write_pointer(builder.address + KERNEL.database.offsets["CurrentSize"], builder.current_size)
    assert "maximum_size_exceeded" in problem_kinds(analyse(scenario, builder))


def test_header_fields_windows_never_leaves_empty():
    scenario, builder = corrupt()
    scenario.pack(builder.address + USER.database.offsets["Flags"], "<I", 0)
    scenario.write_pointer(builder.address + USER.database.offsets["HashFunction"], 0)
    document = analyse(scenario, builder)
    assert {"bad_flags", "null_hash_function"} <= set(problem_kinds(document))
    assert document["hash_function"]["kind"] == "default"  # the placement still says so


def test_a_null_buckets_pointer():
    scenario, builder = corrupt(distinct=5, adds=5)
    scenario.write_pointer(builder.address + USER.database.offsets["Buckets"], 0)
    assert "null_buckets" in problem_kinds(analyse(scenario, builder))


def test_a_block_with_count_zero():
    scenario, builder = corrupt()
    _, block = first_block(builder)
    scenario.pack(block + 4, "<I", 0)
    document = analyse(scenario, builder)
    assert problems_of(document, "bad_count")[0]["address"] == block


def test_segments_claiming_huge_sizes_are_not_read_in_bulk():
    scenario, builder = corrupt("kernel-x64")
    for segment in builder.segments[:-1]:
        scenario.write_pointer(segment + SEGMENT_FIELDS["SegmentEnd"], segment + 0x40000000)
        scenario.write_pointer(segment + SEGMENT_FIELDS["SegmentFree"], segment + 0x40000000)
    target = scenario.target()
    document = run_json(["0x%x" % builder.address], target=target)
    assert document["blocks_found"] == 200  # read block by block instead
    assert "segment_size_mismatch" in problem_kinds(document)
    assert target.stats.bytes_read < 0x1000000


def test_a_trace_address_that_holds_no_block_is_refused_unless_forced():
    scenario, builder = corrupt(distinct=5, adds=5)
    target = scenario.target()
    code, text = run(["0x%x" % builder.address, "--trace", "0x%x" % builder.address], target=target)
    assert code == 1 and "no RTL_TRACE_BLOCK at %s: found the magic of an RTL_TRACE_DATABASE" % hexaddr(
        builder.address) in text
    document = run_json(["0x%x" % builder.address, "--trace", "0x%x" % builder.address, "--force"], target=target)
    assert document["selection"] == "trace" and document["trace_list"][0]["address"] == builder.address
