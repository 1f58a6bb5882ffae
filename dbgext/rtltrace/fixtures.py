"""Build RTL_TRACE_DATABASEs the way Windows does, inside a Scenario.

:class:`TraceDatabaseBuilder` follows ``RtlTraceDatabaseCreate`` /
``RtlTraceDatabaseAdd`` / ``RtlTraceDatabaseFind`` as recorded in the reference:
one first allocation holding the database header, the first segment header, the
bucket array and the first blocks; new segments of the layout's granularity carved
front to back and prepended to SegmentList; new blocks pushed at the head of their
bucket; every lookup counted in HashCounter[hash & 0xF], every new trace also in
HashCounter[bucket / (NoOfBuckets >> 4)] — which for the last few buckets is one
past the array, i.e. the first segment's Magic.

The builder keeps each allocation as a bytearray and edits it in place (no
per-field Scenario writes, no chain searches: lookups go through a dict, which
gives the same answer as Windows' chain search), so 100,000 traces build in
seconds; :meth:`TraceDatabaseBuilder.sync` copies the allocations into the
Scenario's memory.

:class:`StackSource` makes realistic call stacks whose frames are return addresses
inside named functions of the scenario's modules.
"""

import random
import struct

from ..stackhash import stack_trace_hash
from .layouts import (BLOCK_MAGIC, DATABASE_MAGIC, MAX_BUCKETS, MAX_FRAMES, MIN_BUCKETS,
                      SEGMENT_MAGIC, layout_named)

DEFAULT_HASH_SYMBOL = "RtlStackTraceHashFunction"

DEBUG_HEAP_BUCKETS = 6263


class _Region(object):
    """One allocation of the database (the first one or a later segment)."""

    __slots__ = ("address", "data")

    def __init__(self, address, size):
        self.address = address
        self.data = bytearray(size)


