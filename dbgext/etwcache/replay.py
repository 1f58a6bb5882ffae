"""Replay a stream of stacks through the stack cache algorithm of the kernel.

The model keeps what decides the outcome: per bucket the cached stacks in MRU
order (index 0 = front) and the number of free pieces.  Per stack-walk event:

* hit (same frames already in the bucket): move the entry to the front;
* miss: if the bucket holds 4 entries, unlink the tail; pop ceil(n/32) pieces; if
  there are not enough, log the stack uncached (a *starvation fallback*) — the
  unlinked tail is dropped all the same; otherwise link the new entry at the tail;
  then the unlinked tail's last reference goes away: a Delete Definition event, and
  its pieces return to the free list (after the pop, so they cannot serve it).

Stacks are interned (``StackStream``) so each event costs a dict-free list lookup.
"""

from ..problems import ProblemLog
from ..stackhash import stack_trace_hash_frames
from . import layouts


class StackStream(object):
    """Distinct stacks (tuples of frames) and the order they are referenced in."""

    def __init__(self, source="stacks"):
        self.source = source
        self.stacks = []       # stack id -> tuple of frames
        self.sequence = []     # stack ids in event order
        self.notes = []        # what was skipped or assumed while loading
        self.problems = ProblemLog()  # what the source could not give (unreadable, corrupt)
        self._ids = {}
        self._hashes = None

    def add(self, frames, count=1):
        """Reference the stack ``frames`` ``count`` times (empty stacks are never cached)."""
        stack_id = self.intern(frames)
        if stack_id is None or count <= 0:
            return None
        if count == 1:
            self.sequence.append(stack_id)
        else:
            self.sequence.extend([stack_id] * count)
        return stack_id

    def intern(self, frames):
        """The id of stack ``frames`` (registered if new), without referencing it;
        None for an empty stack."""
        frames = tuple(frames)
        if not frames:
            return None
        stack_id = self._ids.get(frames)
        if stack_id is None:
            stack_id = len(self.stacks)
            self._ids[frames] = stack_id
            self.stacks.append(frames)
            self._hashes = None
        return stack_id

    def add_split(self, frames, count=1):
        """Add a captured stack as the kernel walk does: its kernel part and its user
        part are cached as separate entries (kernel first)."""
        kernel = [f for f in frames if f >= layouts.KERNEL_SPACE_START]
        user = [f for f in frames if f < layouts.KERNEL_SPACE_START]
        self.add(kernel, count)
        self.add(user, count)

    def __len__(self):
        return len(self.sequence)

    @property
    def hashes(self):
        if self._hashes is None:
            self._hashes = [stack_trace_hash_frames(frames) for frames in self.stacks]
        return self._hashes


class SimulationResult(object):
    """Metrics of one replay, and the final cache contents."""

    def __init__(self, bucket_count, total_pieces):
        self.bucket_count = bucket_count
        self.total_pieces = total_pieces
        self.lookups = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.delete_definitions = 0
        self.starvation_fallbacks = 0
        self.peak_pieces = 0
        self.free_pieces = total_pieces
        self.buckets = []  # per bucket: stack ids, MRU first

    @property
    def cache_size(self):
        return self.total_pieces * layouts.PIECE_SIZE

    @property
    def hit_rate(self):
        return self.hits / float(self.lookups) if self.lookups else 0.0

    @property
    def cached_stacks(self):
        return sum(len(bucket) for bucket in self.buckets)

    def occupancy(self):
        return layouts.occupancy(self.buckets)

    def as_dict(self):
        return {
            "bucket_count": self.bucket_count,
            "bucket_count_prime": layouts.is_prime(self.bucket_count),
            "cache_size": self.cache_size,
            "total_pieces": self.total_pieces,
            "lookups": self.lookups,
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": round(self.hit_rate, 6),
            "evictions": self.evictions,
            "delete_definitions": self.delete_definitions,
            "starvation_fallbacks": self.starvation_fallbacks,
            "peak_pieces": self.peak_pieces,
            "cached_stacks": self.cached_stacks,
            "free_pieces": self.free_pieces,
            "occupancy": self.occupancy(),
        }


