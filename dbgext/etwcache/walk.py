"""Read an ETW stack cache out of target memory into plain data.

Everything is bounded: at most MAX_BUCKET_COUNT buckets, WALK_LIMIT entries per
bucket, ceil(FrameCount/32) (+1 to notice a longer chain) pieces per stack, and
MAX_PIECES free pieces; visited sets catch loops.  What cannot be read or does not
fit becomes a problem with its address, and the walk goes on.

Memory is read in runs, not piece by piece: the bucket lists are walked side by
side, one entry of every bucket per round (and one piece of every stack per
round), so each round's pieces are fetched together and neighbouring pages merge
into one read; the free list, a single chain through the piece pool, reads ahead
along its direction inside the span the pool can occupy.  Inside WinDbg that makes
a 3 MB cache a handful of debugger round trips instead of one per page.
"""

import struct

from ..errors import UnreadableMemory
from ..problems import ProblemLog
from ..hexaddr import hexaddr
from ..stackhash import stack_trace_hash
from ..target.base import PAGE_SIZE
from . import layouts

WALK_LIMIT = 64  # entries followed per bucket (a sane bucket holds at most 4)
_PIECE_HEAD = struct.Struct("<QQQiII")  # Flink, Blink, Next, RefCount, Hash, FrameCount
_U64 = struct.Struct("<Q")
# Pages between two wanted ones that are read too, to make one run of both.
MAX_GAP_PAGES = 4
# Read-ahead along the free list starts at this many pages and doubles per miss.
FIRST_READ_AHEAD = 8
MAX_READ_AHEAD = 256


class _Pages(object):
    """Whole pages of the walk's memory, fetched in runs through the Target (one
    backend call per run) and kept for the walk, whose bounds keep them to about
    one cache's worth."""

    def __init__(self, target):
        self.target = target
        self.pages = {}   # page address -> bytes, or None when unreadable
        self._read_ahead = FIRST_READ_AHEAD

    def prefetch(self, addresses, size):
        """Fetch the pages holding ``size`` bytes at each of ``addresses``: missing
        pages at most MAX_GAP_PAGES apart become one run."""
        wanted = set()
        for address in addresses:
            page = address & ~(PAGE_SIZE - 1)
            while page < address + size:
                if page not in self.pages:
                    wanted.add(page)
                page += PAGE_SIZE
        if not wanted:
            return
        ordered = sorted(wanted)
        start = previous = ordered[0]
        for page in ordered[1:]:
            if page - previous > (MAX_GAP_PAGES + 1) * PAGE_SIZE:
                self._fetch(start, previous + PAGE_SIZE)
                start = page
            previous = page
        self._fetch(start, previous + PAGE_SIZE)

    def read_ahead(self, address, backwards, window):
        """Fetch the page of ``address`` and the pages after it (before it when
        ``backwards``) inside ``window`` (start, end), more on every call."""
        page = address & ~(PAGE_SIZE - 1)
        span = self._read_ahead * PAGE_SIZE
        self._read_ahead = min(2 * self._read_ahead, MAX_READ_AHEAD)
        low, high = window
        if backwards:
            start, end = max(page + PAGE_SIZE - span, low & ~(PAGE_SIZE - 1)), page + PAGE_SIZE
        else:
            start, end = page, min(page + span, (high + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1))
        if not start <= page < end:
            start, end = page, page + PAGE_SIZE
        self._fetch(start, end)

    def _fetch(self, start, end):
        """Read the pages of [start, end) not held yet, one run per stretch of them:
        every page is read at most once, whatever a corrupt free list does."""
        page = start
        while page < end:
            if page in self.pages:
                page += PAGE_SIZE
                continue
            run_end = page + PAGE_SIZE
            while run_end < end and run_end not in self.pages:
                run_end += PAGE_SIZE
            self._read_run(page, run_end)
            page = run_end

    def _read_run(self, start, end):
        partial = self.target.try_read(start, end - start)
        data = partial.data
        for page in range(start, end, PAGE_SIZE):
            offset = page - start
            self.pages[page] = None if not partial.readable(page, PAGE_SIZE) else data[offset:offset + PAGE_SIZE]

    def locate(self, address, size):
        """(buffer, offset) holding ``size`` bytes at ``address`` — the page itself
        when they fit in it, so callers unpack without copying."""
        offset = address & (PAGE_SIZE - 1)
        page = address - offset
        if page not in self.pages:
            self._read_run(page, page + PAGE_SIZE)
        data = self.pages[page]
        if data is None:
            raise UnreadableMemory(address, size)
        if offset + size <= PAGE_SIZE:
            return data, offset
        following = page + PAGE_SIZE
        if following not in self.pages:
            self._read_run(following, following + PAGE_SIZE)
        if self.pages[following] is None:
            raise UnreadableMemory(following, size)
        return data[offset:] + self.pages[following][:offset + size - PAGE_SIZE], 0

    def pointer(self, address):
        data, offset = self.locate(address, 8)
        return _U64.unpack_from(data, offset)[0]


