"""The one PE/COFF reader: a PE file on disk or a module in target memory, read
lazily and addressed by RVA.

Both inputs become the same thing: the image as the loader maps it, kept as
*segments* (the headers and each section's bytes at their RVAs) over the bytes that
actually exist — the file's own bytes, or the pages the target could read.  Nothing
is ever allocated from a size the image *claims* (SizeOfImage, a section's
VirtualSize, a directory's size or count): a minidump module claiming SizeOfImage
0xFFFFFFFF costs what its readable pages cost.  Bytes a section declares beyond its
raw data read as zeros (as the loader fills them); bytes that could not be read
(pages missing from a dump, a truncated file) are *holes*: reads that touch them
fail.

Headers and the section table are parsed on construction; every directory is parsed
on first use and cached:

===========================  ===================================================
``exports``                  {rva: name} of exported code (forwarders skipped)
``imports``                  {IAT slot rva: "dll!name"}
``coff_functions``           {rva: name} of function symbols in the COFF symbol
                             table (MinGW keeps one; files only)
``relocations``              sorted RVAs holding an absolute pointer (base relocs)
``codeview``                 the debug directory's RSDS record (:class:`CodeView`)
``seh_handlers``             x86 SafeSEH handler RVAs (load config)
``guard_functions``          Control Flow Guard function RVAs (load config)
===========================  ===================================================

Malformed headers raise :class:`~dbgext.errors.BadInput` (the image is unusable);
malformed directories are recorded in ``problems`` (a ProblemLog, each naming the
address) and read as empty.
"""

import bisect
import os
import struct

from .address import merge_ranges
from .errors import BadInput
from .problems import ProblemLog

# IMAGE_FILE_MACHINE_*: x86 and x64 are read for everything; the ARM64 kinds (an
# ARM64X image says ARM64 in its header; ARM64EC is its x64-compatible code) for
# their symbols, exports and directories.
MACHINE_ARCH = {0x8664: "x64", 0x14C: "x86", 0xAA64: "arm64", 0xA641: "arm64ec", 0xA64E: "arm64x"}
POINTER_SIZE = {"x64": 8, "x86": 4, "arm64": 8, "arm64ec": 8, "arm64x": 8}
SECTION_HEADER_SIZE = 40
SECTION_EXECUTE = 0x20000000 | 0x00000020  # IMAGE_SCN_MEM_EXECUTE | IMAGE_SCN_CNT_CODE
SECTION_UNINITIALIZED = 0x00000080

DIRECTORY_EXPORT = 0
DIRECTORY_IMPORT = 1
DIRECTORY_EXCEPTION = 3
DIRECTORY_BASERELOC = 5
DIRECTORY_DEBUG = 6
DIRECTORY_LOAD_CONFIG = 10

DEBUG_TYPE_CODEVIEW = 2
DEBUG_ENTRY = struct.Struct("<IIHHIIII")  # IMAGE_DEBUG_DIRECTORY
RELOC_HIGHLOW = 3
RELOC_DIR64 = 10
COFF_SYMBOL_SIZE = 18
COFF_FUNCTION_TYPE = 0x20          # DTYPE_FUNCTION << 4
COFF_EXTERNAL, COFF_STATIC = 2, 3  # storage classes of code symbols

# IMAGE_LOAD_CONFIG_DIRECTORY{32,64} (by pointer size): offsets of the SafeSEH and CFG tables.
LOAD_CONFIG_FIELDS = {
    4: {"se_handler_table": (0x40, "I"), "se_handler_count": (0x44, "I"),
            "guard_function_table": (0x50, "I"), "guard_function_count": (0x54, "I"), "guard_flags": (0x58, "I")},
    8: {"se_handler_table": (0x60, "Q"), "se_handler_count": (0x68, "Q"),
            "guard_function_table": (0x80, "Q"), "guard_function_count": (0x88, "Q"), "guard_flags": (0x90, "I")},
}
GUARD_ENTRY_EXTRA_SHIFT = 28  # GuardFlags bits 28-31: extra bytes per CFG table entry

MAX_SECTIONS = 96
MAX_HEADER_READ = 0x1000
MAX_NAME = 512
# Bounds on counts an image states: they cap work, never allocation sizes.
MAX_EXPORTS = 1 << 20
MAX_IMPORT_DESCRIPTORS = 4096
MAX_IMPORTS_PER_DLL = 65536
MAX_COFF_SYMBOLS = 1 << 22
MAX_DEBUG_ENTRIES = 64
MAX_RSDS = 24 + MAX_NAME


