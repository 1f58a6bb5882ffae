"""The hash functions a trace database may use to place traces in buckets.

RtlStackTraceHashFunction (Windows' default) views the frame array as 16-bit words
and sums ``w[2i] XOR w[2i+1]`` over consecutive word pairs, truncated to 32 bits.
A pair is one little-endian dword on both architectures (half an x64 frame, a whole
x86 frame), so the hash depends only on the frames' bytes.
"""

import struct


def stack_trace_hash(frame_bytes):
    """RtlStackTraceHashFunction over the raw frame array (length a multiple of 4).

    XOR has no carries, so the low and high bytes of the word pairs are XORed as
    whole byte strings (one big-integer XOR each) and summed with ``sum(bytes)``:
    a handful of C-level operations per trace instead of a Python loop per frame."""
    count = len(frame_bytes) // 4
    if count == 0:
        return 0
    low = (int.from_bytes(frame_bytes[0::4], "little")
           ^ int.from_bytes(frame_bytes[2::4], "little")).to_bytes(count, "little")
    high = (int.from_bytes(frame_bytes[1::4], "little")
            ^ int.from_bytes(frame_bytes[3::4], "little")).to_bytes(count, "little")
    return (sum(low) + 256 * sum(high)) & 0xFFFFFFFF


def stack_trace_hash_frames(frames, pointer_size):
    """The default hash of a list of frame addresses."""
    fmt = "<%d%s" % (len(frames), "Q" if pointer_size == 8 else "I")
    return stack_trace_hash(struct.pack(fmt, *frames))


def pointer_sum_hash(frames):
    """The hash the RtlTraceDatabaseCreate documentation describes ("sums the
    pointer values"), truncated to a ULONG; some custom databases use it."""
    return sum(frames) & 0xFFFFFFFF
