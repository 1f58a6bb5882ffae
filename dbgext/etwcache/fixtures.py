"""Build ETW stack caches, logger contexts and the silo state in a Scenario.

The builder keeps the cache as the kernel does — LIST_ENTRY bucket lists, a LIFO
free list of preallocated pieces, piece chains — and applies the kernel's
insert/evict/MRU steps to those links (independently of ``simulate``, so tests can
hold the simulator against it).  ``finish()`` writes the header, the buckets, every
piece and the x64 SLIST into the scenario's memory.

Pieces are 0x128 bytes, but free pieces are SLIST entries, which must be 16-byte
aligned on x64, so the builder places them at a 0x130 stride.
"""

import struct

from . import layouts
from ..stackhash import stack_trace_hash_frames
from .layouts import PIECE_STRIDE
LOGGER_CONTEXT_SIZE = 0x550
SILO_STATE_SIZE = 0x1000
SAMPLE_LOGGER_ID = 0x11


class _Piece(object):
    __slots__ = ("address", "next", "refcount", "hash", "frame_count", "frames")

    def __init__(self, address):
        self.address = address
        self.next = 0
        self.refcount = 0
        self.hash = 0
        self.frame_count = 0
        self.frames = ()


class StackCacheBuilder(object):
    """A stack cache in a Scenario, fed stack by stack with :meth:`reference`."""

    def __init__(self, scenario, bucket_count=257, total_pieces=1024, variant="B",
                 logger_id=SAMPLE_LOGGER_ID, logger_context=0):
        if variant not in layouts.CACHE_VARIANTS:
            raise ValueError("unknown variant %r" % variant)
        self.scenario = scenario
        self.variant = variant
        self.layout = layouts.CACHE_VARIANTS[variant]
        self.bucket_count = bucket_count
        self.logger_id = logger_id
        self.logger_context = logger_context
        self.address = scenario.alloc(layouts.HEADER_SIZE + bucket_count * layouts.BUCKET_SIZE, align=16)
        self.pieces_base = scenario.alloc(max(total_pieces, 1) * PIECE_STRIDE, align=16)
        self.pieces = {}
        self.free = []  # the SLIST, top = last
        for index in range(total_pieces):
            piece = _Piece(self.pieces_base + index * PIECE_STRIDE)
            self.pieces[piece.address] = piece
            self.free.append(piece.address)
        # LIST_ENTRY links of bucket heads and first pieces: address -> [Flink, Blink]
        self.links = {}
        for index in range(bucket_count):
            head = self.bucket_head(index)
            self.links[head] = [head, head]
        self.slist_sequence = 0
        self.lookups = self.hits = self.evictions = self.starvation_fallbacks = 0

    def bucket_head(self, index):
        return self.address + self.layout.offset("Buckets") + index * layouts.BUCKET_SIZE

    # -- LIST_ENTRY primitives ------------------------------------------------------

    def _remove(self, entry):
        flink, blink = self.links[entry]
        self.links[blink][0] = flink
        self.links[flink][1] = blink

    def _insert_head(self, head, entry):
        first = self.links[head][0]
        self.links[entry] = [first, head]
        self.links[first][1] = entry
        self.links[head][0] = entry

    def _insert_tail(self, head, entry):
        last = self.links[head][1]
        self.links[entry] = [head, last]
        self.links[last][0] = entry
        self.links[head][1] = entry

    def bucket_entries(self, index):
        head = self.bucket_head(index)
        entries = []
        entry = self.links[head][0]
        while entry != head:
            entries.append(entry)
            entry = self.links[entry][0]
        return entries

    def stack_frames(self, key):
        frames = []
        address = key
        while address:
            frames.extend(self.pieces[address].frames)
            address = self.pieces[address].next
        return tuple(frames)

    # -- the algorithm ----------------------------------------------------------------

    def reference(self, frames):
        """One stack-walk event for ``frames``; returns the StackKey or None when
        the cache was starved."""
        frames = tuple(frames)
        if not frames:
            return None
        self.lookups += 1
        frame_hash = stack_trace_hash_frames(frames)
        head = self.bucket_head(frame_hash % self.bucket_count)
        entries = self.bucket_entries(frame_hash % self.bucket_count)
        for key in entries:
            first = self.pieces[key]
            if first.hash == frame_hash and first.frame_count == len(frames) \
                    and self.stack_frames(key) == frames:
                self.hits += 1
                self._remove(key)
                self._insert_head(head, key)
                return key
        evicted = None
        if len(entries) >= layouts.MAX_BUCKET_ENTRIES:
            evicted = self.links[head][1]
            self._remove(evicted)
            del self.links[evicted]
        popped = []
        for _ in range(layouts.pieces_for(len(frames))):
            if not self.free:
                break
            popped.append(self.free.pop())
        key = None
        if len(popped) < layouts.pieces_for(len(frames)):
            self.starvation_fallbacks += 1
            while popped:
                self.free.append(popped.pop())
        else:
            key = popped[0]
            for index, address in enumerate(popped):
                piece = self.pieces[address]
                chunk = frames[index * layouts.FRAMES_PER_PIECE:(index + 1) * layouts.FRAMES_PER_PIECE]
                piece.frames = chunk
                piece.frame_count = len(frames) if index == 0 else len(chunk)
                piece.hash = frame_hash if index == 0 else 0
                piece.next = popped[index + 1] if index + 1 < len(popped) else 0
                piece.refcount = 1 if index == 0 else 0
            self._insert_tail(head, key)
        if evicted is not None:
            self.evictions += 1
            self._free_chain(evicted)
        return key

    def _free_chain(self, key):
        self.pieces[key].refcount = 0
        address = key
        while address:
            self.free.append(address)
            self.slist_sequence += 1
            address = self.pieces[address].next

    def feed(self, stacks):
        for frames in stacks:
            self.reference(frames)
        return self

    # -- memory -------------------------------------------------------------------------

    def used_pieces(self):
        return len(self.pieces) - len(self.free)

    def finish(self):
        """Write the cache into the scenario; returns the cache address."""
        scenario = self.scenario
        layout = self.layout
        header = bytearray(layouts.HEADER_SIZE + self.bucket_count * layouts.BUCKET_SIZE)
        if layout.has("LoggerId"):
            struct.pack_into("<I", header, layout.offset("LoggerId"), self.logger_id)
        else:
            struct.pack_into("<Q", header, layout.offset("LoggerContext"), self.logger_context)
        struct.pack_into("<I", header, layout.offset("BucketCount"), self.bucket_count)
        top = self.free[-1] if self.free else 0
        depth = len(self.free) & layouts.SLIST_DEPTH_MASK
        struct.pack_into("<QQ", header, layout.offset("FreeList"),
                         depth | ((self.slist_sequence & 0xFFFFFFFFFFFF) << 16), top)
        for index in range(self.bucket_count):
            head = self.bucket_head(index)
            struct.pack_into("<QQQ", header, head - self.address, self.links[head][0], self.links[head][1], 0)
        scenario.write(self.address, header)

        region = bytearray(len(self.pieces) * PIECE_STRIDE)
        free_next = {}
        for below, above in zip(self.free, self.free[1:]):
            free_next[above] = below
        if self.free:
            free_next[self.free[0]] = 0
        for address, piece in self.pieces.items():
            offset = address - self.pieces_base
            if address in free_next:
                flink, blink = free_next[address], 0
            elif address in self.links:
                flink, blink = self.links[address]
            else:
                flink = blink = 0
            struct.pack_into("<QQQiII", region, offset, flink, blink, piece.next, piece.refcount,
                             piece.hash, piece.frame_count)
            if piece.frames:
                struct.pack_into("<%dQ" % len(piece.frames), region, offset + layouts.FRAMES_OFFSET,
                                 *piece.frames)
        scenario.write(self.pieces_base, region)
        return self.address


