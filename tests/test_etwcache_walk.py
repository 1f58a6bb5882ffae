"""Walking and validating caches in memory, including damaged ones: every problem
is reported with its address, the walk is bounded and goes on."""

import struct

import pytest

from dbgext.errors import UnreadableMemory, WrongSignature
from dbgext.etwcache import analyze, layouts, validate, walk
from dbgext.problems import ProblemLog
from dbgext.render.text import hexaddr
from dbgext.etwcache.fixtures import PIECE_STRIDE, StackCacheBuilder
from dbgext.stackhash import stack_trace_hash_frames

from etwcache_support import kernel_scenario, random_stacks, scenario_with_cache


def built(variant="B", buckets=7, pieces=60, count=400, seed=5):
    stacks = random_stacks(count, distinct=60, seed=seed)
    scenario, context, builder = scenario_with_cache(stacks, variant, buckets, pieces)
    return scenario, context, builder


def kinds(problems):
    return sorted({p.kind for p in problems})


@pytest.mark.parametrize("variant", ["A", "B"])
def test_a_healthy_cache_reads_back_whole_and_validates_clean(variant):
    scenario, context, builder = built(variant, buckets=257)
    state = walk.read_cache(scenario.target(), builder.address)
    assert state.variant == variant and state.variant_confidence == "high"
    assert state.bucket_count == 257
    assert state.total_pieces == len(builder.pieces)
    assert len(state.free_pieces) == state.free_depth == len(builder.free)
    validate.validate(state)
    assert state.problems == []
    for entry in state.entries:
        assert entry.refcount == 1
        assert list(entry.frames) == list(builder.stack_frames(entry.key))
        assert len(entry.frames) == entry.frame_count
    assert sum(state.occupancy()) == 257
    assert state.owner == (context if variant == "B" else 3)


def test_variant_can_be_forced_and_a_wrong_forced_variant_shows_as_problems():
    scenario, _context, builder = built("B")
    state = walk.read_cache(scenario.target(), builder.address, variant="A")
    assert state.variant == "A" and state.variant_confidence == "given"
    assert state.problems  # BucketCount read from the pointer's high half


def test_unreadable_cache_pointer_is_one_problem():
    scenario = kernel_scenario()
    state = walk.read_cache(scenario.target(), 0xFFFFC0DEAD000000)
    assert not state.readable
    assert [(p.kind, p.address) for p in state.problems] == [("unreadable", 0xFFFFC0DEAD000000)]


def test_memory_that_no_variant_fits_is_not_walked_and_a_given_address_is_refused():
    scenario = kernel_scenario()
    junk = scenario.alloc(0x1000)
    scenario.write(junk, b"\xAB" * 0x1000)
    state = walk.read_cache(scenario.target(), junk)
    assert not state.readable and kinds(state.problems) == ["variant"]
    with pytest.raises(WrongSignature, match="no ETW stack cache at %s: found memory that fits no cache header "
                       "variant" % hexaddr(junk)):
        analyze(scenario.target(), cache=junk)


def test_an_unreadable_cache_address_is_refused_in_one_line():
    scenario = kernel_scenario()
    with pytest.raises(UnreadableMemory, match="no ETW stack cache header can be read at ffffc0de`ad000000"):
        analyze(scenario.target(), cache=0xFFFFC0DEAD000000)


def test_force_walks_memory_that_no_variant_fits_and_says_so():
    scenario = kernel_scenario()
    junk = scenario.alloc(0x1000)
    scenario.write(junk, b"\xAB" * 0x1000)
    state = walk.read_cache(scenario.target(), junk, force=True)
    assert state.variant == "B" and "variant" in kinds(state.problems)


def test_bucket_count_zero_is_reported_and_nothing_is_walked():
    scenario, _context, builder = built("B")
    scenario.pack(builder.address + 8, "<I", 0)
    state = walk.read_cache(scenario.target(), builder.address, variant="B")
    assert "bucket_count" in kinds(state.problems) and state.buckets == []


def test_looping_bucket_list_stops_with_a_cycle_problem():
    scenario, _context, builder = built("B", buckets=3, pieces=60)
    bucket = next(i for i in range(3) if len(builder.bucket_entries(i)) >= 2)
    first, second = builder.bucket_entries(bucket)[:2]
    scenario.pack(second, "<Q", first)  # second.Flink -> first: a loop that never reaches the head
    state = walk.read_cache(scenario.target(), builder.address)
    assert "cycle" in kinds(state.problems)
    assert len(state.buckets[bucket]) == 2


def test_bucket_list_through_unreadable_memory_reports_the_address():
    scenario, _context, builder = built("B", buckets=3)
    bucket = next(i for i in range(3) if builder.bucket_entries(i))
    head = builder.bucket_head(bucket)
    scenario.pack(head, "<Q", 0xFFFFC0DEAD000000)
    state = walk.read_cache(scenario.target(), builder.address)
    assert ("unreadable", 0xFFFFC0DEAD000000) in [(p.kind, p.address) for p in state.problems]


