"""Read an ETW stack cache out of target memory into plain data.

Everything is bounded: at most MAX_BUCKET_COUNT buckets, WALK_LIMIT entries per
bucket, ceil(FrameCount/32) (+1 to notice a longer chain) pieces per stack, and
MAX_PIECES free pieces; visited sets catch loops.  What cannot be read or does not
fit becomes a :class:`Problem` with its address, and the walk goes on.
"""

import struct

from ..errors import UnreadableMemory
from ..problems import CollectsProblems
from ..stackhash import stack_trace_hash
from ..target.base import PAGE_SIZE
from . import layouts

WALK_LIMIT = 64  # entries followed per bucket (a sane bucket holds at most 4)
_PIECE_HEAD = struct.Struct("<QQQiII")  # Flink, Blink, Next, RefCount, Hash, FrameCount
_U64 = struct.Struct("<Q")


class _PageView(object):
    """Reads of small structures through whole-page reads of the Target, kept for
    the walk: a cache of 170,000 pieces becomes ~13,000 Target reads, not 300,000.
    The walk's own bounds keep this to about one cache's worth of pages."""

    def __init__(self, target):
        self.target = target
        self.pages = {}

    def _page(self, page):
        data = self.pages.get(page, False)
        if data is False:
            try:
                data = self.target.read(page, PAGE_SIZE)
            except UnreadableMemory:
                data = None
            self.pages[page] = data
        return data

    def locate(self, address, size):
        """(buffer, offset) holding ``size`` bytes at ``address`` — the cached page
        itself when they fit in it, so callers unpack without copying."""
        offset = address & (PAGE_SIZE - 1)
        data = self.pages.get(address - offset, False)
        if data is False:
            data = self._page(address - offset)
        if data is None:
            raise UnreadableMemory(address, size)
        if offset + size <= PAGE_SIZE:
            return data, offset
        return self.target.read(address, size), 0

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
                "frames": list(self.frames)}


class CacheState(CollectsProblems):
    """What the walker found at one cache address."""

    def __init__(self, address):
        super().__init__()
        self.address = address
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
        counts = [0] * (layouts.MAX_BUCKET_ENTRIES + 1)
        for bucket in self.buckets:
            counts[min(len(bucket), layouts.MAX_BUCKET_ENTRIES)] += 1
        return counts

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
    """(passed, total, notes) of the invariants of variant ``name`` at ``address``."""
    layout = layouts.CACHE_VARIANTS[name]
    passed, total, notes = 0, 0, []
    bucket_count = struct.unpack_from("<I", header, layout["BucketCount"])[0]
    total += 1
    if layouts.MIN_BUCKET_COUNT <= bucket_count <= layouts.MAX_BUCKET_COUNT:
        passed += 1
    else:
        notes.append("BucketCount %d outside %d..%d" % (bucket_count, layouts.MIN_BUCKET_COUNT,
                                                       layouts.MAX_BUCKET_COUNT))
    total += 1
    if layout["owner_kind"] == "logger_id":
        owner = struct.unpack_from("<I", header, layout["owner"])[0]
        ok = owner < layouts.MAX_LOGGERS and (logger_id is None or owner == logger_id)
    else:
        owner = struct.unpack_from("<Q", header, layout["owner"])[0]
        ok = _is_kernel_pointer(owner) and (logger_context is None or owner == logger_context)
        if ok and logger_context is None:
            try:
                ok = target.u32(owner) < layouts.MAX_LOGGERS
            except UnreadableMemory:
                ok = False
    if ok:
        passed += 1
    else:
        notes.append("owner field does not name the logger")
    # The first buckets' list heads must be consistent (Flink->Blink == head).
    if 0 < bucket_count <= layouts.MAX_BUCKET_COUNT:
        sample = target.try_read(address + layout["Buckets"], min(bucket_count, 16) * layouts.BUCKET_SIZE)
        for index in range(min(bucket_count, 16)):
            head = address + layout["Buckets"] + index * layouts.BUCKET_SIZE
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
    return passed, total, notes


