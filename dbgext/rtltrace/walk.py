"""Read an RTL_TRACE_DATABASE: choose its layout, then walk header, segment list,
bucket array and bucket chains into plain data objects.

Reading is bulk: each segment's used part is fetched with one ``try_read`` and
blocks are decoded from those buffers, so the backend sees page-sized runs, not
one request per field.  Everything is bounded (segments, buckets, blocks, frames)
and cycle-checked; what cannot be read becomes a problem naming its address and
the walk goes on with the rest.
"""

import bisect
import contextlib
import gc
import struct

from ..errors import UnreadableMemory, WrongSignature
from ..stackhash import stack_trace_hash
from .layouts import BLOCK_MAGIC, DATABASE_MAGIC, MAX_BUCKETS, MAX_FRAMES, MIN_BUCKETS, describe_magic
from .result import TraceBlock, TraceDatabase, Segment

MAX_SEGMENTS = 100000
MAX_BLOCKS = 1000000
# A segment is one allocation of the layout's granularity (the first may also hold
# a bucket array of up to 8 MiB); a segment claiming more than this is corrupt and
# is not read in bulk, and all bulk reads together stay within a budget, so a
# garbage segment list cannot make the walk read (and hold) gigabytes.
MAX_BULK_SEGMENT = 16 * 1024 * 1024
MAX_BULK_TOTAL = 512 * 1024 * 1024


# -- the walk ----------------------------------------------------------------------

class _Span(object):
    """One bulk-read stretch of a segment, with the default hash's per-dword terms
    precomputed for the whole stretch: for a dword at index i, ``low[i]`` and
    ``high[i]`` are the XOR of its words' low and high bytes, so a trace's hash is
    ``sum(low[i:j]) + 256 * sum(high[i:j])`` over its frames' dwords."""

    __slots__ = ("start", "end", "data", "holes", "low", "high")

    def __init__(self, start, partial):
        self.start = start
        self.end = start + len(partial.data)
        self.data = partial.data
        self.holes = partial.holes
        self.low = self.high = None
        if start % 4 == 0:
            data = self.data
            count = len(data) // 4
            self.low = (int.from_bytes(data[0::4], "little")
                        ^ int.from_bytes(data[2::4], "little")).to_bytes(count + 1, "little")
            self.high = (int.from_bytes(data[1::4], "little")
                         ^ int.from_bytes(data[3::4], "little")).to_bytes(count + 1, "little")

    def covers(self, address, size):
        if address < self.start or address + size > self.end:
            return False
        if not self.holes:
            return True
        for start, end in self.holes:
            if start < address + size and address < end:
                return False
        return True


class _SegmentMemory(object):
    """Bulk-read segment contents, looked up by page (fast path) or by address."""

    def __init__(self, target):
        self.target = target
        self._starts = []
        self._spans = []
        self.by_page = {}  # page number -> the span holding it

    def add(self, start, end):
        if end <= start:
            return
        span = _Span(start, self.target.try_read(start, end - start))
        index = bisect.bisect_left(self._starts, start)
        self._starts.insert(index, start)
        self._spans.insert(index, span)
        for page in range(start >> 12, ((end - 1) >> 12) + 1):
            self.by_page[page] = span

    def span(self, address, size):
        """The span holding [address, address+size) readably, or None."""
        span = self.by_page.get(address >> 12)
        if span is not None and span.covers(address, size):
            return span
        index = bisect.bisect_right(self._starts, address) - 1
        if index >= 0 and self._spans[index].covers(address, size):
            return self._spans[index]
        return None


def read_header(target, db, force=False):
    """Read the header; an unreadable one or a wrong magic is refused
    (UnreadableMemory, WrongSignature) unless ``force``."""
    layout = db.layout
    partial = target.try_read(db.address, layout.database.size)
    if partial.holes:
        if not force:
            raise UnreadableMemory(partial.holes[0][0], detail="no RTL_TRACE_DATABASE header can be read at %s"
                                   % db.hexaddr(db.address))
        db.problems.add("unreadable", partial.holes[0][0],
                        "database header (0x%x bytes at %s) is not fully readable"
                        % (layout.database.size, db.hexaddr(db.address)))
        db.complete = False
        return False
    db.header = layout.database.unpack(partial.data)
    db.header_read = True
    if db.header["Magic"] != DATABASE_MAGIC:
        if not force:
            raise WrongSignature("RTL_TRACE_DATABASE", db.address, describe_magic(db.header["Magic"]))
        db.problems.add("bad_magic", db.address, "database magic 0x%08x, expected 0x%08x"
                        % (db.header["Magic"], DATABASE_MAGIC))
    return True


