"""The memory layer every analysis reads through.

A *backend* knows how to fetch one 4 KiB page of the target's virtual memory (from
pykd, a kernel dump, a minidump, or an in-memory image).  A :class:`Target` puts a
page cache in front of it and offers typed readers, so walkers may read field by
field while the backend only ever sees page-sized requests — the debugger round
trip (or kdmp-parser's ~28 µs page conversion) is paid once per page, not per field.

Every reader either returns data or raises :class:`UnreadableMemory` naming the
first address it could not read; :meth:`Target.try_read` is the non-raising form
that returns what it could read plus the holes (Fay's TryRead).
"""

import struct
from collections import OrderedDict

from ..address import merge_ranges, parse_number
from ..errors import BadInput, NeedsBiggerDump, UnreadableMemory
from ..hexaddr import hexaddr
from ..layouts.arm64 import REGISTER_ALIASES as ARM64_REGISTER_ALIASES
from ..symbols.table import SymbolTable

PAGE_SIZE = 0x1000
PAGE_MASK = ~(PAGE_SIZE - 1)

ARCH_POINTER_SIZE = {"x64": 8, "x86": 4, "arm64": 8}

_U8, _U16, _U32, _I32, _U64 = (struct.Struct(f) for f in ("<B", "<H", "<I", "<i", "<Q"))


def _scalar_reader(codec):
    """A Target method reading one ``codec`` (struct.Struct) value at an address.
    A cached page is decoded in place — no slice, no second call — because typed
    field reads are what walkers do most."""
    size = codec.size
    unpack_from = codec.unpack_from
    unpack = codec.unpack

    def read_scalar(self, address):
        offset = address & (PAGE_SIZE - 1)
        if offset <= PAGE_SIZE - size:
            page = self._cache.get(address - offset)
            if page is not None:
                stats = self.stats
                stats.reads += 1
                stats.bytes_read += size
                stats.cache_hits += 1
                return unpack_from(page, offset)[0]
        return unpack(self.read(address, size))[0]

    return read_scalar


class Module(object):
    """A loaded image: debugger name (``nt``, ``ntdll``), base, size, file name, and
    the TimeDateStamp the loader recorded (None when the source has none): with
    the size it names the image in a symbol store when the dump lacks its headers."""

    __slots__ = ("name", "base", "size", "image", "timestamp")

    def __init__(self, name, base, size, image=None, timestamp=None):
        self.name = name
        self.base = base
        self.size = size
        self.image = image or name
        self.timestamp = timestamp

    @property
    def end(self):
        return self.base + self.size

    def contains(self, address):
        return self.base <= address < self.base + self.size

    def __repr__(self):
        return "Module(%r, 0x%x, 0x%x)" % (self.name, self.base, self.size)

    def __eq__(self, other):
        return isinstance(other, Module) and (self.name, self.base, self.size) == (
            other.name, other.base, other.size)

    def __hash__(self):
        return hash((self.name, self.base, self.size))


# One read's size limit: sizes come from target memory (a module claiming
# SizeOfImage 0xFFFFFFFF), and memory use must follow what a dump holds, not what
# it claims.  Bigger regions are read in pieces (``scan``, ``readable_ranges``).
MAX_READ = 128 << 20
_PROBE_PAGES = 64
_UNASKED = object()
_TOO_LARGE = "a single read of 0x%x bytes is larger than dbgext reads at once (128 MiB)"


# Other names of a register, per architecture.  x86/x64: WinDbg names the flags
# register ``efl``; the CONTEXT structure calls it EFlags.  ARM64: x29/x30 are fp/lr.
# (The pseudo-registers ``@$ip``/``@$csp`` are dbgext.pseudo_registers'.)
_REGISTER_ALIASES = {"eflags": "efl", "rflags": "efl"}
# Each architecture's instruction and stack pointer, as its context names them.
POINTER_REGISTERS = {"x64": ("rip", "rsp"), "x86": ("eip", "esp"), "arm64": ("pc", "sp")}
_ARCH_REGISTER_ALIASES = {"arm64": ARM64_REGISTER_ALIASES}


