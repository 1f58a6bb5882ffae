"""Optional back end: the instruction flow decoded by Intel's libipt, through ctypes.

``reconstruct_flow(..., decoder="libipt")`` (``ipt flow --decoder libipt``) uses
:class:`LibiptFlowDecoder` in place of flow.FlowDecoder: the same ``decode()``,
filling the same FlowResult, so the JSON and the text are the same, but for what
libipt does not say: no blocks are built, an event's trace offset is where libipt's
decoder is (past the packet that gave it), a "disabled" event has the IP libipt gives
(often none), and "sync" is inferred (see ``_Run.sync``).  libipt reads
the code through its image callback (``pt_image_set_callback``) from the flow's
CodeImage: the same target memory and image files the Python decoder reads (the
image files as sections, which libipt reads without a call per instruction).

The library is loaded on first use, never at import (inside WinDbg it is usually
absent): ``libipt.so.2`` on Linux; on Windows the DLL named by DBGEXT_LIBIPT
(``libipt.dll``/``ipt.dll`` else).  DBGEXT_LIBIPT names the library on any system.
The layouts below are libipt 2.x's (intel-pt.h); another major version is refused.

What it follows is libipt's own: its errata table (``pt_cpu_errata``, which knows
fewer CPUs than upstream's in errata.py), the packets it knows (2.0 has no CFE, EVD
or TRIG), resynchronisation at the next PSB after an error (``resync_on_error``
needs the Python decoder), and ptxed's rules: no instruction once libipt reports the
end of the trace with its events drained; the instruction an error stopped at is
listed when libipt had decoded it (pt_insn_next gave its class).  The Python
decoder remains the reference (tests/test_ipt_libipt.py compares them).
"""

import ctypes
import os
import sys
import tempfile

from ..errors import BadInput
from ..target.base import PAGE_SIZE
from .flow import (B_CALL, B_COND, B_FAR_CALL, B_FAR_RET, B_INDIRECT, B_JUMP, B_RET, FLUSH_SIZE, MODE_16, MODE_32,
                   BlockCache, FlowResult)

LIBRARY_VARIABLE = "DBGEXT_LIBIPT"
SUPPORTED_MAJOR = 2
HOW_TO_GET = {"linux": "apt-get install libipt2, or set %s to its path" % LIBRARY_VARIABLE}
BUILD_IT = "build it from https://github.com/intel/libipt and set %s to its path" % LIBRARY_VARIABLE
DEFAULT_NAMES = {"linux": ("libipt.so.2",), "win32": ("libipt.dll", "ipt.dll"), "darwin": ("libipt.2.dylib",)}

# -- libipt 2.x's structures (intel-pt.h), as data -------------------------------------

PTS_EVENT_PENDING = 1 << 0   # enum pt_status_flag
PTS_IP_SUPPRESSED = 1 << 1
PTS_EOS = 1 << 2
PTE_EOS = 7                  # -pte_eos: the end of the trace
PTE_NOMAP = 13               # -pte_nomap: no code at that address


class Version(ctypes.Structure):
    """struct pt_version."""
    _fields_ = [("major", ctypes.c_uint8), ("minor", ctypes.c_uint8), ("patch", ctypes.c_uint16),
                ("build", ctypes.c_uint32), ("ext", ctypes.c_char_p)]


class Cpu(ctypes.Structure):
    """struct pt_cpu (vendor 1: Intel)."""
    _fields_ = [("vendor", ctypes.c_int), ("family", ctypes.c_uint16), ("model", ctypes.c_uint8),
                ("stepping", ctypes.c_uint8)]


CPU_VENDOR_INTEL = 1


class Config(ctypes.Structure):
    """The leading fields of struct pt_config; libipt zero-fills the rest (flags, the
    address filter) from ``size``."""
    _fields_ = [("size", ctypes.c_size_t), ("begin", ctypes.c_void_p), ("end", ctypes.c_void_p),
                ("callback", ctypes.c_void_p), ("context", ctypes.c_void_p), ("cpu", Cpu),
                ("errata", ctypes.c_uint32 * 16), ("cpuid_0x15_eax", ctypes.c_uint32),
                ("cpuid_0x15_ebx", ctypes.c_uint32), ("mtc_freq", ctypes.c_uint8), ("nom_freq", ctypes.c_uint8)]


