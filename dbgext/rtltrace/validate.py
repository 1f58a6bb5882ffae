"""The invariants of a trace database (reference: "Invariants a validator can
check"), applied to what :mod:`dbgext.rtltrace.walk` read.

Known Windows quirks are notes, not problems: the first segment's Magic raised by
HashCounter overflow, and a bucket array that runs past the first SegmentEnd.
"""

import bisect

from .hashing import pointer_sum_hash
from .layouts import BLOCK_MAGIC, DEFAULT_HASH_SYMBOLS, HASH_COUNTER_SLOTS, MIN_BUCKETS, SEGMENT_MAGIC

HASH_NAMES = {
    "default": "RtlStackTraceHashFunction (XOR of 16-bit word pairs)",
    "pointer-sum": "sum of the frame pointers (as the RtlTraceDatabaseCreate documentation says)",
    "custom": "a custom hash function",
    "unknown": "unknown (no blocks to check placement with)",
}


def validate_database(target, db):
    if db.header_read:
        _check_header(db)
        _classify_hash(target, db)
        _check_segments(db)
        _check_blocks(db)
        _check_totals(db)
        _check_hash_counter(db)
        _describe(db)
    db.problems.finish()
    return db


def _field_address(db, name):
    return db.address + db.layout.database.offsets[name]


def _check_header(db):
    flags = db.field("Flags")
    if not flags & db.layout.create_flag:
        db.problems.add("bad_flags", _field_address(db, "Flags"),
                        "Flags 0x%x lacks bit 0x%x that %s's RtlTraceDatabaseCreate always sets"
                        % (flags, db.layout.create_flag, db.layout.module))


def _default_hash_address(target, db):
    for module in (db.layout.module, "ntdll", "nt"):
        for name in DEFAULT_HASH_SYMBOLS:
            address = target.symbol_address("%s!%s" % (module, name))
            if address is not None:
                return address, "%s!%s" % (module, name)
    return None, None


def _classify_hash(target, db):
    """Decide which hash places the blocks; set each block's ``hash`` to it (None
    for a custom hash) and report blocks in the wrong bucket."""
    address = db.field("HashFunction")
    buckets = db.field("NoOfBuckets")
    known_address, known_name = _default_hash_address(target, db)
    checked = [block for block in db.blocks if block.frames_read]
    info = {"address": address, "symbol": target.symbolize(address) if address else None,
            "checked_blocks": len(checked), "matching_blocks": 0}
    db.hash_function = info
    if address == 0:
        db.problems.add("null_hash_function", _field_address(db, "HashFunction"),
                        "HashFunction is NULL (Create always sets one)")
    if buckets == 0:
        info["kind"], info["description"] = "unknown", HASH_NAMES["unknown"]
        return
    default_matches = sum(1 for block in checked if block.hash % buckets == block.bucket)
    if (known_address is not None and address == known_address) or 2 * default_matches > len(checked):
        kind, matches = "default", default_matches
    else:
        sums = [pointer_sum_hash(block.frames) for block in checked]
        sum_matches = sum(1 for block, value in zip(checked, sums) if value % buckets == block.bucket)
        if checked and 2 * sum_matches > len(checked):
            kind, matches = "pointer-sum", sum_matches
            for block, value in zip(checked, sums):
                block.hash = value
        else:
            kind, matches = ("custom" if checked else "unknown"), default_matches
            for block in db.blocks:
                block.hash = None
    info["kind"] = kind
    info["matching_blocks"] = matches
    info["description"] = HASH_NAMES[kind]
    if known_name and address == known_address:
        info["reason"] = "HashFunction is %s" % known_name
    elif kind in ("default", "pointer-sum"):
        info["reason"] = "%d of %d blocks sit in the bucket this hash gives" % (matches, len(checked))
    elif kind == "custom":
        info["reason"] = ("only %d of %d blocks sit where the default hash puts them"
                          % (matches, len(checked)))
        db.note("custom hash function at %s: bucket placement and per-slot HashCounter checks skipped"
                % (info["symbol"] or "0x0"))
    if kind not in ("default", "pointer-sum"):
        return
    for block in checked:
        expected = block.hash % buckets
        if expected != block.bucket:
            db.problems.add("wrong_bucket", block.address, "block is in bucket %d but its frames hash to bucket %d"
                            % (block.bucket, expected))


def _first_segment(db):
    for segment in db.segments:
        if segment.start == db.address:
            return segment
    return None


