"""The simulator reproduces, bucket for bucket, what the cache builder (the kernel's
algorithm over real links in memory) leaves behind, and its metrics are right."""

import random
import struct

import pytest

from dbgext.etwcache import replay, walk
from dbgext.stackhash import stack_trace_hash_frames
from dbgext.etwcache.replay import StackStream

from etwcache_support import random_stacks, scenario_with_cache, walked_state


def stream_of(stacks):
    stream = StackStream()
    for frames in stacks:
        stream.add(frames)
    return stream


def test_hash_sums_xors_of_16_bit_word_pairs():
    frame = 0x1111222233334444
    assert stack_trace_hash_frames([frame]) == (0x4444 ^ 0x3333) + (0x2222 ^ 0x1111)
    assert stack_trace_hash_frames([frame, frame]) == 2 * stack_trace_hash_frames([frame])
    assert stack_trace_hash_frames([0xFFFF0000FFFF0000] * 0x20000) == (0xFFFF * 2 * 0x20000) & 0xFFFFFFFF
    assert stack_trace_hash_frames([]) == 0


@pytest.mark.parametrize("frame_count", [1, 2, 3, 31, 32, 33, 256, 1000, 20000])
def test_fast_hash_equals_the_word_by_word_definition(frame_count):
    rng = random.Random(frame_count)
    frames = [rng.getrandbits(64) for _ in range(frame_count)]
    words = struct.unpack("<%dH" % (4 * frame_count), struct.pack("<%dQ" % frame_count, *frames))
    expected = sum(words[i] ^ words[i + 1] for i in range(0, len(words), 2)) & 0xFFFFFFFF
    assert stack_trace_hash_frames(frames) == expected
    assert stack_trace_hash_frames([0xFFFF0000FFFF0000 | f & 0xFFFF for f in frames]) == sum(
        (0xFFFF ^ (f & 0xFFFF)) + 0xFFFF for f in frames) & 0xFFFFFFFF


@pytest.mark.parametrize("variant", ["A", "B"])
@pytest.mark.parametrize("buckets,pieces,seed", [(7, 40, 1), (13, 400, 2), (5, 9, 3), (256, 30, 4)])
def test_simulator_matches_the_builders_cache_bucket_for_bucket(variant, buckets, pieces, seed):
    stacks = random_stacks(1500, distinct=120, seed=seed)
    scenario, _context, builder = scenario_with_cache(stacks, variant, buckets, pieces)
    state = walk.read_cache(scenario.target(), builder.address)
    result = replay.simulate(stream_of(stacks), buckets, pieces)
    assert walked_state(state) == replay.final_state(result, stream_of(stacks))
    assert len(state.free_pieces) == result.free_pieces
    assert (result.hits, result.evictions, result.starvation_fallbacks) == (
        builder.hits, builder.evictions, builder.starvation_fallbacks)


def test_a_hit_moves_the_entry_to_the_front_and_a_miss_appends_at_the_tail():
    # One bucket: every stack lands in it.
    a, b, c = [0x10], [0x20], [0x30]
    result = replay.simulate(stream_of([a, b, c]), 1, 10)
    assert result.buckets[0] == [0, 1, 2]          # misses: insertion order, tail last
    stream = stream_of([a, b, c, c])
    result = replay.simulate(stream, 1, 10)
    assert [stream.stacks[i] for i in result.buckets[0]] == [tuple(c), tuple(a), tuple(b)]
    assert (result.hits, result.misses) == (1, 3)


def test_a_full_bucket_evicts_its_least_recently_used_tail():
    stacks = [[0x10], [0x20], [0x30], [0x40], [0x10], [0x50]]
    stream = stream_of(stacks)
    result = replay.simulate(stream, 1, 10)
    # After the hit on 0x10 the order is 10,20,30,40; the miss on 0x50 evicts 0x40.
    assert [stream.stacks[i][0] for i in result.buckets[0]] == [0x10, 0x20, 0x30, 0x50]
    assert result.evictions == result.delete_definitions == 1


def test_starvation_drops_the_evicted_tail_without_caching_the_new_stack():
    deep = [0x1000 + i for i in range(40)]  # needs 2 pieces
    stacks = [[0x10], [0x20], [0x30], [0x40], deep]
    stream = stream_of(stacks)
    result = replay.simulate(stream, 1, 4)
    # 4 one-piece stacks fill the pieces; the deep one evicts 0x40 but, with the
    # evicted pieces returned only afterwards, finds 0 free pieces.
    assert result.starvation_fallbacks == 1
    assert [stream.stacks[i][0] for i in result.buckets[0]] == [0x10, 0x20, 0x30]
    assert result.free_pieces == 1
    assert result.peak_pieces == 4


def test_stacks_are_split_into_kernel_and_user_entries():
    stream = StackStream()
    stream.add_split([0xFFFFF80000001000, 0xFFFFF80000002000, 0x7FF700001000])
    assert stream.stacks == [(0xFFFFF80000001000, 0xFFFFF80000002000), (0x7FF700001000,)]
    assert stream.sequence == [0, 1]


def test_empty_stacks_are_never_cached():
    stream = StackStream()
    assert stream.add([]) is None
    assert len(stream) == 0


def test_sweep_clamps_like_windows_and_recommends_a_starvation_free_point():
    stream = stream_of(random_stacks(3000, distinct=400, seed=9))
    results, notes = replay.sweep(stream, [16, 257], [0x1000, 0x300000])
    assert {(r.bucket_count, r.cache_size // 0x128 * 0x128) for r in results} == {
        (256, 0x300000 // 0x128 * 0x128), (257, 0x300000 // 0x128 * 0x128)}
    assert any("clamped" in note for note in notes)
    unclamped, notes = replay.sweep(stream, [7], [0x1000, 0x300000], clamp=False)
    assert notes == [] and unclamped[0].starvation_fallbacks > 0
    choice = replay.recommend(unclamped)
    assert choice["cache_size"] == unclamped[1].cache_size
    assert "no starvation" in choice["reason"]


def test_bucket_count_zero_is_refused():
    with pytest.raises(ValueError):
        replay.simulate(stream_of([[1]]), 0, 10)
