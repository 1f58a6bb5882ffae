"""The two XPRESS decompressions of compressed .etl buffers, as [MS-XCA] specifies
them: plain LZ77 ("XPRESS", COMPRESSION_FORMAT_XPRESS, sections 2.3-2.4: what
Windows' own ETW compression and so PerfView's traces hold) in
:func:`decompress_plain`, and LZ77+Huffman ("XPRESS Huffman",
COMPRESSION_FORMAT_XPRESS_HUFF, section 2.2) in :func:`decompress`.

Plain XPRESS: 32-bit little-endian flag words, read from the most significant
bit; a 0 bit is a literal byte, a 1 bit a match: a u16 whose low 3 bits are the
length - 3 and whose high 13 bits the offset - 1.  Length 7 continues in a
nibble (two matches share one byte: the low nibble first, the high nibble at the
next such match), 15 in a byte, 255 in a u16 and, when that is 0, a u32.

Speed of plain XPRESS (in pure Python, what costs is bytecodes and new int
objects per token): each flag word is split into its runs of literals at once
(its 32 bits as text, from a table of the 256 bytes, split at the 1s), a run
is one slice (one byte: one append), and a match is one slice copy (a repeated
pattern when it overlaps itself).  The match words are decoded for every byte
offset of the buffer at once, with one big-int shift and bytes.translate: the
negated offset as a signed 16-bit array and the short length as a byte string,
so a match costs two C index operations and no shifts or masks.  Matches are
checked (before the start, past ``size``) only in the first 8 KiB of output,
where the largest offset could reach before the start, and when they overlap
themselves, where a long length could repeat without bound.

XPRESS Huffman:
The stream is a run of blocks, one per 64 KiB of output.  Each block starts with
256 bytes holding the 4-bit code lengths of 512 symbols (low nibble = even
symbol); canonical Huffman codes follow from the lengths alone.  Then comes a
bit stream read most significant bit first from 16-bit little-endian words, with
the bytes of long match lengths interleaved where the decoder stands when it
needs them.  Symbols 0-255 are literals; 256-511 are matches: the low nibble is
the length - 3 (15 = the length follows in the byte stream: one byte, or 0xFF
then a u16, or 0xFF, 0x0000 then a u32), the high nibble the bit length of the
offset, whose top bit is implied.

Speed of XPRESS Huffman: one lookup per symbol in a 2^15-entry table (symbol << 4 | code length),
a bit buffer refilled seven words at a time from byte-swapped copies of the
input, literals appended and matches copied as slices.
``scripts/bench_xpress.py`` measures it.
"""

import sys
from array import array

from ..errors import BadInput

BLOCK_SIZE = 0x10000
TABLE_SIZE = 256
TABLE_BITS = 15
MIN_MATCH = 3
LITERAL_ENTRIES = 256 << 4           # table entries below this are literals
REFILL_BYTES = 14                    # 7 words per refill (measured: fewer refills beat smaller ints)
REFILL_BITS = 8 * REFILL_BYTES
SYMBOL_AND_OFFSET_BITS = 31          # a code (<= 15 bits) then its offset bits (<= 15), plus one
MASKS = [(1 << n) - 1 for n in range(REFILL_BITS + SYMBOL_AND_OFFSET_BITS)]
PLAIN_MIN_MATCH = 3
PLAIN_LONG_LENGTH = 15 + 7           # what a u16/u32 length counts beyond the 3-bit and nibble steps
PLAIN_MAX_OFFSET = 1 << 13
PLAIN_FLAG_BITS = tuple(format(byte, "08b") for byte in range(256))     # a flag byte as text, high bit first
# By the first byte of a match word: its length, or 0 when the length continues (3-bit field 7).
PLAIN_SHORT_LENGTHS = bytes((byte & 7) + PLAIN_MIN_MATCH if byte & 7 != 7 else 0 for byte in range(256))
# The two bytes of ~(word >> 3), the negated offset as a 16-bit two's complement, from the bytes of
# the input shifted right by 3 bits (see _negated_offsets).
PLAIN_NOT_OFFSET_LOW = bytes(255 - byte for byte in range(256))
PLAIN_NOT_OFFSET_HIGH = bytes(255 - (byte & 31) for byte in range(256))


class XpressError(BadInput):
    """Compressed data that does not decode; the message names the buffer."""



def _extended_length(data, position, end):
    """A match length whose byte was 255 ([MS-XCA] 2.3.4, 2.4.4): the 16-bit word at
    ``position``, or when that is 0 the 32-bit one after it; and the position
    after what was read."""
    length = data[position] | data[position + 1] << 8
    position += 2
    if length == 0:
        if position + 4 > end:
            raise IndexError
        length = int.from_bytes(data[position:position + 4], "little")
        position += 4
    return length, position

def _symbols_by_length(lengths_table):
    """The symbols of each code length 0..15 (4 bits a symbol, low nibble first)."""
    by_length = [[] for _ in range(16)]
    for index, byte in enumerate(lengths_table):
        by_length[byte & 15].append(2 * index)
        by_length[byte >> 4].append(2 * index + 1)
    return by_length


