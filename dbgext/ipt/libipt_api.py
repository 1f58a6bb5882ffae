"""Intel's libipt 2.x as ctypes declarations (intel-pt.h): its structures, the
enumerations dbgext reads, every entry point used, and :func:`load`.

One set, shared by the libipt back end (dbgext.ipt.libipt) and the tests' harness
(tests/ipt_support.py: the encoder, the packet and block decoders).  Importing this
module loads nothing: the library is loaded on the first :func:`load` (inside WinDbg
it is usually absent): ``libipt.so.2`` on Linux; on Windows the DLL named by
DBGEXT_LIBIPT (``libipt.dll``/``ipt.dll`` else).  DBGEXT_LIBIPT names the library on
any system.  Another major version is refused: the layouts below are 2.x's.
"""

import ctypes
import os
import sys

from ..errors import BadInput

LIBRARY_VARIABLE = "DBGEXT_LIBIPT"
SUPPORTED_MAJOR = 2
HOW_TO_GET = {"linux": "apt-get install libipt2, or set %s to its path" % LIBRARY_VARIABLE}
BUILD_IT = "build it from https://github.com/intel/libipt and set %s to its path" % LIBRARY_VARIABLE
DEFAULT_NAMES = {"linux": ("libipt.so.2",), "win32": ("libipt.dll", "ipt.dll"), "darwin": ("libipt.2.dylib",)}

PTS_EVENT_PENDING = 1 << 0   # enum pt_status_flag
PTS_EOS = 1 << 2
PTE_BAD_OPC = 4              # -pte_bad_opc: an unknown packet opcode
PTE_BAD_PACKET = 5           # -pte_bad_packet: an unknown packet payload
PTE_EOS = 7                  # -pte_eos: the end of the trace
PTE_NOMAP = 13               # -pte_nomap: no code at that address

# enum pt_packet_type, by libipt's names (index = value).
PACKET_TYPES = ("invalid", "unknown", "pad", "psb", "psbend", "fup", "tip", "tip.pge", "tip.pgd", "tnt8", "tnt64",
                "mode", "pip", "vmcs", "cbr", "tsc", "tma", "mtc", "cyc", "stop", "ovf", "mnt", "exstop", "mwait",
                "pwre", "pwrx", "ptw")
# enum pt_event_type, by libipt's names (index = value).
EVENT_TYPES = ("enabled", "disabled", "async_disabled", "async_branch", "paging", "async_paging", "overflow",
               "exec_mode", "tsx", "stop", "vmcs", "async_vmcs", "exstop", "mwait", "pwre", "pwrx", "ptwrite",
               "tick", "cbr", "mnt")
INSN_CLASS_ERROR = 0         # enum pt_insn_class: ptic_error, an instruction not decoded
CPU_VENDOR_INTEL = 1         # enum pt_cpu_vendor
EXEC_MODE_16, EXEC_MODE_32, EXEC_MODE_64 = 1, 2, 3   # enum pt_exec_mode
MODE_LEAF_TSX = 0x20         # pt_packet_mode.leaf: pt_mol_tsx (pt_mol_exec: 0)
# The packet-layer errata (packets.packet_errata) -> struct pt_errata's bit-field, in the first word.
PACKET_ERRATA = {"skd007": 1 << 2, "skz84": 1 << 9}
# Where a packet's IP bit is in pt_packet's payload union: (byte, bit); PTW's is the
# bit-field after its 8-bit plc.
PACKET_IP_BITS = {"exstop": (0, 1), "ptw": (9, 1)}
EVENT_IP_SUPPRESSED = 1 << 0   # pt_event.flags bit 0
EVENT_STATUS_UPDATE = 1 << 1


class Version(ctypes.Structure):
    """struct pt_version."""
    _fields_ = [("major", ctypes.c_uint8), ("minor", ctypes.c_uint8), ("patch", ctypes.c_uint16),
                ("build", ctypes.c_uint32), ("ext", ctypes.c_char_p)]


class Cpu(ctypes.Structure):
    """struct pt_cpu."""
    _fields_ = [("vendor", ctypes.c_int), ("family", ctypes.c_uint16), ("model", ctypes.c_uint8),
                ("stepping", ctypes.c_uint8)]


class Config(ctypes.Structure):
    """The leading fields of struct pt_config; libipt zero-fills the rest (flags, the
    address filter) from ``size``."""
    _fields_ = [("size", ctypes.c_size_t), ("begin", ctypes.c_void_p), ("end", ctypes.c_void_p),
                ("callback", ctypes.c_void_p), ("context", ctypes.c_void_p), ("cpu", Cpu),
                ("errata", ctypes.c_uint32 * 16), ("cpuid_0x15_eax", ctypes.c_uint32),
                ("cpuid_0x15_ebx", ctypes.c_uint32), ("mtc_freq", ctypes.c_uint8), ("nom_freq", ctypes.c_uint8)]