class Thread(object):
    """A thread with a register context: a minidump's thread, a kernel dump's
    crashing thread, the debugger's current thread.  ``registers`` maps lowercase
    register names (``rip``, ``rsp``…, ``eip``, ``esp``… or ARM64's ``x0``…``x28``,
    ``fp``, ``lr``, ``sp``, ``pc``) to values."""

    __slots__ = ("id", "registers", "kernel_thread", "teb", "stack_base", "stack_limit", "name")

    def __init__(self, id, registers, kernel_thread=None, teb=None, stack_base=None, stack_limit=None,
                 name=None):
        self.id = id
        self.registers = dict(registers)
        self.kernel_thread = kernel_thread
        self.teb = teb
        self.stack_base = stack_base
        self.stack_limit = stack_limit
        self.name = name

    def __repr__(self):
        return "Thread(%r, %d registers)" % (self.id, len(self.registers))


class Backend(object):
    """What a memory source must provide.  Subclasses override the page reader.

    ``read_page(page_address)`` returns exactly PAGE_SIZE bytes or None when the page
    is not present.  ``read_pages`` may be overridden when the source can return a
    run of pages more cheaply than one at a time.
    """

    arch = "x64"
    kind = "memory"  # "kernel-dump", "minidump", "pykd", "image"
    # One sentence saying which memory the source lacks (a small memory dump),
    # or None when it holds everything an analysis may walk.
    limitation = None

    def read_page(self, page_address):
        raise NotImplementedError

    def read_pages(self, page_address, count):
        read = self.read_page
        return [read(page_address + i * PAGE_SIZE) for i in range(count)]

    def mapped_ranges(self):
        """Readable virtual ranges as sorted, non-overlapping (start, end) pairs,
        or None when the source cannot enumerate them (a live session)."""
        return None

    def modules(self):
        return []

    def symbols(self):
        return SymbolTable()

    def info(self):
        """Facts about the target for triage: kind, build, bug check, context..."""
        return {"kind": self.kind, "arch": self.arch}

    def threads(self):
        """Threads whose register context the source holds."""
        return []

    def current_thread(self):
        """The crashing or current thread, or None when the source has no context."""
        return None

    def partial_pages(self):
        """Pages the source holds only part of: ``{page address: ((start, end), ...)}``
        with the address ranges of the bytes it does hold (a minidump's 256-byte
        windows).  ``read_page`` zero-fills the rest; the Target reports it as
        unreadable.  Asked once, when the Target is made."""
        return {}

    def layout_hints(self, type_name):
        """Structure offsets the source itself carries (a kernel dump's
        KDDEBUGGER_DATA64): ``{"size": n or None, "fields": {name: offset}}`` or None."""
        return None

    def close(self):
        pass


class ReadStats(object):
    """Counters for benchmarks: what the analyses asked for and what the backend did."""

    __slots__ = ("reads", "bytes_read", "backend_calls", "backend_pages", "cache_hits")

    def __init__(self):
        self.reset()

    def reset(self):
        self.reads = 0
        self.bytes_read = 0
        self.backend_calls = 0
        self.backend_pages = 0
        self.cache_hits = 0

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}


class PartialRead(object):
    """Result of :meth:`Target.try_read`: ``data`` has the requested length with
    unreadable bytes zero-filled; ``holes`` lists the unreadable (start, end) ranges."""

    __slots__ = ("address", "data", "holes")

    def __init__(self, address, data, holes):
        self.address = address
        self.data = data
        self.holes = holes

    @property
    def complete(self):
        return not self.holes

    def readable(self, address, size):
        """True when [address, address+size) lies in the read and in no hole."""
        if address < self.address or address + size > self.address + len(self.data):
            return False
        for start, end in self.holes:
            if start < address + size and address < end:
                return False
        return True


class ListWalk(object):
    """Entries of a LIST_ENTRY list, and why the walk stopped if not at the head."""

    __slots__ = ("entries", "problem", "problem_address")

    def __init__(self):
        self.entries = []
        self.problem = None  # None | "cycle" | "unreadable" | "limit" | "null_link"
        self.problem_address = None