# -- logger contexts and the silo state ----------------------------------------------------


def _ensure_nt(scenario):
    try:
        return scenario.module("nt")
    except KeyError:
        return scenario.add_module("nt", 0xFFFFF80000000000, 0x200000, image="ntoskrnl.exe")


def _profile(scenario):
    """{"logger": {field: offset}, "silo": {field: offset}} of the built-in layouts for
    the scenario's build (the newest ones when the build has none)."""
    offsets = {}
    for key, type_name in (("logger", "_WMI_LOGGER_CONTEXT"), ("silo", "_ETW_SILODRIVERSTATE")):
        row = layouts.BUILTIN.find(type_name, "x64", scenario.build) or layouts.BUILTIN.table[type_name][-1]
        offsets[key] = dict((field, offset) for field, (offset, _) in row["fields"].items())
    return offsets


def _extend_type(scenario, type_name, size, fields):
    """Add ``fields`` to ``nt!type_name`` in the scenario's types, keeping fields
    other builders declared."""
    existing = scenario.module_symbols["nt"].types.get(type_name)
    merged = {}
    if existing:
        for name, field in existing["fields"].items():
            subtype = field.get("type", {})
            merged[name] = (field["offset"], subtype["name"]) if subtype.get("kind") == "struct" \
                else field["offset"]
        size = max(size, existing["size"])
    merged.update(fields)
    scenario.add_type("nt", type_name, size, merged)