def simulate(stream, bucket_count, total_pieces):
    """Replay ``stream`` through a cache of ``bucket_count`` buckets and
    ``total_pieces`` pieces (no clamping: that is the caller's choice)."""
    if bucket_count <= 0:
        raise ValueError("bucket count must be positive")
    result = SimulationResult(bucket_count, total_pieces)
    bucket_of = [h % bucket_count for h in stream.hashes]
    pieces_of = [layouts.pieces_for(len(frames)) for frames in stream.stacks]
    buckets = [[] for _ in range(bucket_count)]
    capacity = layouts.MAX_BUCKET_ENTRIES
    free = total_pieces
    peak = 0
    hits = evictions = starved = 0
    for stack_id in stream.sequence:
        bucket = buckets[bucket_of[stack_id]]
        if stack_id in bucket:
            hits += 1
            if bucket[0] != stack_id:
                bucket.remove(stack_id)
                bucket.insert(0, stack_id)
            continue
        evicted = bucket.pop() if len(bucket) >= capacity else None
        need = pieces_of[stack_id]
        if need <= free:
            free -= need
            bucket.append(stack_id)
            if total_pieces - free > peak:
                peak = total_pieces - free
        else:
            starved += 1
        if evicted is not None:
            evictions += 1
            free += pieces_of[evicted]
    result.lookups = len(stream.sequence)
    result.hits = hits
    result.misses = result.lookups - hits
    result.evictions = evictions
    result.delete_definitions = evictions
    result.starvation_fallbacks = starved
    result.peak_pieces = peak
    result.free_pieces = free
    result.buckets = buckets
    return result


def final_state(result, stream):
    """The simulated cache as {bucket: [frames tuples, MRU first]} (non-empty buckets)."""
    return {index: [stream.stacks[stack_id] for stack_id in bucket]
            for index, bucket in enumerate(result.buckets) if bucket}


def sweep(stream, bucket_counts, cache_sizes, clamp=True):
    """Simulate every (bucket_count, cache_size) point; returns (results, notes)."""
    notes = []
    results = []
    seen = set()
    for bucket_count in bucket_counts:
        for cache_size in cache_sizes:
            bc, size = bucket_count, cache_size
            if clamp:
                bc, size = layouts.clamp_bucket_count(bc), layouts.clamp_cache_size(size)
                if (bc, size) != (bucket_count, cache_size):
                    notes.append("BucketCount %d / CacheSize 0x%x clamped to %d / 0x%x as Windows does"
                                 % (bucket_count, cache_size, bc, size))
            if (bc, size) in seen:
                continue
            seen.add((bc, size))
            results.append(simulate(stream, bc, size // layouts.PIECE_SIZE))
    return results, notes


def recommend(results):
    """Pick the smallest configuration that never starves and whose hit rate is within
    half a percentage point of the best; prime bucket counts win ties."""
    if not results:
        return None
    best_rate = max(r.hit_rate for r in results)
    good = [r for r in results if r.starvation_fallbacks == 0 and r.hit_rate >= best_rate - 0.005]
    if not good:
        good = [max(results, key=lambda r: (r.hit_rate, -r.starvation_fallbacks))]
    choice = min(good, key=lambda r: (r.cache_size, not layouts.is_prime(r.bucket_count), r.bucket_count))
    peak_bytes = choice.peak_pieces * layouts.PIECE_SIZE
    return {
        "bucket_count": choice.bucket_count,
        "cache_size": choice.cache_size,
        "hit_rate": round(choice.hit_rate, 6),
        "reason": "no starvation, hit rate %.1f%% (best %.1f%%), peak %d pieces = 0x%x bytes"
                  % (100 * choice.hit_rate, 100 * best_rate, choice.peak_pieces, peak_bytes),
    }
