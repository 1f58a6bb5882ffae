"""Summaries and advice drawn from a walked cache (plain data, no rendering)."""

from . import layouts

# Headroom the seed's worst case allows for: one new 256-frame stack in flight per CPU.
IN_FLIGHT_PIECES = 64 * layouts.pieces_for(256)
FRAME_RANGES = ((1, 8), (9, 16), (17, 32), (33, 64), (65, 128), (129, 256), (257, None))


def frame_distribution(state):
    """[(label, stacks)] over FRAME_RANGES."""
    rows = []
    histogram = state.frame_histogram()
    for low, high in FRAME_RANGES:
        count = sum(n for frames, n in histogram.items()
                    if frames >= low and (high is None or frames <= high))
        rows.append(("%d-%d" % (low, high) if high else ">%d" % (low - 1), count))
    return rows


def advice(state):
    """Human advice about the configuration in force (list of strings)."""
    notes = []
    count = state.bucket_count
    if not state.readable or count == 0:
        return notes
    if not layouts.is_prime(count):
        notes.append("BucketCount %d is not prime: buckets are hash mod %d, so a prime such as %d "
                     "spreads stacks better" % (count, count, layouts.prime_at_most(count)))
    entries = state.entries
    if not entries:
        notes.append("the cache holds no stacks yet: nothing to judge its size by")
        return notes
    pieces_per_stack = state.used_pieces / float(len(entries))
    deepest = max(entry.frame_count for entry in entries)
    needed_pieces = int(count * layouts.MAX_BUCKET_ENTRIES * pieces_per_stack + 0.999) + IN_FLIGHT_PIECES
    needed = layouts.clamp_cache_size(needed_pieces * layouts.PIECE_SIZE)
    free = len(state.free_pieces)
    if free < layouts.pieces_for(max(deepest, 1)) or free * 20 < state.total_pieces:
        notes.append("only %d of %d pieces are free: new stacks needing more fall back to uncached "
                     "stack-walk events (starvation) while the cache keeps what it has"
                     % (free, state.total_pieces))
    full = state.occupancy()[layouts.MAX_BUCKET_ENTRIES]
    if full * 4 > count and free * 4 > state.total_pieces:
        notes.append("%d of %d buckets are full while pieces are free: a larger BucketCount "
                     "(prime, up to %d) would keep more stacks" % (full, count, layouts.MAX_BUCKET_COUNT))
    shallow = sum(1 for entry in entries if entry.frame_count <= layouts.FRAMES_PER_PIECE)
    if free < layouts.pieces_for(256) and shallow * 4 > len(entries) * 3 and deepest > layouts.FRAMES_PER_PIECE:
        notes.append("the cache is mostly shallow stacks and has little room: deep stacks are likely "
                     "missing it")
    current = state.cache_size
    notes.append("observed %.2f pieces per stack: %d buckets x 4 stacks + in-flight headroom need about "
                 "CacheSize 0x%x (%.1f MB); in force: 0x%x (%.2f MB)"
                 % (pieces_per_stack, count, needed, needed / 1048576.0, current, current / 1048576.0))
    return notes
