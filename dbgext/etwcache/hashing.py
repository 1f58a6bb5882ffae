"""The stack hash the kernel uses for the ETW stack cache (RtlStackTraceHashFunction).

Each 64-bit frame is four 16-bit words w0..w3 contributing (w0 ^ w1) + (w2 ^ w3); the
sum over all frames is truncated to 32 bits.
"""

import operator
import struct


def stack_hash(frames):
    """32-bit hash of a sequence of 64-bit frame addresses."""
    if not frames:
        return 0
    words = struct.unpack("<%dH" % (4 * len(frames)),
                          struct.pack("<%dQ" % len(frames), *[f & 0xFFFFFFFFFFFFFFFF for f in frames]))
    return sum(map(operator.xor, words[0::2], words[1::2])) & 0xFFFFFFFF
