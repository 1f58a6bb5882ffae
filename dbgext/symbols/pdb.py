"""A PDB reader of our own: stdlib only, over an mmap of the file, read lazily.

What it reads (see LLVM's "The PDB File Format" documentation for the layouts):

* the MSF 7.0 container: superblock, stream directory, streams as block lists;
* the PDB info stream (1): signature, age and GUID — what a module's CodeView
  (RSDS) record must match;
* the DBI stream (3): module list with each module's symbol stream, the section
  map, and the optional debug header's section-header and OMAP streams, which turn
  ``segment:offset`` into RVAs (:class:`Omap`, both ways, from whichever direction
  the PDB has; without original section headers the ordinary ones are mapped, as
  Syzygy leaves them);
* symbol records: publics (``S_PUB32``) and globals from the symbol record stream,
  procedures with their code sizes (``S_GPROC32``/``S_LPROC32`` and the ``_ID``
  forms, funclets nested in their parents included) and data
  (``S_GDATA32``/``S_LDATA32``) from the module streams;
* the TPI stream (2): structures, unions, classes, enums, pointers, arrays, bit
  fields, modifiers, procedures, field lists (continued through ``LF_INDEX``), every
  CodeView simple type, with forward references resolved to their definitions by name.

Nothing is read until it is asked for: opening reads the superblock, the stream
directory and the info stream's first 28 bytes; publics, procedures and types are
parsed on first use and kept.  Every field that is used is checked against the data
it points into; a bad one raises :class:`PdbError` naming the file and the field, so
a broken PDB is reported once and the analysis goes on without it.

What the file claims, and what bounds it:

=================================  ===============================================
stream count                       MAX_STREAMS and the directory's size
a stream's size                    the file's size (else PdbError)
a stream's block list              each block inside the file and listed once
                                   (else PdbError), checked before anything is copied
the stream directory               one block of block numbers (at most block size / 4)
DBI substream sizes                their sum within the DBI stream
section map entries                the substream's bytes
symbol and type record lengths     the stream they are in
field-list continuations           MAX_FIELD_LIST_CHAIN, cycles stopped
modifier / enum / array chains     MAX_TYPE_DEPTH, followed without recursion; a
                                   record is cached before it is decoded
OMAP entries                       the OMAP stream's bytes
=================================  ===============================================
"""

import bisect
import mmap
import os
import struct
from collections import namedtuple

from ..errors import BadInput
from ..pe import CodeView

MSF_MAGIC = b"Microsoft C/C++ MSF 7.00\r\n\x1aDS\0\0\0"
NIL_STREAM = 0xFFFFFFFF

STREAM_INFO, STREAM_TPI, STREAM_DBI = 1, 2, 3
INFO_IDENTITY_BYTES = 28  # version, signature, age, GUID
NAMES_STREAM = "/names"     # the string table, found through the info stream's named stream map
NAMES_SIGNATURE = 0xEFFEEFFE
MACHINE_X86 = 0x14C  # the DBI stream's machine (IMAGE_FILE_MACHINE_I386)
DBI_HEADER = struct.Struct("<iIIHHHHHHiiiiiIiiHHI")
TPI_HEADER = struct.Struct("<IIIIIHHIIiIiIiI")
MODULE_INFO = struct.Struct("<I28sHHIIIHHIII")
SECTION_HEADER = struct.Struct("<8sIIIIIIHHI")
OMAP_ENTRY = struct.Struct("<II")  # (address in one space, address in the other; 0: none)
# The DBI optional debug header: which stream holds each kind of debug data.
OPTIONAL_DEBUG_FPO, OPTIONAL_DEBUG_FRAME_DATA = 0, 9
OPTIONAL_DEBUG_OMAP_TO_SOURCE, OPTIONAL_DEBUG_OMAP_FROM_SOURCE, OPTIONAL_DEBUG_SECTION_HEADERS = 3, 4, 5
OPTIONAL_DEBUG_ORIGINAL_SECTION_HEADERS = 10

S_END = 0x0006
S_LDATA32, S_GDATA32, S_PUB32 = 0x110C, 0x110D, 0x110E
S_LPROC32, S_GPROC32 = 0x110F, 0x1110
S_LPROC32_ID, S_GPROC32_ID = 0x1146, 0x1147
PROCEDURE_KINDS = {S_LPROC32: False, S_GPROC32: True, S_LPROC32_ID: False, S_GPROC32_ID: True}
DATA_KINDS = {S_LDATA32: False, S_GDATA32: True}
PUBLIC_FUNCTION = 0x2
PUBLIC_CODE = 0x1

LF_MODIFIER, LF_POINTER, LF_PROCEDURE, LF_MFUNCTION = 0x1001, 0x1002, 0x1008, 0x1009
LF_ARGLIST, LF_FIELDLIST, LF_BITFIELD = 0x1201, 0x1203, 0x1205
LF_ARRAY, LF_CLASS, LF_STRUCTURE, LF_UNION, LF_ENUM, LF_INTERFACE = 0x1503, 0x1504, 0x1505, 0x1506, 0x1507, 0x1519
LF_BCLASS, LF_VBCLASS, LF_IVBCLASS, LF_INDEX, LF_VFUNCTAB = 0x1400, 0x1401, 0x1402, 0x1404, 0x1409
LF_ENUMERATE, LF_MEMBER, LF_STMEMBER, LF_METHOD, LF_NESTTYPE, LF_ONEMETHOD = (
    0x1502, 0x150D, 0x150E, 0x150F, 0x1510, 0x1511)