def walk_segments(target, db, max_segments=MAX_SEGMENTS):
    layout = db.layout
    seen = set()
    address = db.field("SegmentList")
    while address:
        if address in seen:
            db.problems.add("segment_cycle", address, "segment list returns to %s after %d segments"
                            % (db.hexaddr(address), len(db.segments)))
            db.complete = False
            db.segment_list_complete = False
            return
        if len(db.segments) >= max_segments:
            db.problems.add("segment_limit", address, "stopped after %d segments" % max_segments)
            db.complete = False
            db.segment_list_complete = False
            return
        seen.add(address)
        try:
            data = target.read(address, layout.segment.span)
        except UnreadableMemory as error:
            db.problems.add("unreadable", error.address, "segment header at %s (segment %d of the list)"
                            % (db.hexaddr(address), len(db.segments)))
            db.complete = False
            db.segment_list_complete = False
            return
        segment = Segment(address, layout.segment.unpack(data))
        db.segments.append(segment)
        address = segment.next


def _bucket_array_end(db):
    count = min(db.field("NoOfBuckets"), MAX_BUCKETS)
    return db.field("Buckets") + count * db.layout.pointer_size


def _place_segments(db, memory):
    """Set each segment's block area and extent, and bulk-read the used part."""
    layout = db.layout
    granularity = layout.segment_granularity
    buckets_start, buckets_end = db.field("Buckets"), _bucket_array_end(db)
    budget = MAX_BULK_TOTAL
    for segment in db.segments:
        segment.payload_start = segment.address + layout.segment.size
        segment.extent_end = segment.end
        if segment.start == db.address:
            # The first allocation: header, first segment, bucket array, blocks.
            if segment.address <= buckets_start < segment.address + MAX_BULK_SEGMENT:
                segment.payload_start = max(segment.payload_start, buckets_end)
            needed = max(segment.payload_start, segment.end) - db.address
            segment.extent_end = db.address + (needed + granularity - 1) // granularity * granularity
        size = min(segment.free, segment.extent_end) - segment.payload_start
        if 0 < size <= min(MAX_BULK_SEGMENT, budget):
            memory.add(segment.payload_start, segment.payload_start + size)
            budget -= size


