"""PE input for the stack analyses: one mapped-image view over a file on disk or a
module in target memory.

Both inputs become the same thing: the image as the loader maps it (headers and
sections at their RVAs), plus the RVA ranges that could not be read (pages missing
from a dump, a truncated file).  Everything downstream addresses code and data by
RVA, so the file and the running module take one code path — and for a module in
memory it is the code that actually runs that gets analysed.
"""

import os
import struct

from ..errors import BadInput
from .layouts import (DIRECTORY_EXCEPTION, DIRECTORY_EXPORT, DIRECTORY_IMPORT, MACHINE_ARCH,
                      SECTION_EXECUTE, SECTION_HEADER_SIZE)

# Images larger than this are not plausible drivers/DLLs; a corrupt SizeOfImage
# must not make us allocate gigabytes.
MAX_IMAGE_SIZE = 512 * 1024 * 1024
MAX_EXPORTS = 200000
MAX_IMPORT_DESCRIPTORS = 4096
MAX_IMPORTS_PER_DLL = 65536


class Section(object):
    __slots__ = ("name", "rva", "size", "characteristics")

    def __init__(self, name, rva, size, characteristics):
        self.name = name
        self.rva = rva
        self.size = size
        self.characteristics = characteristics

    @property
    def executable(self):
        return bool(self.characteristics & SECTION_EXECUTE)

    def contains(self, rva):
        return self.rva <= rva < self.rva + self.size

    def __repr__(self):
        return "Section(%r, 0x%x, 0x%x)" % (self.name, self.rva, self.size)