def detect_variant(target, address, header, logger_context=None, logger_id=None):
    """(variant or None, confidence, detail): the variant whose invariants hold."""
    scores = {}
    for name in sorted(layouts.CACHE_VARIANTS):
        scores[name] = _variant_checks(target, address, header, name, logger_context, logger_id)
    ranked = sorted(scores, key=lambda n: (scores[n][0] / float(scores[n][1]), scores[n][0]), reverse=True)
    best, other = ranked[0], ranked[1]
    best_passed, best_total, _ = scores[best]
    other_passed, other_total, _ = scores[other]
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


def read_cache(target, address, variant=None, logger_context=None, logger_id=None):
    """Walk the cache at ``address``; never raises for bad memory."""
    state = CacheState(address)
    try:
        header = target.read(address, layouts.HEADER_SIZE)
    except UnreadableMemory as error:
        state.problem("unreadable", error.address, "cache header is unreadable")
        return state
    if variant is None:
        variant, state.variant_confidence, state.variant_detail = detect_variant(
            target, address, header, logger_context, logger_id)
        if variant is None:
            state.problem("variant", address, "no layout variant fits (%s); give --variant"
                          % state.variant_detail)
            return state
    else:
        state.variant_confidence = "given"
    state.variant = variant
    layout = layouts.CACHE_VARIANTS[variant]
    owner_fmt = "<I" if layout["owner_kind"] == "logger_id" else "<Q"
    state.owner = struct.unpack_from(owner_fmt, header, layout["owner"])[0]
    state.bucket_count = struct.unpack_from("<I", header, layout["BucketCount"])[0]
    view = _PageView(target)
    _walk_free_list(view, state, header, layout)
    _walk_buckets(target, view, state, layout)
    state.finish_problems()
    return state


def _walk_buckets(target, view, state, layout):
    count = state.bucket_count
    if count == 0:
        state.problem("bucket_count", state.address + layout["BucketCount"], "BucketCount is 0")
        return
    if count > layouts.MAX_BUCKET_COUNT:
        state.problem("bucket_count", state.address + layout["BucketCount"],
                      "BucketCount %d exceeds %d; walking the first %d"
                      % (count, layouts.MAX_BUCKET_COUNT, layouts.MAX_BUCKET_COUNT))
        count = layouts.MAX_BUCKET_COUNT
    base = state.address + layout["Buckets"]
    array = target.try_read(base, count * layouts.BUCKET_SIZE)
    seen = set()
    for index in range(count):
        head = base + index * layouts.BUCKET_SIZE
        bucket = []
        state.buckets.append(bucket)
        if not array.readable(head, 16):
            state.problem("unreadable", head, "bucket %d list head is unreadable" % index)
            continue
        flink = struct.unpack_from("<Q", array.data, index * layouts.BUCKET_SIZE)[0]
        previous = head
        current = flink
        while current != head:
            if current == 0:
                state.problem("broken_link", previous, "bucket %d: NULL Flink" % index)
                break
            if current in seen:
                state.problem("cycle", current, "bucket %d: entry 0x%x reached twice" % (index, current))
                break
            if len(bucket) >= WALK_LIMIT:
                state.problem("walk_limit", current, "bucket %d: stopped after %d entries"
                              % (index, WALK_LIMIT))
                break
            seen.add(current)
            entry = CachedStack(current, index, len(bucket))
            next_entry = _read_entry(view, state, entry, previous)
            if next_entry is None:
                break
            bucket.append(entry)
            previous, current = current, next_entry
        else:
            blink = struct.unpack_from("<Q", array.data, index * layouts.BUCKET_SIZE + 8)[0]
            if blink != previous:
                state.problem("broken_link", head, "bucket %d: head Blink 0x%x, last entry 0x%x"
                              % (index, blink, previous))
    state.buckets_walked = count


