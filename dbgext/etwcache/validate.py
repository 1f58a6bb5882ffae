"""Consistency checks over a walked cache (the walker already reported what it
could not read or follow): bucket sizes, hashes and buckets recomputed, piece
frame counts, free/used overlap, SLIST depth, reference counts."""

from ..hexaddr import hexaddr
from . import layouts


def validate(state, idle=True):
    """Add to ``state.problems`` what the walk could not see: the invariants
    between entries, pieces and the free list.  ``idle``: the logger is not logging
    right now, so every cached entry should hold exactly one reference."""
    if not state.readable:
        return
    add = state.problems.add
    for index, bucket in enumerate(state.buckets):
        if len(bucket) > layouts.MAX_BUCKET_ENTRIES:
            add("bucket_overfull", bucket[0].key, "bucket %d holds %d entries (max %d)"
                % (index, len(bucket), layouts.MAX_BUCKET_ENTRIES))
    used = {}
    for entry in state.entries:
        if len(entry.frames) == entry.frame_count:
            computed = entry.frames_hash
            if computed != entry.hash:
                add("hash_mismatch", entry.key, "stored hash 0x%08x, frames hash to 0x%08x" % (entry.hash, computed))
            if state.bucket_count and computed % state.bucket_count != entry.bucket:
                add("wrong_bucket", entry.key, "in bucket %d, hash puts it in bucket %d"
                    % (entry.bucket, computed % state.bucket_count))
        remaining = entry.frame_count - layouts.FRAMES_PER_PIECE
        for piece, count in zip(entry.pieces[1:], entry.piece_frame_counts):
            expected = min(layouts.FRAMES_PER_PIECE, remaining)
            if count != expected:
                add("piece_frame_count", piece, "stack %s: piece says %d frames, FrameCount %d leaves %d"
                    % (hexaddr(entry.key), count, entry.frame_count, expected))
            remaining -= layouts.FRAMES_PER_PIECE
        if idle and entry.refcount != 1:
            add("refcount", entry.key, "RefCount %d on an idle cache (expected 1)" % entry.refcount)
        for piece in entry.pieces:
            if piece in used:
                add("shared_piece", piece, "piece used by stacks %s and %s"
                    % (hexaddr(used[piece]), hexaddr(entry.key)))
            else:
                used[piece] = entry.key
    for piece in state.free_pieces:
        if piece in used:
            add("free_and_used", piece, "piece is on the free list and in stack %s" % hexaddr(used[piece]))
    if state.free_walk_complete and (len(state.free_pieces) & layouts.SLIST_DEPTH_MASK) != state.free_depth:
        add("free_depth", state.address + state.layout.offset("FreeList"), "SLIST depth %d, walk found %d free pieces"
            % (state.free_depth, len(state.free_pieces)))
