"""Compressed symbol files (``name.pd_``, ``name.sy_``): a Microsoft cabinet holding
one file, as ``symstore /compress`` writes them and symbol servers serve older
files.  Only MSZIP folders are expanded (stdlib :mod:`zlib`); that is what symstore
writes.

Layout ([MS-CAB]): CFHEADER, CFFOLDER entries, CFFILE entries, then each folder's
CFDATA blocks.  An MSZIP block is ``CK`` and a raw deflate stream of at most 32 KiB
of output whose history is the previous block's output.

The cabinet is untrusted input: it is read block by block and written as it is
expanded, never whole in memory; every block is at most 32 KiB out, and the output
stops at the file size the cabinet states and at ``max_bytes``.  Anything wrong is a
:class:`CabinetError` naming the file and the field.
"""

import struct
import zlib

from ..errors import BadInput

CAB_SIGNATURE = b"MSCF"
CFHEADER = struct.Struct("<4sIIIIIBBHHHHH")
CFFOLDER = struct.Struct("<IHH")
CFFILE = struct.Struct("<IIHHHH")
CFDATA = struct.Struct("<IHH")
FLAG_PREVIOUS_CABINET, FLAG_NEXT_CABINET, FLAG_RESERVE_PRESENT = 0x1, 0x2, 0x4
COMPRESSION_NONE, COMPRESSION_MSZIP = 0, 1
COMPRESSION_NAMES = {0: "none", 1: "MSZIP", 2: "Quantum", 3: "LZX"}
MSZIP_SIGNATURE = b"CK"
MSZIP_BLOCK = 32768
MAX_NAME = 256


class CabinetError(BadInput):
    def __init__(self, path, field, detail):
        super().__init__("bad cabinet %s: %s (%s)" % (path, field, detail))


def expand_cabinet(source, output, path, max_bytes):
    """Expand the single file of the cabinet open in ``source`` (a binary file at
    its start) into ``output``; (its name in the cabinet, bytes written)."""
    def fail(field, detail):
        raise CabinetError(path, field, detail)

    def read_exact(size, field):
        data = source.read(size)
        if len(data) != size:
            fail(field, "the file ends after %d of %d bytes" % (len(data), size))
        return data

    header = CFHEADER.unpack(read_exact(CFHEADER.size, "CFHEADER"))
    signature, _, _, _, files_at, _, _, _, folders, files, flags = header[:11]
    if signature != CAB_SIGNATURE:
        fail("signature", "not a cabinet")
    if flags & (FLAG_PREVIOUS_CABINET | FLAG_NEXT_CABINET):
        fail("flags", "a cabinet set spanning several files")
    if folders != 1 or files != 1:
        fail("CFHEADER", "%d folders and %d files, not one file" % (folders, files))
    folder_reserve = data_reserve = 0
    position = CFHEADER.size
    if flags & FLAG_RESERVE_PRESENT:
        header_reserve, folder_reserve, data_reserve = struct.unpack("<HBB", read_exact(4, "reserve sizes"))
        read_exact(header_reserve, "header reserve")
        position += 4 + header_reserve
    data_at, blocks, compression = CFFOLDER.unpack(read_exact(CFFOLDER.size, "CFFOLDER"))
    read_exact(folder_reserve, "folder reserve")
    position += CFFOLDER.size + folder_reserve
    if files_at < position:
        fail("CFFILE offset", "%d inside the headers" % files_at)
    read_exact(files_at - position, "CFFILE offset")
    size, folder_offset = CFFILE.unpack(read_exact(CFFILE.size, "CFFILE"))[:2]
    name = _name(source, path)
    position = files_at + CFFILE.size + len(name) + 1
    if compression & 0xF not in (COMPRESSION_NONE, COMPRESSION_MSZIP):
        fail("compression", "%s, which dbgext does not expand (only MSZIP)"
             % COMPRESSION_NAMES.get(compression & 0xF, "type %d" % (compression & 0xF)))
    if folder_offset:
        fail("CFFILE", "the file starts at %d in its folder" % folder_offset)
    if size > max_bytes:
        fail("CFFILE size", "%d bytes, more than the %d allowed" % (size, max_bytes))
    if data_at < position:
        fail("CFFOLDER data offset", "%d inside the headers" % data_at)
    read_exact(data_at - position, "CFFOLDER data offset")
    written = 0
    history = b""
    for index in range(blocks):
        if written >= size:
            break
        _, packed, unpacked = CFDATA.unpack(read_exact(CFDATA.size, "CFDATA %d" % index))
        read_exact(data_reserve, "CFDATA %d reserve" % index)
        block = read_exact(packed, "CFDATA %d" % index)
        if unpacked > MSZIP_BLOCK or unpacked > size - written:
            fail("CFDATA %d" % index, "%d bytes out, with %d of the file's %d left" % (unpacked, size - written, size))
        if compression & 0xF == COMPRESSION_NONE:
            expanded = block[:unpacked]
        else:
            if block[:2] != MSZIP_SIGNATURE:
                fail("CFDATA %d" % index, "no MSZIP signature")
            expanded = _inflate(block[2:], history, unpacked, lambda detail: fail("CFDATA %d" % index, detail))
        if len(expanded) != unpacked:
            fail("CFDATA %d" % index, "%d bytes out, the block says %d" % (len(expanded), unpacked))
        output.write(expanded)
        written += len(expanded)
        history = (history + expanded)[-MSZIP_BLOCK:]
    if written != size:
        fail("CFDATA", "%d of the file's %d bytes" % (written, size))
    return name.decode("latin-1"), written


def _inflate(data, history, limit, fail):
    """One MSZIP block: raw deflate with the previous block's output as history."""
    try:
        inflater = zlib.decompressobj(-15, zdict=history) if history else zlib.decompressobj(-15)
        expanded = inflater.decompress(data, limit + 1)
    except zlib.error as error:
        fail("deflate: %s" % error)
    if len(expanded) > limit:
        fail("more than the %d bytes the block states" % limit)
    return expanded


def _name(source, path):
    name = b""
    while True:
        byte = source.read(1)
        if not byte:
            raise CabinetError(path, "CFFILE name", "the file ends inside it")
        if byte == b"\0":
            return name
        name += byte
        if len(name) > MAX_NAME:
            raise CabinetError(path, "CFFILE name", "longer than %d bytes" % MAX_NAME)