class Target(object):
    """Typed, cached, read-only access to a target's virtual memory plus its
    symbols, types and modules."""

    def __init__(self, backend, cache_pages=8192, symbols=None):
        self.backend = backend
        self.arch = backend.arch
        self.pointer_size = ARCH_POINTER_SIZE[self.arch]
        self._ptr_char = "Q" if self.pointer_size == 8 else "I"
        # pointer(address): a pointer-sized value.  Walkers read pointers more
        # than anything, so the right reader is bound once here.
        self.pointer = self._pointer64 if self.pointer_size == 8 else self._pointer32
        self.address_mask = (1 << (8 * self.pointer_size)) - 1
        self.stats = ReadStats()
        self._cache = OrderedDict()
        self._cache_limit = cache_pages
        self._modules = None
        self._symbols = symbols
        self._thread = None
        self._build = _UNASKED
        # Partly captured pages never enter the cache, so the cached fast paths
        # only ever serve whole pages; reads that touch them check their holes.
        self._partial = backend.partial_pages()

    # -- pages ------------------------------------------------------------------

    def _pages(self, first_page, count):
        """Pages [first_page, first_page + count*PAGE_SIZE) as a list of bytes|None."""
        cache = self._cache
        if count == 1:
            page = cache.get(first_page, False)
            if page is not False:
                self.stats.cache_hits += 1
                return [page]
            self.stats.backend_calls += 1
            self.stats.backend_pages += 1
            page = self.backend.read_page(first_page)
            self._remember(first_page, page)
            return [page]
        result = [cache.get(first_page + i * PAGE_SIZE, False) for i in range(count)]
        missing = result.count(False)
        self.stats.cache_hits += count - missing
        if not missing:
            return result
        # Fetch each run of missing pages with one backend call.
        i = result.index(False)
        while i < count:
            j = i + 1
            while j < count and result[j] is False:
                j += 1
            run_start = first_page + i * PAGE_SIZE
            fetched = self.backend.read_pages(run_start, j - i)
            self.stats.backend_calls += 1
            self.stats.backend_pages += j - i
            result[i:j] = fetched
            # Big scans would flush the working set; cache only modest runs.
            if j - i <= 64:
                for k, page in enumerate(fetched):
                    self._remember(run_start + k * PAGE_SIZE, page)
            i = j
            while i < count and result[i] is not False:
                i += 1
        return result

    def _remember(self, page_address, page):
        if page_address in self._partial:
            return
        cache = self._cache
        cache[page_address] = page
        if len(cache) > self._cache_limit:
            cache.popitem(last=False)

    def drop_cache(self):
        self._cache.clear()

    # -- raw reads --------------------------------------------------------------

    def read(self, address, size):
        """Exactly ``size`` bytes at ``address``, or UnreadableMemory naming the
        first unreadable address."""
        # Fast path: field-by-field walkers mostly hit one cached page.
        offset = address & (PAGE_SIZE - 1)
        if 0 < size <= PAGE_SIZE - offset:
            page = self._cache.get(address - offset)
            if page is not None:
                stats = self.stats
                stats.reads += 1
                stats.bytes_read += size
                stats.cache_hits += 1
                return page[offset:offset + size]
        if size < 0:
            raise ValueError("negative size")
        if size > MAX_READ:
            raise UnreadableMemory(address, size, _TOO_LARGE % size)
        self.stats.reads += 1
        self.stats.bytes_read += size
        if size == 0:
            return b""
        if address < 0 or address + size - 1 > self.address_mask:
            raise UnreadableMemory(address & self.address_mask, size, "outside the address space")
        offset = address & (PAGE_SIZE - 1)
        first = address - offset
        if offset + size <= PAGE_SIZE:
            page = self._pages(first, 1)[0]
            if page is None:
                raise UnreadableMemory(address, size)
            if self._partial:
                self._check_partial(address, size)
            return page[offset:offset + size]
        count = (offset + size + PAGE_SIZE - 1) // PAGE_SIZE
        pages = self._pages(first, count)
        for i, page in enumerate(pages):
            if page is None:
                raise UnreadableMemory(max(address, first + i * PAGE_SIZE), size)
        if self._partial:
            self._check_partial(address, size)
        return b"".join(pages)[offset:offset + size]

    def _partial_holes(self, address, size):
        """(start, end) ranges of [address, address+size) that partly captured
        pages do not hold, in ascending order."""
        holes = []
        end = address + size
        page = address & PAGE_MASK
        while page < end:
            pieces = self._partial.get(page)
            if pieces is not None:
                cursor, stop = max(address, page), min(end, page + PAGE_SIZE)
                for lo, hi in pieces:
                    if lo > cursor:
                        holes.append((cursor, min(lo, stop)))
                    cursor = max(cursor, hi)
                    if cursor >= stop:
                        break
                if cursor < stop:
                    holes.append((cursor, stop))
            page += PAGE_SIZE
        return holes

    def _check_partial(self, address, size):
        holes = self._partial_holes(address, size)
        if holes:
            raise UnreadableMemory(holes[0][0], size, "not captured in the dump")

    def try_read(self, address, size):
        """Read what can be read: a :class:`PartialRead` whose holes are zero-filled."""
        self.stats.reads += 1
        self.stats.bytes_read += size
        if size <= 0:
            return PartialRead(address, b"", [])
        if size > MAX_READ:
            raise UnreadableMemory(address, size, _TOO_LARGE % size)
        end = address + size
        if address < 0 or end - 1 > self.address_mask:
            lo = max(address, 0)
            hi = min(end, self.address_mask + 1)
            if lo >= hi:
                return PartialRead(address, bytes(size), [(address, end)])
            inner = self.try_read(lo, hi - lo)
            holes = ([(address, lo)] if address < lo else []) + inner.holes + (
                [(hi, end)] if hi < end else [])
            return PartialRead(address, bytes(lo - address) + inner.data + bytes(end - hi), holes)
        offset = address & (PAGE_SIZE - 1)
        first = address - offset
        count = (offset + size + PAGE_SIZE - 1) // PAGE_SIZE
        pages = self._pages(first, count)
        holes = merge_ranges(self._partial_holes(address, size)) if self._partial else []
        if None not in pages:
            data = b"".join(pages)
            return PartialRead(address, data if offset == 0 and len(data) == size
                               else data[offset:offset + size], holes)
        zero = None
        for i, page in enumerate(pages):
            if page is None:
                if zero is None:
                    zero = bytes(PAGE_SIZE)
                pages[i] = zero
                start = max(address, first + i * PAGE_SIZE)
                stop = min(end, first + (i + 1) * PAGE_SIZE)
                holes.append((start, stop))
        return PartialRead(address, b"".join(pages)[offset:offset + size], merge_ranges(holes))

    def is_readable(self, address, size=1):
        if size <= 0:
            return True
        if address < 0 or address + size - 1 > self.address_mask:
            return False
        offset = address & (PAGE_SIZE - 1)
        first = address - offset
        count = (offset + size + PAGE_SIZE - 1) // PAGE_SIZE
        if not all(page is not None for page in self._pages(first, count)):
            return False
        return not (self._partial and self._partial_holes(address, size))

    # -- typed reads ------------------------------------------------------------

    def unpack(self, fmt, address):
        """struct.unpack(fmt, memory at address); fmt must be little-endian ('<...')."""
        return struct.unpack(fmt, self.read(address, struct.calcsize(fmt)))

    u8 = _scalar_reader(_U8)
    u16 = _scalar_reader(_U16)
    u32 = _scalar_reader(_U32)
    i32 = _scalar_reader(_I32)
    u64 = _scalar_reader(_U64)
    _pointer32 = _scalar_reader(_U32)
    _pointer64 = _scalar_reader(_U64)

    def array(self, type_char, address, count):
        """``count`` little-endian values of struct type ``type_char`` ('I', 'Q', 'H'...)."""
        fmt = "<%d%s" % (count, type_char)
        return list(struct.unpack(fmt, self.read(address, struct.calcsize(fmt))))

    def pointers(self, address, count):
        return self.array(self._ptr_char, address, count)

    def cstring(self, address, max_length=0x1000, encoding="latin-1"):
        """A NUL-terminated narrow string (at most ``max_length`` bytes, stopping at
        the first unreadable page)."""
        return self._terminated(address, max_length, 1).decode(encoding, "replace")

    def wstring(self, address, max_chars=0x1000):
        return self._terminated(address, max_chars * 2, 2).decode("utf-16-le", "replace")

    def _terminated(self, address, max_bytes, unit):
        chunks = []
        total = 0
        cursor = address
        terminator = b"\0" * unit
        while total < max_bytes:
            span = min(PAGE_SIZE - (cursor & (PAGE_SIZE - 1)), max_bytes - total)
            span -= span % unit if span >= unit else 0
            if span <= 0:
                span = unit
            data = self.read(cursor, span)
            for index in range(0, len(data) - unit + 1, unit):
                if data[index:index + unit] == terminator:
                    chunks.append(data[:index])
                    return b"".join(chunks)
            chunks.append(data)
            total += len(data)
            cursor += len(data)
        return b"".join(chunks)[:max_bytes]

    def unicode_string(self, address, max_chars=0x8000):
        """A UNICODE_STRING {u16 Length, u16 MaximumLength, PWSTR Buffer}."""
        length, maximum = struct.unpack("<HH", self.read(address, 4))
        buffer = self.pointer(address + self.pointer_size)
        if length == 0:
            return ""
        if length > maximum or length & 1:
            from ..errors import BadInput
            raise BadInput("corrupt UNICODE_STRING at 0x%x (Length %d, MaximumLength %d)"
                           % (address, length, maximum))
        return self.read(buffer, min(length, max_chars * 2)).decode("utf-16-le", "replace")

    def walk_list(self, head, max_entries=100000, link_offset=0):
        """Follow Flink from a LIST_ENTRY head until it returns to the head.

        Returns a :class:`ListWalk` with the entry (LIST_ENTRY) addresses in order;
        a cycle that does not pass through the head, an unreadable link, a NULL link
        or more than ``max_entries`` entries stop the walk with ``problem`` set.
        """
        walk = ListWalk()
        seen = {head}
        current = head
        while True:
            try:
                nxt = self.pointer(current + link_offset)
            except UnreadableMemory:
                walk.problem, walk.problem_address = "unreadable", current
                return walk
            if nxt == head:
                return walk
            if nxt == 0:
                walk.problem, walk.problem_address = "null_link", current
                return walk
            if nxt in seen:
                walk.problem, walk.problem_address = "cycle", nxt
                return walk
            if len(walk.entries) >= max_entries:
                walk.problem, walk.problem_address = "limit", nxt
                return walk
            seen.add(nxt)
            walk.entries.append(nxt)
            current = nxt

    @property
    def kind(self):
        """What the source is: a kernel dump's kind (``kernel-dump``,
        ``kernel-small-dump``...), ``minidump``, ``pykd``, ``image`` or ``memory``."""
        return self.backend.kind

    def can_list_memory(self):
        """Whether the source knows which memory it holds (a dump does; a live
        session does not, so a scan there needs a bounded range)."""
        return self.backend.mapped_ranges() is not None

    def layout_hints(self, type_name):
        """Structure offsets the source itself carries for ``type_name`` (a kernel
        dump's KDDEBUGGER_DATA64), or None."""
        return self.backend.layout_hints(type_name)

    def readable_ranges(self, start=0, end=None):
        """Yield (start, end) ranges of readable memory within [start, end).

        Uses the backend's map when it has one; otherwise probes page by page,
        which is only sensible over a bounded range."""
        if end is None:
            end = self.address_mask + 1
        mapped = self.backend.mapped_ranges()
        if mapped is not None:
            for lo, hi in mapped:
                lo, hi = max(lo, start), min(hi, end)
                if lo < hi:
                    yield lo, hi
            return
        # Probe in runs of pages: one backend call per run (a live session splits
        # a run with a hole itself), not one per page.
        run_start = None
        page = start & PAGE_MASK
        while page < end:
            count = min(_PROBE_PAGES, (end - page + PAGE_SIZE - 1) // PAGE_SIZE)
            for index, present in enumerate(self._pages(page, count)):
                at = page + index * PAGE_SIZE
                if present is not None:
                    if run_start is None:
                        run_start = max(at, start)
                elif run_start is not None:
                    yield run_start, at
                    run_start = None
            page += count * PAGE_SIZE
        if run_start is not None:
            yield run_start, end

    def scan(self, pattern, start=0, end=None, chunk=0x100000, alignment=1, limit=100000):
        """Addresses of ``pattern`` (bytes) in readable memory, in ascending order."""
        found = []
        overlap = max(len(pattern) - 1, 0)
        chunk = max(chunk, PAGE_SIZE, 2 * len(pattern))  # a match spans at most two chunks

        def collect(data, base, below=None):
            """Record matches in ``data`` (at ``base``) starting before ``below``;
            True once the limit is reached."""
            index = data.find(pattern)
            while index != -1:
                address = base + index
                if below is not None and address >= below:
                    break
                if address % alignment == 0:
                    found.append(address)
                    if len(found) >= limit:
                        return True
                index = data.find(pattern, index + 1)
            return False

        for lo, hi in self.readable_ranges(start, end):
            cursor = lo
            tail = b""  # the previous chunk's last ``overlap`` bytes
            while cursor < hi:
                # Page-aligned chunks let try_read hand back the joined pages as
                # they are; matches straddling two chunks are found in tail+head.
                stop = min(hi, (cursor + chunk) & PAGE_MASK)  # > cursor: chunk >= PAGE_SIZE
                data = self.try_read(cursor, stop - cursor).data
                if tail and collect(tail + data[:overlap], cursor - len(tail), below=cursor):
                    return found
                if collect(data, cursor):
                    return found
                if overlap:
                    tail = data[-overlap:] if len(data) >= overlap else (tail + data)[-overlap:]
                cursor = stop
        return found

    # -- modules and symbols ------------------------------------------------------

    def modules(self):
        if self._modules is None:
            self._modules = sorted(self.backend.modules(), key=lambda m: m.base)
        return self._modules

    def module_at(self, address):
        for module in self.modules():
            if module.contains(address):
                return module
        return None

    def module_named(self, name):
        wanted = name.lower()
        for module in self.modules():
            if module.name.lower() == wanted or module.image.lower() == wanted:
                return module
        return None

    @property
    def symbols(self):
        if self._symbols is None:
            self._symbols = self.backend.symbols()
            self._symbols.bind(self.modules())
        return self._symbols

    def symbol_address(self, name):
        """``module!name`` or bare ``name`` -> address, or None."""
        return self.symbols.address(name)

    def symbolize(self, address):
        """``module!symbol+0xoff``, ``module+0xoff`` or ``0x...`` — never raises."""
        return self.symbols.describe(address)

    def field_offset(self, type_name, field):
        """Offset of ``field`` (dotted paths allowed) in ``type_name``, or None."""
        return self.symbols.field_offset(type_name, field)

    def type_size(self, type_name):
        return self.symbols.type_size(type_name)

    def type_layout(self, type_name):
        """The type's :class:`~dbgext.layouts.Layout` (fields with their formats) from
        the symbol files, or None when they don't describe it that fully."""
        describe = getattr(self.symbols, "type_layout", None)
        return describe(type_name) if describe else None

    def type_source(self, type_name):
        """Where the type information for ``type_name`` comes from (``pdb nt``,
        ``isf nt``, ``debugger``), for output that says which layout was used."""
        describe = getattr(self.symbols, "type_source", None)
        return describe(type_name) if describe else "type information"

    def info(self):
        return self.backend.info()

    def require_full_memory(self, what):
        """Raise NeedsBiggerDump when the source holds too little memory for
        ``what`` (an analysis that scans or walks kernel memory) to mean anything."""
        if self.backend.limitation:
            raise NeedsBiggerDump("%s needs a kernel, full or active memory dump: %s"
                                  % (what, self.backend.limitation))

    @property
    def build(self):
        """The Windows build number, or None when the source doesn't say (asked
        once: a live session answers info() with many engine calls)."""
        if self._build is _UNASKED:
            self._build = self.backend.info().get("build")
        return self._build

    # -- threads and registers ------------------------------------------------------

    def threads(self):
        return self.backend.threads()

    @property
    def thread(self):
        """The selected thread: the crashing/current one unless select_thread chose
        another; None when the target holds no register context."""
        if self._thread is None:
            self._thread = self.backend.current_thread()
        return self._thread

    def select_thread(self, wanted):
        """Select a thread by id or KTHREAD address (hex by default, as every number
        dbgext takes), or by WinDbg's decimal index ``~N`` (``~Ns`` too)."""
        threads = self.threads()
        text = str(wanted).strip()
        if isinstance(wanted, int):
            number, by_index = wanted, False
        elif text.startswith("~"):
            by_index = True
            try:
                number = int(text[1:].rstrip("s"), 10)
            except ValueError:
                raise BadInput("'%s' is not a thread index (~N, decimal)" % wanted)
        else:
            by_index = False
            number = parse_number(text)
        if not by_index:
            for thread in threads:
                if thread.id == number or (thread.kernel_thread is not None and thread.kernel_thread == number):
                    self._thread = thread
                    return thread
        if 0 <= number < len(threads):
            self._thread = threads[number]
            return self._thread
        raise BadInput("no thread '%s' in this target (%d threads with a context)" % (wanted, len(threads)))

    def register(self, name):
        """A register of the selected thread, for ``@reg`` in addresses."""
        thread = self.thread
        if thread is None:
            raise BadInput("@%s: this target holds no register context" % name)
        name = name.lower()
        aliases = _ARCH_REGISTER_ALIASES.get(self.arch, _REGISTER_ALIASES)
        try:
            return thread.registers[aliases.get(name, name)]
        except KeyError:
            raise BadInput("@%s: no such register in the %s context of thread %s" % (name, self.arch, thread.id))

    def close(self):
        self.backend.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def name_addresses(self, names, addresses):
        """Add ``symbolize(address)`` to the dict ``names`` for each of ``addresses``
        not named yet: what a result carries for the frames its views show."""
        for address in addresses:
            if address not in names:
                names[address] = self.symbolize(address)
        return names

    def format_address(self, address):
        """WinDbg style: 64-bit as ``fffff800`00001000``, 32-bit as ``80001000``."""
        return hexaddr(address, self.pointer_size)