class Section(object):
    __slots__ = ("name", "rva", "size", "raw_offset", "raw_size", "characteristics")

    def __init__(self, name, rva, size, raw_offset, raw_size, characteristics):
        self.name = name
        self.rva = rva
        self.size = size              # bytes the section spans when mapped
        self.raw_offset = raw_offset
        self.raw_size = raw_size
        self.characteristics = characteristics

    @property
    def executable(self):
        return bool(self.characteristics & SECTION_EXECUTE)

    @property
    def end(self):
        return self.rva + self.size

    def __repr__(self):
        return "Section(%r, 0x%x, 0x%x)" % (self.name, self.rva, self.size)


class CodeView(object):
    """The RSDS record naming the PDB: what a symbol server is asked for."""

    __slots__ = ("guid", "age", "pdb_name")

    def __init__(self, guid, age, pdb_name):
        self.guid = guid              # the 16 GUID bytes as stored
        self.age = age
        self.pdb_name = pdb_name

    @classmethod
    def from_record(cls, data):
        """The CodeView of an RSDS record's bytes, or None when they are not one."""
        if len(data) < 24 or data[:4] != b"RSDS":
            return None
        name = data[24:]
        end = name.find(b"\0")
        return cls(bytes(data[4:20]), struct.unpack_from("<I", data, 20)[0],
                   bytes(name if end < 0 else name[:end]).decode("utf-8", "replace"))

    @property
    def guid_text(self):
        """``{8-4-4-4-12}`` upper-case, as WinDbg and llvm-pdbutil print it."""
        d1, d2, d3 = struct.unpack_from("<IHH", self.guid)
        tail = self.guid[8:].hex().upper()
        return "%08X-%04X-%04X-%s-%s" % (d1, d2, d3, tail[:4], tail[4:])

    @property
    def symbol_server_key(self):
        """``<GUID hex><age hex>``: the directory under ``<pdb name>/`` on a symbol server."""
        return self.guid_text.replace("-", "") + "%X" % self.age


class _Segment(object):
    """RVAs [rva, end) backed by ``buffer[offset:offset + filled]``; the rest of the
    span reads as zeros."""

    __slots__ = ("rva", "end", "buffer", "offset", "filled")

    def __init__(self, rva, end, buffer, offset, filled):
        self.rva = rva
        self.end = end
        self.buffer = buffer
        self.offset = offset
        self.filled = filled


