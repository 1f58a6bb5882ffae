"""Text views of analyzed caches, StackKey lookups and simulations (nothing is
computed here: the results carry it, frame names included; views never touch the
Target).  Addresses are WinDbg style."""

from ..render.text import hexaddr
from . import layouts
from .analysis import shown_buckets

PROBLEMS_SHOWN_WITHOUT_VALIDATE = 10


def layout_sources(out, logger_layouts):
    out.line("layouts: _WMI_LOGGER_CONTEXT from %s, _ETW_SILODRIVERSTATE from %s"
             % (logger_layouts.logger.source, logger_layouts.silo.source))


def summary(out, report, validated):
    state = report.state
    out.line(report.label)
    if not state.readable:
        out.line("  stack cache %s: cannot be read" % hexaddr(state.address))
        _problems(out, report.problems, limit=None)
        return
    out.line("  stack cache %s  variant %s (%s confidence: %s; %s)"
             % (hexaddr(state.address), state.variant, state.variant_confidence,
                state.variant_detail or "given with --variant", state.layout.source))
    out.line("  BucketCount %d (%s)  pieces: %d total = CacheSize 0x%x, %d free, %d in use"
             % (state.bucket_count, "prime" if layouts.is_prime(state.bucket_count) else "not prime",
                state.total_pieces, state.cache_size, len(state.free_pieces), state.used_pieces))
    out.line("  cached stacks: %d   bytes wasted in partly filled pieces: %d"
             % (len(state.entries), state.wasted_bytes()))
    out.table([[str(n), str(count)] for n, count in enumerate(state.occupancy())], ["stacks in bucket", "buckets"],
              title="  occupancy:")
    out.table([[label, str(count)] for label, count in report.frame_distribution if count],
              ["frames", "stacks"], title="  frames per stack:")
    if report.advice:
        out.line("  advice:")
        for note in report.advice:
            out.line("    - %s" % note)
    if validated:
        _problems(out, report.problems, limit=None)
    elif report.problems:
        out.line("  %d problem(s) found while walking (run with --validate for the full check):"
                 % len(report.problems))
        _problems(out, report.problems, limit=PROBLEMS_SHOWN_WITHOUT_VALIDATE)
    out.line()


def _problems(out, problems, limit):
    if not problems:
        out.line("  problems: none")
        return
    shown = problems if limit is None else problems[:limit]
    out.table([[p.severity, p.kind, hexaddr(p.address), p.message] for p in shown],
              ["severity", "problem", "address", "message"])
    if len(shown) < len(problems):
        out.line("  ... %d more" % (len(problems) - len(shown)))


def frames_command(entry):
    """``dps`` over the frames in the entry's first piece (L counts are hex)."""
    return "dps %s L0x%x" % (hexaddr(entry.key + layouts.FRAMES_OFFSET),
                             min(entry.frame_count, layouts.FRAMES_PER_PIECE))


def buckets(out, report, limit):
    """Each non-empty bucket's entries in MRU order (at most ``limit`` buckets)."""
    rows, links = [], {}
    shown, more = shown_buckets(report.state, limit)
    for index, bucket in shown:
        for entry in bucket:
            links[(len(rows), 2)] = frames_command(entry)
            rows.append([str(index), str(entry.position), hexaddr(entry.key), str(entry.refcount),
                         "0x%08x" % entry.hash, str(entry.frame_count),
                         report.frame_names.get(entry.frames[0], "?") if entry.frames else "-"])
    out.table(rows, ["bucket", "pos", "key", "refs", "hash", "frames", "top frame"], links=links,
              title="buckets (position 0 = most recently used):")
    if more:
        out.line("  (more non-empty buckets not shown: --limit 0n%d)" % limit)


def stack(out, entry, names):
    """One cached stack; ``names``: {frame: name} (a report's ``frame_names``)."""
    out.line("StackKey %s  bucket %d position %d  RefCount %d  hash 0x%08x  %d frames in %d piece(s)"
             % (hexaddr(entry.key), entry.bucket, entry.position, entry.refcount, entry.hash, entry.frame_count,
                len(entry.pieces)))
    for number, frame in enumerate(entry.frames):
        out.line("  %02x  %s  %s" % (number, hexaddr(frame), names.get(frame, "?")))


def key_lookup(out, lookup):
    if not lookup.found:
        out.line("StackKey %s is not cached: %s" % (hexaddr(lookup.key), lookup.detail))
        return
    out.line(lookup.report.label)
    stack(out, lookup.entry, dict(zip(lookup.entry.frames, lookup.symbols)))


def simulation(out, report):
    stream = report.stream
    out.line("simulated %d stack lookups (%d distinct stacks) from %s"
             % (len(stream), len(stream.stacks), stream.source))
    for note in report.notes:
        out.line("  note: %s" % note)
    for problem in report.problems:
        out.line("  %s" % problem)
    rows = []
    for r in report.results:
        rows.append([str(r.bucket_count) + ("" if layouts.is_prime(r.bucket_count) else " (not prime)"),
                     "0x%x" % r.cache_size, "%.2f%%" % (100 * r.hit_rate), str(r.evictions),
                     str(r.delete_definitions), str(r.starvation_fallbacks), str(r.peak_pieces),
                     str(r.cached_stacks)])
    out.table(rows, ["buckets", "CacheSize", "hit rate", "evictions", "delete defs", "starved",
                     "peak pieces", "cached"])
    recommendation = report.recommendation
    if recommendation:
        out.line("recommendation: BucketCount %d, CacheSize 0x%x — %s"
                 % (recommendation["bucket_count"], recommendation["cache_size"], recommendation["reason"]))
