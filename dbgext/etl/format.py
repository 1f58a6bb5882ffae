"""Binary layouts of .etl files: WMI buffers and the event headers inside them.

A file is a run of buffers, each starting with a 0x48-byte WMI_BUFFER_HEADER
(BufferSize at +0x00, SavedOffset +0x04, CurrentOffset +0x08, TimeStamp +0x10,
SequenceNumber +0x18, ClientContext {ProcessorNumber u8, Alignment u8, LoggerId u16}
+0x28, State +0x2C, Offset +0x30, BufferFlag +0x34, BufferType +0x36), followed by
8-byte aligned events up to the used size; the unused tail is 0xFF bytes.

Every event starts with a ULONG whose top byte is the marker (0x80 flag | 0x40
"trace header") and whose third byte is the header type.  Kernel (system) events
carry a SYSTEM_TRACE_HEADER (0x20 bytes), its compact form (0x18) or a
PERFINFO_TRACE_HEADER (0x10): {u16 Version, u8 HeaderType, u8 Flags}, {u16 Size,
u8 Type (opcode), u8 Group} (HookId = Group << 8 | Type), then ThreadId, ProcessId,
SystemTime, KernelTime, UserTime as far as the header goes.  Classic providers use
EVENT_TRACE_HEADER (0x30: Size, HeaderType, MarkerFlags, Type, Level, Version,
ThreadId, ProcessId, TimeStamp, Guid, KernelTime, UserTime); manifest providers use
EVENT_HEADER (0x50: Size, HeaderType, MarkerFlags, Flags, EventProperty, ThreadId,
ProcessId, TimeStamp, ProviderId, EVENT_DESCRIPTOR {Id u16, Version u8, Channel u8,
Level u8, Opcode u8, Task u16, Keyword u64}, ProcessorTime, ActivityId).
"""

import struct
import uuid

BUFFER_HEADER_SIZE = 0x48
BUFFER_HEADER = struct.Struct("<IIIiqqQBBHIIHH16s")
MAX_BUFFER_SIZE = 64 * 1024 * 1024
PADDING_MARKER = 0xFFFFFFFF

BUFFER_FLAG_COMPRESSED = 0x40        # ETW_BUFFER_FLAG_COMPRESSED in BufferFlag (+0x34)
BUFFER_STATE_OFFSET = 0x2C

# A compressed buffer keeps its 0x48-byte header uncompressed; BufferSize is then
# its size on disk and SavedOffset its decompressed size (header included).
#
# Which algorithm decompresses a buffer (``compression_algorithm``):
# 1. the file's header says: the logfile header (the first event of the first
#    buffer, never compressed) has EVENT_TRACE_COMPRESSED_MODE in its LogFileMode,
#    and then the first buffer's State low word holds the COMPRESSION_FORMAT_*:
#    3, plain LZ77 XPRESS, in PerfView's real traces (Windows' own ETW
#    compression); 4, XPRESS Huffman; 2, LZNT1;
# 2. when the header announces no format it knows, the buffer says: a payload
#    that opens with a 256-byte table of Huffman code lengths forming a complete
#    prefix code is XPRESS Huffman (a plain XPRESS stream, which opens with a flag
#    word and literals, practically never does), anything else plain XPRESS.
LOGFILE_HEADER_MODE = 0x20            # TRACE_LOGFILE_HEADER.LogFileMode, from the payload
EVENT_TRACE_COMPRESSED_MODE = 0x04000000
COMPRESSION_FORMAT_LZNT1 = 2
COMPRESSION_FORMAT_XPRESS = 3         # Windows' ETW compression; PerfView's traces
COMPRESSION_FORMAT_XPRESS_HUFF = 4
COMPRESSION_FORMAT_NAMES = {COMPRESSION_FORMAT_LZNT1: "LZNT1", COMPRESSION_FORMAT_XPRESS: "XPRESS",
                            COMPRESSION_FORMAT_XPRESS_HUFF: "XPRESS Huffman"}