class TraceDatabaseBuilder(object):
    """A trace database being built in ``scenario`` memory with layout ``layout``
    ("user-x64", "kernel-x64", "user-x86").

    ``hash_function``: None for the default RtlStackTraceHashFunction, or a Python
    callable ``(frames) -> int`` standing for a caller-supplied function placed at
    ``hash_function_address``.
    """

    def __init__(self, scenario, layout="user-x64", buckets=DEBUG_HEAP_BUCKETS, maximum_size=0,
                 flags=0, tag=0, hash_function=None, hash_function_address=None):
        self.layout = layout_named(layout, "built by TraceDatabaseBuilder")
        if (scenario.arch, scenario.mode) != (self.layout.arch, self.layout.mode):
            raise ValueError("layout %s needs a %s %s-mode scenario, not %s %s-mode"
                             % (layout, self.layout.arch, self.layout.mode, scenario.arch, scenario.mode))
        if buckets > MAX_BUCKETS:
            raise ValueError("RtlTraceDatabaseCreate refuses more than 0x%x buckets" % MAX_BUCKETS)
        if buckets < MIN_BUCKETS:
            raise ValueError("fewer than %d buckets divides by zero in HashCounter bookkeeping" % MIN_BUCKETS)
        self.scenario = scenario
        self.buckets = buckets
        self.maximum_size = maximum_size
        self._pointer_char = "Q" if self.layout.pointer_size == 8 else "I"
        self._pointer = struct.Struct("<" + self._pointer_char)
        self._hash = hash_function
        self.hash_function_address = (hash_function_address if hash_function_address is not None
                                      else self._default_hash_address())
        granularity = self.layout.segment_granularity
        database_size = self.layout.database.size
        segment_size = self.layout.segment.size
        self._bucket_array_offset = database_size + segment_size
        needed = self._bucket_array_offset + buckets * self.layout.pointer_size
        first_size = max(granularity, (needed + granularity - 1) // granularity * granularity)
        first = _Region(scenario.alloc_pages(first_size), first_size)
        self.address = first.address
        self.regions = [first]
        self.buckets_address = first.address + self._bucket_array_offset
        self.segments = [first.address + database_size]  # newest first, like SegmentList
        self.current_size = granularity
        self.traces = 0
        self.hits = 0
        self._blocks = {}  # frames tuple -> (region, offset of the block)
        self._heads = {}   # bucket -> first block address
        self._free = first.address + needed  # SegmentFree of the head segment
        self._db_field("Magic", DATABASE_MAGIC)
        self._db_field("Flags", flags | self.layout.create_flag)
        self._db_field("Tag", tag)
        self._db_field("SegmentList", self.segments[0])
        self._db_field("MaximumSize", maximum_size)
        self._db_field("CurrentSize", self.current_size)
        self._db_field("NoOfBuckets", buckets)
        self._db_field("Buckets", self.buckets_address)
        self._db_field("HashFunction", self.hash_function_address)
        self._write_segment_header(first, database_size, next_segment=0, start=first.address,
                                   free=self._free)

    # -- the Rtl operations -------------------------------------------------------

    def add(self, frames):
        """RtlTraceDatabaseAdd: the block's address, or None when Windows would fail
        (too many frames, or MaximumSize reached when a new segment is needed)."""
        frames = tuple(frames)
        if not frames or len(frames) > MAX_FRAMES:
            return None
        full_hash, bucket = self._place(frames)
        self._count_lookup(full_hash)
        existing = self._blocks.get(frames)
        if existing is not None:
            region, offset = existing
            count_offset = offset + self.layout.block.offsets["Count"]
            count = struct.unpack_from("<I", region.data, count_offset)[0]
            struct.pack_into("<I", region.data, count_offset, (count + 1) & 0xFFFFFFFF)
            self.hits += 1
            self._db_field("NoOfHits", self.hits)
            return region.address + offset
        block_size = self.layout.block.size + len(frames) * self.layout.pointer_size
        region = self._room_for(block_size)
        if region is None:
            return None
        block = self._free
        offset = block - region.address
        self._free += block_size
        self._set_segment_free()
        self._write_block(region, offset, frames, next_block=self._heads.get(bucket, 0))
        self._heads[bucket] = block
        self._pointer.pack_into(self.regions[0].data,
                                self._bucket_array_offset + bucket * self.layout.pointer_size, block)
        self._blocks[frames] = (region, offset)
        self.traces += 1
        self._db_field("NoOfTraces", self.traces)
        self._bump_counter(bucket // (self.buckets >> 4))
        return block

    def find(self, frames):
        """RtlTraceDatabaseFind: the block's address or None; counted as a lookup."""
        frames = tuple(frames)
        if not frames or len(frames) > MAX_FRAMES:
            return None
        full_hash, _ = self._place(frames)
        self._count_lookup(full_hash)
        existing = self._blocks.get(frames)
        return existing[0].address + existing[1] if existing else None

    def sync(self):
        """Copy the database's allocations into the scenario's memory; returns the
        database address."""
        for region in self.regions:
            self.scenario.write(region.address, region.data)
        return self.address

    # -- facts for tests ----------------------------------------------------------

    def bucket_of(self, frames):
        return self._place(tuple(frames))[1]

    def block_count(self, frames):
        region, offset = self._blocks[tuple(frames)]
        return struct.unpack_from("<I", region.data, offset + self.layout.block.offsets["Count"])[0]

    def bucket_chain(self, bucket):
        """Block addresses of one bucket, head first (newest first)."""
        chain = []
        address = self._heads.get(bucket, 0)
        next_offset = self.layout.block.offsets["Next"]
        while address:
            chain.append(address)
            region, offset = self._locate(address)
            address = self._pointer.unpack_from(region.data, offset + next_offset)[0]
        return chain

    @property
    def first_segment_magic(self):
        return struct.unpack_from("<I", self.regions[0].data, self.layout.first_segment_offset)[0]

    @property
    def hash_counter(self):
        return list(struct.unpack_from("<16I", self.regions[0].data, self.layout.hash_counter_offset))

    def frames_of(self, block):
        region, offset = self._locate(block)
        size = struct.unpack_from("<I", region.data, offset + self.layout.block.offsets["Size"])[0]
        return list(struct.unpack_from("<%d%s" % (size, self._pointer_char), region.data,
                                       offset + self.layout.block.size))

    # -- internals ----------------------------------------------------------------

    def _default_hash_address(self):
        module_name = self.layout.module
        try:
            self.scenario.module(module_name)
        except KeyError:
            raise ValueError("the scenario has no %s module for %s; pass hash_function_address"
                             % (module_name, DEFAULT_HASH_SYMBOL))
        address = ensure_symbol(self.scenario, module_name, DEFAULT_HASH_SYMBOL)
        if address is None:
            raise ValueError("no room in %s for %s; pass hash_function_address" % (module_name, DEFAULT_HASH_SYMBOL))
        return address

    def _place(self, frames):
        if self._hash is None:
            packed = struct.pack("<%d%s" % (len(frames), self._pointer_char), *frames)
            full_hash = stack_trace_hash(packed)
        else:
            full_hash = self._hash(frames) & 0xFFFFFFFF
        return full_hash, full_hash % self.buckets

    def _count_lookup(self, full_hash):
        self._bump_counter(full_hash & 0xF)

    def _bump_counter(self, slot):
        # Slot 16 (and, for tiny bucket counts, beyond) lands after the array: on the
        # first segment header, exactly as Windows' unchecked increment does.
        offset = self.layout.hash_counter_offset + 4 * slot
        data = self.regions[0].data
        value = struct.unpack_from("<I", data, offset)[0]
        struct.pack_into("<I", data, offset, (value + 1) & 0xFFFFFFFF)

    def _db_field(self, name, value):
        database = self.layout.database
        struct.pack_into(database.layout.format(name), self.regions[0].data, database.offsets[name], value)

    def _write_segment_header(self, region, offset, next_segment, start, free):
        fields = self.layout.segment.offsets
        data = region.data
        granularity = self.layout.segment_granularity
        struct.pack_into("<I", data, offset + fields["Magic"], SEGMENT_MAGIC)
        self._pointer.pack_into(data, offset + fields["Database"], self.address)
        self._pointer.pack_into(data, offset + fields["NextSegment"], next_segment)
        self._pointer.pack_into(data, offset + fields["TotalSize"], granularity)
        self._pointer.pack_into(data, offset + fields["SegmentStart"], start)
        self._pointer.pack_into(data, offset + fields["SegmentEnd"], start + granularity)
        self._pointer.pack_into(data, offset + fields["SegmentFree"], free)

    def _set_segment_free(self):
        head = self.regions[-1]
        header = self.segments[0] - head.address
        self._pointer.pack_into(head.data, header + self.layout.segment.offsets["SegmentFree"], self._free)

    def _head_segment_end(self):
        head = self.regions[-1]
        header = self.segments[0] - head.address
        start = self._pointer.unpack_from(head.data, header + self.layout.segment.offsets["SegmentStart"])[0]
        return start + self.layout.segment_granularity

    def _room_for(self, size):
        """The region the next ``size`` bytes are carved from, adding a segment
        when the head segment is full; None when MaximumSize forbids growing."""
        if self._free + size <= self._head_segment_end():
            return self.regions[-1]
        if self.maximum_size and self.current_size > self.maximum_size:
            return None
        granularity = self.layout.segment_granularity
        if size + self.layout.segment.size > granularity:
            return None
        region = _Region(self.scenario.alloc_pages(granularity), granularity)
        self.regions.append(region)
        self._free = region.address + self.layout.segment.size
        self._write_segment_header(region, 0, next_segment=self.segments[0], start=region.address,
                                   free=self._free)
        self.segments.insert(0, region.address)
        self.current_size += granularity
        self._db_field("SegmentList", region.address)
        self._db_field("CurrentSize", self.current_size)
        return region

    def _write_block(self, region, offset, frames, next_block):
        fields = self.layout.block.offsets
        data = region.data
        block = region.address + offset
        struct.pack_into("<III", data, offset, BLOCK_MAGIC, 1, len(frames))
        self._pointer.pack_into(data, offset + fields["Next"], next_block)
        self._pointer.pack_into(data, offset + fields["Trace"], block + self.layout.block.size)
        struct.pack_into("<%d%s" % (len(frames), self._pointer_char), data,
                         offset + self.layout.block.size, *frames)

    def _locate(self, address):
        for region in self.regions:
            if region.address <= address < region.address + len(region.data):
                return region, address - region.address
        raise KeyError("0x%x is not in the database" % address)


# -- realistic stacks ----------------------------------------------------------------

# Allocator entry points first: a module's first four functions are the innermost
# frames when it is the allocating module.
_FUNCTION_NAMES = {
    "ntdll": ["RtlAllocateHeap", "RtlpAllocateHeapInternal", "RtlDebugAllocateHeap",
              "RtlpAllocateHeap", "RtlpCallVectoredHandlers", "LdrpInitializeProcess",
              "RtlpStackTraceDatabaseLogPrefix"],
    "kernel32": ["HeapAlloc", "LocalAlloc", "CreateFileW", "GlobalAlloc"],
    "kernelbase": ["LocalAlloc", "CreateFileW", "ReadFile", "WaitForSingleObjectEx"],
    "nt": ["ExAllocatePool2", "ExAllocatePoolWithTag", "ExpAllocatePoolWithTagFromNode",
           "ExAllocatePool3", "IofCallDriver", "IopSynchronousServiceTail", "NtDeviceIoControlFile",
           "KiSystemServiceCopyEnd", "IopXxxControlFile", "ObpCreateHandle"],
}
_GENERIC_VERBS = ["Create", "Open", "Read", "Write", "Queue", "Complete", "Dispatch", "Parse",
                  "Allocate", "Initialize", "Process", "Handle", "Update", "Query", "Flush"]
_GENERIC_NOUNS = ["Request", "Buffer", "Context", "Device", "Packet", "Record", "Entry",
                  "Object", "Table", "Session", "Stream", "Irp", "Work", "Timer"]

_FUNCTION_SPACING = 0x400

# Outermost frames of every thread, per mode: (module, function).
_THREAD_START = {
    "user": [("kernel32", "BaseThreadInitThunk"), ("ntdll", "RtlUserThreadStart")],
    "kernel": [("nt", "PspSystemThreadStartup"), ("nt", "KiStartSystemThread")],
}


def ensure_symbol(scenario, module_name, name):
    """Address of ``module!name``, adding the symbol after the module's last one
    when missing; None when the module has no room left."""
    module = scenario.module(module_name)
    symbols = scenario.module_symbols[module_name].symbols
    if name not in symbols:
        rva = max([0x1000] + [value + _FUNCTION_SPACING for value in symbols.values() if value < module.size])
        if rva + _FUNCTION_SPACING > module.size:
            return None
        scenario.add_symbol(module_name, name, rva)
    return module.base + symbols[name]


class StackSource(object):
    """Call stacks (innermost frame first) made of return addresses inside the named
    functions of ``modules`` (debugger module names present in ``scenario``).

    Functions the modules lack are added to the scenario with ``add_symbol``; the
    first module is the allocator (innermost frame), the others supply callers,
    and every stack ends in the mode's thread start routines when the scenario has
    the modules that hold them."""

    def __init__(self, scenario, modules, seed=1, functions_per_module=24):
        self.scenario = scenario
        self.random = random.Random(seed)
        self.functions = {name: self._functions(name, functions_per_module) for name in modules}
        self.allocator = modules[0]
        self.callers = list(modules[1:]) or [modules[0]]
        present = set(m.name for m in scenario.modules)
        outer = [ensure_symbol(scenario, module, name) for module, name in _THREAD_START[scenario.mode]
                 if module in present]
        self.outer = [address for address in outer if address is not None]

    def _functions(self, module_name, count):
        wanted = list(_FUNCTION_NAMES.get(module_name, []))
        rng = random.Random(module_name)
        while len(wanted) < count:
            name = rng.choice(_GENERIC_VERBS) + rng.choice(_GENERIC_NOUNS)
            if name not in wanted:
                wanted.append(name)
        functions = [ensure_symbol(self.scenario, module_name, name) for name in wanted]
        return [address for address in functions if address is not None]

    def _return_address(self, function):
        return function + 0x10 + 4 * self.random.randrange(0xF0)

    def stack(self, min_depth=4, max_depth=24):
        """One stack: an allocator frame, a random caller chain, the thread start."""
        depth = self.random.randint(min_depth, max_depth)
        frames = [self._return_address(self.random.choice(self.functions[self.allocator][:4]))]
        for _ in range(max(0, depth - 1 - len(self.outer))):
            module = self.random.choice(self.callers)
            frames.append(self._return_address(self.random.choice(self.functions[module])))
        frames.extend(function + 0x1D for function in self.outer)
        return frames


def build_database(scenario, layout, distinct, adds=None, buckets=DEBUG_HEAP_BUCKETS, modules=None,
                   seed=1, max_depth=24, **create_options):
    """A populated database: ``distinct`` different stacks added ``adds`` times in
    total (repeats chosen at random so hit counts vary), then synced into the scenario.
    Returns the builder."""
    builder = TraceDatabaseBuilder(scenario, layout, buckets=buckets, **create_options)
    if modules is None:
        modules = [m.name for m in scenario.modules]
    source = StackSource(scenario, modules, seed=seed)
    stacks = []
    while len(stacks) < distinct:
        frames = source.stack(max_depth=max_depth)
        if builder.add(frames) is None:
            break
        if builder.traces > len(stacks):
            stacks.append(frames)
    extra = max(0, (adds or distinct) - len(stacks))
    rng = random.Random(seed + 1)
    for _ in range(extra):
        # Skewed repeats: a few hot stacks collect most hits, as allocations do.
        builder.add(stacks[int(len(stacks) * rng.random() ** 3)])
    builder.sync()
    return builder


SAMPLE_DRIVER = ("tracedrv", "tracedrv.sys", 0x20000)


def add_sample_database(scenario):
    """Put a kernel-x64 trace database (a few hundred traces from ``nt`` and a
    driver) into a kernel-mode x64 Scenario; returns its address.

    The driver is this capability's own ``tracedrv.sys`` (added above the highest
    module unless present), so no other capability's driver image or symbols are
    touched; its global ``g_TraceDatabase`` points at the database, as a real
    driver's would.  211 buckets (not a multiple of 16) so the sample also shows
    the HashCounter overflow into the first segment's magic."""
    if (scenario.arch, scenario.mode) != ("x64", "kernel"):
        raise ValueError("add_sample_database needs an x64 kernel-mode scenario")
    if "nt" not in [m.name for m in scenario.modules]:
        raise ValueError("the sample trace database needs an nt module in the scenario")
    name, image, size = SAMPLE_DRIVER
    try:
        driver = scenario.module(name)
    except KeyError:
        base = (max(m.end for m in scenario.modules) + 0xFFFFF) // 0x100000 * 0x100000 + 0x100000
        driver = scenario.add_module(name, base, size, image=image)
    builder = build_database(scenario, "kernel-x64", distinct=300, adds=1200, buckets=211,
                             modules=["nt", driver.name], seed=7, max_depth=16, flags=4, tag=0x62445452)
    global_rva = driver.size - 0x100
    scenario.write_pointer(driver.base + global_rva, builder.address)
    scenario.add_symbol(driver.name, "g_TraceDatabase", global_rva)
    return builder.address
