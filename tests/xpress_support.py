"""An LZ77+Huffman ([MS-XCA] 2.2) compressor for the tests and the benchmark, and
compressed .etl files built with it.

Plain greedy LZ77 (one hash-chain candidate per 3-byte prefix, offsets up to
0xFFFF, matches may reach into earlier blocks as the format allows), then one
canonical Huffman code per 64 KiB block with lengths capped at 15.  The bit
writer keeps two 16-bit slots reserved ahead, as the spec's encoder does, so the
bytes of long match lengths land exactly where the decoder stands when it reads
them.  This is test support: dbgext itself only decompresses.
"""

import heapq
import struct

from dbgext.etl import format as fmt

BLOCK_SIZE = 0x10000
MIN_MATCH = 3
MAX_OFFSET = 0xFFFF
MAX_CODE_LENGTH = 15
EOF_SYMBOL = 256


def lz77_tokens(data, start, stop, max_match=0xFFFF):
    """Greedy LZ77 over data[start:stop], matches looking back into all of data:
    a list of ints (literal bytes) and (length, offset) tuples."""
    tokens = []
    head = {}
    position = start
    # Earlier blocks are the window too: index their last 64 KiB.
    for index in range(max(0, start - MAX_OFFSET), start):
        head[data[index:index + 3]] = index
    while position < stop:
        key = data[position:position + MIN_MATCH]
        candidate = head.get(key)
        head[key] = position
        if candidate is not None and position - candidate <= MAX_OFFSET and position + MIN_MATCH <= stop:
            limit = min(stop - position, max_match)
            length = 3
            while length < limit and data[candidate + length] == data[position + length]:
                length += 1
            tokens.append((length, position - candidate))
            for index in range(position + 1, position + length):
                head[data[index:index + 3]] = index
            position += length
        else:
            tokens.append(data[position])
            position += 1
    return tokens


def match_symbol(length, offset):
    offset_bits = offset.bit_length() - 1
    return 256 + (offset_bits << 4) + min(length - MIN_MATCH, 15)