def _check_segments(db):
    layout = db.layout
    granularity = layout.segment_granularity
    first = _first_segment(db)
    for segment in db.segments:
        if segment is not first and segment.magic != SEGMENT_MAGIC:
            db.problems.add("bad_magic", segment.address, "segment magic 0x%08x, expected 0x%08x"
                            % (segment.magic, SEGMENT_MAGIC))
        if segment.database != db.address:
            db.problems.add("segment_database_mismatch", segment.address,
                            "segment's Database is %s, not this database" % db.hexaddr(segment.database))
        if segment.free < segment.start:
            db.problems.add("segment_free_before_start", segment.address,
                            "SegmentFree %s is below SegmentStart %s"
                            % (db.hexaddr(segment.free), db.hexaddr(segment.start)))
        if segment.end - segment.start != segment.total_size:
            db.problems.add("segment_size_mismatch", segment.address,
                            "SegmentEnd - SegmentStart = 0x%x but TotalSize = 0x%x"
                            % ((segment.end - segment.start) & ((1 << 64) - 1), segment.total_size))
        if segment.free > segment.end:
            if segment is first and segment.free == segment.payload_start:
                db.note("the bucket array (%d buckets) runs past the first segment's SegmentEnd, so its "
                        "SegmentFree %s > SegmentEnd %s: Windows lays big bucket arrays out this way"
                        % (db.field("NoOfBuckets"), db.hexaddr(segment.free), db.hexaddr(segment.end)))
            else:
                db.problems.add("segment_free_past_end", segment.address,
                                "SegmentFree %s is past SegmentEnd %s"
                                % (db.hexaddr(segment.free), db.hexaddr(segment.end)))
    if not db.segment_list_complete:
        return
    if db.segments and db.segments[-1] is not first:
        db.problems.add("first_segment_missing", db.segments[-1].address,
                        "the segment list does not end at the first segment (SegmentStart == database)")
    total = sum(segment.total_size for segment in db.segments)
    if total != db.field("CurrentSize"):
        db.problems.add("current_size_mismatch", _field_address(db, "CurrentSize"),
                        "CurrentSize 0x%x but the %d segments total 0x%x"
                        % (db.field("CurrentSize"), len(db.segments), total))
    maximum = db.field("MaximumSize")
    if maximum and len(db.segments) > 1 and db.field("CurrentSize") - granularity > maximum:
        db.problems.add("maximum_size_exceeded", _field_address(db, "MaximumSize"),
                        "CurrentSize 0x%x exceeds MaximumSize 0x%x by more than one segment"
                        % (db.field("CurrentSize"), maximum))


def _check_blocks(db):
    layout = db.layout
    areas = sorted((segment.payload_start, min(segment.free, segment.extent_end)) for segment in db.segments)
    starts = [start for start, _ in areas]
    header_size = layout.block.size
    pointer_size = layout.pointer_size
    nonzero_user = 0
    for block in db.blocks:
        size = header_size + (block.size if block.size <= 256 else 0) * pointer_size
        index = bisect.bisect_right(starts, block.address) - 1
        if index < 0 or block.address + size > areas[index][1]:
            db.problems.add("block_outside_segments", block.address,
                            "bucket %d: block is not inside any segment's used area" % block.bucket)
        if block.magic != BLOCK_MAGIC:
            continue  # already reported; its other fields are noise
        if block.trace != block.address + header_size:
            db.problems.add("bad_trace_pointer", block.address, "Trace is 0x%x, expected block + 0x%x"
                            % (block.trace, header_size))
        if block.count == 0:
            db.problems.add("bad_count", block.address, "bucket %d: Count is 0 (1 on creation)" % block.bucket)
        if block.user_count or block.user_size or block.user_context:
            nonzero_user += 1
    if nonzero_user:
        db.note("%d blocks have non-zero UserCount/UserSize/UserContext (Rtl leaves them 0; the "
                "database's owner set them)" % nonzero_user)


def _check_totals(db):
    found = len(db.blocks)
    stored = db.field("NoOfTraces")
    if found != stored:
        db.problems.add("count_mismatch", _field_address(db, "NoOfTraces"),
                        "NoOfTraces is %d but %d blocks were reached through the buckets%s"
                        % (stored, found, "" if db.complete else " (walk incomplete)"))
    hits = sum(block.count - 1 for block in db.blocks if block.count)
    if db.complete and hits != db.field("NoOfHits"):
        db.problems.add("count_mismatch", _field_address(db, "NoOfHits"),
                        "NoOfHits is %d but the blocks' Count - 1 sum to %d" % (db.field("NoOfHits"), hits))