class Packet(ctypes.Structure):
    """struct pt_packet: type, size, the payload union as bytes."""
    _fields_ = [("type", ctypes.c_int), ("size", ctypes.c_uint8), ("alignment", ctypes.c_uint8 * 3),
                ("payload", ctypes.c_uint8 * 16)]


class Insn(ctypes.Structure):
    """struct pt_insn."""
    _fields_ = [("ip", ctypes.c_uint64), ("isid", ctypes.c_int), ("mode", ctypes.c_int),
                ("iclass", ctypes.c_int), ("raw", ctypes.c_uint8 * 15), ("size", ctypes.c_uint8),
                ("flags", ctypes.c_uint32)]


class Block(ctypes.Structure):
    """struct pt_block."""
    _fields_ = [("ip", ctypes.c_uint64), ("end_ip", ctypes.c_uint64), ("isid", ctypes.c_int),
                ("mode", ctypes.c_int), ("iclass", ctypes.c_int), ("ninsn", ctypes.c_uint16),
                ("raw", ctypes.c_uint8 * 15), ("size", ctypes.c_uint8), ("flags", ctypes.c_uint32)]


class Event(ctypes.Structure):
    """struct pt_event: the common fields, then the variant union as 64-bit words
    (the first is the IP of every event dbgext reads)."""
    _fields_ = [("type", ctypes.c_int), ("flags", ctypes.c_uint32), ("tsc", ctypes.c_uint64),
                ("lost_mtc", ctypes.c_uint32), ("lost_cyc", ctypes.c_uint32), ("reserved", ctypes.c_uint64 * 2),
                ("variant", ctypes.c_uint64 * 4)]


READ_MEMORY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint8), ctypes.c_size_t, ctypes.c_void_p,
                               ctypes.c_uint64, ctypes.c_void_p)

_HANDLE = [ctypes.c_void_p]
_NEXT = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]   # (decoder, struct out, its size)
_OFFSET = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
# (function, argument types, result type): every entry point used.
FUNCTIONS = (
    ("pt_library_version", [], Version),
    ("pt_errstr", [ctypes.c_int], ctypes.c_char_p),
    ("pt_cpu_errata", [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int),
    ("pt_alloc_encoder", _HANDLE, ctypes.c_void_p),
    ("pt_free_encoder", _HANDLE, None),
    ("pt_enc_next", _NEXT, ctypes.c_int),
    ("pt_enc_get_offset", _OFFSET, ctypes.c_int),
    ("pt_pkt_alloc_decoder", _HANDLE, ctypes.c_void_p),
    ("pt_pkt_free_decoder", _HANDLE, None),
    ("pt_pkt_sync_forward", _HANDLE, ctypes.c_int),
    ("pt_pkt_next", _NEXT, ctypes.c_int),
    ("pt_pkt_get_offset", _OFFSET, ctypes.c_int),
    ("pt_image_set_callback", [ctypes.c_void_p, READ_MEMORY, ctypes.c_void_p], ctypes.c_int),
    ("pt_image_add_file", [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p,
                           ctypes.c_uint64], ctypes.c_int),
    ("pt_insn_alloc_decoder", _HANDLE, ctypes.c_void_p),
    ("pt_insn_free_decoder", _HANDLE, None),
    ("pt_insn_get_image", _HANDLE, ctypes.c_void_p),
    ("pt_insn_sync_forward", _HANDLE, ctypes.c_int),
    ("pt_insn_next", _NEXT, ctypes.c_int),
    ("pt_insn_event", _NEXT, ctypes.c_int),
    ("pt_insn_get_offset", _OFFSET, ctypes.c_int),
    ("pt_insn_get_sync_offset", _OFFSET, ctypes.c_int),
    ("pt_blk_alloc_decoder", _HANDLE, ctypes.c_void_p),
    ("pt_blk_free_decoder", _HANDLE, None),
    ("pt_blk_get_image", _HANDLE, ctypes.c_void_p),
    ("pt_blk_sync_forward", _HANDLE, ctypes.c_int),
    ("pt_blk_next", _NEXT, ctypes.c_int),
    ("pt_blk_event", _NEXT, ctypes.c_int),
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


def trace_buffer(data):
    """``data`` as the uint8 array libipt's decoders read (one byte at least: a
    ctypes array of none has no address to give)."""
    return (ctypes.c_uint8 * max(len(data), 1)).from_buffer_copy(data or b"\0")


def config_for(buffer, size, cpu=None, library=None):
    """A pt_config over the first ``size`` bytes of the ctypes ``buffer``; with ``cpu``
    (family, model[, stepping]) and ``library``, libipt's errata workarounds for it."""
    config = Config()
    config.size = ctypes.sizeof(Config)
    config.begin = ctypes.addressof(buffer)
    config.end = config.begin + size
    if cpu is not None:
        config.cpu = Cpu(CPU_VENDOR_INTEL, cpu[0], cpu[1], cpu[2] if len(cpu) > 2 else 0)
        library.pt_cpu_errata(ctypes.byref(config.errata), ctypes.byref(config.cpu))
    return config