def ensure_silo_state(scenario, with_types=True):
    """``nt!EtwpHostSiloState`` -> _ETW_SILODRIVERSTATE with a 64-slot logger context
    array (unused slots hold 1); reuses the one already in the scenario."""
    nt = _ensure_nt(scenario)
    offsets = _profile(scenario)["silo"]
    existing = scenario.module_symbols["nt"].symbols.get("EtwpHostSiloState")
    if existing is not None:
        silo = struct.unpack("<Q", scenario.read(nt.base + existing, 8))[0]
        return silo
    cell = scenario.alloc(8, align=8)
    silo = scenario.alloc(SILO_STATE_SIZE, align=16)
    array = scenario.alloc(layouts.MAX_LOGGERS * 8, align=16)
    scenario.write(array, struct.pack("<%dQ" % layouts.MAX_LOGGERS, *([1] * layouts.MAX_LOGGERS)))
    scenario.pack(silo + offsets["MaxLoggers"], "<I", layouts.MAX_LOGGERS)
    scenario.pack(silo + offsets["EtwpLoggerContext"], "<Q", array)
    scenario.pack(cell, "<Q", silo)
    # Like PsLoadedModuleList in the core scenario: the global is a separate
    # allocation and the symbol names it.
    scenario.add_symbol("nt", "EtwpHostSiloState", cell - nt.base)
    if with_types:
        _extend_type(scenario, "_ETW_SILODRIVERSTATE", SILO_STATE_SIZE, dict(offsets))
    return silo


def add_logger_context(scenario, logger_id, name, stack_cache=0, with_types=True):
    """A _WMI_LOGGER_CONTEXT registered in the silo's logger array; returns its address."""
    offsets = _profile(scenario)
    silo = ensure_silo_state(scenario, with_types)
    context = scenario.alloc(LOGGER_CONTEXT_SIZE, align=16)
    logger = offsets["logger"]
    scenario.pack(context + logger["LoggerId"], "<I", logger_id)
    encoded = name.encode("utf-16-le")
    buffer = scenario.alloc(len(encoded) + 2, align=8)
    scenario.write(buffer, encoded + b"\0\0")
    scenario.pack(context + logger["LoggerName"], "<HHxxxxQ", len(encoded), len(encoded) + 2, buffer)
    scenario.pack(context + logger["StackCache"], "<Q", stack_cache)
    array = struct.unpack("<Q", scenario.read(silo + offsets["silo"]["EtwpLoggerContext"], 8))[0]
    scenario.pack(array + 8 * logger_id, "<Q", context)
    if with_types:
        _extend_type(scenario, "_WMI_LOGGER_CONTEXT", LOGGER_CONTEXT_SIZE, {
            "LoggerId": logger["LoggerId"],
            "LoggerName": (logger["LoggerName"], "_UNICODE_STRING"),
            "StackCache": logger["StackCache"],
        })
    return context