def _coverage(by_length):
    """How much of the 15-bit code space the codes take: 2^15 for a complete code."""
    return sum(len(by_length[length]) << (TABLE_BITS - length) for length in range(1, 16))


def is_complete_code(lengths_table):
    """Whether a 256-byte code-length table forms a complete prefix code."""
    return _coverage(_symbols_by_length(lengths_table)) == 1 << TABLE_BITS


def decoding_table(lengths_table, where="compressed data"):
    """The 2^15-entry lookup list of one block: entry = symbol << 4 | code length,
    indexed by the next 15 bits.  Codes are canonical: shorter codes first, and
    within one length in symbol order ([MS-XCA] 2.2.4)."""
    by_length = _symbols_by_length(lengths_table)
    # Checked before the table is built: an over-subscribed code would make it huge.
    covered = _coverage(by_length)
    if covered != 1 << TABLE_BITS:
        raise XpressError("%s: the Huffman code lengths do not form a complete prefix code (%s)"
                          % (where, "over-subscribed" if covered > 1 << TABLE_BITS else "incomplete"))
    table = []
    for length in range(1, 16):
        span = 1 << (TABLE_BITS - length)
        for symbol in by_length[length]:
            table.extend([symbol << 4 | length] * span)
    return table


def _word_views(data):
    """Two copies of ``data`` with every 16-bit word byte-swapped, one for words at
    even offsets and one for odd, so that ``int.from_bytes(view[p:p + n], "big")``
    is the bit stream from offset p in one call; padded with zeros so that a read
    ahead past the end is harmless (the end is checked where the decoder stands)."""
    views = []
    for parity in (0, 1):
        body = data[parity:]
        words = array("H", body[:len(body) & ~1])
        if sys.byteorder == "little":
            words.byteswap()
        views.append(bytes(parity) + words.tobytes() + body[len(body) & ~1:] + bytes(2 * REFILL_BYTES))
    return views