class PEImage(object):
    """A mapped PE image.

    ``data`` is the image laid out by RVA (length SizeOfImage); ``holes`` are the
    unreadable RVA ranges (zero-filled in ``data``); ``problems`` collects what was
    wrong with the headers and directories, each naming the address concerned.
    """

    def __init__(self, name, data, image_base, holes=(), origin="file"):
        self.name = name
        self.data = data
        self.image_base = image_base
        self.holes = sorted(holes)
        self.origin = origin
        self.problems = []
        self.sections = []
        self.exports = {}       # rva -> name
        self.imports = {}       # IAT slot rva -> "dll!name"
        self.runtime_functions = []  # (begin rva, end rva, unwind info rva), as stored
        self.machine = 0
        self.arch = None
        self.entry_point = 0
        self.size_of_image = len(data)
        self._parse_headers()

    # -- construction -----------------------------------------------------------------

    @classmethod
    def from_file(cls, path):
        try:
            with open(path, "rb") as handle:
                raw = handle.read()
        except OSError as error:
            raise BadInput("cannot read %s: %s" % (path, error.strerror or error))
        return cls.from_bytes(raw, os.path.basename(path))

    @classmethod
    def from_bytes(cls, raw, name="image"):
        """Map a PE file's bytes as the loader would (sections at their RVAs)."""
        header = _read_header_fields(raw, name, 0, len(raw))
        size_of_image = header["size_of_image"]
        data = bytearray(size_of_image)
        holes = []
        headers_size = min(header["size_of_headers"], len(raw), size_of_image)
        data[:headers_size] = raw[:headers_size]
        for section in header["sections"]:
            rva, virtual_size, raw_size, raw_offset = section[1], section[2], section[3], section[4]
            span = min(virtual_size or raw_size, max(size_of_image - rva, 0))
            if span <= 0:
                continue
            available = max(0, min(raw_size, span, len(raw) - raw_offset))
            data[rva:rva + available] = raw[raw_offset:raw_offset + available]
            if raw_offset + min(raw_size, span) > len(raw):
                # The file ends inside this section: the rest of its bytes are unknown.
                holes.append((rva + available, rva + min(raw_size, span)))
        image = cls(name, data, header["image_base"], holes, origin="file")
        if holes:
            image.problems.append("file truncated: %s ends inside section data at rva 0x%x"
                                  % (name, holes[0][0]))
        return image

    @classmethod
    def from_target(cls, target, module):
        """The module as it is in the target's memory, read in one bulk request."""
        size = min(module.size, MAX_IMAGE_SIZE)
        read = target.try_read(module.base, size)
        holes = [(start - module.base, end - module.base) for start, end in read.holes]
        if not read.readable(module.base, 0x200):
            raise BadInput("the PE headers of %s at %s are not in the target"
                           % (module.name, target.format_address(module.base)))
        return cls(module.name, bytearray(read.data), module.base, holes, origin="memory")

    # -- reading by RVA ---------------------------------------------------------------

    def is_readable(self, rva, size):
        if rva < 0 or rva + size > len(self.data):
            return False
        for start, end in self.holes:
            if start < rva + size and rva < end:
                return False
        return True

    def first_hole_in(self, rva, size):
        """The first unreadable RVA in [rva, rva+size), or None."""
        if rva < 0:
            return rva
        for start, end in self.holes:
            if start < rva + size and rva < end:
                return max(start, rva)
        if rva + size > len(self.data):
            return max(rva, len(self.data))
        return None

    def readable_span(self, rva, size):
        """How many bytes from ``rva`` (at most ``size``) can be read before a hole."""
        hole = self.first_hole_in(rva, size)
        return size if hole is None else max(0, hole - rva)

    def section_of(self, rva):
        for section in self.sections:
            if section.contains(rva):
                return section
        return None

    def is_code(self, rva):
        section = self.section_of(rva)
        return section is not None and section.executable

    def describe(self, rva):
        return "%s+0x%x (0x%x)" % (self.name, rva, self.image_base + rva)

    # -- headers and directories ------------------------------------------------------

    def _parse_headers(self):
        header = _read_header_fields(bytes(self.data[:0x1000]), self.name, self.image_base,
                                     len(self.data), mapped=True)
        self.machine = header["machine"]
        self.arch = MACHINE_ARCH.get(self.machine)
        if self.arch is None:
            raise BadInput("%s: unsupported machine type 0x%x (x64 and x86 only)" % (self.name, self.machine))
        if self.origin == "file":
            self.image_base = header["image_base"]
        self.entry_point = header["entry_point"]
        self.sections = [Section(name, rva, vsize or rsize, chars)
                         for name, rva, vsize, rsize, _, chars in header["sections"]]
        directories = header["directories"]
        self._parse_exports(*directories[DIRECTORY_EXPORT])
        self._parse_imports(*directories[DIRECTORY_IMPORT])
        if self.arch == "x64":
            self._parse_exception_directory(*directories[DIRECTORY_EXCEPTION])

    def _directory_ok(self, what, rva, size):
        if rva == 0 or size == 0:
            return False
        if rva + size > len(self.data):
            self.problems.append("%s directory at rva 0x%x (+0x%x) lies outside the image (size 0x%x)"
                                 % (what, rva, size, len(self.data)))
            return False
        hole = self.first_hole_in(rva, size)
        if hole is not None:
            self.problems.append("%s directory unreadable at %s" % (what, self.describe(hole)))
            return False
        return True

    def _parse_exports(self, rva, size):
        if not self._directory_ok("export", rva, min(size, 40) if size else 0):
            return
        (_, _, _, _, _, _, number_of_functions, number_of_names, functions_rva, names_rva,
         ordinals_rva) = struct.unpack_from("<IIHHIIIIIII", self.data, rva)
        if number_of_functions > MAX_EXPORTS or number_of_names > MAX_EXPORTS:
            self.problems.append("export directory at rva 0x%x claims %d functions: ignored"
                                 % (rva, number_of_functions))
            return
        if not (self.is_readable(functions_rva, 4 * number_of_functions)
                and self.is_readable(names_rva, 4 * number_of_names)
                and self.is_readable(ordinals_rva, 2 * number_of_names)):
            self.problems.append("export tables of %s are unreadable" % self.name)
            return
        functions = struct.unpack_from("<%dI" % number_of_functions, self.data, functions_rva)
        names = struct.unpack_from("<%dI" % number_of_names, self.data, names_rva)
        ordinals = struct.unpack_from("<%dH" % number_of_names, self.data, ordinals_rva)
        named = {}
        for name_rva, ordinal in zip(names, ordinals):
            if ordinal < number_of_functions:
                named[ordinal] = self._cstring(name_rva)
        for index, function_rva in enumerate(functions):
            # Forwarders point back into the export directory: not code.
            if function_rva == 0 or rva <= function_rva < rva + size:
                continue
            if self.is_code(function_rva):
                self.exports.setdefault(function_rva, named.get(index) or "#%d" % index)

    def _parse_imports(self, rva, size):
        if not self._directory_ok("import", rva, 20 if size else 0):
            return
        pointer = 8 if self.arch == "x64" else 4
        ordinal_flag = 1 << (8 * pointer - 1)
        fmt = "<Q" if pointer == 8 else "<I"
        for index in range(MAX_IMPORT_DESCRIPTORS):
            descriptor = rva + 20 * index
            if not self.is_readable(descriptor, 20):
                self.problems.append("import descriptor unreadable at %s" % self.describe(descriptor))
                return
            lookup_rva, _, _, name_rva, iat_rva = struct.unpack_from("<IIIII", self.data, descriptor)
            if name_rva == 0 and iat_rva == 0:
                return
            dll = self._cstring(name_rva) or "?"
            dll_stem = dll.rsplit(".", 1)[0]
            # The lookup table keeps the names even after the loader overwrote the IAT.
            names_rva = lookup_rva or iat_rva
            for slot in range(MAX_IMPORTS_PER_DLL):
                entry_rva = names_rva + slot * pointer
                if not self.is_readable(entry_rva, pointer):
                    break
                value = struct.unpack_from(fmt, self.data, entry_rva)[0]
                if value == 0:
                    break
                if value & ordinal_flag:
                    name = "#%d" % (value & 0xFFFF)
                else:
                    name = self._cstring((value & 0x7FFFFFFF) + 2) or "?"
                self.imports[iat_rva + slot * pointer] = "%s!%s" % (dll_stem, name)

    def _parse_exception_directory(self, rva, size):
        if not self._directory_ok("exception", rva, size):
            return
        count = size // 12
        entries = struct.iter_unpack("<III", bytes(self.data[rva:rva + count * 12]))
        self.runtime_functions = list(entries)

    def _cstring(self, rva, limit=512):
        if not self.is_readable(rva, 1):
            return None
        end = self.data.find(b"\0", rva, min(len(self.data), rva + limit))
        if end < 0:
            end = min(len(self.data), rva + limit)
        return bytes(self.data[rva:end]).decode("latin-1")


