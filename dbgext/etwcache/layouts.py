"""Layouts of the ETW stack cache and of the structures that lead to it (x64).

``_ETW_STACK_CACHE`` is opaque in the public symbols, so its layout is carried here
as data: two variants seen across Windows 10/11 builds (see
shared/reference/etw-stack-cache.md).  The logger context and silo state offsets
come from type information when the target has it; ``BUILTIN`` is the
fallback keyed by build number.  All of them are :class:`dbgext.layouts.Layout`
data, the logger context and silo state looked up through
:func:`dbgext.layouts.lookup_layout`.

ARM64 kernels use the same tables (``arm64_as_x64``).  The cache header, its
pieces and buckets are plain 64-bit data, and ARM64's 16-byte SLIST_HEADER has
x64's shape (Depth in the low 16 bits, the next entry in the second quadword
with its low 4 bits free).  The built-in _WMI_LOGGER_CONTEXT and
_ETW_SILODRIVERSTATE offsets are x64's public type dumps, assumed for ARM64.
None of this was verified on an ARM64 dump: the real one is a small memory dump,
which holds no ETW buffers.  Type information, when the target has it, wins.
"""

from ..layouts import BuiltinLayouts, Layout

PIECE_SIZE = 0x128
# Free pieces are SLIST entries, 16-byte aligned: a pool's stride is at most this (the sample's is this).
PIECE_STRIDE = (PIECE_SIZE + 15) & ~15
FRAMES_PER_PIECE = 32
MAX_BUCKET_ENTRIES = 4
BUCKET_SIZE = 0x18

# Windows clamps the configuration to these ranges (not validated, clamped).
MIN_BUCKET_COUNT = 256
MAX_BUCKET_COUNT = 4096
MIN_CACHE_SIZE = 0x300000
MAX_CACHE_SIZE = 0x3200000
MAX_PIECES = MAX_CACHE_SIZE // PIECE_SIZE

# A stack walk never captures more frames than this; a larger FrameCount is corrupt.
MAX_PLAUSIBLE_FRAMES = 1024

# One piece of a cached stack (or a free piece on the SLIST); the kernel has no
# public type for it.
PIECE = Layout("stack cache piece", PIECE_SIZE, {
    "Links": (0x00, "2Q"),      # LIST_ENTRY in the bucket (first piece) / SLIST next (free piece)
    "Next": (0x10, "Q"),        # next piece of the same stack
    "RefCount": (0x18, "i"),    # LONG
    "Hash": (0x1C, "I"),        # ULONG, first piece
    "FrameCount": (0x20, "I"),  # ULONG: total frames (first piece), frames in this piece (later ones)
    "Frames": (0x28, "32Q"),
}, "built-in")
FRAMES_OFFSET = PIECE.offset("Frames")

# The cache header, _ETW_STACK_CACHE (opaque in the public symbols, so always built
# in).  The owner is a ULONG logger id (variant A) or a pointer to the owning
# _WMI_LOGGER_CONTEXT (variant B); Buckets is an array of BucketCount buckets.
CACHE_VARIANTS = {
    "A": Layout("_ETW_STACK_CACHE", 0x20, {"LoggerId": (0x00, "I"), "BucketCount": (0x04, "I"),
                                           "FreeList": (0x10, "2Q"), "Buckets": (0x20, None)},
                "built-in variant A (older builds)"),
    "B": Layout("_ETW_STACK_CACHE", 0x20, {"LoggerContext": (0x00, "Q"), "BucketCount": (0x08, "I"),
                                           "FreeList": (0x10, "2Q"), "Buckets": (0x20, None)},
                "built-in variant B (newer builds)"),
}
HEADER_SIZE = 0x20

# x64 SLIST_HEADER (16-byte aligned "HeaderX64" format): Depth is the low 16 bits of
# the first quadword; the next entry is the second quadword with its low 4 bits cleared.
SLIST_DEPTH_MASK = 0xFFFF
SLIST_NEXT_MASK = ~0xF & 0xFFFFFFFFFFFFFFFF

# _WMI_LOGGER_CONTEXT and _ETW_SILODRIVERSTATE (x64) per build, from public type
# dumps, for targets without type information.
LOGGER_FIELDS = ("LoggerId", "LoggerName", "StackCache")
SILO_FIELDS = ("MaxLoggers", "EtwpLoggerContext")
BUILTIN = BuiltinLayouts({
    "_WMI_LOGGER_CONTEXT": [
        {"arch": "x64", "builds": (17134, 19040), "size": None,  # Windows 10 1803-1909
         "fields": {"LoggerId": (0x0, "I"), "LoggerName": (0x88, None), "StackCache": (0x348, "Q")}},
        {"arch": "x64", "builds": (19041, 22631), "size": None,  # Windows 10 2004-22H2 / 11
         "fields": {"LoggerId": (0x0, "I"), "LoggerName": (0x98, None), "StackCache": (0x3E0, "Q")}},
    ],
    "_ETW_SILODRIVERSTATE": [
        {"arch": "x64", "builds": (17134, 19040), "size": None,
         "fields": {"MaxLoggers": (0x10, "I"), "EtwpLoggerContext": (0x1B0, "Q")}},
        {"arch": "x64", "builds": (19041, 22631), "size": None,
         "fields": {"MaxLoggers": (0x10, "I"), "EtwpLoggerContext": (0x1C8, "Q")}},
    ],
}, arm64_as_x64=True)

LOGGER_TYPE = "nt!_WMI_LOGGER_CONTEXT"
SILO_TYPE = "nt!_ETW_SILODRIVERSTATE"
HOST_SILO_SYMBOL = "nt!EtwpHostSiloState"

# Unused logger slots hold a small non-pointer value (1); there are at most 64 loggers.
MAX_LOGGERS = 64
KERNEL_SPACE_START = 0xFFFF800000000000


def occupancy(buckets):
    """How many of ``buckets`` (lists of entries) hold 0, 1, ... MAX_BUCKET_ENTRIES
    (or more) entries."""
    counts = [0] * (MAX_BUCKET_ENTRIES + 1)
    for bucket in buckets:
        counts[min(len(bucket), MAX_BUCKET_ENTRIES)] += 1
    return counts


def pieces_for(frame_count):
    """Pieces a stack of ``frame_count`` frames occupies."""
    return (frame_count + FRAMES_PER_PIECE - 1) // FRAMES_PER_PIECE


def clamp_bucket_count(count):
    return max(MIN_BUCKET_COUNT, min(MAX_BUCKET_COUNT, count))


def clamp_cache_size(size):
    return max(MIN_CACHE_SIZE, min(MAX_CACHE_SIZE, size))


def is_prime(number):
    if number < 2:
        return False
    if number % 2 == 0:
        return number == 2
    divisor = 3
    while divisor * divisor <= number:
        if number % divisor == 0:
            return False
        divisor += 2
    return True


def prime_at_most(number):
    """The largest prime <= number (2 at least)."""
    while number > 2 and not is_prime(number):
        number -= 1
    return max(number, 2)