RECORD_KINDS = {LF_CLASS: "class", LF_STRUCTURE: "struct", LF_INTERFACE: "class", LF_UNION: "union"}
UDT_KINDS = (LF_CLASS, LF_STRUCTURE, LF_INTERFACE, LF_UNION, LF_ENUM)
PROPERTY_FORWARD_REF = 0x80
PROPERTY_UNIQUE_NAME = 0x200

# Numeric leaves: a value below 0x8000 is itself; above, a kind and the value after it.
NUMERIC_LEAVES = {0x8000: "<b", 0x8001: "<h", 0x8002: "<H", 0x8003: "<i", 0x8004: "<I",
                  0x8009: "<q", 0x800A: "<Q"}

# Simple (built-in) type indices: low byte = kind, bits 8-11 = pointer mode.  Every
# kind CodeView defines (LLVM's SimpleTypeKind), as kind -> (the name dt shows, size,
# struct format or None).  WinDbg's names where it has one; the rarer kinds are named
# in the same style (Int16B, Float10B, Complex8B...).
SIMPLE_TYPES = {
    0x00: ("None", 0, None), 0x03: ("Void", 0, None), 0x07: ("NotTranslated", 0, None),
    0x08: ("HRESULT", 4, "i"), 0x04: ("Currency", 8, "q"),
    0x10: ("Char", 1, "b"), 0x20: ("UChar", 1, "B"), 0x70: ("Char", 1, "b"), 0x71: ("Wchar", 2, "H"),
    0x7A: ("Char16", 2, "H"), 0x7B: ("Char32", 4, "I"), 0x7C: ("Char8", 1, "B"),
    0x68: ("Char", 1, "b"), 0x69: ("UChar", 1, "B"),
    0x11: ("Int2B", 2, "h"), 0x21: ("Uint2B", 2, "H"), 0x72: ("Int2B", 2, "h"), 0x73: ("Uint2B", 2, "H"),
    0x12: ("Int4B", 4, "i"), 0x22: ("Uint4B", 4, "I"), 0x74: ("Int4B", 4, "i"), 0x75: ("Uint4B", 4, "I"),
    0x13: ("Int8B", 8, "q"), 0x23: ("Uint8B", 8, "Q"), 0x76: ("Int8B", 8, "q"), 0x77: ("Uint8B", 8, "Q"),
    0x14: ("Int16B", 16, None), 0x24: ("Uint16B", 16, None), 0x78: ("Int16B", 16, None),
    0x79: ("Uint16B", 16, None),
    0x46: ("Float2B", 2, "e"), 0x40: ("Float", 4, "f"), 0x45: ("Float", 4, "f"), 0x44: ("Float6B", 6, None),
    0x41: ("Double", 8, "d"), 0x42: ("Float10B", 10, None), 0x43: ("Float16B", 16, None),
    0x56: ("Complex4B", 4, None), 0x50: ("Complex8B", 8, None), 0x55: ("Complex8B", 8, None),
    0x54: ("Complex12B", 12, None), 0x51: ("Complex16B", 16, None), 0x52: ("Complex20B", 20, None),
    0x53: ("Complex32B", 32, None),
    0x30: ("Bool", 1, "B"), 0x31: ("Bool2B", 2, "H"), 0x32: ("Bool4B", 4, "I"), 0x33: ("Bool8B", 8, "Q"),
    0x34: ("Bool16B", 16, None),
}
SIMPLE_POINTER_SIZE = {0x1: 2, 0x2: 4, 0x3: 4, 0x4: 4, 0x5: 6, 0x6: 8, 0x7: 16}  # near, far, huge, near32, far32, near64, near128

# Bounds on what a file states: they cap work, never allocation.
MAX_STREAMS = 1 << 20
MAX_FIELD_LIST_CHAIN = 4096
MAX_TYPE_DEPTH = 64


class PdbError(BadInput):
    """A PDB that cannot be used: one line naming the file and the field."""

    def __init__(self, path, field, detail=""):
        self.path = path
        self.field = field
        super().__init__("bad PDB %s: %s%s" % (path, field, " (%s)" % detail if detail else ""))


# What the symbol streams hold, as dbgext uses it.
Public = namedtuple("Public", "name rva is_function")
Procedure = namedtuple("Procedure", "name rva size is_global type_index")
DataSymbol = namedtuple("DataSymbol", "name rva type_index is_global")
ModuleInfo = namedtuple("ModuleInfo", "name object_name stream symbol_bytes")


class Omap(object):
    """The address map a relink (OMAP: BBT, Syzygy) leaves in a PDB, both ways.

    Each direction is a sorted list of (start, target) pairs: an address maps to
    ``target + (address - start)`` of the last pair starting at or below it, and to
    nothing when that target is 0.  A PDB may carry one direction only; the other
    is then the inverse of the one it has."""

    def __init__(self, from_source, to_source):
        self._to_image = _omap_table(from_source if from_source else _inverse(to_source))
        self._to_source = _omap_table(to_source if to_source else _inverse(from_source))

    def to_image(self, rva):
        return _omap_lookup(self._to_image, rva)

    def to_source(self, rva):
        return _omap_lookup(self._to_source, rva)