def code_lengths(frequencies):
    """Huffman code lengths (at most 15) for 512 symbol frequencies; at least two
    symbols get a code so that the code is complete."""
    frequencies = list(frequencies)
    for symbol in (0, 1):
        if sum(1 for count in frequencies if count) < 2 and not frequencies[symbol]:
            frequencies[symbol] = 1
    while True:
        used = [symbol for symbol, count in enumerate(frequencies) if count]
        heap = [(frequencies[symbol], symbol, (symbol,)) for symbol in used]
        heapq.heapify(heap)
        depth = dict.fromkeys(used, 0)
        tie = len(frequencies)
        while len(heap) > 1:
            count_a, _, group_a = heapq.heappop(heap)
            count_b, _, group_b = heapq.heappop(heap)
            for symbol in group_a + group_b:
                depth[symbol] += 1
            tie += 1
            heapq.heappush(heap, (count_a + count_b, tie, group_a + group_b))
        if max(depth.values()) <= MAX_CODE_LENGTH:
            lengths = [0] * 512
            for symbol, length in depth.items():
                lengths[symbol] = length
            return lengths
        # Flatten the distribution and try again: long codes only come from skew.
        frequencies = [(count + 1) // 2 for count in frequencies]


def canonical_codes(lengths):
    """{symbol: (code, length)}: shorter codes first, symbol order within a length."""
    codes = {}
    code = 0
    for length in range(1, 16):
        for symbol in range(512):
            if lengths[symbol] == length:
                codes[symbol] = (code, length)
                code += 1
        code <<= 1
    return codes


class _BitWriter(object):
    """16-bit words, most significant bit first, with the spec's two reserved
    word slots ahead of the byte stream."""

    def __init__(self, out):
        self.out = out
        self.slot1 = len(out)
        self.slot2 = len(out) + 2
        out += bytes(4)
        self.word = 0
        self.free = 16

    def bits(self, value, count):
        if count == 0:
            return
        if count <= self.free:
            self.word = (self.word << count) | value
            self.free -= count
            return
        spill = count - self.free
        self.word = (self.word << self.free) | (value >> spill)
        self._emit_word()
        self.word = value & ((1 << spill) - 1)
        self.free = 16 - spill

    def _emit_word(self):
        struct.pack_into("<H", self.out, self.slot1, self.word)
        self.slot1 = self.slot2
        self.slot2 = len(self.out)
        self.out += bytes(2)

    def byte_stream(self, data):
        self.out += data

    def finish(self):
        struct.pack_into("<H", self.out, self.slot1, (self.word << self.free) & 0xFFFF)
        struct.pack_into("<H", self.out, self.slot2, 0)


def compress(data):
    """``data`` as LZ77+Huffman bytes that [MS-XCA]'s decoder turns back into it."""
    data = bytes(data)
    out = bytearray()
    blocks = range(0, max(len(data), 1), BLOCK_SIZE)
    for block_start in blocks:
        block_stop = min(block_start + BLOCK_SIZE, len(data))
        tokens = lz77_tokens(data, block_start, block_stop, max_match=block_stop - block_start)
        last = block_stop == len(data)
        frequencies = [0] * 512
        for token in tokens:
            frequencies[token if isinstance(token, int) else match_symbol(*token)] += 1
        if last:
            frequencies[EOF_SYMBOL] += 1
        lengths = code_lengths(frequencies)
        out += bytes(lengths[2 * i] | lengths[2 * i + 1] << 4 for i in range(256))
        codes = canonical_codes(lengths)
        writer = _BitWriter(out)
        for token in tokens:
            if isinstance(token, int):
                writer.bits(*codes[token])
                continue
            length, offset = token
            writer.bits(*codes[match_symbol(length, offset)])
            extra = length - MIN_MATCH
            if extra >= 15:
                extra -= 15
                if extra < 255:
                    writer.byte_stream(bytes([extra]))
                elif extra + 15 <= 0xFFFF:
                    writer.byte_stream(b"\xff" + struct.pack("<H", extra + 15))
                else:
                    writer.byte_stream(b"\xff\x00\x00" + struct.pack("<I", extra + 15))
            offset_bits = offset.bit_length() - 1
            writer.bits(offset - (1 << offset_bits), offset_bits)
        if last:
            writer.bits(*codes[EOF_SYMBOL])
        writer.finish()
    return bytes(out)


# -- [MS-XCA] 3.2's worked examples ----------------------------------------------------

def spec_example_literals():
    """abcdefghijklmnopqrstuvwxyz as 26 literals and EOF, byte for byte as printed."""
    table = bytearray(256)
    table[48:62] = bytes([0x50] + [0x55] * 10 + [0x45, 0x44, 0x04])
    table[128] = 0x04
    return bytes(table) + bytes.fromhex("d8523ed794115be9195ff9d67cdf8d0400000000")


def spec_example_long_match():
    """abc, then one match of length 297 at offset 3, then EOF: "abc" * 100."""
    table = bytearray(256)
    table[48] = 0x30      # 'a' (0x61): 3 bits
    table[49] = 0x23      # 'b': 3 bits, 'c': 2 bits
    table[128] = 0x02     # EOF (256): 2 bits
    table[143] = 0x20     # 287 = 256 + (1 << 4) + 15: 2 bits
    return bytes(table) + bytes.fromhex("a8dc0000ff2601")


# -- compressed .etl files --------------------------------------------------------------

COMPRESSED_MODE = 0x04000000          # EVENT_TRACE_COMPRESSED_MODE in LogFileMode
FORMAT_XPRESS_HUFF = 4                # COMPRESSION_FORMAT_XPRESS_HUFF


def compress_etl(data, skip=(0,), corrupt=()):
    """The .etl bytes ``data`` (uncompressed buffers from EtlWriter) with every
    buffer but those in ``skip`` stored compressed as Windows stores them:
    BufferSize = bytes on disk, SavedOffset = the decompressed size, BufferFlag
    has 0x40, the first buffer's State low word names the format and the
    logfile header's LogFileMode has EVENT_TRACE_COMPRESSED_MODE.  Buffers in
    ``corrupt`` get their compressed bytes damaged."""
    buffers = []
    offset = 0
    while offset < len(data):
        size = struct.unpack_from("<I", data, offset)[0]
        buffers.append(bytearray(data[offset:offset + size]))
        offset += size
    first = buffers[0]
    struct.pack_into("<I", first, 0x2C, FORMAT_XPRESS_HUFF)
    mode_offset = fmt.BUFFER_HEADER_SIZE + 0x20 + 0x20   # system header, then LogFileMode
    struct.pack_into("<I", first, mode_offset, struct.unpack_from("<I", first, mode_offset)[0] | COMPRESSED_MODE)
    out = bytearray()
    for index, buffer in enumerate(buffers):
        if index in skip:
            out += buffer
            continue
        used = struct.unpack_from("<I", buffer, 4)[0]
        packed = bytearray(compress(bytes(buffer[fmt.BUFFER_HEADER_SIZE:used])))
        if index in corrupt:
            for position in range(0, 256, 2):
                packed[position] = 0xFF   # every code length 15: over-subscribed
        header = bytearray(buffer[:fmt.BUFFER_HEADER_SIZE])
        disk_size = (fmt.BUFFER_HEADER_SIZE + len(packed) + 7) & ~7
        struct.pack_into("<I", header, 0, disk_size)
        struct.pack_into("<H", header, 0x34, struct.unpack_from("<H", header, 0x34)[0] | fmt.BUFFER_FLAG_COMPRESSED)
        out += header + packed + bytes(disk_size - fmt.BUFFER_HEADER_SIZE - len(packed))
    return bytes(out)