def set_stack_cache(scenario, context, cache):
    scenario.pack(context + _profile(scenario)["logger"]["StackCache"], "<Q", cache)


def add_logger_with_cache(scenario, stacks, logger_id=SAMPLE_LOGGER_ID, name="dbgext sample logger",
                          bucket_count=257, total_pieces=1024, variant="B", with_types=True):
    """Logger context + a cache fed with ``stacks``; returns (context, builder)."""
    context = add_logger_context(scenario, logger_id, name, with_types=with_types)
    builder = StackCacheBuilder(scenario, bucket_count, total_pieces, variant, logger_id, context)
    builder.feed(stacks)
    set_stack_cache(scenario, context, builder.finish())
    return context, builder


def sample_stacks(modules, count=600, seed=4):
    """A deterministic, skewed stream of kernel stacks whose frames lie in ``modules``
    (a few hot stacks, a long tail, depths from 3 to 70 frames)."""
    import random
    rng = random.Random(seed)
    modules = [m for m in modules if m.base >= layouts.KERNEL_SPACE_START] or list(modules)
    distinct = []
    for _ in range(max(count // 4, 1)):
        depth = rng.choice([3, 5, 8, 12, 17, 24, 33, 40, 70])
        frames = []
        for _ in range(depth):
            module = rng.choice(modules)
            frames.append(module.base + 0x1000 + rng.randrange(0, max(module.size - 0x1000, 0x10)) // 4 * 4)
        distinct.append(frames)
    stream = []
    for _ in range(count):
        index = min(int(rng.paretovariate(1.2)) - 1, len(distinct) - 1)
        stream.append(distinct[index] if rng.random() < 0.7 else rng.choice(distinct))
    return stream


def add_sample_logger(scenario):
    """Add a logger with a populated variant-B stack cache to a kernel-mode Scenario
    (the bundled sample dump).  Coexists with other builders: only allocates through
    the scenario and extends an existing silo state and types."""
    if scenario.mode != "kernel" or scenario.arch != "x64":
        raise ValueError("the ETW stack cache sample needs an x64 kernel scenario")
    _ensure_nt(scenario)
    stacks = sample_stacks(scenario.modules)
    used_ids = set()
    silo = ensure_silo_state(scenario)
    array = struct.unpack("<Q", scenario.read(silo + _profile(scenario)["silo"]["EtwpLoggerContext"], 8))[0]
    for slot in range(layouts.MAX_LOGGERS):
        if struct.unpack("<Q", scenario.read(array + 8 * slot, 8))[0] >= layouts.KERNEL_SPACE_START:
            used_ids.add(slot)
    logger_id = next(i for i in range(SAMPLE_LOGGER_ID, layouts.MAX_LOGGERS) if i not in used_ids)
    context, builder = add_logger_with_cache(scenario, stacks, logger_id=logger_id,
                                             name="dbgext sample logger", bucket_count=257,
                                             total_pieces=160)
    return {"logger_id": logger_id, "logger_context": context, "cache": builder.address,
            "bucket_count": builder.bucket_count, "total_pieces": len(builder.pieces),
            "stacks": sum(len(builder.bucket_entries(i)) for i in range(builder.bucket_count)),
            "keys": [k for i in range(builder.bucket_count) for k in builder.bucket_entries(i)]}
