"""The public entry points: ``analyze`` the stack caches of a target (discover or
take the logger/cache, walk, validate, derive statistics and advice, look up a
StackKey) and ``simulate`` a stack stream over a sweep of configurations.  Their
results hold every derived fact and own their JSON (docs/json-schema/etwstacks.md)."""

from ..errors import BadInput, UnreadableMemory, WrongSignature
from ..problems import ProblemLog
from ..hexaddr import hexaddr
from . import discover, layouts, replay
from .validate import validate as validate_cache
from .walk import read_cache

SCHEMA_VERSION = 1
DEFAULT_BUCKET_COUNTS = (256, 257, 1021, 2039, 4093)
DEFAULT_CACHE_SIZES = (0x300000, 0x800000, 0x1000000)

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


class CacheReport(object):
    """One logger's cache: the walked state and what the analysis derived from it.
    ``logger`` is None for a cache given by address."""

    def __init__(self, logger, state):
        self.logger = logger
        self.state = state
        self.problems = ProblemLog(list(logger.problems) if logger else [])
        self.problems.extend(state.problems)
        self.problems.finish()
        self.advice = advice(state)
        self.frame_distribution = frame_distribution(state)
        self.frame_names = {}   # frame -> name, for the stacks a caller shows (name_frames)

    @property
    def label(self):
        if self.logger is None:
            return "cache given by address (logger unknown)"
        name = '"%s"' % self.logger.name if self.logger.name is not None else "(name unreadable)"
        return "logger %s %s, context %s" % (self.logger.logger_id, name, hexaddr(self.logger.context))

    def as_dict(self):
        state = self.state
        logger = self.logger
        return {
            "logger_id": logger.logger_id if logger else None,
            "name": logger.name if logger else None,
            "context": logger.context if logger else None,
            "cache": {
                "address": state.address,
                "variant": state.variant,
                "variant_confidence": state.variant_confidence,
                "variant_detail": state.variant_detail,
                "layout_source": state.layout.source if state.layout else None,
                "bucket_count": state.bucket_count,
                "bucket_count_prime": layouts.is_prime(state.bucket_count),
                "total_pieces": state.total_pieces,
                "free_pieces": len(state.free_pieces),
                "used_pieces": state.used_pieces,
                "cache_size": state.cache_size,
                "stacks": len(state.entries),
                "occupancy": state.occupancy(),
                "frames_histogram": dict((str(k), v) for k, v in state.frame_histogram().items()),
                "frame_distribution": [[label, count] for label, count in self.frame_distribution],
                "wasted_bytes": state.wasted_bytes(),
                "advice": list(self.advice),
                "entries": [entry.as_dict() for entry in state.entries],
                "problems": self.problems.as_list(),
            },
        }


def name_frames(target, report, entries, first_only=False):
    """Name the frames of ``entries`` (cached stacks a caller is about to show; with
    ``first_only`` just each one's top frame) in ``report.frame_names``."""
    for entry in entries:
        target.name_addresses(report.frame_names, entry.frames[:1] if first_only else entry.frames)
    return report


def shown_buckets(state, limit):
    """The first ``limit`` non-empty buckets of a cache ``state`` as (index,
    entries), and whether more non-empty ones follow."""
    shown = []
    for index, bucket in enumerate(state.buckets):
        if bucket:
            if len(shown) >= limit:
                return shown, True
            shown.append((index, bucket))
    return shown, False


class KeyLookup(object):
    """Where a StackKey is: the cached stack it names (``entry``, with its frames
    symbolized) or why it is not cached (``detail``)."""

    def __init__(self, key, report=None, entry=None, symbols=None, detail=None):
        self.key = key
        self.report = report
        self.entry = entry
        self.symbols = symbols or []
        self.detail = detail

    @property
    def found(self):
        return self.entry is not None

    def as_dict(self):
        document = {"schema_version": SCHEMA_VERSION, "key": self.key, "found": self.found,
                    "logger_id": None, "cache": None, "entry": None, "detail": self.detail}
        if self.found:
            logger = self.report.logger
            entry = dict(self.entry.as_dict(), symbols=list(self.symbols))
            document.update(logger_id=logger.logger_id if logger else None, cache=self.report.state.address,
                            entry=entry)
        return document


class StackCacheAnalysis(object):
    """Every cache analyzed (``caches``: CacheReport), the logger layouts used when
    loggers were discovered or given, the StackKey lookup when one was asked for,
    and every problem of every cache (``problems``)."""

    def __init__(self, caches, logger_layouts=None, key=None):
        self.caches = caches
        self.logger_layouts = logger_layouts
        self.key = key
        self.problems = ProblemLog()
        for report in caches:
            self.problems.extend(report.problems)
        self.problems.finish()

    def as_dict(self):
        return {"schema_version": SCHEMA_VERSION,
                "layout_sources": self.logger_layouts.sources if self.logger_layouts else None,
                "loggers": [report.as_dict() for report in self.caches],
                "problems": self.problems.as_list()}