class Insn(ctypes.Structure):
    """struct pt_insn."""
    _fields_ = [("ip", ctypes.c_uint64), ("isid", ctypes.c_int), ("mode", ctypes.c_int),
                ("iclass", ctypes.c_int), ("raw", ctypes.c_uint8 * 15), ("size", ctypes.c_uint8),
                ("flags", ctypes.c_uint32)]


class Event(ctypes.Structure):
    """struct pt_event: the common fields, then the variant union as 64-bit words."""
    _fields_ = [("type", ctypes.c_int), ("flags", ctypes.c_uint32), ("tsc", ctypes.c_uint64),
                ("lost_mtc", ctypes.c_uint32), ("lost_cyc", ctypes.c_uint32), ("reserved", ctypes.c_uint64 * 2),
                ("variant", ctypes.c_uint64 * 4)]


EVENT_IP_SUPPRESSED = 1 << 0   # pt_event.flags bit 0
EVENT_STATUS_UPDATE = 1 << 1

# enum pt_event_type -> (the flow's event kind, which variant word is its IP); the
# events the Python decoder reports, by the same names.  Others (paging, exec_mode,
# timing, power...) are not flow events there, so they are not here either; nor are
# status updates (a PSB+ restating the state).  A "disabled" event's IP is libipt's: none where libipt gives none (the
# Python decoder gives the TIP.PGD's).
EVENTS = {
    0: ("enabled", 0),            # ptev_enabled {ip, resumed}
    1: ("disabled", 0),           # ptev_disabled {ip}
    2: ("disabled", 0),           # ptev_async_disabled {at, ip}: where it happened
    3: ("interrupt", 0),          # ptev_async_branch {from, to}
    4: ("paging", None),          # ptev_paging {cr3, non_root}: no IP
    5: ("paging", None),          # ptev_async_paging {cr3, non_root, ip}: with the transfer, IP left out
    6: ("overflow", 0),           # ptev_overflow {ip}: see _event
    8: ("tsx", 0),                # ptev_tsx {ip, speculative:1 aborted:1}
    12: ("exstop", 0),            # ptev_exstop {ip}
    16: ("ptwrite", 0),           # ptev_ptwrite {ip, size, payload}
}
EVENT_OVERFLOW, EVENT_TSX = 6, 8
# Events after which tracing is on without a "sync" (the Python decoder's name for
# tracing found on at a PSB+).
EVENTS_STARTING = (0, 6)

# enum pt_exec_mode -> the flow's mode, for the modes the listing cannot assume (64-bit).
OTHER_MODES = {1: MODE_16, 2: MODE_32}

# enum pt_insn_class -> the block kind the views read (CallTree: calls and returns).
INSN_CLASSES = {2: B_CALL, 3: B_RET, 4: B_JUMP, 5: B_COND, 6: B_FAR_CALL, 7: B_FAR_RET, 8: B_INDIRECT}

READ_MEMORY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint8), ctypes.c_size_t, ctypes.c_void_p,
                               ctypes.c_uint64, ctypes.c_void_p)

# (function, argument types, result type): every entry point used.
FUNCTIONS = (
    ("pt_library_version", [], Version),
    ("pt_errstr", [ctypes.c_int], ctypes.c_char_p),
    ("pt_cpu_errata", [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int),
    ("pt_insn_alloc_decoder", [ctypes.c_void_p], ctypes.c_void_p),
    ("pt_insn_free_decoder", [ctypes.c_void_p], None),
    ("pt_insn_get_image", [ctypes.c_void_p], ctypes.c_void_p),
    ("pt_image_set_callback", [ctypes.c_void_p, READ_MEMORY, ctypes.c_void_p], ctypes.c_int),
    ("pt_image_add_file", [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p,
                           ctypes.c_uint64], ctypes.c_int),
    ("pt_insn_sync_forward", [ctypes.c_void_p], ctypes.c_int),
    ("pt_insn_next", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t], ctypes.c_int),
    ("pt_insn_event", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t], ctypes.c_int),
    ("pt_insn_get_offset", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)], ctypes.c_int),
    ("pt_insn_get_sync_offset", [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)], ctypes.c_int),
)