def _read_entry(view, state, entry, previous):
    """Fill ``entry`` from its pieces; returns its Flink, or None when the entry
    itself is unreadable."""
    try:
        data, at = view.locate(entry.key, layouts.PIECE_SIZE)
    except UnreadableMemory as error:
        state.problem("unreadable", error.address, "bucket %d: entry is unreadable" % entry.bucket)
        return None
    flink, blink, next_piece, entry.refcount, entry.hash, entry.frame_count = _PIECE_HEAD.unpack_from(data, at)
    if blink != previous:
        state.problem("broken_link", entry.key, "Blink 0x%x, expected 0x%x" % (blink, previous))
    entry.pieces.append(entry.key)
    frame_count = entry.frame_count
    if frame_count > layouts.MAX_PLAUSIBLE_FRAMES:
        state.problem("frame_count", entry.key, "FrameCount %d is implausible (max %d); reading %d"
                      % (frame_count, layouts.MAX_PLAUSIBLE_FRAMES, layouts.MAX_PLAUSIBLE_FRAMES))
        frame_count = layouts.MAX_PLAUSIBLE_FRAMES
    # Collect the frame bytes piece by piece, decode and hash them once at the end.
    frames_at = at + layouts.PIECE["Frames"]
    take = min(layouts.FRAMES_PER_PIECE, frame_count)
    chunks = [data[frames_at:frames_at + 8 * take]]
    collected = take
    expected = layouts.pieces_for(frame_count)
    visited = {entry.key}
    while next_piece:
        if len(entry.pieces) >= expected:
            state.problem("chain_too_long", next_piece, "stack 0x%x: more pieces than FrameCount %d allows"
                          % (entry.key, entry.frame_count))
            break
        if next_piece in visited:
            state.problem("chain_cycle", next_piece, "stack 0x%x: piece chain loops" % entry.key)
            break
        visited.add(next_piece)
        piece = next_piece
        try:
            data, at = view.locate(piece, layouts.PIECE_SIZE)
        except UnreadableMemory as error:
            state.problem("unreadable", error.address, "stack 0x%x: piece is unreadable" % entry.key)
            break
        _links, _blink, next_piece, _refs, _hash, piece_frames = _PIECE_HEAD.unpack_from(data, at)
        entry.pieces.append(piece)
        entry.piece_frame_counts.append(piece_frames)
        take = min(layouts.FRAMES_PER_PIECE, frame_count - collected)
        if take > 0:
            frames_at = at + layouts.PIECE["Frames"]
            chunks.append(data[frames_at:frames_at + 8 * take])
            collected += take
    if len(entry.pieces) < expected:
        state.problem("chain_short", entry.key, "stack 0x%x: FrameCount %d needs %d pieces, chain has %d"
                      % (entry.key, entry.frame_count, expected, len(entry.pieces)))
    raw = b"".join(chunks)
    entry.frames = struct.unpack("<%dQ" % collected, raw)
    entry.frames_hash = stack_trace_hash(raw)
    return flink


def _walk_free_list(view, state, header, layout):
    low, high = struct.unpack_from("<QQ", header, layout["FreeList"])
    state.free_depth = low & layouts.SLIST_DEPTH_MASK
    state.free_list_top = high & layouts.SLIST_NEXT_MASK
    seen = set()
    current = state.free_list_top
    while current:
        if current in seen:
            state.problem("free_list_cycle", current, "free list loops")
            state.free_walk_complete = False
            return
        if len(seen) >= layouts.MAX_PIECES:
            state.problem("walk_limit", current, "free list longer than %d pieces" % layouts.MAX_PIECES)
            state.free_walk_complete = False
            return
        seen.add(current)
        state.free_pieces.append(current)
        try:
            current = view.pointer(current)
        except UnreadableMemory as error:
            state.problem("unreadable", error.address, "free list piece is unreadable")
            state.free_walk_complete = False
            return
