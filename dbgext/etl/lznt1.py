"""LZNT1 (COMPRESSION_FORMAT_LZNT1) decompression, as [MS-XCA] section 2.5
specifies it; the third format an .etl file's header can announce.

The stream is a run of chunks, each decoding to at most 4 KiB on its own (no
match reaches into an earlier chunk).  A chunk starts with a u16 header: the low
12 bits are the chunk's stored size - 3, bits 12-14 the signature 3, bit 15 set
when the chunk is compressed (else its bytes are stored as they are).  A header
of 0 ends the stream.  A compressed chunk is a run of flag bytes, each followed by
up to 8 tokens, least significant flag bit first: 0 is a literal byte, 1 a u16
copy token whose split between offset and length depends on how much of the
chunk is decoded: the offset takes max(4, bit length of (position - 1)) bits at
the top, the length - 3 the rest.
"""

from .xpress import XpressError

CHUNK_SIZE = 0x1000
SIGNATURE = 3


def _offset_bits(position):
    """The bits of a copy token's offset when ``position`` bytes of the chunk are out."""
    return max(4, (position - 1).bit_length())


OFFSET_BITS = [0] + [_offset_bits(position) for position in range(1, CHUNK_SIZE + 1)]


def decompress(data, size, where="compressed data"):
    """The ``size`` bytes that ``data`` (bytes-like, LZNT1) decodes to.

    Raises :class:`~dbgext.etl.xpress.XpressError` naming ``where`` when the data
    is corrupt: a chunk header without the signature, a chunk running past the
    input or past 4 KiB of output, a copy reaching before its chunk, input that
    ends before ``size`` bytes are out."""
    data = bytes(data)
    end = len(data)
    out = bytearray()
    position = 0
    while len(out) < size:
        if position + 2 > end:
            break
        header = data[position] | data[position + 1] << 8
        if header == 0:
            break
        if (header >> 12) & 7 != SIGNATURE:
            raise XpressError("%s: no LZNT1 chunk signature at byte 0x%x (header 0x%04x)" % (where, position, header))
        chunk_end = position + (header & 0xFFF) + 3
        if chunk_end > end:
            raise XpressError("%s: the LZNT1 chunk at byte 0x%x runs past the input" % (where, position))
        position += 2
        if not header & 0x8000:
            out += data[position:chunk_end]
            position = chunk_end
            continue
        chunk_start = len(out)
        while position < chunk_end:
            flags = data[position]
            position += 1
            for bit in range(8):
                if position >= chunk_end:
                    break
                if not flags >> bit & 1:
                    out.append(data[position])
                    position += 1
                    continue
                if position + 2 > chunk_end:
                    raise XpressError("%s: an LZNT1 copy token at byte 0x%x is cut by its chunk's end" % (where,
                                                                                                      position))
                token = data[position] | data[position + 1] << 8
                position += 2
                produced = len(out) - chunk_start
                if produced == 0 or produced > CHUNK_SIZE:
                    raise XpressError("%s: an LZNT1 copy at chunk byte 0x%x has nothing to copy from"
                                      % (where, produced))
                length_bits = 16 - OFFSET_BITS[produced]
                offset = (token >> length_bits) + 1
                length = (token & ((1 << length_bits) - 1)) + 3
                if offset > produced:
                    raise XpressError("%s: an LZNT1 copy at chunk byte 0x%x reaches back 0x%x bytes, before its "
                                      "chunk" % (where, produced, offset))
                if produced + length > CHUNK_SIZE:
                    raise XpressError("%s: an LZNT1 chunk decodes to more than 4 KiB" % where)
                start = len(out) - offset
                if offset >= length:
                    out += out[start:start + length]
                else:
                    out += (out[start:] * (length // offset + 1))[:length]
        if len(out) - chunk_start > CHUNK_SIZE:
            raise XpressError("%s: an LZNT1 chunk decodes to more than 4 KiB" % where)
    if len(out) < size:
        raise XpressError("%s: the compressed data ends at byte 0x%x with %d of %d bytes decoded"
                          % (where, position, len(out), size))
    return bytes(out[:size])