_loaded = {}  # library path or name -> CDLL with FUNCTIONS declared


def _platform():
    return "win32" if sys.platform == "win32" else "darwin" if sys.platform == "darwin" else "linux"


def load(path=None):
    """The libipt CDLL: ``path``, else DBGEXT_LIBIPT, else the system's default names.
    Raises BadInput in one line (which library, why, how to get it) when it cannot be
    loaded or is not version 2.x."""
    names = (path,) if path else ((os.environ[LIBRARY_VARIABLE],) if os.environ.get(LIBRARY_VARIABLE)
                                  else DEFAULT_NAMES[_platform()])
    for name in names:
        if name in _loaded:
            return _loaded[name]
    failures = []
    for name in names:
        try:
            library = ctypes.CDLL(name)
        except OSError as error:
            failures.append(str(error) or name)
            continue
        for function, arguments, result in FUNCTIONS:
            getattr(library, function).argtypes = arguments
            getattr(library, function).restype = result
        version = library.pt_library_version()
        if version.major != SUPPORTED_MAJOR:
            raise BadInput("libipt: %s is version %d.%d.%d; this back end reads libipt %d.x's layouts only "
                           "(decode with the python decoder)" % (name, version.major, version.minor, version.patch,
                                                       SUPPORTED_MAJOR))
        _loaded[name] = library
        return library
    raise BadInput("libipt: cannot load %s (%s); %s, or decode with the python decoder"
                   % (" or ".join(names), "; ".join(failures), HOW_TO_GET.get(_platform(), BUILD_IT)))


def library_version(library):
    version = library.pt_library_version()
    return "%d.%d.%d" % (version.major, version.minor, version.patch)


# -- code --------------------------------------------------------------------------------


class _ImageFiles(object):
    """The CodeImage's image files as libipt sections: each image's bytes in memory
    layout written once to a temporary file (libipt maps sections from files), so
    libipt reads their code itself; the callback serves only target memory."""

    def __init__(self, code):
        self.folder = tempfile.TemporaryDirectory(prefix="dbgext-libipt-")
        self.sections = []   # (path, size, base)
        for number, (base, size, read) in enumerate(code.images):
            data = read(0, size)
            path = os.path.join(self.folder.name, "image%d.bin" % number)
            with open(path, "wb") as handle:
                handle.write(data)
            self.sections.append((path, len(data), base))

    def add_to(self, library, image):
        for path, size, base in self.sections:
            status = library.pt_image_add_file(image, os.fsencode(path), 0, size, None, base)
            if status < 0:
                raise BadInput("libipt cannot map the code image at %#x: %s"
                               % (base, library.pt_errstr(-status).decode()))


class _CodeReader(object):
    """libipt's image callback over a flow.CodeImage: code read a page at a time and
    kept, as libipt asks for each instruction's bytes (15 at a time)."""

    def __init__(self, code):
        self.code = code
        self.pages = {}
        self.callback = READ_MEMORY(self._read)

    def bytes_at(self, address, size):
        page = address & ~(PAGE_SIZE - 1)
        data = self.pages.get(page)
        if data is None:
            data = self.pages[page] = self.code.read_upto(page, PAGE_SIZE)
        offset = address - page
        if offset >= len(data):   # the page is unreadable from its start (an image that starts inside it)
            return self.code.read_upto(address, size)
        piece = data[offset:offset + size]
        if len(piece) < size and len(data) == PAGE_SIZE:   # on into the next page
            piece += self.bytes_at(page + PAGE_SIZE, size - len(piece))
        return piece

    def _read(self, buffer, size, asid, address, context):
        try:
            piece = self.bytes_at(address, size)
        except Exception:  # an exception cannot cross into libipt: an unreadable byte is no code
            piece = b""
        if not piece:
            return -PTE_NOMAP
        ctypes.memmove(buffer, piece, len(piece))
        return len(piece)


