"""Benchmark: what a dump's identity costs — the whole-content SHA-256 triage
computes in the worker, against the former sampled key (size, head, tail and 16
samples of 64 KiB: about 1.1 MiB read, whatever the size), on the same file.

    python scripts/bench_hash.py [--size 0n4294967296] [--dense 0n268435456] [--repeat 3] [--keep DIR]

The big file is sparse (its pages read as zeros from the page cache, so the figure
is the CPU cost of hashing plus the kernel's copy, the floor on any disk); a
smaller dense file of random bytes, read twice so it is cached, shows that the
hash rate does not depend on the content.  A real dump on a disk or a share costs
max(this, its read time): triage reads each new dump once for its hash.
"""

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dbgext.address import parse_number  # noqa: E402
from dbgext.triage.record import content_hash  # noqa: E402

SAMPLE_CHUNK = 0x10000
SAMPLES = 16


def sampled_key(path):
    """The former key (anchor): it misses any difference outside its samples."""
    size = os.path.getsize(path)
    digest = hashlib.sha256(("sha256-sampled-v1:%d:" % size).encode("ascii"))
    with open(path, "rb") as handle:
        step = (size - SAMPLE_CHUNK) // (SAMPLES + 1)
        for offset in [0] + [step * (i + 1) for i in range(SAMPLES)] + [size - SAMPLE_CHUNK]:
            handle.seek(offset)
            digest.update(handle.read(SAMPLE_CHUNK))
    return digest.hexdigest()


def best_of(action, repeat):
    """(best wall seconds, best CPU seconds) of ``repeat`` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        action()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus)


def measure(label, path, repeat):
    size = os.path.getsize(path)
    full_wall, full_cpu = best_of(lambda: content_hash(path), repeat)
    sampled_wall, _ = best_of(lambda: sampled_key(path), repeat)
    print("%s (%.2f GB): full SHA-256 %.2f s wall, %.2f s CPU = %.0f MB/s; sampled key %.1f ms"
          % (label, size / 1e9, full_wall, full_cpu, size / full_wall / 1e6, sampled_wall * 1000))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="0n4294967296", help="sparse file size (hex, 0n decimal; default 4 GiB)")
    parser.add_argument("--dense", default="0n268435456", help="random-content file size (default 256 MiB)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="write the files here and keep them")
    args = parser.parse_args()
    directory = args.keep or tempfile.mkdtemp(prefix="bench_hash_")
    os.makedirs(directory, exist_ok=True)
    try:
        sparse = os.path.join(directory, "sparse.dmp")
        with open(sparse, "wb") as handle:
            handle.truncate(parse_number(args.size))
            handle.seek(0)
            handle.write(b"PAGEDU64")
        dense = os.path.join(directory, "dense.dmp")
        with open(dense, "wb") as handle:
            remaining = parse_number(args.dense)
            while remaining:
                block = os.urandom(min(remaining, 1 << 24))
                handle.write(block)
                remaining -= len(block)
        content_hash(dense)   # into the page cache
        print("sha256 in hashlib: %s" % hashlib.sha256().name)
        measure("sparse", sparse, args.repeat)
        measure("dense, cached", dense, args.repeat)
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