def _read_header_fields(raw, name, base, image_size, mapped=False):
    """DOS/NT/optional headers and section table from the first bytes of a PE."""
    def fail(why):
        raise BadInput("%s is not a usable PE image: %s" % (name, why))

    if len(raw) < 2 or (len(raw) < 0x40 and raw[:2] == b"MZ"):
        fail("truncated before the DOS header ends (0x%x bytes)" % len(raw))
    if raw[:2] != b"MZ":
        fail("no MZ header")
    if len(raw) < 0x40:
        fail("truncated before the DOS header ends (0x%x bytes)" % len(raw))
    nt = struct.unpack_from("<I", raw, 0x3C)[0]
    if nt + 24 > len(raw):
        fail("NT headers at 0x%x lie beyond the %s (0x%x bytes)" % (nt, "headers" if mapped else "file", len(raw)))
    if raw[nt:nt + 4] != b"PE\0\0":
        fail("no PE signature at offset 0x%x" % nt)
    machine, section_count, _, _, _, optional_size, _ = struct.unpack_from("<HHIIIHH", raw, nt + 4)
    optional = nt + 24
    if optional + optional_size > len(raw) or optional_size < 0x60:
        fail("optional header truncated")
    magic = struct.unpack_from("<H", raw, optional)[0]
    if magic == 0x20B:
        entry_point = struct.unpack_from("<I", raw, optional + 16)[0]
        image_base = struct.unpack_from("<Q", raw, optional + 24)[0]
        size_of_image, size_of_headers = struct.unpack_from("<II", raw, optional + 56)
        directory_count = struct.unpack_from("<I", raw, optional + 108)[0]
        directories_at = optional + 112
    elif magic == 0x10B:
        entry_point = struct.unpack_from("<I", raw, optional + 16)[0]
        image_base = struct.unpack_from("<I", raw, optional + 28)[0]
        size_of_image, size_of_headers = struct.unpack_from("<II", raw, optional + 56)
        directory_count = struct.unpack_from("<I", raw, optional + 92)[0]
        directories_at = optional + 96
    else:
        fail("unknown optional header magic 0x%x" % magic)
    if size_of_image == 0 or size_of_image > MAX_IMAGE_SIZE:
        fail("implausible SizeOfImage 0x%x" % size_of_image)
    directory_count = min(directory_count, 16, max(0, (optional + optional_size - directories_at) // 8))
    directories = [(0, 0)] * 16
    for index in range(directory_count):
        directories[index] = struct.unpack_from("<II", raw, directories_at + 8 * index)
    sections = []
    table = optional + optional_size
    for index in range(min(section_count, 96)):
        at = table + SECTION_HEADER_SIZE * index
        if at + SECTION_HEADER_SIZE > len(raw):
            fail("section table truncated at section %d" % index)
        raw_name, vsize, rva, raw_size, raw_offset = struct.unpack_from("<8sIIII", raw, at)
        characteristics = struct.unpack_from("<I", raw, at + 36)[0]
        section_name = raw_name.rstrip(b"\0").decode("latin-1")
        sections.append((section_name, rva, vsize, raw_size, raw_offset, characteristics))
    return {"machine": machine, "image_base": image_base, "entry_point": entry_point,
            "size_of_image": size_of_image, "size_of_headers": size_of_headers,
            "directories": directories, "sections": sections}
