"""Benchmarks for etwstacks (figures printed, nothing asserted):

1. ``--validate --json`` over a maximal cache (4096 buckets x 4 stacks x 256 frames,
   CacheSize 50 MB) in a kernel dump file; target < 2 s.
2. The simulator on a 1,000,000-stack stream; target >= 200,000 stacks/s.

    python scripts/bench_etwcache.py [--quick]
"""

import argparse
import io
import os
import random
import sys
import tempfile
import time

from dbgext.cli import main
from dbgext.etwcache import fixtures, layouts, replay
from dbgext.stackhash import stack_trace_hash_frames
from dbgext.sample.scenario import Scenario

NT_BASE = 0xFFFFF80000000000


def stack_for_bucket(rng, bucket, bucket_count, depth):
    """``depth`` kernel frames whose hash lands in ``bucket``: the last frame's low
    word is chosen to steer the sum (a frame fffff800`0000xxxx adds xxxx + 0x7ff)."""
    frames = [NT_BASE + rng.randrange(0x1000, 0x100000, 4) for _ in range(depth - 1)]
    low = (bucket - stack_trace_hash_frames(frames) - 0x7FF) % bucket_count
    frames.append(NT_BASE + low)
    assert stack_trace_hash_frames(frames) % bucket_count == bucket
    return frames


def bench_validate(quick):
    bucket_count = 4096 if not quick else 512
    rng = random.Random(1)
    scenario = Scenario("x64", "kernel", build=19041)
    scenario.add_module("nt", NT_BASE, 0x100000, image="ntoskrnl.exe")
    scenario.add_symbol("nt", "KiSystemCall64", 0x9000)
    started = time.perf_counter()
    stacks = [stack_for_bucket(rng, bucket, bucket_count, 256)
              for bucket in range(bucket_count) for _ in range(layouts.MAX_BUCKET_ENTRIES)]
    total_pieces = layouts.MAX_CACHE_SIZE // layouts.PIECE_SIZE
    context, builder = fixtures.add_logger_with_cache(scenario, stacks, bucket_count=bucket_count,
                                                      total_pieces=total_pieces)
    built = time.perf_counter() - started
    directory = tempfile.mkdtemp(prefix="bench_etwcache_")
    path = os.path.join(directory, "maximal.dmp")
    scenario.write_kernel_dump(path)
    scenario.write_symbols(path + ".symbols")
    size = os.path.getsize(path)
    for argv in (["--validate"], ["--validate", "--json"]):
        out = io.StringIO()
        started = time.perf_counter()
        code = main(["etwstacks", "--dump", path] + argv, stream=out)
        elapsed = time.perf_counter() - started
        text = out.getvalue()
        print("validate: `etwstacks --dump %s` exit %d in %.2f s (target < 2 s), %d bytes of output"
              % (" ".join(argv), code, elapsed, len(text)))
    print("validate: %d buckets x 4 stacks x 256 frames, %d pieces (CacheSize 0x%x), dump %.1f MB, "
          "built in %.1f s" % (bucket_count, total_pieces, total_pieces * layouts.PIECE_SIZE,
                               size / 1048576.0, built))
    os.remove(path)


def bench_simulate(quick):
    events = 1000000 if not quick else 100000
    rng = random.Random(2)
    distinct = []
    for _ in range(20000):
        depth = rng.choice([4, 8, 12, 20, 30, 45, 64, 100, 180])
        distinct.append([NT_BASE + rng.randrange(0x1000, 0x100000, 4) for _ in range(depth)])
    started = time.perf_counter()
    stream = replay.StackStream(source="benchmark")
    # A skewed mix like real traces: most walks repeat a hot set, the rest spread wide.
    for _ in range(events):
        if rng.random() < 0.6:
            stream.add(distinct[min(int(rng.paretovariate(1.0)) - 1, len(distinct) - 1)])
        else:
            stream.add(distinct[rng.randrange(len(distinct))])
    stream.hashes  # hashing distinct stacks is part of loading, not of replaying
    loaded = time.perf_counter() - started
    print("simulate: stream of %d stacks (%d distinct) interned and hashed in %.2f s"
          % (len(stream), len(stream.stacks), loaded))
    for bucket_count, cache_size in ((257, 0x300000), (4093, 0x1000000), (4093, 0x3200000)):
        started = time.perf_counter()
        result = replay.simulate(stream, bucket_count, cache_size // layouts.PIECE_SIZE)
        elapsed = time.perf_counter() - started
        print("simulate: %4d buckets, CacheSize 0x%07x: %.2f s = %d stacks/s (target >= 200000); "
              "hit rate %.1f%%, %d evictions, %d starved"
              % (bucket_count, cache_size, elapsed, len(stream) / elapsed, 100 * result.hit_rate,
                 result.evictions, result.starvation_fallbacks))


def main_entry():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    args = parser.parse_args()
    print("python %s" % sys.version.split()[0])
    bench_simulate(args.quick)
    bench_validate(args.quick)


if __name__ == "__main__":
    main_entry()