def decompress(data, size, where="compressed data"):
    """The ``size`` bytes that ``data`` (bytes-like, LZ77+Huffman) decodes to.

    Raises :class:`XpressError` naming ``where`` when the data is corrupt: a code
    table that is not a prefix code, input that ends before the output is
    complete, a match reaching before the start or past ``size``."""
    data = bytes(data)
    end = len(data)
    views = _word_views(data)
    masks = MASKS
    out = bytearray()
    append = out.append
    position = 0
    produced = 0
    try:
        while produced < size:
            if position + TABLE_SIZE + 4 > end:
                raise IndexError
            table = decoding_table(data[position:position + TABLE_SIZE], where)
            position += TABLE_SIZE
            # ``bits`` holds ``available`` unread bits in its low end.  It is filled
            # REFILL_BYTES at a time, ahead of the spec's decoder, which reads one
            # word whenever it holds fewer than 16 bits; the long-length bytes are
            # where that decoder stands, so before reading them the words read
            # ahead are given back.  Refilling below 31 bits leaves enough for a
            # symbol and its offset bits, and at least the spec decoder's 16 bits
            # after the symbol.
            view = views[position & 1]
            bits = int.from_bytes(view[position:position + REFILL_BYTES], "big")
            position += REFILL_BYTES
            available = REFILL_BITS
            block_end = min(produced + BLOCK_SIZE, size)
            while produced < block_end:
                if available < SYMBOL_AND_OFFSET_BITS:
                    bits = (bits & masks[available]) << REFILL_BITS | int.from_bytes(
                        view[position:position + REFILL_BYTES], "big")
                    position += REFILL_BYTES
                    available += REFILL_BITS
                entry = table[(bits >> (available - 15)) & 0x7FFF]
                available -= entry & 15
                if entry < LITERAL_ENTRIES:
                    append(entry >> 4)
                    produced += 1
                    continue
                symbol = (entry >> 4) - 256
                length = symbol & 15
                offset_bits = symbol >> 4
                if length == 15:
                    ahead = (available - 16) >> 4      # the spec's decoder holds 16..31 bits here
                    position -= 2 * ahead
                    available -= 16 * ahead
                    bits >>= 16 * ahead
                    length = data[position]
                    position += 1
                    if length == 255:
                        length, position = _extended_length(data, position, end)
                        if length < 15:
                            raise XpressError("%s: corrupt match length %d at byte 0x%x" % (where, length, position))
                        length -= 15
                    length += 15
                    view = views[position & 1]
                length += MIN_MATCH
                if offset_bits:
                    available -= offset_bits
                    offset = ((bits >> available) & masks[offset_bits]) | 1 << offset_bits
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
                    out += (out[start:produced] * (length // offset + 1))[:length]
                produced += length
            # Back to where the spec's decoder stands (it may be a word further on).
            position -= 2 * ((available - 16) >> 4)
            if position > end:
                raise IndexError
    except IndexError:
        raise XpressError("%s: the compressed data ends at byte 0x%x with %d of %d bytes decoded"
                          % (where, end, produced, size))
    return bytes(out)


def _negated_offsets(data):
    """The negated offset (-1 to -8192) of a match word at every byte offset of
    ``data`` but the last (where no whole word starts), as signed 16-bit ints:
    ``out[back:back + length]`` is the match's copy.  A word that would run past
    the input raises IndexError."""
    count = max(len(data) - 1, 0)
    # In the input shifted right by 3 bits as one integer, byte p is bits 3-10 of the word at p
    # (offset - 1's low byte) and the low 5 bits of byte p + 1 its bits 11-15 (the high byte).
    shifted = (int.from_bytes(data, "little") >> 3).to_bytes(len(data), "little")
    interleaved = bytearray(2 * count)
    interleaved[0::2] = shifted[:count].translate(PLAIN_NOT_OFFSET_LOW)
    interleaved[1::2] = shifted[1:].translate(PLAIN_NOT_OFFSET_HIGH)
    backs = array("h", interleaved)
    if sys.byteorder != "little":
        backs.byteswap()
    return backs


def decompress_plain(data, size, where="compressed data"):
    """The ``size`` bytes that ``data`` (bytes-like, plain LZ77 XPRESS) decodes to.

    Raises :class:`XpressError` naming ``where`` when the data is corrupt: input
    that ends before the output is complete, a match reaching before the start,
    or a checked match (one that repeats itself, or any in the first 8 KiB of
    output) starting before ``size`` and running past it.

    The end is checked once per flag word, not per token: the tokens after the
    last one of a flag word may run past ``size`` or past the input (the writer
    sets the unused flag bits, which read as matches), and both are harmless
    once ``size`` bytes are out.  The output stays bounded: a match that does
    not overlap itself copies at most 8 KiB (its offset), and one that does (the
    only kind a long length can make large) is checked against ``size`` first."""
    data = bytes(data)
    end = len(data)
    backs = _negated_offsets(data)
    short_lengths = data.translate(PLAIN_SHORT_LENGTHS)
    out = bytearray()
    append = out.append
    position = 0
    nibble_at = 0        # the byte whose high nibble the next length-7 match uses, or 0
    # Until 8 KiB are out a match may reach before the start: ``floor`` then sends every match
    # to the checked copy; after, only the ones that overlap themselves go there.
    floor = -PLAIN_MAX_OFFSET
    bits = PLAIN_FLAG_BITS
    try:
        while len(out) < size:
            # The word's bits, most significant first, from the table of bytes (a flag word that
            # would run past the input raises IndexError).
            runs = (bits[data[position + 3]] + bits[data[position + 2]] + bits[data[position + 1]]
                    + bits[data[position]]).split("1")
            position += 4
            last_run = len(runs.pop())                    # the literals after the word's last match
            if floor and len(out) >= PLAIN_MAX_OFFSET:
                floor = 0
            for run in map(len, runs):                    # the literals before each match
                # A run cut by the end of the input comes up short, which the check after the loop sees.
                if run == 1:
                    append(data[position])
                    position += 1
                elif run:
                    out += data[position:position + run]
                    position += run
                back = backs[position]
                length = short_lengths[position]
                position += 2
                if not length:
                    if nibble_at:
                        length = data[nibble_at] >> 4
                        nibble_at = 0
                    else:
                        nibble_at = position
                        length = data[position] & 15
                        position += 1
                    if length == 15:
                        length = data[position]
                        position += 1
                        if length == 255:
                            length, position = _extended_length(data, position, end)
                            if length < PLAIN_LONG_LENGTH:
                                raise XpressError("%s: corrupt match length %d at byte 0x%x"
                                                  % (where, length, position))
                            length -= PLAIN_LONG_LENGTH
                        length += 15
                    length += 7 + PLAIN_MIN_MATCH
                stop = back + length
                if stop < floor:                          # within the output and not overlapping itself
                    out += out[back:stop]
                    continue
                produced = len(out)
                if produced < -back:
                    raise XpressError("%s: a match at output byte 0x%x reaches back 0x%x bytes, before the start"
                                      % (where, produced, -back))
                if produced + length > size:
                    if produced >= size:                  # past the last token: done
                        break
                    raise XpressError("%s: a match at output byte 0x%x runs 0x%x bytes past the expected size "
                                      "0x%x" % (where, produced, produced + length - size, size))
                if stop < 0:
                    out += out[back:stop]
                else:                                     # the match repeats its own start
                    out += (out[back:] * (length // -back + 1))[:length]
            else:
                if last_run:
                    out += data[position:position + last_run]
                    position += last_run
    except IndexError:
        pass             # read past the input: an error only if the output is not complete
    if len(out) < size:
        raise XpressError("%s: the compressed data ends at byte 0x%x with %d of %d bytes decoded"
                          % (where, end, len(out), size))
    return bytes(out[:size]) if len(out) > size else bytes(out)