class CachedStack(object):
    """One cache entry: its StackKey (address of its first piece) and contents."""

    __slots__ = ("key", "bucket", "position", "refcount", "hash", "frame_count", "frames",
                 "frames_hash", "pieces", "piece_frame_counts")

    def __init__(self, key, bucket, position):
        self.key = key
        self.bucket = bucket
        self.position = position
        self.refcount = 0
        self.hash = 0
        self.frame_count = 0
        self.frames = ()
        self.frames_hash = 0          # hash of the frames as read (to check ``hash``)
        self.pieces = []             # addresses, first piece first
        self.piece_frame_counts = []  # FrameCount field of each later piece

    def as_dict(self):
        return {"key": self.key, "bucket": self.bucket, "position": self.position,
                "refcount": self.refcount, "hash": self.hash, "frame_count": self.frame_count,
                "pieces": list(self.pieces), "frames": list(self.frames)}


class CacheState(object):
    """What the walker found at one cache address."""

    def __init__(self, address):
        self.problems = ProblemLog()
        self.address = address
        self.layout = None         # the header variant's Layout
        self.variant = None
        self.variant_confidence = "none"
        self.variant_detail = ""
        self.owner = None          # logger id (A) or logger context address (B)
        self.bucket_count = 0
        self.buckets_walked = 0
        self.buckets = []          # per bucket: list of CachedStack, MRU first
        self.free_depth = 0        # SLIST header depth (16 bits)
        self.free_list_top = 0
        self.free_pieces = []      # addresses reached by walking the SLIST
        self.free_walk_complete = True

    @property
    def entries(self):
        return [entry for bucket in self.buckets for entry in bucket]

    @property
    def readable(self):
        return self.variant is not None

    @property
    def used_pieces(self):
        return sum(len(entry.pieces) for entry in self.entries)

    @property
    def total_pieces(self):
        return len(self.free_pieces) + self.used_pieces

    @property
    def cache_size(self):
        return self.total_pieces * layouts.PIECE_SIZE

    def occupancy(self):
        return layouts.occupancy(self.buckets)

    def frame_histogram(self):
        """{frames per stack: number of cached stacks}."""
        histogram = {}
        for entry in self.entries:
            histogram[entry.frame_count] = histogram.get(entry.frame_count, 0) + 1
        return dict(sorted(histogram.items()))

    def wasted_bytes(self):
        """Bytes of frame slots left empty in the last piece of each cached stack."""
        wasted = 0
        for entry in self.entries:
            used = len(entry.frames) % layouts.FRAMES_PER_PIECE
            if used:
                wasted += (layouts.FRAMES_PER_PIECE - used) * 8
        return wasted

    def find(self, key):
        for entry in self.entries:
            if entry.key == key:
                return entry
        return None


# -- variant detection -----------------------------------------------------------------


def _is_kernel_pointer(value):
    return value >= layouts.KERNEL_SPACE_START