def _check_hash_counter(db):
    buckets = db.field("NoOfBuckets")
    stored = db.field("HashCounter", [0] * HASH_COUNTER_SLOTS)
    first = _first_segment(db)
    if buckets < MIN_BUCKETS:
        if first is not None and first.magic != SEGMENT_MAGIC:
            db.problems.add("bad_magic", first.address, "first segment magic 0x%08x, expected 0x%08x"
                            % (first.magic, SEGMENT_MAGIC))
        return
    per_range = buckets >> 4
    range_counts = [0] * (HASH_COUNTER_SLOTS + 1)
    beyond = 0
    for block in db.blocks:
        slot = block.bucket // per_range
        if slot <= HASH_COUNTER_SLOTS:
            range_counts[slot] += 1
        else:
            beyond += 1
    overflow = range_counts[HASH_COUNTER_SLOTS]
    if beyond:
        db.note("%d traces' HashCounter bookkeeping landed beyond the first segment's Magic "
                "(NoOfBuckets %d < 256 and not a multiple of 16)" % (beyond, buckets))
    if first is not None:
        raised = (first.magic - SEGMENT_MAGIC) & 0xFFFFFFFF
        if raised == overflow:
            if overflow:
                db.note("first segment Magic reads 0x%08x = 0x%08x + %d: HashCounter overflow from the "
                        "%d traces in buckets %d..%d (a Windows quirk, not corruption)"
                        % (first.magic, SEGMENT_MAGIC, overflow, overflow, 16 * per_range, buckets - 1))
        elif not db.complete and raised <= db.field("NoOfTraces"):
            db.note("first segment Magic reads 0x%08x = 0x%08x + %d; %d traces were seen in the overflow "
                    "buckets before the walk stopped, consistent with HashCounter overflow"
                    % (first.magic, SEGMENT_MAGIC, raised, overflow))
            overflow = raised
        else:
            db.problems.add("bad_magic", first.address, "first segment magic 0x%08x, expected 0x%08x + %d "
                            "(HashCounter overflow from %d traces in the last buckets)"
                            % (first.magic, SEGMENT_MAGIC, overflow, overflow))
    db.overflow_traces = overflow
    lookups = 2 * db.field("NoOfTraces") + db.field("NoOfHits")
    finds = sum(stored) + overflow - lookups
    if finds < 0:
        db.problems.add("hash_counter_mismatch", _field_address(db, "HashCounter"),
                        "sum(HashCounter) + %d = %d is below 2*NoOfTraces + NoOfHits = %d"
                        % (overflow, sum(stored) + overflow, lookups))
    else:
        db.external_finds = finds
    if any(block.hash is None for block in db.blocks) or not db.complete:
        return
    expected = list(range_counts[:HASH_COUNTER_SLOTS])
    for block in db.blocks:
        expected[block.hash & 0xF] += block.count
    db.hash_counter_expected = expected
    for slot in range(HASH_COUNTER_SLOTS):
        if stored[slot] < expected[slot]:
            db.problems.add("hash_counter_mismatch", _field_address(db, "HashCounter") + 4 * slot,
                            "HashCounter[%d] is %d but the stored blocks account for %d lookups"
                            % (slot, stored[slot], expected[slot]))


FLAG_NAMES = ((1, "user-mode create"), (2, "kernel-mode create"), (4, "non-paged segments"))


def _segment_magic(db, segment, first):
    if segment.magic == SEGMENT_MAGIC:
        return "ok"
    if segment is first and segment.magic == (SEGMENT_MAGIC + db.overflow_traces) & 0xFFFFFFFF:
        return "ok (+%d HashCounter overflow)" % db.overflow_traces
    return "BAD 0x%08x" % segment.magic


def _describe(db):
    """The derived facts views show: flag names, each segment's magic verdict and
    the bucket and size statistics."""
    flags = db.field("Flags")
    db.flag_names = [name for bit, name in FLAG_NAMES if flags & bit]
    first = _first_segment(db)
    db.segment_magic = dict((segment.address, _segment_magic(db, segment, first)) for segment in db.segments)
    lengths = db.chain_lengths
    histogram = {}
    for length in lengths:
        histogram[length] = histogram.get(length, 0) + 1
    occupied = len(lengths) - histogram.get(0, 0)
    longest_bucket = max(range(len(lengths)), key=lengths.__getitem__) if lengths else None
    header_size = db.layout.block.size
    pointer_size = db.layout.pointer_size
    db.statistics = {
        "buckets_walked": len(lengths),
        "occupied_buckets": occupied,
        "empty_buckets": len(lengths) - occupied,
        "chain_histogram": [[length, histogram[length]] for length in sorted(histogram)],
        "longest_chain": {"bucket": longest_bucket,
                          "length": lengths[longest_bucket] if lengths else 0},
        "average_chain": (float(len(db.blocks)) / occupied) if occupied else 0.0,
        "blocks_found": len(db.blocks),
        "hits_found": sum(block.count - 1 for block in db.blocks if block.count),
        "block_bytes": sum(header_size + block.size * pointer_size
                           for block in db.blocks if block.frames_read),
        "segment_bytes": sum(segment.total_size for segment in db.segments),
        "segments_magic_ok": sum(1 for verdict in db.segment_magic.values() if verdict.startswith("ok")),
        "blocks_magic_ok": sum(1 for block in db.blocks if block.magic == BLOCK_MAGIC),
    }
