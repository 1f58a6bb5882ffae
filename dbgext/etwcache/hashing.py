"""The stack hash the kernel uses for the ETW stack cache (RtlStackTraceHashFunction).

Each 64-bit frame is four 16-bit words w0..w3 contributing (w0 ^ w1) + (w2 ^ w3); the
sum over all frames is truncated to 32 bits.

Validating a maximal cache hashes four million frames, so the XORs are done on the
whole stack at once as one big integer (value ^ value >> 16 puts w0^w1 and w2^w3 in
the low half of every 32-bit slot) and the slots are summed by folding the integer.
"""

import struct

_FRAME_MASK = 0xFFFFFFFFFFFFFFFF
_SLOT_MASKS = {}


def _slot_mask(frame_count):
    mask = _SLOT_MASKS.get(frame_count)
    if mask is None:
        mask = int.from_bytes(b"\xff\xff\x00\x00" * (2 * frame_count), "little")
        if len(_SLOT_MASKS) < 4096:
            _SLOT_MASKS[frame_count] = mask
    return mask


def hash_frame_bytes(data):
    """Hash of little-endian 64-bit frames given as bytes (length a multiple of 8)."""
    frame_count = len(data) // 8
    if not frame_count:
        return 0
    value = int.from_bytes(data, "little")
    total = (value ^ (value >> 16)) & _slot_mask(frame_count)
    # Fold the 32-bit slots onto each other until one is left: a slot's sum of at
    # most 2 * frame_count 16-bit values cannot carry into its neighbour while
    # frame_count < 2**15, and longer stacks are summed in slices.
    slots = 2 * frame_count
    if slots > 0x8000:
        return sum(memoryview(total.to_bytes(4 * slots, "little")).cast("I")) & 0xFFFFFFFF
    while slots > 1:
        half = slots // 2
        total = (total & ((1 << (32 * (slots - half))) - 1)) + (total >> (32 * (slots - half)))
        slots -= half
    return total & 0xFFFFFFFF


def stack_hash(frames):
    """32-bit hash of a sequence of 64-bit frame addresses."""
    count = len(frames)
    if not count:
        return 0
    try:
        data = struct.pack("<%dQ" % count, *frames)
    except struct.error:
        data = struct.pack("<%dQ" % count, *[frame & _FRAME_MASK for frame in frames])
    return hash_frame_bytes(data)