def _variant_checks(target, address, header, name, logger_context, logger_id):
    """(passed, total) of the invariants of variant ``name`` at ``address``; none
    pass when its BucketCount could not be walked (0 or above the maximum)."""
    layout = layouts.CACHE_VARIANTS[name]
    passed, total = 0, 1
    bucket_count = layout.unpack(header, "BucketCount")
    if not 0 < bucket_count <= layouts.MAX_BUCKET_COUNT:
        return passed, total
    if bucket_count >= layouts.MIN_BUCKET_COUNT:  # the range Windows clamps it to
        passed += 1
    total += 1
    if layout.has("LoggerId"):
        owner = layout.unpack(header, "LoggerId")
        ok = owner < layouts.MAX_LOGGERS and (logger_id is None or owner == logger_id)
    else:
        owner = layout.unpack(header, "LoggerContext")
        ok = _is_kernel_pointer(owner) and (logger_context is None or owner == logger_context)
        if ok and logger_context is None:
            try:
                ok = target.u32(owner) < layouts.MAX_LOGGERS
            except UnreadableMemory:
                ok = False
    if ok:
        passed += 1
    # The first buckets' list heads must be consistent (Flink->Blink == head).
    buckets = address + layout.offset("Buckets")
    sample = target.try_read(buckets, min(bucket_count, 16) * layouts.BUCKET_SIZE)
    for index in range(min(bucket_count, 16)):
        head = buckets + index * layouts.BUCKET_SIZE
        if not sample.readable(head, 16):
            continue
        flink, blink = struct.unpack_from("<QQ", sample.data, index * layouts.BUCKET_SIZE)
        total += 1
        if flink == head and blink == head:
            passed += 1
        elif _is_kernel_pointer(flink) and _is_kernel_pointer(blink):
            try:
                if target.pointer(flink + 8) == head:
                    passed += 1
            except UnreadableMemory:
                pass
    return passed, total


def detect_variant(target, address, header, logger_context=None, logger_id=None):
    """(variant or None, confidence, detail): the variant whose invariants hold
    best; None when no variant has a BucketCount that can be walked (then
    nothing else it says can be trusted either) or no check holds."""
    scores = {}
    for name in sorted(layouts.CACHE_VARIANTS):
        scores[name] = _variant_checks(target, address, header, name, logger_context, logger_id)
    ranked = sorted(scores, key=lambda n: (scores[n][0] / float(scores[n][1]), scores[n][0]), reverse=True)
    best, other = ranked[0], ranked[1]
    best_passed, best_total = scores[best]
    other_passed, other_total = scores[other]
    detail = ", ".join("%s %d/%d checks" % (n, scores[n][0], scores[n][1]) for n in sorted(scores))
    if best_passed == 0:
        return None, "none", detail
    best_ratio = best_passed / float(best_total)
    other_ratio = other_passed / float(other_total)
    if best_ratio >= 0.75 and other_ratio <= 0.25:
        confidence = "high"
    elif best_ratio - other_ratio >= 0.25:
        confidence = "medium"
    else:
        confidence = "low"
    return best, confidence, detail


# -- the walk -----------------------------------------------------------------------------


def read_cache(target, address, variant=None, logger_context=None, logger_id=None, force=False):
    """Walk the cache at ``address``; bad memory becomes problems, never an
    exception.  Memory that no header variant fits is not walked (a ``variant``
    problem) unless ``force``, which walks it as variant B."""
    state = CacheState(address)
    try:
        header = target.read(address, layouts.HEADER_SIZE)
    except UnreadableMemory as error:
        state.problems.add("unreadable", error.address, "cache header is unreadable")
        return state
    if variant is None:
        variant, state.variant_confidence, state.variant_detail = detect_variant(
            target, address, header, logger_context, logger_id)
        if variant is None:
            if not force:
                state.problems.add("variant", address, "memory that fits no cache header variant (%s)"
                                   % state.variant_detail)
                return state
            variant = "B"
            state.problems.add("variant", address, "no layout variant fits (%s); walked as variant B as "
                               "forced" % state.variant_detail, severity="warning")
    else:
        state.variant_confidence = "given"
    state.variant = variant
    layout = state.layout = layouts.CACHE_VARIANTS[variant]
    state.owner = layout.unpack(header, "LoggerId" if layout.has("LoggerId") else "LoggerContext")
    state.bucket_count = layout.unpack(header, "BucketCount")
    pages = _Pages(target)
    _walk_buckets(target, pages, state)
    _walk_free_list(pages, state, layout.unpack(header, "FreeList"))
    return state


class _BucketWalk(object):
    """One bucket list being followed, one entry per round."""

    __slots__ = ("index", "head", "previous", "current", "entries")

    def __init__(self, index, head, first, entries):
        self.index = index
        self.head = head
        self.previous = head
        self.current = first
        self.entries = entries


