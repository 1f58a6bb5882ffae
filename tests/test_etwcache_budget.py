"""Inside WinDbg every pykd call is a debugger round trip: a cache is read in runs
of pages, at most 3 engine calls per page of cache memory plus a small constant
(counted through the fake pykd)."""

import pytest

from dbgext.etwcache import analyze, layouts
from dbgext.etwcache.fixtures import PIECE_STRIDE, StackCacheBuilder
from dbgext.etwcache.walk import MAX_READ_AHEAD
from dbgext.target.base import PAGE_SIZE
from dbgext.target.pykd_backend import open_pykd_target
from fake_pykd import make_fake_pykd

from etwcache_support import kernel_scenario, random_stacks
from pykd_support import memory_engine_calls, run_windbg_script

CONSTANT = 64  # variant detection, the logger and symbol look-ups: not per page
THREE_MB_PIECES = layouts.MIN_CACHE_SIZE // layouts.PIECE_SIZE


def cache_pages(builder):
    """Pages of cache memory: the header with its buckets, and the piece pool."""
    header = layouts.HEADER_SIZE + builder.bucket_count * layouts.BUCKET_SIZE
    pool = len(builder.pieces) * PIECE_STRIDE
    return sum((end - 1) // PAGE_SIZE - start // PAGE_SIZE + 1
               for start, end in ((builder.address, builder.address + header),
                                  (builder.pieces_base, builder.pieces_base + pool)))


def three_mb_cache(stacks, bucket_count=1021):
    scenario = kernel_scenario()
    builder = StackCacheBuilder(scenario, bucket_count=bucket_count, total_pieces=THREE_MB_PIECES)
    builder.feed(stacks)
    builder.finish()
    return scenario, builder


@pytest.mark.parametrize("stacks", [
    pytest.param([], id="empty: every piece free"),
    pytest.param(random_stacks(6000, distinct=3000, seed=3, max_depth=200), id="half used after evictions"),
])
def test_a_3mb_cache_costs_at_most_3_engine_calls_per_page(stacks):
    scenario, builder = three_mb_cache(stacks)
    text, fake = run_windbg_script("etwstacks", ["--cache", "%x" % builder.address, "--validate"], scenario)
    assert "problems: none" in text
    pages = cache_pages(builder)
    assert pages > 780
    assert memory_engine_calls(fake) <= 3 * pages + CONSTANT
    # Runs, not pages: the pool's ~790 pages take a few dozen reads.
    assert fake.fake_calls["loadBytes"] <= pages // 8 + CONSTANT


def test_the_free_list_is_read_ahead_in_either_direction():
    scenario = kernel_scenario()
    builder = StackCacheBuilder(scenario, bucket_count=257, total_pieces=THREE_MB_PIECES)
    builder.free.reverse()  # the top is now the lowest piece: the list climbs
    builder.finish()
    text, fake = run_windbg_script("etwstacks", ["--cache", "%x" % builder.address, "--validate"], scenario)
    assert "problems: none" in text
    assert fake.fake_calls["loadBytes"] <= cache_pages(builder) // 8 + CONSTANT


def test_a_free_list_longer_than_the_slist_depth_can_count_is_still_read_in_runs():
    scenario = kernel_scenario()
    builder = StackCacheBuilder(scenario, bucket_count=257, total_pieces=70000)  # depth reads 70000 - 65536
    builder.finish()
    text, fake = run_windbg_script("etwstacks", ["--cache", "%x" % builder.address], scenario)
    assert "70000 total" in text
    assert fake.fake_calls["loadBytes"] <= cache_pages(builder) // 8 + CONSTANT


def test_a_free_list_jumping_across_the_pool_reads_each_page_once():
    scenario = kernel_scenario()
    builder = StackCacheBuilder(scenario, bucket_count=257, total_pieces=THREE_MB_PIECES)
    pieces = sorted(builder.pieces)
    builder.free = [piece for pair in zip(pieces[:len(pieces) // 2], reversed(pieces[len(pieces) // 2:]))
                    for piece in pair]  # bottom, top, bottom+1, top-1, ...
    builder.finish()
    fake = make_fake_pykd(scenario)
    target = open_pykd_target(fake)
    report = analyze(target, cache=builder.address).caches[0]
    assert len(report.state.free_pieces) == len(builder.free) and not report.problems
    assert target.stats.backend_pages <= cache_pages(builder) + 2 * MAX_READ_AHEAD