# -- the decoder -------------------------------------------------------------------------

class LibiptFlowDecoder(object):
    """flow.FlowDecoder's interface over libipt's instruction decoder.  ``code``: a
    flow.CodeImage; ``cpu``: (family, model[, stepping]) whose errata workarounds
    libipt applies (its own table); ``cache``: the BlockCache the views and the listing
    disassemble with (no blocks are built while decoding)."""

    def __init__(self, code, suspicious=None, cache=None, cpu=None, library=None):
        self.library = library or load()
        self.code = code
        self.cache = cache or BlockCache(code)
        self.suspicious = dict(suspicious or {})
        self.cpu = cpu
        self.version = library_version(self.library)
        self.files = _ImageFiles(code) if code.images else None

    def _config(self, buffer, size):
        config = Config()
        config.size = ctypes.sizeof(Config)
        config.begin = ctypes.addressof(buffer)
        config.end = config.begin + size
        if self.cpu is not None:
            family, model = self.cpu[0], self.cpu[1]
            stepping = self.cpu[2] if len(self.cpu) > 2 else 0
            config.cpu = Cpu(CPU_VENDOR_INTEL, family, model, stepping)
            self.library.pt_cpu_errata(ctypes.byref(config.errata), ctypes.byref(config.cpu))
        return config

    def decode(self, data, start=0, end=None, max_insns=None, sink=None, progress=None, result=None):
        """As flow.FlowDecoder.decode: ``data[start:end]`` to the end; instructions in
        chunks to ``sink``, the first ``max_insns`` kept in ``result.instructions``."""
        result = result if result is not None else FlowResult()
        end = len(data) if end is None else min(end, len(data))
        trace = bytes(data[start:end])
        buffer = (ctypes.c_uint8 * max(len(trace), 1)).from_buffer_copy(trace or b"\0")
        config = self._config(buffer, len(trace))
        lib = self.library
        decoder = lib.pt_insn_alloc_decoder(ctypes.byref(config))
        if not decoder:
            raise BadInput("libipt could not allocate an instruction decoder for this trace")
        image = lib.pt_insn_get_image(decoder)
        if self.files is not None:
            self.files.add_to(lib, image)
        reader = _CodeReader(self.code)
        lib.pt_image_set_callback(image, reader.callback, None)
        try:
            _Run(self, result, decoder, start, max_insns, sink, progress).run()
        finally:
            lib.pt_insn_free_decoder(decoder)
        result.blocks_built = self.cache.blocks_built
        return result