def _walk_buckets(target, pages, state):
    count = state.bucket_count
    layout = state.layout
    if count == 0:
        state.problems.add("bucket_count", state.address + layout.offset("BucketCount"), "BucketCount is 0")
        return
    if count > layouts.MAX_BUCKET_COUNT:
        state.problems.add("bucket_count", state.address + layout.offset("BucketCount"),
                           "BucketCount %d exceeds %d; walking the first %d"
                           % (count, layouts.MAX_BUCKET_COUNT, layouts.MAX_BUCKET_COUNT))
        count = layouts.MAX_BUCKET_COUNT
    base = state.address + layout.offset("Buckets")
    array = target.try_read(base, count * layouts.BUCKET_SIZE)
    walks = []
    for index in range(count):
        head = base + index * layouts.BUCKET_SIZE
        bucket = []
        state.buckets.append(bucket)
        if not array.readable(head, 16):
            state.problems.add("unreadable", head, "bucket %d list head is unreadable" % index)
            continue
        walks.append(_BucketWalk(index, head, _U64.unpack_from(array.data, index * layouts.BUCKET_SIZE)[0],
                                 bucket))
    state.buckets_walked = count
    seen = set()
    while walks:
        walks = [walk for walk in walks if not _at_end(state, array, base, walk, seen)]
        pages.prefetch([walk.current for walk in walks], layouts.PIECE_SIZE)
        readers = []
        for walk in walks:
            seen.add(walk.current)
            reader = _StackReader(pages, state, CachedStack(walk.current, walk.index, len(walk.entries)),
                                  walk.previous)
            if reader.flink is None:
                walk.current = None
                continue
            walk.entries.append(reader.entry)
            readers.append(reader)
            walk.previous, walk.current = walk.current, reader.flink
        _read_piece_chains(pages, readers)
        walks = [walk for walk in walks if walk.current is not None]


def _at_end(state, array, base, walk, seen):
    """True when ``walk`` ends before its current entry (back at the head, or a
    link that cannot be followed: a problem)."""
    current, index = walk.current, walk.index
    if current == walk.head:
        blink = _U64.unpack_from(array.data, walk.head - base + 8)[0]
        if blink != walk.previous:
            state.problems.add("broken_link", walk.head, "bucket %d: head Blink %s, last entry %s"
                               % (index, hexaddr(blink), hexaddr(walk.previous)))
        return True
    if current == 0:
        state.problems.add("broken_link", walk.previous, "bucket %d: NULL Flink" % index)
        return True
    if current in seen:
        state.problems.add("cycle", current, "bucket %d: entry %s reached twice" % (index, hexaddr(current)))
        return True
    if len(walk.entries) >= WALK_LIMIT:
        state.problems.add("walk_limit", current, "bucket %d: stopped after %d entries" % (index, WALK_LIMIT))
        return True
    return False