def analyze(target, cache=None, logger_context=None, variant=None, validate=True, busy=False, key=None,
            force=False):
    """Analyze the ETW stack caches of ``target`` (an x64 kernel): the cache at
    ``cache``, the one of the logger context at ``logger_context``, or every
    logger's found through nt!EtwpHostSiloState.  ``variant`` forces the cache
    header layout ("A"/"B"); ``validate`` runs the full consistency check (with
    ``busy``, RefCount 2 is not flagged: the logger was logging); ``key`` looks a
    StackKey up.  A ``cache`` address that holds no cache is refused in one line
    (WrongSignature, or UnreadableMemory) unless ``force``; a discovered logger's
    cache that cannot be walked is a problem of that logger.  Returns a
    StackCacheAnalysis."""
    if target.arch not in ("x64", "arm64"):
        raise BadInput("ETW stack cache layouts are known for x64 and ARM64 kernels only (target is %s)" % target.arch)
    if variant is not None and variant not in layouts.CACHE_VARIANTS:
        raise BadInput("unknown variant %r (known: %s)" % (variant, ", ".join(sorted(layouts.CACHE_VARIANTS))))
    found_layouts = None
    if cache is not None and logger_context is None:
        targets = [(None, cache)]
    else:
        target.require_full_memory("finding the ETW loggers")
        found_layouts = discover.logger_layouts(target)
        if logger_context is not None:
            logger = discover.read_logger(target, logger_context, found_layouts)
            if logger.problems and logger.problems[0].kind == "unreadable" and cache is None:
                raise BadInput(logger.problems[0].message)
            address = cache if cache is not None else logger.stack_cache
            targets = [(logger, address)] if address else []
        else:
            targets = [(logger, logger.stack_cache)
                       for logger in discover.discover_loggers(target, found_layouts) if logger.stack_cache]
    caches = []
    for logger, address in targets:
        state = read_cache(target, address, variant=variant, logger_context=logger.context if logger else None,
                           logger_id=logger.logger_id if logger else None, force=force)
        if cache is not None and not state.readable and not force:
            _refuse(state)
        if validate:
            validate_cache(state, idle=not busy)
        state.problems.finish()
        caches.append(CacheReport(logger, state))
    return StackCacheAnalysis(caches, found_layouts, _look_up(target, caches, key) if key is not None else None)


def _refuse(state):
    """A cache address the caller gave that holds no cache: one line saying what is there."""
    problem = state.problems[0]
    if problem.kind == "unreadable":
        raise UnreadableMemory(problem.address, detail="no ETW stack cache header can be read at %s"
                               % hexaddr(state.address))
    raise WrongSignature("ETW stack cache", state.address, problem.message)


def _look_up(target, caches, key):
    for report in caches:
        entry = report.state.find(key)
        if entry is not None:
            return KeyLookup(key, report, entry, [target.symbolize(frame) for frame in entry.frames])
    if any(key in report.state.free_pieces for report in caches):
        return KeyLookup(key, detail="it is on the free list (evicted; look for its Delete Definition event)")
    return KeyLookup(key, detail="it is not the first piece of any cached stack")


class SimulationReport(object):
    """A sweep of simulated configurations over one stack stream, and the one
    recommended."""

    def __init__(self, stream, results, recommendation, notes):
        self.stream = stream
        self.results = results
        self.recommendation = recommendation
        self.notes = list(stream.notes) + list(notes)
        self.problems = ProblemLog(stream.problems).finish()

    def as_dict(self):
        return {"schema_version": SCHEMA_VERSION,
                "source": self.stream.source,
                "events": len(self.stream),
                "distinct_stacks": len(self.stream.stacks),
                "notes": list(self.notes),
                "points": [result.as_dict() for result in self.results],
                "recommendation": self.recommendation,
                "problems": self.problems.as_list()}


def simulate(stream, bucket_counts=DEFAULT_BUCKET_COUNTS, cache_sizes=DEFAULT_CACHE_SIZES, clamp=True):
    """Replay ``stream`` (a StackStream) through the kernel's cache algorithm for
    every (bucket count, cache size) point — clamped to Windows' ranges unless
    ``clamp`` is False — and recommend one: a SimulationReport."""
    if not len(stream):
        raise BadInput("the stack stream is empty (%s)" % "; ".join(
            stream.notes + [str(problem) for problem in stream.problems] or [stream.source]))
    if not bucket_counts or not cache_sizes:
        raise BadInput("give at least one bucket count and one cache size")
    if any(count <= 0 for count in bucket_counts):
        raise BadInput("bucket counts must be positive")
    if any(size < layouts.PIECE_SIZE for size in cache_sizes):
        raise BadInput("a cache size below one piece (0x%x bytes) holds nothing" % layouts.PIECE_SIZE)
    results, notes = replay.sweep(stream, bucket_counts, cache_sizes, clamp=clamp)
    return SimulationReport(stream, results, replay.recommend(results), notes)
