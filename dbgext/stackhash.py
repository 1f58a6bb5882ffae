"""RtlStackTraceHashFunction: the stack hash both the trace database (default
HashFunction) and the ETW stack cache use to pick a bucket.

The frame array is viewed as 16-bit words and ``w[2i] XOR w[2i+1]`` is summed over
consecutive word pairs, truncated to 32 bits.  A pair is one little-endian dword on
both architectures (half an x64 frame, a whole x86 frame), so the hash depends only
on the frames' bytes.

Validating a maximal ETW cache hashes four million frames, so the XORs are done on
the whole array at once as one big integer (``value ^ value >> 16`` leaves each
pair's XOR in the low half of its 32-bit slot) and the slots are summed by folding
the integer onto itself.
"""

import struct

_SLOT_MASKS = {}


def _slot_mask(slots):
    mask = _SLOT_MASKS.get(slots)
    if mask is None:
        mask = int.from_bytes(b"\xff\xff\x00\x00" * slots, "little")
        if len(_SLOT_MASKS) < 4096:
            _SLOT_MASKS[slots] = mask
    return mask


def stack_trace_hash(frame_bytes):
    """The hash of a raw little-endian frame array (length a multiple of 4)."""
    slots = len(frame_bytes) // 4
    if not slots:
        return 0
    value = int.from_bytes(frame_bytes[:4 * slots], "little")
    total = (value ^ (value >> 16)) & _slot_mask(slots)
    # A slot's sum of at most ``slots`` 16-bit values cannot carry into its
    # neighbour while slots < 2**16; longer arrays are summed slot by slot.
    if slots > 0x8000:
        return sum(memoryview(total.to_bytes(4 * slots, "little")).cast("I")) & 0xFFFFFFFF
    while slots > 1:
        half = slots // 2
        total = (total & ((1 << (32 * (slots - half))) - 1)) + (total >> (32 * (slots - half)))
        slots -= half
    return total & 0xFFFFFFFF


def stack_trace_hash_frames(frames, pointer_size=8):
    """The hash of a list of frame addresses of ``pointer_size`` bytes each."""
    char = "Q" if pointer_size == 8 else "I"
    mask = (1 << (8 * pointer_size)) - 1
    try:
        data = struct.pack("<%d%s" % (len(frames), char), *frames)
    except struct.error:  # corrupt frames wider than a pointer: hash what the CPU would
        data = struct.pack("<%d%s" % (len(frames), char), *[frame & mask for frame in frames])
    return stack_trace_hash(data)