class _StackReader(object):
    """Reads one cached stack: its first piece at once, the later pieces one per
    :meth:`step`; ``flink`` is the next entry of the bucket (None when the first
    piece is unreadable)."""

    def __init__(self, pages, state, entry, previous):
        self.pages = pages
        self.state = state
        self.entry = entry
        self.flink = None
        self.next_piece = 0
        try:
            data, at = pages.locate(entry.key, layouts.PIECE_SIZE)
        except UnreadableMemory as error:
            state.problems.add("unreadable", error.address, "bucket %d: entry is unreadable" % entry.bucket)
            return
        flink, blink, self.next_piece, entry.refcount, entry.hash, entry.frame_count = \
            _PIECE_HEAD.unpack_from(data, at)
        self.flink = flink
        if blink != previous:
            state.problems.add("broken_link", entry.key, "Blink %s, expected %s" % (hexaddr(blink), hexaddr(previous)))
        entry.pieces.append(entry.key)
        self.frame_count = entry.frame_count
        if self.frame_count > layouts.MAX_PLAUSIBLE_FRAMES:
            state.problems.add("frame_count", entry.key, "FrameCount %d is implausible (max %d); reading %d"
                               % (self.frame_count, layouts.MAX_PLAUSIBLE_FRAMES, layouts.MAX_PLAUSIBLE_FRAMES))
            self.frame_count = layouts.MAX_PLAUSIBLE_FRAMES
        # Frame bytes are collected piece by piece, decoded and hashed once at the end.
        take = min(layouts.FRAMES_PER_PIECE, self.frame_count)
        frames_at = at + layouts.FRAMES_OFFSET
        self.chunks = [data[frames_at:frames_at + 8 * take]]
        self.collected = take
        self.expected = layouts.pieces_for(self.frame_count)
        self.visited = {entry.key}
        if not self.next_piece:
            self.finish()

    def step(self):
        """Read the next piece; True while more pieces follow."""
        entry, state, piece = self.entry, self.state, self.next_piece
        self.next_piece = 0
        if len(entry.pieces) >= self.expected:
            state.problems.add("chain_too_long", piece, "stack %s: more pieces than FrameCount %d allows"
                               % (hexaddr(entry.key), entry.frame_count))
        elif piece in self.visited:
            state.problems.add("chain_cycle", piece, "stack %s: piece chain loops" % hexaddr(entry.key))
        else:
            self.visited.add(piece)
            try:
                data, at = self.pages.locate(piece, layouts.PIECE_SIZE)
            except UnreadableMemory as error:
                state.problems.add("unreadable", error.address, "stack %s: piece is unreadable" % hexaddr(entry.key))
            else:
                _links, _blink, self.next_piece, _refs, _hash, piece_frames = _PIECE_HEAD.unpack_from(data, at)
                entry.pieces.append(piece)
                entry.piece_frame_counts.append(piece_frames)
                take = min(layouts.FRAMES_PER_PIECE, self.frame_count - self.collected)
                if take > 0:
                    frames_at = at + layouts.FRAMES_OFFSET
                    self.chunks.append(data[frames_at:frames_at + 8 * take])
                    self.collected += take
        if self.next_piece:
            return True
        self.finish()
        return False

    def finish(self):
        entry = self.entry
        if len(entry.pieces) < self.expected:
            self.state.problems.add("chain_short", entry.key, "stack %s: FrameCount %d needs %d pieces, chain has %d"
                                    % (hexaddr(entry.key), entry.frame_count, self.expected, len(entry.pieces)))
        raw = b"".join(self.chunks)
        entry.frames = struct.unpack("<%dQ" % self.collected, raw)
        entry.frames_hash = stack_trace_hash(raw)


def _read_piece_chains(pages, readers):
    """Follow the piece chains of ``readers`` side by side, one piece each per round."""
    pending = [reader for reader in readers if reader.next_piece]
    while pending:
        pages.prefetch([reader.next_piece for reader in pending], layouts.PIECE_SIZE)
        pending = [reader for reader in pending if reader.step()]


class _PoolWindow(object):
    """The span the piece pool can occupy, for reading ahead along the free list:
    one allocation of free + used pieces that holds every piece seen.  The SLIST
    depth counts free pieces modulo 2^16, so the window first assumes depth free
    pieces and widens by 2^16 pieces whenever the list leaves it."""

    def __init__(self, state, top):
        known = [piece for entry in state.entries for piece in entry.pieces] + [top]
        self.low, self.high = min(known), max(known)
        self.pieces = state.free_depth + state.used_pieces

    def span(self, piece):
        """(start, end) of the window, first widened to cover ``piece``."""
        self.low, self.high = min(self.low, piece), max(self.high, piece)
        while (self.high - self.low + layouts.PIECE_SIZE > self.pieces * layouts.PIECE_STRIDE
               and self.pieces < layouts.MAX_PIECES):
            self.pieces += layouts.SLIST_DEPTH_MASK + 1
        size = min(self.pieces, layouts.MAX_PIECES) * layouts.PIECE_STRIDE
        return self.high + layouts.PIECE_SIZE - size, self.low + size


def _walk_free_list(pages, state, free_list):
    low, high = free_list
    state.free_depth = low & layouts.SLIST_DEPTH_MASK
    state.free_list_top = high & layouts.SLIST_NEXT_MASK
    seen = set()
    current = previous = state.free_list_top
    window = _PoolWindow(state, current) if current else None
    while current:
        if current in seen:
            state.problems.add("free_list_cycle", current, "free list loops")
            state.free_walk_complete = False
            return
        if len(seen) >= layouts.MAX_PIECES:
            state.problems.add("walk_limit", current, "free list longer than %d pieces" % layouts.MAX_PIECES)
            state.free_walk_complete = False
            return
        seen.add(current)
        state.free_pieces.append(current)
        if current & ~(PAGE_SIZE - 1) not in pages.pages:
            pages.read_ahead(current, current < previous, window.span(current))
        try:
            previous, current = current, pages.pointer(current)
        except UnreadableMemory as error:
            state.problems.add("unreadable", error.address, "free list piece is unreadable")
            state.free_walk_complete = False
            return