def read_buckets(target, db):
    """Bucket head pointers (a list; unreadable heads are 0 and reported)."""
    count = db.field("NoOfBuckets")
    if count < MIN_BUCKETS or count > MAX_BUCKETS:
        db.problems.add("bad_bucket_count", db.address + db.layout.database.offsets["NoOfBuckets"],
                        "NoOfBuckets is %d (Windows uses %d..0x%x)" % (count, MIN_BUCKETS, MAX_BUCKETS))
        count = min(count, MAX_BUCKETS)
        if count < db.field("NoOfBuckets"):
            db.note("only the first 0x%x buckets were walked" % count)
            db.complete = False
    if count == 0:
        return []
    buckets = db.field("Buckets")
    if buckets == 0:
        db.problems.add("null_buckets", db.address + db.layout.database.offsets["Buckets"],
                        "Buckets pointer is NULL with %d buckets" % count)
        db.complete = False
        return []
    size = count * db.layout.pointer_size
    partial = target.try_read(buckets, size)
    pointer_size = db.layout.pointer_size
    for start, end in partial.holes:
        db.problems.add("unreadable", start, "bucket array: buckets %d..%d are unreadable"
                        % ((start - buckets) // pointer_size, (end - 1 - buckets) // pointer_size))
        db.complete = False
    fmt = "<%d%s" % (count, "Q" if pointer_size == 8 else "I")
    return list(struct.unpack(fmt, partial.data))


def read_block(target, layout, address):
    """One block read on its own (not through a bucket): raises UnreadableMemory
    for its header; frames stay None when unreadable or Size is implausible."""
    block = TraceBlock(address, None, layout.block.unpack_tuple(target.read(address, layout.block.span)))
    if 1 <= block.size <= MAX_FRAMES:
        frames_size = block.size * layout.pointer_size
        partial = target.try_read(address + layout.block.size, frames_size)
        if not partial.holes:
            block.frames = struct.unpack("<%d%s" % (block.size, "Q" if layout.pointer_size == 8 else "I"),
                                         partial.data)
            block.hash = stack_trace_hash(partial.data)
    return block


def walk_chains(db, heads, memory, max_blocks=MAX_BLOCKS):
    """Follow every bucket chain; fills db.blocks and db.chain_lengths.

    The hot loop of a 100,000-trace walk: blocks are decoded straight from the
    segment spans (found by page number, bounds checked inline) and hashed from
    the spans' precomputed dword terms; anything else goes through the Target."""
    layout = db.layout
    target = memory.target
    header_size = layout.block.size
    header_span = layout.block.span
    unpack_header = layout.block.unpack_tuple
    pointer_size = layout.pointer_size
    frame_structs = [struct.Struct("<%d%s" % (count, "Q" if pointer_size == 8 else "I"))
                     for count in range(MAX_FRAMES + 1)]
    owner = {}  # block address -> bucket that reached it
    blocks = db.blocks
    lengths = db.chain_lengths
    span_of_page = memory.by_page.get
    find_span = memory.span
    buckets_address = db.field("Buckets")
    for bucket, address in enumerate(heads):
        length = 0
        came_from = buckets_address + bucket * pointer_size
        while address:
            if address in owner:
                if owner[address] == bucket:
                    db.problems.add("bucket_cycle", address, "bucket %d: chain loops back to %s after %d blocks"
                                    % (bucket, db.hexaddr(address), length))
                else:
                    db.problems.add("bucket_cross_link", address, "bucket %d: chain joins bucket %d's chain at %s"
                                    % (bucket, owner[address], db.hexaddr(address)))
                db.complete = False
                break
            if len(blocks) >= max_blocks:
                db.problems.add("block_limit", address, "stopped after %d blocks" % max_blocks)
                db.complete = False
                break
            span = span_of_page(address >> 12)
            if span is None or span.holes or address < span.start or address + header_span > span.end:
                span = find_span(address, header_span)
            try:
                if span is not None:
                    fields = unpack_header(span.data, address - span.start)
                else:
                    fields = unpack_header(target.read(address, header_span))
            except UnreadableMemory as error:
                db.problems.add("unreadable", error.address, "bucket %d: block %s (linked from %s) is unreadable"
                                % (bucket, db.hexaddr(address), db.hexaddr(came_from)))
                db.complete = False
                break
            owner[address] = bucket
            block = TraceBlock(address, bucket, fields)
            blocks.append(block)
            length += 1
            if block.magic != BLOCK_MAGIC:
                db.problems.add("bad_magic", address, "bucket %d: block magic 0x%08x, expected 0x%08x "
                                "(chain not followed further)" % (bucket, block.magic, BLOCK_MAGIC))
                db.complete = False
                break
            size = block.size
            if 0 < size <= MAX_FRAMES:
                frames_address = address + header_size
                frames_end = frames_address + size * pointer_size
                if span is None or span.holes or frames_end > span.end:
                    span = find_span(frames_address, frames_end - frames_address)
                if span is not None:
                    offset = frames_address - span.start
                    block.defer_frames(span.data, offset, frame_structs[size])
                    low = span.low
                    if low is not None and not offset & 3:
                        first, last = offset >> 2, (frames_end - span.start) >> 2
                        block.hash = (sum(low[first:last]) + 256 * sum(span.high[first:last])) & 0xFFFFFFFF
                    else:
                        block.hash = stack_trace_hash(span.data[offset:offset + frames_end - frames_address])
                else:
                    partial = target.try_read(frames_address, frames_end - frames_address)
                    if partial.holes:
                        db.problems.add("unreadable", partial.holes[0][0], "bucket %d: frames of block %s are "
                                        "unreadable" % (bucket, db.hexaddr(address)))
                    else:
                        block.frames = frame_structs[size].unpack(partial.data)
                        block.hash = stack_trace_hash(partial.data)
            else:
                db.problems.add("bad_block_size", address, "bucket %d: block Size %d (1..%d frames expected); "
                                "frames not read" % (bucket, size, MAX_FRAMES))
            came_from = address
            address = block.next
        lengths.append(length)
    db.buckets_walked = len(heads)


def walk_database(target, address, layouts, force=False, max_blocks=MAX_BLOCKS):
    """Read the database at ``address`` with ``layouts`` (a TraceLayouts)."""
    db = TraceDatabase(address, layouts)
    if layouts.arch != target.arch:
        db.note("layout %s is for %s but the target is %s" % (layouts.name, layouts.arch, target.arch))
    if not read_header(target, db, force):
        return db
    walk_segments(target, db)
    memory = _SegmentMemory(target)
    _place_segments(db, memory)
    heads = read_buckets(target, db)
    with _collector_paused():
        walk_chains(db, heads, memory, max_blocks=max_blocks)
    return db


@contextlib.contextmanager
def _collector_paused():
    """Pause the cyclic garbage collector while the walk creates its objects:
    100,000 blocks with frame tuples otherwise trigger repeated full collections
    (about 40% of the walk), and the walk's objects form no cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
