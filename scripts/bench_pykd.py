"""Benchmark: what the pykd backend asks of the debugger engine.

Runs the Target over the fake pykd (in-memory scenario) and prints, for field-by-
field reads and for sequential scans, the engine calls (loadBytes), reads/s and
MB/s with and without the page cache, next to the naive one-pykd-call-per-field
pattern.  Inside WinDbg every engine call is a DbgEng round trip, so the call
counts are the figures that carry over; the rates here measure dbgext's own
overhead on top of a zero-latency engine.

    python scripts/bench_pykd.py [--fields N] [--scan-mib M]
"""

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from dbgext.target.base import PAGE_MASK, PAGE_SIZE  # noqa: E402
from dbgext.target.pykd_backend import open_pykd_target  # noqa: E402
from fake_pykd import make_fake_pykd  # noqa: E402
from dbgext.sample.scenario import Scenario  # noqa: E402


def build(scan_bytes):
    s = Scenario("x64", "kernel")
    s.add_module("nt", 0xFFFFF80000000000, 0x10000, image="ntoskrnl.exe")
    s.add_symbol("nt", "KiSystemStartup", 0x1000)
    region = s.alloc_pages(scan_bytes)
    s.write(region, os.urandom(scan_bytes))
    return s, region


def timed(function):
    start = time.perf_counter()
    result = function()
    return result, time.perf_counter() - start


def field_reads(scenario, region, count, cache_pages):
    pykd = make_fake_pykd(scenario.target())
    target = open_pykd_target(pykd, cache_pages=cache_pages)
    rng = random.Random(7)
    offsets = [rng.randrange(0, 64 * PAGE_SIZE - 4) & ~3 for _ in range(count)]
    pykd.fake_calls.clear()
    _, seconds = timed(lambda: [target.u32(region + offset) for offset in offsets])
    return pykd.fake_calls["loadBytes"], count / seconds


def naive_field_reads(scenario, region, count):
    pykd = make_fake_pykd(scenario.target())
    rng = random.Random(7)
    offsets = [rng.randrange(0, 64 * PAGE_SIZE - 4) & ~3 for _ in range(count)]
    _, seconds = timed(lambda: [pykd.ptrDWord(region + offset) for offset in offsets])
    return pykd.fake_calls["ptrDWord"], count / seconds


def sequential_scan(scenario, region, size, cache_pages):
    pykd = make_fake_pykd(scenario.target())
    target = open_pykd_target(pykd, cache_pages=cache_pages)
    chunk = 0x100000
    pykd.fake_calls.clear()
    _, seconds = timed(lambda: [target.read(region + offset, chunk) for offset in range(0, size, chunk)])
    return pykd.fake_calls["loadBytes"], size / seconds / 1e6


def db_command(scenario, region):
    from pykd_support import run_windbg_script
    (text, pykd), seconds = timed(lambda: run_windbg_script("db", ["%x" % region, "L?10000"], scenario))
    return pykd.fake_calls["loadBytes"], seconds, text.count("\n")


def etwstacks_cache():
    """``etwstacks --cache ADDR --validate`` over a 3 MB cache (half used after
    evictions) through commands/etwstacks.py, next to the anchor: the same pages
    read one loadBytes each, as the walker did before it read runs."""
    from etwcache_support import kernel_scenario, random_stacks
    from pykd_support import memory_engine_calls, run_windbg_script
    from dbgext.etwcache import layouts
    from dbgext.etwcache.fixtures import PIECE_STRIDE, StackCacheBuilder
    scenario = kernel_scenario()
    builder = StackCacheBuilder(scenario, bucket_count=1021, total_pieces=layouts.MIN_CACHE_SIZE // layouts.PIECE_SIZE)
    builder.feed(random_stacks(6000, distinct=3000, seed=3, max_depth=200))
    builder.finish()
    header_end = builder.address + layouts.HEADER_SIZE + builder.bucket_count * layouts.BUCKET_SIZE
    pool_end = builder.pieces_base + len(builder.pieces) * PIECE_STRIDE
    pages = sorted(set(range(builder.address & PAGE_MASK, header_end, PAGE_SIZE))
                   | set(range(builder.pieces_base & PAGE_MASK, pool_end, PAGE_SIZE)))
    (text, fake), seconds = timed(lambda: run_windbg_script(
        "etwstacks", ["--cache", "%x" % builder.address, "--validate"], scenario))
    anchor = make_fake_pykd(scenario)
    _, anchor_seconds = timed(lambda: [anchor.loadBytes(page, PAGE_SIZE) for page in pages])
    return (len(pages), fake.fake_calls["loadBytes"], memory_engine_calls(fake), seconds,
            anchor.fake_calls["loadBytes"], memory_engine_calls(anchor), anchor_seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fields", type=int, default=100000)
    parser.add_argument("--scan-mib", type=int, default=16)
    args = parser.parse_args()
    scan_bytes = args.scan_mib << 20
    scenario, region = build(max(scan_bytes, 64 * PAGE_SIZE))

    print("field reads: %d random u32 reads over 64 pages" % args.fields)
    calls, rate = field_reads(scenario, region, args.fields, cache_pages=8192)
    print("  Target + page cache     : %7d loadBytes calls  %10.0f reads/s" % (calls, rate))
    calls, rate = field_reads(scenario, region, args.fields, cache_pages=0)
    print("  Target, no page cache   : %7d loadBytes calls  %10.0f reads/s" % (calls, rate))
    calls, rate = naive_field_reads(scenario, region, args.fields)
    print("  naive pykd.ptrDWord     : %7d ptrDWord calls   %10.0f reads/s" % (calls, rate))

    print("sequential scan: %d MiB in 1 MiB reads" % args.scan_mib)
    for label, pages in (("with page cache", 8192), ("no page cache", 0)):
        calls, rate = sequential_scan(scenario, region, scan_bytes, pages)
        print("  %-24s: %7d loadBytes calls  %10.1f MB/s" % (label, calls, rate))

    calls, seconds, lines = db_command(scenario, region)
    print("db L?10000 through commands/db.py: %d loadBytes calls, %d lines, %.3f s" % (calls, lines, seconds))

    pages, calls, engine, seconds, anchor_calls, anchor_engine, anchor_seconds = etwstacks_cache()
    print("etwstacks --cache --validate, 3 MB cache (%d pages of cache memory), DbgEng round trips:" % pages)
    print("  dbgext (runs of pages)  : %5d loadBytes = %5d engine calls = %.3f per page (budget 3)  %.2f s"
          % (calls, engine, float(engine) / pages, seconds))
    print("  anchor: page by page    : %5d loadBytes = %5d engine calls = %.3f per page           %.2f s"
          % (anchor_calls, anchor_engine, float(anchor_engine) / pages, anchor_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