def _inverse(pairs):
    return [(target, start) for start, target in pairs if target]


def _omap_table(pairs):
    pairs = sorted(pairs)
    return [start for start, _ in pairs], [target for _, target in pairs]


def _omap_lookup(table, rva):
    starts, targets = table
    index = bisect.bisect_right(starts, rva) - 1
    if index < 0 or targets[index] == 0:
        return None
    return targets[index] + rva - starts[index]


class MsfFile(object):
    """The MSF 7.0 container: numbered streams made of fixed-size blocks."""

    def __init__(self, path):
        self.path = path
        try:
            self._handle = open(path, "rb")
        except OSError as error:
            raise BadInput("cannot read %s: %s" % (path, error.strerror or error))
        try:
            size = os.fstat(self._handle.fileno()).st_size
            if size < len(MSF_MAGIC) + 24:
                raise PdbError(path, "superblock", "file of %d bytes" % size)
            self._map = mmap.mmap(self._handle.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError, PdbError) as error:
            self._handle.close()
            if isinstance(error, PdbError):
                raise
            raise BadInput("cannot map %s: %s" % (path, error))
        try:
            self._read_directory()
        except BaseException:
            self.close()
            raise

    def fail(self, field, detail=""):
        raise PdbError(self.path, field, detail)

    def _read_directory(self):
        data = self._map
        if data[:len(MSF_MAGIC)] != MSF_MAGIC:
            self.fail("MSF signature", "not an MSF 7.00 file")
        (self.block_size, _, self.block_count, directory_bytes, _,
         block_map_block) = struct.unpack_from("<6I", data, len(MSF_MAGIC))
        if self.block_size not in (512, 1024, 2048, 4096, 8192, 16384, 32768):
            self.fail("block size", "%d" % self.block_size)
        if self.block_count * self.block_size > len(data):
            self.fail("block count", "%d blocks of %d bytes in a file of %d bytes"
                      % (self.block_count, self.block_size, len(data)))
        directory_blocks = -(-directory_bytes // self.block_size)
        if directory_bytes < 4 or directory_blocks * 4 > self.block_size:
            self.fail("stream directory size", "%d bytes" % directory_bytes)
        if not 0 < block_map_block < self.block_count:
            self.fail("block map address", "block %d" % block_map_block)
        block_list = struct.unpack_from("<%dI" % directory_blocks, data, block_map_block * self.block_size)
        self._check_blocks(block_list, "stream directory")
        directory = self._join(block_list, directory_bytes)
        stream_count = struct.unpack_from("<I", directory)[0]
        if stream_count > MAX_STREAMS or 4 + 4 * stream_count > directory_bytes:
            self.fail("stream count", "%d" % stream_count)
        sizes = struct.unpack_from("<%dI" % stream_count, directory, 4)
        cursor = 4 + 4 * stream_count
        self._streams = []
        file_bytes = self.block_count * self.block_size
        for index, size in enumerate(sizes):
            if size == NIL_STREAM:
                self._streams.append((0, ()))
                continue
            # A stream is at most the file, each block of it listed once: what a
            # stream costs to read is then bounded by the file, whatever it claims.
            if size > file_bytes:
                self.fail("stream %d size" % index, "%d bytes in a file of %d" % (size, file_bytes))
            count = -(-size // self.block_size)
            if cursor + 4 * count > directory_bytes:
                self.fail("stream %d block list" % index, "directory ends at byte %d" % directory_bytes)
            blocks = struct.unpack_from("<%dI" % count, directory, cursor)
            cursor += 4 * count
            self._check_blocks(blocks, "stream %d block list" % index)
            self._streams.append((size, blocks))

    def _check_blocks(self, blocks, what):
        """PdbError unless every block lies in the file and none is listed twice."""
        if len(set(blocks)) != len(blocks):
            seen = set()
            for block in blocks:
                if block in seen:
                    self.fail(what, "block %d listed twice" % block)
                seen.add(block)
        for block in blocks:
            if not 0 < block < self.block_count:
                self.fail(what, "block %d outside the file's %d blocks" % (block, self.block_count))

    def _join(self, blocks, size):
        """The bytes of checked blocks (:meth:`_check_blocks`), cut to ``size``."""
        size_per_block = self.block_size
        pieces = []
        run_start = run_end = None
        for block in blocks:
            if run_end == block:
                run_end += 1
                continue
            if run_start is not None:
                pieces.append(self._map[run_start * size_per_block:run_end * size_per_block])
            run_start, run_end = block, block + 1
        if run_start is not None:
            pieces.append(self._map[run_start * size_per_block:run_end * size_per_block])
        data = b"".join(pieces)
        return data[:size] if len(data) > size else data

    def stream_size(self, index):
        return self._streams[index][0] if 0 <= index < len(self._streams) else 0

    def stream(self, index, what=None, limit=None):
        """Stream ``index``'s bytes (its first ``limit`` bytes when given); ``what``
        names it in errors."""
        if not 0 <= index < len(self._streams):
            self.fail(what or "stream %d" % index, "stream %d of %d" % (index, len(self._streams)))
        size, blocks = self._streams[index]
        if limit is not None and limit < size:
            size = limit
            blocks = blocks[:-(-limit // self.block_size)]
        return self._join(blocks, size)

    @property
    def closed(self):
        return getattr(self, "_map", None) is None

    def close(self):
        if getattr(self, "_map", None) is not None:
            self._map.close()
            self._map = None
        self._handle.close()


class PdbFile(object):
    """One PDB: identity on open, everything else on first use."""

    def __init__(self, path):
        self.path = path
        self.msf = MsfFile(path)
        try:
            self._read_info()
        except BaseException:
            self.msf.close()
            raise
        self._dbi = None
        self._publics = None
        self._global_data = None
        self._procedures = None
        self._module_data = None
        self._data = None
        self._sections = None
        self._types = None

    def fail(self, field, detail=""):
        raise PdbError(self.path, field, detail)

    # -- identity ------------------------------------------------------------------------

    def _read_info(self):
        # Only the identity is read before the GUID check: the rest (named streams,
        # features) is never needed.
        info = self.msf.stream(STREAM_INFO, "PDB info stream", limit=INFO_IDENTITY_BYTES)
        if len(info) < 28:
            self.fail("PDB info stream", "%d bytes" % len(info))
        self.version, self.signature, self.age = struct.unpack_from("<III", info)
        self.guid = bytes(info[12:28])

    @property
    def codeview(self):
        """This PDB's identity in the shape of an image's RSDS record."""
        return CodeView(self.guid, self.age, os.path.basename(self.path))

    @property
    def guid_text(self):
        return self.codeview.guid_text

    def matches(self, guid, age):
        """True when this PDB belongs to an image whose RSDS record says (guid, age).
        The DBI stream's age is the one debuggers compare (the info stream's may be
        bumped by later tools); both are accepted."""
        return guid == self.guid and age in (self.age, self.dbi_age)

    # -- DBI -----------------------------------------------------------------------------

    @property
    def dbi(self):
        if self._dbi is None:
            self._dbi = self._read_dbi()
        return self._dbi

    @property
    def dbi_age(self):
        return self.dbi["age"]

    @property
    def machine(self):
        return self.dbi["machine"]

    @property
    def is_x86(self):
        return self.machine == MACHINE_X86

    @property
    def pointer_size(self):
        return 4 if self.is_x86 else 8

    def _read_dbi(self):
        data = self.msf.stream(STREAM_DBI, "DBI stream")
        if len(data) < DBI_HEADER.size:
            self.fail("DBI header", "%d bytes" % len(data))
        (signature, _, age, _, _, public_stream, _, symbol_record_stream, _, module_info_size,
         contribution_size, section_map_size, source_info_size, type_server_size, _,
         optional_debug_size, ec_size, _, machine, _) = DBI_HEADER.unpack_from(data)
        if signature != -1:
            self.fail("DBI signature", "%d" % signature)
        sizes = (module_info_size, contribution_size, section_map_size, source_info_size, type_server_size,
                 ec_size, optional_debug_size)
        if any(size < 0 for size in sizes) or DBI_HEADER.size + sum(sizes) > len(data):
            self.fail("DBI substream sizes", "%s in a stream of %d bytes" % (list(sizes), len(data)))
        cursor = DBI_HEADER.size
        module_info = data[cursor:cursor + module_info_size]
        cursor += module_info_size + contribution_size
        section_map = data[cursor:cursor + section_map_size]
        cursor += section_map_size + source_info_size + type_server_size + ec_size
        optional = data[cursor:cursor + optional_debug_size]
        optional_streams = struct.unpack_from("<%dH" % (len(optional) // 2), optional)
        return {"age": age, "machine": machine, "public_stream": public_stream,
                "symbol_record_stream": symbol_record_stream,
                "modules": self._read_modules(module_info),
                "section_map": self._read_section_map(section_map),
                "optional_streams": optional_streams}

    def _read_modules(self, data):
        modules = []
        cursor = 0
        while cursor + MODULE_INFO.size <= len(data):
            fields = MODULE_INFO.unpack_from(data, cursor)
            stream, symbol_bytes = fields[3], fields[4]
            name, cursor = _cstring(data, cursor + MODULE_INFO.size)
            object_name, cursor = _cstring(data, cursor)
            cursor = (cursor + 3) & ~3
            modules.append(ModuleInfo(name, object_name, stream if stream != 0xFFFF else None, symbol_bytes))
        return modules

    def _read_section_map(self, data):
        """The section map's (flags, frame, length) entries: which segment numbers
        exist.  RVAs come from the section headers stream."""
        if len(data) < 4:
            return []
        count = struct.unpack_from("<H", data)[0]
        if 4 + 20 * count > len(data):
            self.fail("section map", "%d entries in %d bytes" % (count, len(data)))
        return [struct.unpack_from("<HHHHHHII", data, 4 + 20 * index) for index in range(count)]

    @property
    def modules(self):
        return self.dbi["modules"]

    def string_table(self):
        """The ``/names`` stream's string buffer (named in the PDB info stream's
        named stream map), or b"" when the PDB has none.  FrameData program strings
        are offsets into it."""
        info = self.msf.stream(STREAM_INFO, "PDB info stream")
        try:
            buffer_size = struct.unpack_from("<I", info, 28)[0]
            buffer = info[32:32 + buffer_size]
            at = 32 + buffer_size
            _, _, present_words = struct.unpack_from("<III", info, at)  # size, capacity, words
            at += 12
            present = struct.unpack_from("<%dI" % present_words, info, at)
            at += 4 * present_words
            deleted_words = struct.unpack_from("<I", info, at)[0]
            at += 4 + 4 * deleted_words
            stream = None
            for _ in range(sum(bin(word).count("1") for word in present)):
                key, value = struct.unpack_from("<II", info, at)
                at += 8
                end = buffer.find(b"\0", key)
                if buffer[key:end] == NAMES_STREAM.encode():
                    stream = value
        except struct.error:
            self.fail("named stream map", "cut short")
        if stream is None:
            return b""
        names = self.msf.stream(stream, "/names stream")
        if len(names) < 12 or struct.unpack_from("<I", names)[0] != NAMES_SIGNATURE:
            self.fail("/names stream", "no string table signature")
        size = struct.unpack_from("<I", names, 8)[0]
        return names[12:12 + size]

    # -- segment:offset -> RVA ---------------------------------------------------------------

    def debug_stream(self, kind, what=None):
        """The bytes of the optional debug header's stream ``kind``
        (``OPTIONAL_DEBUG_FPO``, ``OPTIONAL_DEBUG_FRAME_DATA``...), or None when the
        PDB has none.  Its addresses are the ones before any relink:
        :meth:`source_rva` maps an image RVA to them."""
        stream = self._optional_stream(kind)
        return self.msf.stream(stream, what or "optional debug stream %d" % kind) if stream is not None else None

    def _optional_stream(self, index):
        streams = self.dbi["optional_streams"]
        if index < len(streams) and streams[index] != 0xFFFF and self.msf.stream_size(streams[index]):
            return streams[index]
        return None

    def _section_rvas(self, index, what):
        stream = self._optional_stream(index)
        if stream is None:
            return None
        data = self.msf.stream(stream, what)
        return [SECTION_HEADER.unpack_from(data, at)[2]
                for at in range(0, len(data) - SECTION_HEADER.size + 1, SECTION_HEADER.size)]

    @property
    def sections(self):
        """(segment RVAs, :class:`Omap` or None): segment N (1-based) starts at
        rvas[N-1], in the address space the symbols were written in."""
        if self._sections is None:
            from_source = self._omap(OPTIONAL_DEBUG_OMAP_FROM_SOURCE, "OMAP-from-source stream")
            to_source = self._omap(OPTIONAL_DEBUG_OMAP_TO_SOURCE, "OMAP-to-source stream")
            omap = Omap(from_source, to_source) if from_source or to_source else None
            rvas = None
            if omap is not None:
                # Symbols are in the addresses before the relink: the original headers
                # when the PDB kept them, else (Syzygy does this) the ordinary ones.
                rvas = self._section_rvas(OPTIONAL_DEBUG_ORIGINAL_SECTION_HEADERS, "original section headers")
            if rvas is None:
                rvas = self._section_rvas(OPTIONAL_DEBUG_SECTION_HEADERS, "section headers")
            if rvas is None:
                self.fail("section headers stream", "missing from the DBI optional debug header")
            self._sections = (rvas, omap)
        return self._sections

    def _omap(self, index, what):
        """An OMAP stream's (from, to) pairs, or None when the PDB lacks it."""
        stream = self._optional_stream(index)
        if stream is None:
            return None
        data = self.msf.stream(stream, what)
        return list(OMAP_ENTRY.iter_unpack(data[:len(data) // OMAP_ENTRY.size * OMAP_ENTRY.size])) or None

    def rva(self, segment, offset):
        """The RVA of ``segment:offset`` in the image, or None for a segment the PDB
        doesn't have or code the relink removed."""
        rvas, omap = self.sections
        if not 1 <= segment <= len(rvas):
            return None
        rva = rvas[segment - 1] + offset
        return rva if omap is None else omap.to_image(rva)

    def source_rva(self, rva):
        """The address before the relink of the image's ``rva`` (what the PDB's own
        address-keyed tables, such as FPO and frame data, are written in); ``rva``
        itself when the PDB has no OMAP; None for code the relink added."""
        omap = self.sections[1]
        return rva if omap is None else omap.to_source(rva)

    # -- symbols ---------------------------------------------------------------------------

    def publics(self):
        """Every ``S_PUB32`` of the symbol record stream, names as stored (decorated)."""
        if self._publics is None:
            self._read_symbol_records()
        return self._publics

    def _read_symbol_records(self):
        """Publics and global data (``S_GDATA32``: C++ static members, globals of
        modules without debug info) from the symbol record stream, in one pass."""
        stream = self.dbi["symbol_record_stream"]
        publics, data_symbols = [], []
        if stream != 0xFFFF and self.msf.stream_size(stream):
            data = self.msf.stream(stream, "symbol record stream")
            for kind, at, end in _records(data, self, "symbol record stream"):
                if kind == S_PUB32 and end - at >= 10:
                    flags, offset, segment = struct.unpack_from("<IIH", data, at)
                    rva = self.rva(segment, offset)
                    if rva is not None:
                        publics.append(Public(_name(data, at + 10, end), rva,
                                              bool(flags & (PUBLIC_FUNCTION | PUBLIC_CODE))))
                elif kind in DATA_KINDS and end - at >= 10:
                    type_index, offset, segment = struct.unpack_from("<IIH", data, at)
                    rva = self.rva(segment, offset)
                    if rva is not None:
                        data_symbols.append(DataSymbol(_name(data, at + 10, end), rva, type_index,
                                                       DATA_KINDS[kind]))
        self._publics, self._global_data = publics, data_symbols

    def _read_module_symbols(self):
        procedures, data_symbols = [], []
        for module in self.modules:
            if module.stream is None or module.symbol_bytes < 4:
                continue
            what = "module %s symbol stream" % module.name
            data = self.msf.stream(module.stream, what)
            if module.symbol_bytes > len(data):
                self.fail(what, "%d symbol bytes in a stream of %d" % (module.symbol_bytes, len(data)))
            data = data[:module.symbol_bytes]
            unpack_from = struct.unpack_from
            # Records follow the CV_SIGNATURE_C13 word; procedures nest (a funclet,
            # ``dtor$0``, ``catch$0``, lies inside its parent's body), so every record is read.
            for kind, payload, end in _records(data, self, what, start=4):
                if kind in PROCEDURE_KINDS and end - payload >= 35:
                    (_, _, _, code_size, _, _, type_index, offset,
                     segment) = unpack_from("<IIIIIIIIH", data, payload)
                    rva = self.rva(segment, offset)
                    if rva is not None:
                        procedures.append(Procedure(_name(data, payload + 35, end), rva, code_size,
                                                    PROCEDURE_KINDS[kind], type_index))
                elif kind in DATA_KINDS and end - payload >= 10:
                    type_index, offset, segment = unpack_from("<IIH", data, payload)
                    rva = self.rva(segment, offset)
                    if rva is not None:
                        data_symbols.append(DataSymbol(_name(data, payload + 10, end), rva, type_index,
                                                       DATA_KINDS[kind]))
        self._procedures, self._module_data = procedures, data_symbols

    def procedures(self):
        """Functions with their code sizes, from every module's symbol stream."""
        if self._procedures is None:
            self._read_module_symbols()
        return self._procedures

    def data(self):
        """Global and static variables: the module streams' and the global ones."""
        if self._data is None:
            if self._procedures is None:
                self._read_module_symbols()
            if self._publics is None:
                self._read_symbol_records()
            seen = set((symbol.name, symbol.rva) for symbol in self._module_data)
            self._data = self._module_data + [symbol for symbol in self._global_data
                                              if (symbol.name, symbol.rva) not in seen]
        return self._data

    # -- types --------------------------------------------------------------------------------

    @property
    def types(self):
        if self._types is None:
            self._types = TypeTable(self.msf.stream(STREAM_TPI, "TPI stream"), self.path, self.pointer_size)
        return self._types

    @property
    def closed(self):
        return self.msf.closed

    def close(self):
        self.msf.close()


def _records(data, pdb, what, start=0):
    """(kind, payload start, end) of each record in a symbol stream."""
    at = start
    limit = len(data)
    unpack_from = struct.unpack_from
    while at + 4 <= limit:
        length, kind = unpack_from("<HH", data, at)
        end = at + 2 + length
        if length < 2 or end > limit:
            pdb.fail(what, "record at offset %d runs past the stream" % at)
        yield kind, at + 4, end
        at = end


def _cstring(data, at):
    end = data.find(b"\0", at)
    if end < 0:
        end = len(data)
    return data[at:end].decode("utf-8", "replace"), end + 1


def _name(data, at, end):
    return _cstring_until(data, at, end)[0]


# -- types ------------------------------------------------------------------------------------

class Member(object):
    __slots__ = ("name", "offset", "type_index")

    def __init__(self, name, offset, type_index):
        self.name = name
        self.offset = offset
        self.type_index = type_index


class CvType(object):
    """One type record, decoded.  ``kind``: base, pointer, modifier, array, bitfield,
    struct, union, class, enum, procedure, fieldlist, arglist or unknown.  Only the
    attributes of its kind are set (the others stay None)."""

    __slots__ = ("index", "kind", "name", "size", "element", "fields", "enumerators", "bit_position",
                 "bit_length", "forward", "field_list", "fmt")

    def __init__(self, index, kind, name=None, size=None, element=None):
        self.index = index
        self.kind = kind
        self.name = name
        self.size = size
        self.element = element  # pointee, modified, element, bit-field base, return type
        self.fields = None
        self.enumerators = None
        self.bit_position = None
        self.bit_length = None
        self.forward = False
        self.field_list = None
        self.fmt = None

    def __repr__(self):
        return "CvType(0x%x, %s, %r, size=%r)" % (self.index, self.kind, self.name, self.size)


class TypeTable(object):
    """The TPI stream's records, decoded on demand and cached by type index."""

    def __init__(self, data, path, pointer_size):
        self.path = path
        self.pointer_size = pointer_size
        self._data = data
        if len(data) < TPI_HEADER.size:
            raise PdbError(path, "TPI header", "%d bytes" % len(data))
        (_, header_size, self.first_index, self.end_index, record_bytes) = TPI_HEADER.unpack_from(data)[:5]
        if header_size < TPI_HEADER.size or header_size + record_bytes > len(data) \
                or self.end_index < self.first_index or self.first_index < 0x1000:
            raise PdbError(path, "TPI header", "header %d bytes, %d record bytes, indices 0x%x-0x%x in %d bytes"
                           % (header_size, record_bytes, self.first_index, self.end_index, len(data)))
        self._start = header_size
        self._limit = header_size + record_bytes
        self._offsets = None
        self._by_name = None
        self._cache = {}

    def fail(self, field, detail=""):
        raise PdbError(self.path, field, detail)

    @property
    def offsets(self):
        if self._offsets is None:
            offsets = []
            at, limit, data = self._start, self._limit, self._data
            unpack_from = struct.unpack_from
            count = self.end_index - self.first_index
            while at + 4 <= limit and len(offsets) < count:
                length = unpack_from("<H", data, at)[0]
                if length < 2 or at + 2 + length > limit:
                    self.fail("type record 0x%x" % (self.first_index + len(offsets)),
                              "length %d at offset %d" % (length, at))
                offsets.append(at)
                at += 2 + length
            self._offsets = offsets
        return self._offsets

    def _by_names(self):
        """{name: index} of every named structure, union, class and enum; a
        definition wins over a forward reference."""
        if self._by_name is None:
            names = {}
            data = self._data
            unpack_from = struct.unpack_from
            for position, at in enumerate(self.offsets):
                length, kind = unpack_from("<HH", data, at)
                if kind not in UDT_KINDS:
                    continue
                record = self.get(self.first_index + position)
                if record.name is None:
                    continue
                if record.name not in names or (not record.forward and self.get(names[record.name]).forward):
                    names[record.name] = record.index
            self._by_name = names
        return self._by_name

    def names(self):
        """Names of the defined structures, unions, classes and enums."""
        return sorted(name for name, index in self._by_names().items() if not self.get(index).forward)

    def find(self, name):
        """The definition of the structure/union/class/enum called ``name``, or None."""
        index = self._by_names().get(name)
        return self.resolve(self.get(index)) if index is not None else None

    def resolve(self, record):
        """A forward reference's definition (the record itself if it is none)."""
        if record is not None and record.forward and record.name:
            index = self._by_names().get(record.name)
            if index is not None:
                return self.get(index)
        return record

    def get(self, index):
        cached = self._cache.get(index)
        if cached is not None:
            return cached
        if index < self.first_index:
            record = _simple_type(index, self.pointer_size)
        elif index >= self.first_index + len(self.offsets):
            record = CvType(index, "unknown", "<type 0x%x>" % index)
        else:
            # Cached before decoding: a record that names itself (or a cycle back to
            # it) finds this placeholder instead of recursing.
            self._cache[index] = CvType(index, "unknown", "<type 0x%x>" % index)
            record = self._decode(index)
        self._cache[index] = record
        return record

    def _decode(self, index):
        data = self._data
        at = self.offsets[index - self.first_index]
        length, kind = struct.unpack_from("<HH", data, at)
        start, end = at + 4, at + 2 + length
        try:
            return self._decode_leaf(index, kind, data, start, end)
        except (struct.error, IndexError):
            self.fail("type record 0x%x" % index, "leaf 0x%04x shorter than its fields" % kind)

    def _decode_leaf(self, index, kind, data, at, end):
        unpack_from = struct.unpack_from
        if kind in RECORD_KINDS:
            _, properties, field_list = unpack_from("<HHI", data, at)
            # Classes and structures carry derivation and vshape indices before their size.
            size, cursor = _numeric(data, at + (8 if kind == LF_UNION else 16), end)
            record = CvType(index, RECORD_KINDS[kind], _name(data, cursor, end), size)
            record.forward = bool(properties & PROPERTY_FORWARD_REF)
            record.field_list = field_list
            return record
        if kind == LF_ENUM:
            count, properties, underlying, field_list = unpack_from("<HHII", data, at)
            base = self._enum_base(underlying)
            record = CvType(index, "enum", _name(data, at + 12, end), base.size, underlying)
            record.forward = bool(properties & PROPERTY_FORWARD_REF)
            record.field_list = field_list
            record.fmt = base.fmt
            return record
        if kind == LF_POINTER:
            referent, attributes = unpack_from("<II", data, at)
            size = (attributes >> 13) & 0x3F or self.pointer_size
            return _pointer(index, size, referent, self.pointer_size)
        if kind == LF_MODIFIER:
            return CvType(index, "modifier", None, None, unpack_from("<I", data, at)[0])
        if kind == LF_ARRAY:
            element, _ = unpack_from("<II", data, at)
            size, cursor = _numeric(data, at + 8, end)
            return CvType(index, "array", _name(data, cursor, end) or None, size, element)
        if kind == LF_BITFIELD:
            base, bit_length, bit_position = unpack_from("<IBB", data, at)
            record = CvType(index, "bitfield", None, None, base)
            record.bit_length, record.bit_position = bit_length, bit_position
            return record
        if kind in (LF_PROCEDURE, LF_MFUNCTION):
            return_type = unpack_from("<I", data, at)[0]
            arglist = unpack_from("<I", data, at + (8 if kind == LF_PROCEDURE else 16))[0]
            record = CvType(index, "procedure", None, None, return_type)
            record.field_list = arglist
            return record
        if kind == LF_ARGLIST:
            count = unpack_from("<I", data, at)[0]
            if at + 4 + 4 * count > end:
                self.fail("type record 0x%x" % index, "argument list of %d entries" % count)
            return CvType(index, "arglist")
        if kind == LF_FIELDLIST:
            record = CvType(index, "fieldlist")
            record.fields, record.enumerators, record.field_list = _field_list(data, at, end, self, index)
            return record
        return CvType(index, "unknown", "<leaf 0x%04x>" % kind)

    def _enum_base(self, index):
        """The integer type under an enum, followed through modifiers and enums
        named as underlying types by reading their raw records (no recursion),
        at most MAX_TYPE_DEPTH steps; an unknown type when the chain does not end."""
        data = self._data
        for _ in range(MAX_TYPE_DEPTH):
            if not self.first_index <= index < self.first_index + len(self.offsets):
                return self.get(index)
            at = self.offsets[index - self.first_index]
            length, kind = struct.unpack_from("<HH", data, at)
            if kind == LF_ENUM and length >= 10:
                index = struct.unpack_from("<I", data, at + 8)[0]
            elif kind == LF_MODIFIER and length >= 6:
                index = struct.unpack_from("<I", data, at + 4)[0]
            else:
                return self.get(index)
        return CvType(index, "unknown", "<type 0x%x: a chain of more than %d enums>" % (index, MAX_TYPE_DEPTH))

    # -- structure members ---------------------------------------------------------------------

    def members(self, record):
        """``record``'s (struct/union/class) data members in declaration order,
        continued field lists followed; [] for a forward reference with no definition."""
        fields, _ = self._field_list_items(self.resolve(record))
        return fields

    def enumerators(self, record):
        _, values = self._field_list_items(self.resolve(record))
        return values

    def _field_list_items(self, record):
        fields, values = [], []
        index = record.field_list if record is not None else None
        seen = set()
        while index and index not in seen and len(seen) < MAX_FIELD_LIST_CHAIN:
            seen.add(index)
            field_list = self.get(index)
            if field_list.kind != "fieldlist":
                break
            fields.extend(field_list.fields)
            values.extend(field_list.enumerators)
            index = field_list.field_list  # LF_INDEX continuation
        return fields, values

    def strip(self, index, depth=0):
        """The type under modifiers, forward references resolved."""
        record = self.resolve(self.get(index))
        while record.kind == "modifier" and depth < MAX_TYPE_DEPTH:
            record = self.resolve(self.get(record.element))
            depth += 1
        return record


def _field_list(data, at, end, table, index):
    """(members, enumerators, continuation index) of one LF_FIELDLIST record."""
    unpack_from = struct.unpack_from
    members, enumerators, continuation = [], [], None
    while at + 2 <= end:
        if data[at] >= 0xF0:  # LF_PAD bytes: the low nibble says how far the next member is
            at += data[at] & 0x0F or 1
            continue
        leaf = unpack_from("<H", data, at)[0]
        if leaf == LF_MEMBER:
            type_index = unpack_from("<I", data, at + 4)[0]
            offset, cursor = _numeric(data, at + 8, end)
            name, at = _cstring_until(data, cursor, end)
            members.append(Member(name, offset, type_index))
        elif leaf == LF_ENUMERATE:
            value, cursor = _numeric(data, at + 4, end)
            name, at = _cstring_until(data, cursor, end)
            enumerators.append((name, value))
        elif leaf == LF_INDEX:
            continuation = unpack_from("<I", data, at + 4)[0]
            at += 8
        elif leaf in (LF_NESTTYPE, LF_STMEMBER):
            _, at = _cstring_until(data, at + 8, end)
        elif leaf == LF_BCLASS:
            _, at = _numeric(data, at + 8, end)
        elif leaf in (LF_VBCLASS, LF_IVBCLASS):
            _, cursor = _numeric(data, at + 12, end)
            _, at = _numeric(data, cursor, end)
        elif leaf == LF_VFUNCTAB:
            at += 8
        elif leaf == LF_METHOD:
            _, at = _cstring_until(data, at + 8, end)
        elif leaf == LF_ONEMETHOD:
            attributes = unpack_from("<H", data, at + 2)[0]
            introducing = (attributes >> 2) & 7 in (4, 6)
            _, at = _cstring_until(data, at + 8 + (4 if introducing else 0), end)
        else:
            table.fail("field list 0x%x" % index, "unknown member leaf 0x%04x" % leaf)
    return members, enumerators, continuation


def _cstring_until(data, at, end):
    stop = data.find(b"\0", at, end)
    if stop < 0:
        return data[at:end].decode("utf-8", "replace"), end
    return data[at:stop].decode("utf-8", "replace"), stop + 1


def _numeric(data, at, end):
    """(value, next offset) of a CodeView numeric leaf."""
    value = struct.unpack_from("<H", data, at)[0]
    if value < 0x8000:
        return value, at + 2
    fmt = NUMERIC_LEAVES.get(value)
    if fmt is None or at + 2 + struct.calcsize(fmt) > end:
        raise struct.error("numeric leaf 0x%04x" % value)
    return struct.unpack_from(fmt, data, at + 2)[0], at + 2 + struct.calcsize(fmt)


def _simple_type(index, pointer_size):
    kind, mode = index & 0xFF, (index >> 8) & 0xF
    name, size, fmt = SIMPLE_TYPES.get(kind, ("<simple 0x%x>" % kind, None, None))
    if mode:
        return _pointer(index, SIMPLE_POINTER_SIZE.get(mode, pointer_size), kind, pointer_size)
    record = CvType(index, "base", name, size)
    record.fmt = fmt
    return record


def _pointer(index, size, referent, pointer_size):
    """A pointer record; ``fmt`` "P" when it is the target's pointer size."""
    record = CvType(index, "pointer", None, size, referent)
    record.fmt = "P" if size == pointer_size else {2: "H", 4: "I", 8: "Q"}.get(size)
    return record