def test_piece_chain_that_loops_or_runs_past_frame_count_is_cut():
    stacks = [[0xFFFFF80000001000 + 8 * i for i in range(70)]]  # 3 pieces
    scenario, _context, builder = scenario_with_cache(stacks, "B", 7, 10)
    key = builder.bucket_entries(stack_trace_hash_frames(stacks[0]) % 7)[0]
    second = builder.pieces[key].next
    scenario.pack(second + 0x10, "<Q", key)  # second.Next -> first
    state = walk.read_cache(scenario.target(), builder.address)
    assert "chain_cycle" in kinds(state.problems)
    scenario.pack(key + 0x20, "<I", 40)  # FrameCount 40 allows 2 pieces; the chain has 3
    scenario.pack(second + 0x10, "<Q", builder.pieces[second].next)
    state = walk.read_cache(scenario.target(), builder.address)
    assert "chain_too_long" in kinds(state.problems)


def test_frame_count_of_all_ones_is_bounded():
    scenario, _context, builder = built("B", buckets=3)
    key = next(k for i in range(3) for k in builder.bucket_entries(i))
    scenario.pack(key + 0x20, "<I", 0xFFFFFFFF)
    state = walk.read_cache(scenario.target(), builder.address)
    assert {"frame_count", "chain_short"} <= set(kinds(state.problems))
    entry = state.find(key)
    assert len(entry.frames) <= layouts.MAX_PLAUSIBLE_FRAMES


def test_slist_depth_that_disagrees_with_its_chain_is_flagged():
    scenario, _context, builder = built("B")
    low = struct.unpack("<Q", scenario.read(builder.address + 0x10, 8))[0]
    scenario.pack(builder.address + 0x10, "<Q", (low & ~0xFFFF) | ((low + 5) & 0xFFFF))
    state = walk.read_cache(scenario.target(), builder.address)
    validate.validate(state)
    assert kinds(state.problems) == ["free_depth"]


def test_free_list_loop_and_piece_both_free_and_used():
    scenario, _context, builder = built("B", buckets=3, pieces=80)
    top = builder.free[-1]
    scenario.pack(top, "<Q", top)  # the top free piece points to itself
    state = walk.read_cache(scenario.target(), builder.address)
    assert "free_list_cycle" in kinds(state.problems)
    scenario, _context, builder = built("B", buckets=3, pieces=80)
    used = next(k for i in range(3) for k in builder.bucket_entries(i))
    scenario.pack(builder.free[0], "<Q", used)  # bottom free piece -> a cached piece
    state = walk.read_cache(scenario.target(), builder.address)
    validate.validate(state)
    assert "free_and_used" in kinds(state.problems)


def test_validator_finds_overfull_buckets_wrong_buckets_hashes_and_refcounts():
    scenario = kernel_scenario()
    builder = StackCacheBuilder(scenario, bucket_count=2, total_pieces=20)
    stacks = [[0xFFFFF80000001000 + i] for i in range(6)]
    for frames in stacks:
        builder.reference(frames)
    builder.finish()
    # Move every entry of bucket 0 into bucket 1's list: one list of 5+ entries.
    entries = builder.bucket_entries(0) + builder.bucket_entries(1)
    head0, head1 = builder.bucket_head(0), builder.bucket_head(1)
    chain = [head1] + entries
    for index, node in enumerate(chain):
        scenario.pack(node, "<QQ", chain[(index + 1) % len(chain)], chain[index - 1])
    scenario.pack(head0, "<QQ", head0, head0)
    scenario.pack(entries[0] + 0x18, "<i", 2)
    scenario.pack(entries[1] + 0x1C, "<I", 0x12345678)
    idle = analyze(scenario.target(), cache=builder.address, variant="B")
    assert {"bucket_overfull", "wrong_bucket", "hash_mismatch", "refcount"} <= set(kinds(idle.problems))
    busy = analyze(scenario.target(), cache=builder.address, variant="B", busy=True)
    assert "refcount" not in kinds(busy.problems)


def test_pieces_are_16_byte_aligned_slist_entries():
    scenario, _context, builder = built("B")
    assert PIECE_STRIDE % 16 == 0
    assert all(address % 16 == 0 for address in builder.pieces)


def test_summaries_histogram_and_wasted_bytes():
    scenario = kernel_scenario()
    builder = StackCacheBuilder(scenario, bucket_count=257, total_pieces=10)
    builder.reference([0xFFFFF80000001000 + i for i in range(33)])  # 2 pieces, 31 empty slots
    builder.reference([0xFFFFF80000002000])                          # 1 piece, 31 empty slots
    builder.finish()
    state = walk.read_cache(scenario.target(), builder.address)
    assert state.frame_histogram() == {1: 1, 33: 1}
    assert state.wasted_bytes() == 62 * 8
    assert (state.used_pieces, len(state.free_pieces), state.cache_size) == (3, 7, 10 * 0x128)


def test_thousands_of_damaged_entries_are_summarised_past_200_of_a_kind():
    scenario = kernel_scenario()
    builder = StackCacheBuilder(scenario, bucket_count=300, total_pieces=400)
    for index in range(300):
        builder.reference([0xFFFFF80000000000 + index])  # hash index + 0x7ff: one per bucket
    builder.finish()
    for key in [k for i in range(300) for k in builder.bucket_entries(i)]:
        scenario.pack(key + 0x20, "<I", 0xFFFFFFFF)
    problems = analyze(scenario.target(), cache=builder.address).problems
    frame_count_problems = [p for p in problems if p.kind == "frame_count"]
    assert len(frame_count_problems) == ProblemLog.MAX_PER_KIND
    assert any(p.kind == "problems_truncated" and "frame_count" in p.message for p in problems)
