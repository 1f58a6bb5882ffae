"""LZ77+Huffman ("XPRESS Huffman", COMPRESSION_FORMAT_XPRESS_HUFF) decompression,
as [MS-XCA] section 2.2 specifies it; what compressed .etl buffers hold.

The stream is a run of blocks, one per 64 KiB of output.  Each block starts with
256 bytes holding the 4-bit code lengths of 512 symbols (low nibble = even
symbol); canonical Huffman codes follow from the lengths alone.  Then comes a
bit stream read most significant bit first from 16-bit little-endian words, with
the bytes of long match lengths interleaved where the decoder stands when it
needs them.  Symbols 0-255 are literals; 256-511 are matches: the low nibble is
the length - 3 (15 = the length follows in the byte stream: one byte, or 0xFF
then a u16, or 0xFF, 0x0000 then a u32), the high nibble the bit length of the
offset, whose top bit is implied.

Speed: one lookup per symbol in a 2^15-entry table (symbol << 4 | code length),
a bit buffer refilled 16 bits at a time, literals appended and matches copied
as slices.  ``scripts/bench_xpress.py`` measures it.
"""

from ..errors import BadInput

BLOCK_SIZE = 0x10000
TABLE_SIZE = 256
SYMBOLS = 512
TABLE_BITS = 15
MIN_MATCH = 3


class XpressError(BadInput):
    """Compressed data that does not decode; the message names the buffer."""


def decoding_table(lengths_table, where="compressed data"):
    """The 2^15-entry lookup list of one block: entry = symbol << 4 | code length,
    indexed by the next 15 bits.  Codes are canonical: shorter codes first, and
    within one length in symbol order ([MS-XCA] 2.2.4)."""
    lengths = []
    for byte in lengths_table:
        lengths.append(byte & 15)
        lengths.append(byte >> 4)
    by_length = [[] for _ in range(16)]
    for symbol, length in enumerate(lengths):
        if length:
            by_length[length].append(symbol)
    table = []
    for length in range(1, 16):
        span = 1 << (TABLE_BITS - length)
        for symbol in by_length[length]:
            table.extend([symbol << 4 | length] * span)
    if len(table) != 1 << TABLE_BITS:
        raise XpressError("%s: the Huffman code lengths do not form a complete prefix code (%s)"
                          % (where, "over-subscribed" if len(table) > 1 << TABLE_BITS else "incomplete"))
    return table


def decompress(data, size, where="compressed data"):
    """The ``size`` bytes that ``data`` (bytes-like, LZ77+Huffman) decodes to.

    Raises :class:`XpressError` naming ``where`` when the data is corrupt: a code
    table that is not a prefix code, input that ends before the output is
    complete, a match reaching before the start or past ``size``."""
    data = bytes(data)
    end = len(data)
    out = bytearray()
    append = out.append
    position = 0
    produced = 0
    while produced < size:
        if position + TABLE_SIZE + 4 > end:
            raise XpressError("%s: the compressed data ends at byte 0x%x with %d of %d bytes decoded"
                              % (where, end, produced, size))
        table = decoding_table(data[position:position + TABLE_SIZE], where)
        position += TABLE_SIZE
        # ``bits`` holds ``available`` unread bits in its low end; the spec's
        # 32-bit NextBits with ExtraBitCount = available - 16.
        bits = (data[position] | data[position + 1] << 8) << 16 | data[position + 2] | data[position + 3] << 8
        position += 4
        available = 32
        block_end = min(produced + BLOCK_SIZE, size)
        try:
            while produced < block_end:
                entry = table[(bits >> (available - 15)) & 0x7FFF]
                available -= entry & 15
                if available < 16:
                    bits = (bits & 0xFFFF) << 16 | data[position] | data[position + 1] << 8
                    position += 2
                    available += 16
                symbol = entry >> 4
                if symbol < 256:
                    append(symbol)
                    produced += 1
                    continue
                symbol -= 256
                length = symbol & 15
                offset_bits = symbol >> 4
                if length == 15:
                    length = data[position]
                    position += 1
                    if length == 255:
                        length = data[position] | data[position + 1] << 8
                        position += 2
                        if length == 0:
                            if position + 4 > end:
                                raise IndexError
                            length = int.from_bytes(data[position:position + 4], "little")
                            position += 4
                        if length < 15:
                            raise XpressError("%s: corrupt match length %d at byte 0x%x" % (where, length, position))
                        length -= 15
                    length += 15
                length += MIN_MATCH
                if offset_bits:
                    available -= offset_bits
                    offset = ((bits >> available) & ((1 << offset_bits) - 1)) | 1 << offset_bits
                    if available < 16:
                        bits = (bits & 0xFFFF) << 16 | data[position] | data[position + 1] << 8
                        position += 2
                        available += 16
                else:
                    offset = 1
                start = produced - offset
                if start < 0:
                    raise XpressError("%s: a match at output byte 0x%x reaches back 0x%x bytes, before the start"
                                      % (where, produced, offset))
                if produced + length > size:
                    raise XpressError("%s: a match at output byte 0x%x runs 0x%x bytes past the expected size 0x%x"
                                      % (where, produced, produced + length - size, size))
                if offset >= length:
                    out += out[start:start + length]
                else:
                    pattern = out[start:produced]
                    out += (pattern * (length // offset + 1))[:length]
                produced += length
        except IndexError:
            raise XpressError("%s: the compressed data ends at byte 0x%x with %d of %d bytes decoded"
                              % (where, end, produced, size))
    return bytes(out)