# Bounds on decompression (a "bomb" is a buffer built to decode to far more than
# it holds).  Real PerfView buffers decode to at most 14 times their size.
MAX_COMPRESSION_RATIO = 256            # decoded payload <= this x the compressed payload
MAX_DECOMPRESSED_BUFFER = 16 * 1024 * 1024
MAX_DECOMPRESSED_FILE = 4 * 1024 * 1024 * 1024

MARKER_FLAGS = 0xC0  # TRACE_HEADER_FLAG | TRACE_HEADER_EVENT_TRACE, the top byte

# HeaderType values (the third byte of an event).
SYSTEM32, SYSTEM64 = 1, 2
COMPACT32, COMPACT64 = 3, 4
FULL_HEADER32, INSTANCE32 = 10, 11
PERFINFO32, PERFINFO64 = 16, 17
EVENT_HEADER32, EVENT_HEADER64 = 18, 19
FULL_HEADER64, INSTANCE64 = 20, 21

SYSTEM_HEADER_SIZES = {SYSTEM32: 0x20, SYSTEM64: 0x20, COMPACT32: 0x18, COMPACT64: 0x18,
                       PERFINFO32: 0x10, PERFINFO64: 0x10}
POINTER_SIZE = {SYSTEM32: 4, SYSTEM64: 8, COMPACT32: 4, COMPACT64: 8, PERFINFO32: 4, PERFINFO64: 8,
                FULL_HEADER32: 4, FULL_HEADER64: 8, EVENT_HEADER32: 4, EVENT_HEADER64: 8,
                INSTANCE32: 4, INSTANCE64: 8}
FULL_HEADER_SIZE = 0x30
EVENT_HEADER_SIZE = 0x50

SYSTEM_PREFIX = struct.Struct("<HBBHBB")                 # Version, HeaderType, Flags, Size, Type, Group
SYSTEM_REST = struct.Struct("<IIQII")                    # ThreadId, ProcessId, SystemTime, KernelTime, UserTime
FULL_HEADER = struct.Struct("<HBBBBHIIq16sII")
EVENT_HEADER = struct.Struct("<HBBHHIIq16sHBBBBHQQ16s")

# Kernel event groups and the classic provider GUIDs consumers show for them.
STACKWALK_GROUP = 0x18
EVENT_TRACE_GROUP = 0x00
STACKWALK_GUID = uuid.UUID("def2fe46-7bd6-4b80-bd94-f57fe20d0ce3")
EVENT_TRACE_GUID = uuid.UUID("68fdd900-4a3e-11d1-84f4-0000f80464e3")
INTEL_PT_GUID = uuid.UUID("ff1fd2fd-6008-42bb-9e75-00a20051f3be")
GROUP_GUIDS = {STACKWALK_GROUP: STACKWALK_GUID, EVENT_TRACE_GROUP: EVENT_TRACE_GUID}

# StackWalk opcodes.
STACK_WALK = 32
STACK_DELETE_DEFINITION = 35
STACK_RUNDOWN_DEFINITION = 36
STACK_KEY_KERNEL = 37
STACK_KEY_USER = 38

# What the first bytes of an .etl file hold: the first buffer's header, then the
# logfile header event (group 0, type 0) with a full system header.
SIGNATURE_SIZE = BUFFER_HEADER_SIZE + SYSTEM_PREFIX.size


def looks_like_etl(head):
    """True when ``head`` (the first SIGNATURE_SIZE or more bytes of a file) starts
    like an .etl file: a plausible first BufferSize and the logfile header event."""
    if len(head) < SIGNATURE_SIZE:
        return False
    buffer_size = BUFFER_HEADER.unpack_from(head)[0]
    _version, header_type, marker, _size, opcode, group = SYSTEM_PREFIX.unpack_from(head, BUFFER_HEADER_SIZE)
    return (BUFFER_HEADER_SIZE < buffer_size <= MAX_BUFFER_SIZE and marker & MARKER_FLAGS == MARKER_FLAGS
            and header_type in (SYSTEM32, SYSTEM64) and group == EVENT_TRACE_GROUP and opcode == 0)
