"""Text and JSON views of walked caches and simulations (no analysis here)."""

from . import analysis, layouts


def _hex(value):
    return "0x%x" % value if value is not None else "-"


def logger_label(logger):
    if logger is None:
        return "cache given by address (logger unknown)"
    name = '"%s"' % logger.name if logger.name is not None else "(name unreadable)"
    return "logger %s %s, context %s" % (logger.logger_id, name, _hex(logger.context))


def cache_document(state, problems):
    return {
        "address": state.address,
        "variant": state.variant,
        "variant_confidence": state.variant_confidence,
        "bucket_count": state.bucket_count,
        "bucket_count_prime": layouts.is_prime(state.bucket_count),
        "total_pieces": state.total_pieces,
        "free_pieces": len(state.free_pieces),
        "used_pieces": state.used_pieces,
        "cache_size": state.cache_size,
        "stacks": len(state.entries),
        "occupancy": state.occupancy(),
        "frames_histogram": {str(k): v for k, v in state.frame_histogram().items()},
        "wasted_bytes": state.wasted_bytes(),
        "advice": analysis.advice(state),
        "entries": [entry.as_dict() for entry in state.entries],
        "problems": [problem.as_dict() for problem in problems],
    }


def logger_document(logger, state, problems):
    return {
        "logger_id": logger.logger_id if logger else None,
        "name": logger.name if logger else None,
        "context": logger.context if logger else None,
        "cache": cache_document(state, problems),
    }


def summary(out, target, logger, state, problems, validated):
    out.line("%s" % logger_label(logger))
    if not state.readable:
        out.line("  stack cache %s: cannot be read" % _hex(state.address))
        _problems(out, problems, limit=None)
        return
    out.line("  stack cache %s  variant %s (%s confidence: %s)"
             % (target.format_address(state.address), state.variant, state.variant_confidence,
                state.variant_detail or "given with --variant"))
    out.line("  BucketCount %d (%s)  pieces: %d total = CacheSize 0x%x, %d free, %d in use"
             % (state.bucket_count, "prime" if layouts.is_prime(state.bucket_count) else "not prime",
                state.total_pieces, state.cache_size, len(state.free_pieces), state.used_pieces))
    out.line("  cached stacks: %d   bytes wasted in partly filled pieces: %d"
             % (len(state.entries), state.wasted_bytes()))
    occupancy = state.occupancy()
    out.table([[str(n), str(count)] for n, count in enumerate(occupancy)], ["stacks in bucket", "buckets"],
              title="  occupancy:")
    out.table([[label, str(count)] for label, count in analysis.frame_distribution(state) if count],
              ["frames", "stacks"], title="  frames per stack:")
    notes = analysis.advice(state)
    if notes:
        out.line("  advice:")
        for note in notes:
            out.line("    - %s" % note)
    if validated:
        _problems(out, problems, limit=None)
    elif problems:
        out.line("  %d problem(s) found while walking (run with --validate for the full check):" % len(problems))
        _problems(out, problems, limit=10)
    out.line()


def _problems(out, problems, limit):
    if not problems:
        out.line("  problems: none")
        return
    shown = problems if limit is None else problems[:limit]
    out.table([[p.kind, _hex(p.address), p.detail] for p in shown], ["problem", "address", "detail"])
    if len(shown) < len(problems):
        out.line("  ... %d more" % (len(problems) - len(shown)))


def _frames_command(entry):
    return "dps 0x%x L%d" % (entry.key + layouts.PIECE["Frames"], min(entry.frame_count, layouts.FRAMES_PER_PIECE))


def buckets(out, target, state, limit):
    """Each non-empty bucket's entries in MRU order (at most ``limit`` buckets)."""
    rows, links = [], {}
    shown = 0
    more = False
    for index, bucket in enumerate(state.buckets):
        if not bucket:
            continue
        if shown >= limit:
            more = True
            break
        shown += 1
        for entry in bucket:
            links[(len(rows), 2)] = _frames_command(entry)
            rows.append([str(index), str(entry.position), "0x%x" % entry.key, str(entry.refcount),
                         "0x%08x" % entry.hash, str(entry.frame_count),
                         target.symbolize(entry.frames[0]) if entry.frames else "-"])
    out.table(rows, ["bucket", "pos", "key", "refs", "hash", "frames", "top frame"], links=links,
              title="buckets (position 0 = most recently used):")
    if more:
        out.line("  (more non-empty buckets not shown: --limit %d)" % limit)


def stack(out, target, entry):
    out.line("StackKey 0x%x  bucket %d position %d  RefCount %d  hash 0x%08x  %d frames in %d piece(s)"
             % (entry.key, entry.bucket, entry.position, entry.refcount, entry.hash, entry.frame_count,
                len(entry.pieces)))
    for number, frame in enumerate(entry.frames):
        out.line("  %02x  %s  %s" % (number, target.format_address(frame), target.symbolize(frame)))


def simulation_document(stream, results, recommendation, notes):
    return {
        "source": stream.source,
        "events": len(stream),
        "distinct_stacks": len(stream.stacks),
        "notes": list(stream.notes) + list(notes),
        "points": [result.as_dict() for result in results],
        "recommendation": recommendation,
    }


def simulation(out, stream, results, recommendation, notes):
    out.line("simulated %d stack lookups (%d distinct stacks) from %s"
             % (len(stream), len(stream.stacks), stream.source))
    for note in list(stream.notes) + list(notes):
        out.line("  note: %s" % note)
    rows = []
    for r in results:
        rows.append([str(r.bucket_count) + ("" if layouts.is_prime(r.bucket_count) else " (not prime)"),
                     "0x%x" % r.cache_size, "%.2f%%" % (100 * r.hit_rate), str(r.evictions),
                     str(r.delete_definitions), str(r.starvation_fallbacks), str(r.peak_pieces),
                     str(r.cached_stacks)])
    out.table(rows, ["buckets", "CacheSize", "hit rate", "evictions", "delete defs", "starved",
                     "peak pieces", "cached"])
    if recommendation:
        out.line("recommendation: BucketCount %d, CacheSize 0x%x — %s"
                 % (recommendation["bucket_count"], recommendation["cache_size"], recommendation["reason"]))