class _Run(object):
    """One decode: libipt's loop as ptxed runs it (events drained before each
    instruction; after an error, on at the next PSB; stop at the end of the trace)."""

    def __init__(self, owner, result, decoder, start, max_insns, sink, progress):
        self.owner = owner
        self.lib = owner.library
        self.result = result
        self.decoder = decoder
        self.start = start
        self.max_insns = max_insns
        self.sink = sink
        self.progress = progress
        self.out = []
        self.flushed = 0
        self.offset = ctypes.c_uint64()
        self.sync_offset = None   # the PSB synchronised at, until its "sync" event or an event that starts tracing

    def trace_offset(self):
        self.lib.pt_insn_get_offset(self.decoder, ctypes.byref(self.offset))
        return self.start + self.offset.value

    def flush(self):
        chunk, self.out = self.out, []
        if not chunk:
            return
        listing = self.result.instructions
        room = len(chunk) if self.max_insns is None else self.max_insns - len(listing)
        if room > 0:
            listing.extend(chunk[:room])
        if room < len(chunk):
            self.result.truncated = True
        self.flushed += len(chunk)
        if self.sink is not None:
            self.sink(chunk)
        if self.progress is not None:
            self.progress(self.trace_offset(), self.flushed)

    def error(self, status, ip):
        self.result.problems.add("ipt_flow_error", ip, "libipt: %s" % self.lib.pt_errstr(-status).decode(),
                                 offset=self.trace_offset())

    def synchronised(self):
        self.lib.pt_insn_get_sync_offset(self.decoder, ctypes.byref(self.offset))
        self.sync_offset = self.start + self.offset.value

    def sync(self, ip):
        """Tracing was on at the PSB+ synchronised at: the Python decoder's "sync" event,
        before the first event or instruction after it, at its IP."""
        self.result.add_event((self.flushed + len(self.out), "sync", self.sync_offset, ip))
        self.sync_offset = None

    def event(self, event):
        """Record a libipt event under the flow's name for it, before the next instruction."""
        known = EVENTS.get(event.type)
        if known is None or event.flags & EVENT_STATUS_UPDATE:
            return
        kind, word = known
        ip = None if event.flags & EVENT_IP_SUPPRESSED or word is None else event.variant[word]
        if event.type in EVENTS_STARTING:
            self.sync_offset = None
        elif self.sync_offset is not None and word is not None:   # an event without IP does not say where
            self.sync(ip)
        index = self.flushed + len(self.out)
        offset = self.trace_offset()
        if event.type == EVENT_OVERFLOW:
            self.result.add_event((index, "overflow", offset, None))
            if ip is not None:
                self.result.add_event((index, "resumed", offset, ip))
            return
        if event.type == EVENT_TSX:
            bits = event.variant[1]
            kind = "tsx_abort" if bits & 2 else "tsx_begin" if bits & 1 else "tsx_commit"
        self.result.add_event((index, kind, offset, ip))

    def run(self):
        lib, decoder = self.lib, self.decoder
        insn_next, insn_event = lib.pt_insn_next, lib.pt_insn_event
        insn, event = Insn(), Event()
        insn_ref, insn_size = ctypes.byref(insn), ctypes.sizeof(Insn)
        event_ref, event_size = ctypes.byref(event), ctypes.sizeof(Event)
        cache = self.owner.cache
        ends, suspicious, warned = cache.ends, self.owner.suspicious, set()
        out = self.out
        last_ip = None
        status = lib.pt_insn_sync_forward(decoder)
        if status >= 0:
            self.synchronised()
        while True:
            if status < 0:
                if status == -PTE_EOS:
                    break
                self.error(status, last_ip)
                status = lib.pt_insn_sync_forward(decoder)
                if status >= 0:
                    self.synchronised()
                continue
            while status & PTS_EVENT_PENDING:
                status = insn_event(decoder, event_ref, event_size)
                if status < 0:
                    break
                self.event(event)
            if status < 0:
                continue
            if status & PTS_EOS:
                break   # as ptxed: the end of the trace, its events drained
            tracing = not status & PTS_IP_SUPPRESSED  # else pt_insn_next returns and leaves insn as it was
            status = insn_next(decoder, insn_ref, insn_size)
            if status < 0 and not (tracing and insn.iclass):
                continue   # as ptxed, an error's instruction is listed when libipt had decoded it (its class)
            ip = last_ip = insn.ip
            if self.sync_offset is not None:
                self.sync(ip)
            out.append(ip)
            if insn.iclass > 1 and ip not in ends:
                ends[ip] = INSN_CLASSES.get(insn.iclass, B_INDIRECT)
            if insn.mode in OTHER_MODES and ip not in cache.blocks(OTHER_MODES[insn.mode]):
                cache.build(ip, OTHER_MODES[insn.mode])   # so that the listing disassembles it in its mode
            if ip in suspicious and ip not in warned:
                warned.add(ip)
                self.result.problems.add("ipt_suspicious_path", ip, "the path enters %s: a real trace rarely runs "
                                         "it; check the reconstruction" % suspicious[ip], "warning",
                                         self.trace_offset())
            if len(out) >= FLUSH_SIZE:
                self.flush()
                out = self.out
        self.flush()
        self.result.instruction_count = self.flushed