class PEImage(object):
    """A PE image addressed by RVA (see the module docstring).

    ``origin`` is ``"file"`` or ``"memory"``; ``image_base`` is where it is loaded
    (the preferred base for a file); ``problems`` holds what was wrong with its
    directories."""

    def __init__(self, name, origin, image_base, segments, holes, file_bytes=None):
        self.name = name
        self.origin = origin
        self.image_base = image_base
        self.problems = ProblemLog()
        self._segments = sorted(segments, key=lambda segment: segment.rva)
        self._starts = [segment.rva for segment in self._segments]
        self.holes = sorted(holes)
        # The holes' union as sorted disjoint runs, for a bisect on every read.
        runs = merge_ranges(self.holes)
        self._hole_starts, self._hole_ends = [start for start, _ in runs], [end for _, end in runs]
        self._file = file_bytes
        self._cache = {}
        self._parse_headers()

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_file(cls, path, name=None):
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError as error:
            raise BadInput("cannot read %s: %s" % (path, error.strerror or error))
        return cls.from_bytes(raw, name or os.path.basename(path))

    @classmethod
    def from_bytes(cls, raw, name="image"):
        """A PE file's bytes, mapped section by section without copying them."""
        header = _parse_header_fields(raw, name, "file")
        headers_size = min(header["size_of_headers"], len(raw)) or len(raw)
        segments = [_Segment(0, headers_size, raw, 0, headers_size)]
        holes = []
        for section in header["sections"]:
            if section.size == 0:
                continue
            raw_size = 0 if section.characteristics & SECTION_UNINITIALIZED else min(section.raw_size,
                                                                                       section.size)
            available = max(0, min(raw_size, len(raw) - section.raw_offset))
            if available < raw_size:
                # The file ends inside this section: the rest of its bytes are unknown.
                holes.append((section.rva + available, section.rva + raw_size))
            segments.append(_Segment(section.rva, section.end, raw, section.raw_offset, available))
        image = cls(name, "file", header["image_base"], segments, holes, file_bytes=raw)
        if holes:
            image.problems.add("pe_truncated", image.image_base + holes[0][0],
                               "file truncated: %s ends inside section data at rva 0x%x" % (name, holes[0][0]))
        return image

    @classmethod
    def from_target(cls, target, module, directories=None):
        """``module`` (a target Module) as it is in memory.  Only the pages the
        target can read are read: the header page, then each section's readable
        runs — never the module's claimed size in one piece.  ``directories``
        (data directory indexes): read only those directories' bytes, for a
        reader that needs one table (the exports) and not the whole image, which
        over a live debugger connection costs minutes."""
        first = target.try_read(module.base, MAX_HEADER_READ)
        if not first.readable(module.base, 0x200):
            raise BadInput("the PE headers of %s at %s are not in the target"
                           % (module.name, target.format_address(module.base)))
        header = _parse_header_fields(first.data, module.name, "memory")
        span = min(module.size, header["size_of_image"]) if module.size else header["size_of_image"]
        segments = [_Segment(0, len(first.data), first.data, 0, len(first.data))]
        if directories is None:
            wanted = [(section.rva, section.end) for section in header["sections"]]
        else:
            wanted = [(rva, rva + size) for rva, size in
                      (header["directories"][index] for index in directories if index < len(header["directories"]))
                      if rva and size]
        for low_rva, high_rva in wanted:
            start = max(low_rva, len(first.data))
            end = min(high_rva, span)
            for low, high in target.readable_ranges(module.base + start, module.base + end):
                # Each run is read in bounded pieces: a run is what the target holds.
                at = low
                while at < high:
                    size = min(high - at, 1 << 24)
                    read = target.try_read(at, size)
                    segments.extend(_read_segments(read, module.base))
                    at += size
        covered = sorted((segment.rva, segment.end) for segment in segments)
        holes = _gaps(covered, span)
        return cls(module.name, "memory", module.base, segments, holes)

    # -- reading by RVA -------------------------------------------------------------------

    @property
    def pointer_size(self):
        return POINTER_SIZE[self.arch]

    def va(self, rva):
        return self.image_base + rva

    def _segment(self, rva):
        index = bisect.bisect_right(self._starts, rva) - 1
        if index < 0:
            return None
        segment = self._segments[index]
        return segment if rva < segment.end else None

    def read(self, rva, size):
        """``size`` bytes at ``rva``, or None when any of them is unreadable."""
        data = self.read_partial(rva, size)
        return data if len(data) == size else None

    def read_partial(self, rva, size):
        """The bytes at ``rva`` up to ``size``, stopping at the first unreadable one
        (a section's zero-filled tail reads as zeros)."""
        if rva < 0 or size <= 0:
            return b""
        segment = self._segment(rva)
        if segment is not None and rva - segment.rva + size <= segment.filled and not self._first_hole(rva, size):
            # The common case, one backed piece: no copy of a file's bytes.
            start = segment.offset + rva - segment.rva
            return bytes(segment.buffer[start:start + size])
        return self._read_pieces(rva, size, zero_fill=True)

    def read_backed(self, rva, size):
        """The bytes at ``rva`` up to ``size`` that the file (or target memory)
        holds, stopping at the first byte that is a hole or zero-fill.  A table a
        header sizes (a directory, a count of entries) is read this way: what it
        costs is bounded by the bytes behind it, not by the size it claims."""
        if rva < 0 or size <= 0:
            return b""
        return self._read_pieces(rva, size, zero_fill=False)

    def _read_pieces(self, rva, size, zero_fill):
        """read_partial and read_backed across segments: up to the first hole, and
        through (``zero_fill``) or up to a segment's zero-filled tail."""
        hole = self._first_hole(rva, size)
        end = hole if hole is not None else rva + size
        pieces = []
        at = rva
        while at < end:
            segment = self._segment(at)
            if segment is None:
                break
            take = min(end, segment.end) - at
            inside = at - segment.rva
            backed = max(0, min(take, segment.filled - inside))
            if backed:
                start = segment.offset + inside
                pieces.append(segment.buffer[start:start + backed])
            if backed < take:
                if not zero_fill:
                    break
                pieces.append(bytes(take - backed))
            at += take
        return bytes(pieces[0]) if len(pieces) == 1 else b"".join(pieces)

    def unpack(self, fmt, rva):
        """``struct.unpack`` of the bytes at ``rva`` (``fmt`` little-endian), or None."""
        size = struct.calcsize(fmt)
        segment = self._segment(rva)
        if segment is not None and rva - segment.rva + size <= segment.filled and not self._first_hole(rva, size):
            return struct.unpack_from(fmt, segment.buffer, segment.offset + rva - segment.rva)
        data = self.read(rva, size)
        return None if data is None else struct.unpack(fmt, data)

    def pointer(self, rva):
        value = self.unpack("<Q" if self.pointer_size == 8 else "<I", rva)
        return None if value is None else value[0]

    def cstring(self, rva, limit=MAX_NAME):
        """The NUL-terminated string at ``rva`` (latin-1), or None when unreadable."""
        data = self.read_partial(rva, limit)
        if not data:
            return None
        end = data.find(b"\0")
        return (data if end < 0 else data[:end]).decode("latin-1")

    def is_readable(self, rva, size):
        return self.readable_span(rva, size) == size

    def readable_span(self, rva, size):
        """How many bytes from ``rva`` (at most ``size``) can be read."""
        if rva < 0:
            return 0
        hole = self._first_hole(rva, size)
        limit = size if hole is None else hole - rva
        done = 0
        while done < limit:
            segment = self._segment(rva + done)
            if segment is None:
                break
            done = min(limit, segment.end - rva)
        return done

    def _first_hole(self, rva, size):
        """The first unreadable rva in [rva, rva + size), or None."""
        index = bisect.bisect_right(self._hole_starts, rva)
        if index and rva < self._hole_ends[index - 1]:
            return rva
        if index < len(self._hole_starts) and self._hole_starts[index] < rva + size:
            return self._hole_starts[index]
        return None

    def is_code(self, rva):
        for low, high in self.code_ranges:
            if low <= rva < high:
                return True
        return False

    def describe(self, rva):
        return "%s+0x%x (0x%x)" % (self.name, rva, self.image_base + rva)

    def backed_code_ranges(self):
        """The parts of the code sections backed by bytes the file (or target
        memory) holds, for sweeps over all code: a section's zero-filled tail is
        not code, and a corrupt header may claim gigabytes of it."""
        return [(max(low, segment.rva), min(high, segment.rva + segment.filled))
                for low, high in self.code_ranges for segment in self._segments
                if max(low, segment.rva) < min(high, segment.rva + segment.filled)]

    # -- headers ------------------------------------------------------------------------------

    def _parse_headers(self):
        header = _parse_header_fields(self.read_partial(0, MAX_HEADER_READ), self.name, self.origin)
        self.machine = header["machine"]
        self.arch = MACHINE_ARCH[self.machine]
        self.timestamp = header["timestamp"]
        self.size_of_image = header["size_of_image"]
        self.entry_point = header["entry_point"]
        self.sections = header["sections"]
        self.code_ranges = [(section.rva, section.end) for section in self.sections if section.executable]
        self._directories = header["directories"]
        self._symbol_table = header["symbol_table"]

    def directory(self, index):
        """(rva, size) of data directory ``index``; (0, 0) when absent."""
        return self._directories[index] if index < len(self._directories) else (0, 0)

    def _directory_ok(self, kind, index, minimum):
        rva, size = self.directory(index)
        if rva == 0 or size == 0:
            return None
        if not self.is_readable(rva, min(size, minimum) or minimum):
            self.problems.add("pe_directory_unreadable", self.va(rva),
                              "%s: the %s directory (rva 0x%x, 0x%x bytes) is not readable"
                              % (self.name, kind, rva, size))
            return None
        return rva, size

    def _cached(self, key, parse):
        if key not in self._cache:
            self._cache[key] = parse()
        return self._cache[key]

    # -- directories -----------------------------------------------------------------------------

    @property
    def exports(self):
        return self._cached("exports", self._parse_exports)

    def _parse_exports(self):
        exports = {}
        found = self._directory_ok("export", DIRECTORY_EXPORT, 40)
        if found is None:
            return exports
        rva, size = found
        (number_of_functions, number_of_names, functions_rva, names_rva,
         ordinals_rva) = self.unpack("<IIIII", rva + 20)
        if number_of_functions > MAX_EXPORTS or number_of_names > MAX_EXPORTS:
            self.problems.add("pe_exports_implausible", self.va(rva), "%s: the export directory claims %d functions"
                              % (self.name, number_of_functions))
            return exports
        functions = self.read_backed(functions_rva, 4 * number_of_functions)
        names = self.read_backed(names_rva, 4 * number_of_names)
        ordinals = self.read_backed(ordinals_rva, 2 * number_of_names)
        if len(functions) < 4 * number_of_functions or len(names) < 4 * number_of_names \
                or len(ordinals) < 2 * number_of_names:
            self.problems.add("pe_directory_unreadable", self.va(rva),
                              "%s: the export tables are not readable" % self.name)
            return exports
        named = {}
        for name_rva, ordinal in zip(struct.unpack("<%dI" % number_of_names, names),
                                     struct.unpack("<%dH" % number_of_names, ordinals)):
            if ordinal < number_of_functions:
                named[ordinal] = self.cstring(name_rva)
        for index, function_rva in enumerate(struct.unpack("<%dI" % number_of_functions, functions)):
            # Forwarders point back into the export directory: not code.
            if function_rva == 0 or rva <= function_rva < rva + size:
                continue
            if self.is_code(function_rva):
                exports.setdefault(function_rva, named.get(index) or "#%d" % index)
        return exports

    @property
    def imports(self):
        return self._cached("imports", self._parse_imports)

    def _parse_imports(self):
        imports = {}
        found = self._directory_ok("import", DIRECTORY_IMPORT, 20)
        if found is None:
            return imports
        rva = found[0]
        pointer = self.pointer_size
        ordinal_flag = 1 << (8 * pointer - 1)
        # Descriptors may all name one thunk table: the thunks read in all are
        # bounded by the bytes that could hold them, not descriptors x table length.
        thunks_left = sum(segment.filled for segment in self._segments) // pointer
        for index in range(MAX_IMPORT_DESCRIPTORS):
            descriptor = self.unpack("<IIIII", rva + 20 * index)
            if descriptor is None:
                self.problems.add("pe_directory_unreadable", self.va(rva + 20 * index),
                                  "%s: import descriptor %d is not readable" % (self.name, index))
                break
            lookup_rva, _, _, name_rva, iat_rva = descriptor
            if name_rva == 0 and iat_rva == 0:
                break
            dll_stem = (self.cstring(name_rva) or "?").rsplit(".", 1)[0]
            # The lookup table keeps the names even after the loader overwrote the IAT.
            names_rva = lookup_rva or iat_rva
            for slot in range(MAX_IMPORTS_PER_DLL):
                value = self.pointer(names_rva + slot * pointer)
                if not value:
                    break
                thunks_left -= 1
                if thunks_left < 0:
                    self.problems.add("pe_imports_implausible", self.va(rva + 20 * index),
                                      "%s: the import descriptors list more thunks than the image's bytes hold; "
                                      "stopped at descriptor %d" % (self.name, index))
                    return imports
                if value & ordinal_flag:
                    name = "#%d" % (value & 0xFFFF)
                else:
                    name = self.cstring((value & 0x7FFFFFFF) + 2) or "?"
                imports[iat_rva + slot * pointer] = "%s!%s" % (dll_stem, name)
        return imports

    @property
    def coff_functions(self):
        return self._cached("coff", self._parse_coff_functions)

    def _parse_coff_functions(self):
        """Code symbols of the COFF symbol table (files only: it is not mapped).
        x86 C decorations (``_name``, ``_name@12``, ``@name@8``) are removed."""
        functions = {}
        offset, count = self._symbol_table
        if self._file is None or offset == 0 or count == 0:
            return functions
        count = min(count, MAX_COFF_SYMBOLS, max(0, (len(self._file) - offset) // COFF_SYMBOL_SIZE))
        strings_at = offset + count * COFF_SYMBOL_SIZE
        raw = self._file
        index = 0
        while index < count:
            at = offset + index * COFF_SYMBOL_SIZE
            short_name, value, section_number, symbol_type, storage, aux = struct.unpack_from(
                "<8sIhHBB", raw, at)
            index += 1 + aux
            # Functions, and external labels of assembly code (``___chkstk_ms``
            # carries no function type); section symbols have aux records.
            if not (symbol_type == COFF_FUNCTION_TYPE and storage in (COFF_EXTERNAL, COFF_STATIC)
                    or symbol_type == 0 and storage == COFF_EXTERNAL and aux == 0) \
                    or not 0 < section_number <= len(self.sections):
                continue
            if short_name[:4] == b"\0\0\0\0":
                name_at = strings_at + struct.unpack_from("<I", short_name, 4)[0]
                end = raw.find(b"\0", name_at, name_at + MAX_NAME)
                name = bytes(raw[name_at:end if end >= 0 else name_at + MAX_NAME]).decode("latin-1")
            else:
                name = short_name.rstrip(b"\0").decode("latin-1")
            rva = self.sections[section_number - 1].rva + value
            if name and self.is_code(rva):
                functions.setdefault(rva, undecorate(name) if self.arch == "x86" else name)
        return functions

    @property
    def relocations(self):
        return self._cached("relocations", self._parse_relocations)

    def _parse_relocations(self):
        """Sorted RVAs of the absolute pointers the loader relocates."""
        found = self._directory_ok("base relocation", DIRECTORY_BASERELOC, 8)
        if found is None:
            return []
        rva, size = found
        data = self.read_backed(rva, size)
        if len(data) < size:
            self.problems.add("pe_directory_unreadable", self.va(rva + len(data)),
                              "%s: the base relocation directory claims 0x%x bytes; the %s holds 0x%x"
                              % (self.name, size, self.origin, len(data)))
        wanted = RELOC_DIR64 if self.pointer_size == 8 else RELOC_HIGHLOW
        sites = []
        at = 0
        while at + 8 <= len(data):
            page, block_size = struct.unpack_from("<II", data, at)
            if block_size < 8 or at + block_size > len(data):
                if block_size != 0 or page != 0:
                    self.problems.add("pe_bad_relocation_block", self.va(rva + at),
                                      "%s: base relocation block of 0x%x bytes at rva 0x%x"
                                      % (self.name, block_size, rva + at))
                break
            for entry in struct.unpack_from("<%dH" % ((block_size - 8) // 2), data, at + 8):
                if entry >> 12 == wanted:
                    sites.append(page + (entry & 0xFFF))
            at += block_size
        sites.sort()
        return sites

    @property
    def codeview(self):
        return self._cached("codeview", self._parse_codeview)

    def _parse_codeview(self):
        found = self._directory_ok("debug", DIRECTORY_DEBUG, DEBUG_ENTRY.size)
        if found is None:
            return None
        rva, size = found
        for index in range(min(size // DEBUG_ENTRY.size, MAX_DEBUG_ENTRIES)):
            entry = self.unpack(DEBUG_ENTRY.format, rva + DEBUG_ENTRY.size * index)
            if entry is None:
                break
            debug_type, data_size, data_rva, data_offset = entry[4:8]
            if debug_type != DEBUG_TYPE_CODEVIEW or data_size < 24:
                continue
            data = self.read(data_rva, min(data_size, MAX_RSDS)) if data_rva else None
            if data is None and self._file is not None:
                data = bytes(self._file[data_offset:data_offset + min(data_size, MAX_RSDS)])
            codeview = CodeView.from_record(data) if data else None
            if codeview is not None:
                return codeview
        return None

    @property
    def load_config(self):
        """The SafeSEH/CFG fields of the load config directory ({field: value} for
        the fields its declared size covers)."""
        return self._cached("load_config", self._parse_load_config)

    def _parse_load_config(self):
        found = self._directory_ok("load config", DIRECTORY_LOAD_CONFIG, 4)
        if found is None:
            return {}
        rva = found[0]
        declared = self.unpack("<I", rva)[0]
        fields = {}
        for field, (offset, fmt) in LOAD_CONFIG_FIELDS[self.pointer_size].items():
            if offset + struct.calcsize(fmt) <= declared:
                value = self.unpack("<" + fmt, rva + offset)
                if value is not None:
                    fields[field] = value[0]
        return fields

    @property
    def seh_handlers(self):
        return self._cached("seh", lambda: self._va_table("se_handler_table", "se_handler_count", 4))

    @property
    def guard_functions(self):
        return self._cached("guard", lambda: self._va_table(
            "guard_function_table", "guard_function_count",
            4 + ((self.load_config.get("guard_flags", 0) >> GUARD_ENTRY_EXTRA_SHIFT) & 0xF)))

    def _va_table(self, table_field, count_field, entry_size):
        """A load-config table of 32-bit RVAs (plus ``entry_size - 4`` flag bytes each)."""
        config = self.load_config
        table, count = config.get(table_field), config.get(count_field)
        if not table or not count:
            return []
        rva = table - self.image_base
        data = self.read_backed(rva, min(count, MAX_EXPORTS) * entry_size)
        if len(data) < count * entry_size:
            self.problems.add("pe_directory_unreadable", table, "%s: %s holds %d entries, %d readable"
                              % (self.name, table_field, count, len(data) // entry_size))
        return sorted(set(struct.unpack_from("<I", data, at)[0]
                          for at in range(0, len(data) - entry_size + 1, entry_size)))


def undecorate(name):
    """``_name`` / ``_name@12`` / ``@name@8`` (x86 C decorations) -> ``name``."""
    if name.startswith(("_", "@")):
        name = name[1:]
    stem, at, digits = name.rpartition("@")
    if at and digits.isdigit() and stem:
        return stem
    return name


def _read_segments(read, base):
    """The readable runs of a target PartialRead as segments (holes left out)."""
    segments = []
    at = read.address
    data = read.data
    for start, end in read.holes + [(read.address + len(data), read.address + len(data))]:
        if start > at:
            segments.append(_Segment(at - base, start - base, data, at - read.address, start - at))
        at = max(at, end)
    return segments


def _gaps(covered, span):
    gaps = []
    at = 0
    for start, end in covered:
        if start > at:
            gaps.append((at, start))
        at = max(at, end)
    if at < span:
        gaps.append((at, span))
    return gaps


def _parse_header_fields(raw, name, origin):
    """DOS/NT/optional headers and the section table from the first bytes of a PE."""
    def fail(why):
        raise BadInput("%s is not a usable PE image: %s" % (name, why))

    if len(raw) >= 2 and raw[:2] != b"MZ":
        fail("no MZ header")
    if len(raw) < 0x40:
        fail("truncated before the DOS header ends (0x%x bytes)" % len(raw))
    nt = struct.unpack_from("<I", raw, 0x3C)[0]
    if nt + 24 > len(raw):
        fail("NT headers at 0x%x lie beyond the %s (0x%x bytes)" % (nt, "file" if origin == "file" else "headers",
                                                                     len(raw)))
    if raw[nt:nt + 4] != b"PE\0\0":
        fail("no PE signature at offset 0x%x" % nt)
    (machine, section_count, timestamp, symbol_table, symbol_count, optional_size,
     _) = struct.unpack_from("<HHIIIHH", raw, nt + 4)
    if machine not in MACHINE_ARCH:
        fail("unsupported machine type 0x%x (x64, x86 and ARM64 only)" % machine)
    optional = nt + 24
    if optional + optional_size > len(raw) or optional_size < 0x60:
        fail("optional header truncated")
    magic = struct.unpack_from("<H", raw, optional)[0]
    entry_point = struct.unpack_from("<I", raw, optional + 16)[0]
    if magic == 0x20B:
        image_base = struct.unpack_from("<Q", raw, optional + 24)[0]
        directory_count, directories_at = struct.unpack_from("<I", raw, optional + 108)[0], optional + 112
    elif magic == 0x10B:
        image_base = struct.unpack_from("<I", raw, optional + 28)[0]
        directory_count, directories_at = struct.unpack_from("<I", raw, optional + 92)[0], optional + 96
    else:
        fail("unknown optional header magic 0x%x" % magic)
    size_of_image, size_of_headers = struct.unpack_from("<II", raw, optional + 56)
    if size_of_image == 0:
        fail("SizeOfImage is 0")
    directory_count = min(directory_count, 16, max(0, (optional + optional_size - directories_at) // 8))
    directories = [struct.unpack_from("<II", raw, directories_at + 8 * index) for index in range(directory_count)]
    sections = []
    table = optional + optional_size
    for index in range(min(section_count, MAX_SECTIONS)):
        at = table + SECTION_HEADER_SIZE * index
        if at + SECTION_HEADER_SIZE > len(raw):
            fail("section table truncated at section %d" % index)
        raw_name, vsize, rva, raw_size, raw_offset = struct.unpack_from("<8sIIII", raw, at)
        characteristics = struct.unpack_from("<I", raw, at + 36)[0]
        sections.append(Section(raw_name.rstrip(b"\0").decode("latin-1"), rva, vsize or raw_size, raw_offset,
                                raw_size, characteristics))
    return {"machine": machine, "timestamp": timestamp, "image_base": image_base, "entry_point": entry_point,
            "size_of_image": size_of_image, "size_of_headers": size_of_headers, "directories": directories,
            "sections": sections, "symbol_table": (symbol_table, symbol_count)}
