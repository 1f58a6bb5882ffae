"""PDB fixtures from an independent toolchain, built at test time and cached per
session: tests/data/symbols/kernel_shapes.c compiled by clang for the MSVC target
with CodeView debug info and linked by lld-link with /debug /pdb, for x64 and x86.
Tests that need them skip (with the reason) when clang or lld-link is missing."""

import os
import re
import struct
import subprocess

from dbgext.pe import PEImage
from dbgext.symbols.pdb import PdbFile
from dbgext.symbols.types import pdb_type_text, pdb_type_view
from minidump_writer import write_minidump
from requirements import need_tool

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "data", "symbols", "kernel_shapes.c")
TRIPLES = {"x64": "x86_64-pc-windows-msvc", "x86": "i686-pc-windows-msvc"}
TOOLS = ("clang", "lld-link")


class BuiltDll(object):
    def __init__(self, arch, dll, pdb):
        self.arch = arch
        self.dll = dll
        self.pdb = pdb
        self.image = PEImage.from_file(dll)


def build_dll(directory, arch, source=SOURCE, name="kernel_shapes", extra_link=()):
    """Compile and link ``source`` into ``directory``; a BuiltDll."""
    need_tool(*TOOLS)
    obj = os.path.join(directory, "%s_%s.obj" % (name, arch))
    dll = os.path.join(directory, "%s_%s.dll" % (name, arch))
    pdb = os.path.join(directory, "%s_%s.pdb" % (name, arch))
    subprocess.run(["clang", "--target=" + TRIPLES[arch], "-g", "-gcodeview", "-O1", "-c", source, "-o", obj],
                   check=True, capture_output=True)
    subprocess.run(["lld-link", "/dll", "/debug", "/noentry", "/nodefaultlib", "/machine:" + arch,
                    "/pdb:" + pdb, "/out:" + dll, obj] + list(extra_link), check=True, capture_output=True)
    return BuiltDll(arch, dll, pdb)


def mapped_image(path):
    """The bytes of a PE file laid out as the loader maps it (sections at their RVAs)."""
    image = PEImage.from_file(path)
    raw = open(path, "rb").read()
    mapped = bytearray(image.size_of_image)
    headers = min(len(raw), image.sections[0].raw_offset if image.sections else len(raw))
    mapped[:headers] = raw[:headers]
    for section in image.sections:
        data = raw[section.raw_offset:section.raw_offset + min(section.raw_size, section.size)]
        mapped[section.rva:section.rva + len(data)] = data
    return bytes(mapped)


def llvm_pdbutil(*args):
    need_tool("llvm-pdbutil")
    return subprocess.run(["llvm-pdbutil"] + list(args), check=True, capture_output=True).stdout.decode("utf-8", "replace")


DRIVER_BASE = 0xFFFFF80001000000
DLL_BASE_X86 = 0x10000000


def kernel_dump_with_driver(built, path, name="kernel_shapes"):
    """An x64 kernel dump (written by dbgext's writer) with ``built``'s DLL loaded
    as ``<name>.sys`` and an nt module; the DLL's PDB is not beside it."""
    from dbgext.sample.scenario import Scenario
    scenario = Scenario("x64", "kernel")
    data = mapped_image(built.dll)
    scenario.add_module("nt", 0xFFFFF80000000000, 0x10000, image="ntoskrnl.exe")
    scenario.add_module(name, DRIVER_BASE, len(data), image=name + ".sys", content=data)
    scenario.build_loaded_module_list()
    scenario.registers = {"rip": DRIVER_BASE + 0x1000, "rsp": 0}
    scenario.write_kernel_dump(path)
    return scenario


def minidump_with_dll(built, path, name="kernel_shapes"):
    """A user-mode minidump (x86 or x64 after ``built``) with the DLL loaded."""
    from dbgext.sample.scenario import Scenario
    scenario = Scenario(built.arch, "user")
    data = mapped_image(built.dll)
    base = DLL_BASE_X86 if built.arch == "x86" else 0x7FF800000000
    scenario.add_module(name, base, len(data), image=name + ".dll", content=data)
    write_minidump(scenario, path)
    return scenario, base


def read_everything(path):
    """What dbgext ever asks of a PDB."""
    pdb = PdbFile(path)
    try:
        pdb.matches(pdb.guid, pdb.age)
        pdb.publics()
        pdb.procedures()
        pdb.data()
        types = pdb.types
        for name in types.names():
            record = types.find(name)
            view = pdb_type_view(types, record)
            for member in view.members:
                pdb_type_text(types, types.strip(member.nested).index if member.nested else 0x74)
    finally:
        pdb.close()


# -- the real PDBs Microsoft's linker wrote (../shared/realworld/pdb) -----------------------

REALWORLD_PDB = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "realworld", "pdb")


class RealPdb(object):
    """One entry of ../shared/realworld/pdb: its PDB (a ``.pd_`` expanded into
    ``scratch``), its image when the entry has one, DIA's ``.sym`` when it has one."""

    def __init__(self, entry, scratch):
        import json
        folder = os.path.join(REALWORLD_PDB, entry)
        with open(os.path.join(folder, "entry.json")) as handle:
            facts = json.load(handle)
        self.entry = entry
        self.omap = bool(facts.get("omap"))
        self.image = os.path.join(folder, facts["pe"]) if facts.get("pe") else None
        self.sym = os.path.join(folder, facts["sym"]) if facts.get("sym") else None
        if facts.get("pd_"):
            from dbgext.symbols.cab import expand_cabinet
            self.pdb = os.path.join(scratch, facts["pdb_name"])
            if not os.path.exists(self.pdb):
                with open(os.path.join(folder, facts["pd_"]), "rb") as source, open(self.pdb, "wb") as output:
                    expand_cabinet(source, output, facts["pd_"], 1 << 30)
        else:
            self.pdb = os.path.join(folder, facts["pdb_file"])
        self.for_llvm = self.pdb
        if entry == "msvc2003-x86-compiled2003":
            self.for_llvm = _tpi_version_patched(self.pdb, scratch)

    def __repr__(self):
        return self.entry


def realworld_entries():
    if not os.path.isdir(REALWORLD_PDB):
        return []
    return sorted(name for name in os.listdir(REALWORLD_PDB)
                  if os.path.isfile(os.path.join(REALWORLD_PDB, name, "entry.json")))


def _tpi_version_patched(path, scratch):
    """A copy whose TPI header says V80 with 4-byte hash keys and no hash stream
    (llvm-pdbutil 14 refuses VC 7.x's 19990903 and its 2-byte keys; the records
    are the same)."""
    from dbgext.symbols.pdb import MsfFile, STREAM_TPI
    copy = os.path.join(scratch, "v80-" + os.path.basename(path))
    if not os.path.exists(copy):
        msf = MsfFile(path)
        first_block = msf._streams[STREAM_TPI][1][0]
        offset = first_block * msf.block_size
        msf.close()
        data = bytearray(open(path, "rb").read())
        data[offset:offset + 4] = struct.pack("<I", 20040203)
        data[offset + 20:offset + 28] = struct.pack("<HHI", 0xFFFF, 0xFFFF, 4)
        with open(copy, "wb") as handle:
            handle.write(bytes(data))
    return copy


# Sizes of CodeView's simple types under the names llvm-pdbutil prints (C's sizes).
LLVM_SIMPLE_SIZES = {
    "void": 0, "HRESULT": 4, "signed char": 1, "unsigned char": 1, "char": 1, "wchar_t": 2, "char16_t": 2,
    "char32_t": 4, "char8_t": 1, "__int8": 1, "unsigned __int8": 1, "short": 2, "unsigned short": 2,
    "__int16": 2, "unsigned __int16": 2, "long": 4, "unsigned long": 4, "int": 4, "unsigned": 4, "__int64": 8,
    "unsigned __int64": 8, "__int128": 16, "unsigned __int128": 16, "__half": 2, "float": 4, "double": 8,
    "long double": 10, "__float128": 16, "bool": 1,
}
POINTER_KIND_SIZES = {"ptr32": 4, "ptr64": 8, "near32": 4, "far32": 6}


class LlvmTypes(object):
    """``llvm-pdbutil dump -types`` read back: each record's text by index, and the
    size of any type index as llvm-pdbutil describes it."""

    def __init__(self, path):
        text = llvm_pdbutil("dump", "-types", path)
        self.records = {}
        self.simple_names = {}
        self._definitions = None
        for chunk in re.split(r"\n(?=\s+0x[0-9A-F]+ \| )", text):
            found = re.match(r"\s+(0x[0-9A-F]+) \| (LF_\w+)", chunk)
            if found:
                self.records[int(found.group(1), 16)] = (found.group(2), chunk)
        for index, name in re.findall(r"(0x00[0-9A-F]{2}) \(([^)]*)\)", text):
            self.simple_names[int(index, 16)] = name

    def named_definitions(self):
        """{index: (name, sizeof, field list index)} of every structure, class and
        union definition."""
        found = {}
        for index, (leaf, text) in self.records.items():
            if leaf in ("LF_STRUCTURE", "LF_CLASS", "LF_UNION", "LF_INTERFACE") and "forward ref" not in text:
                name = re.search(r"\] `(.*)`\n", text).group(1)
                field_list = re.search(r"field list: (0x[0-9A-F]+|<no type>)", text).group(1)
                size = int(re.search(r"sizeof (\d+)", text).group(1))
                found[index] = (name, size, int(field_list, 16) if field_list.startswith("0x") else None)
        return found

    def enum_definitions(self):
        """{index: (name, size, field list index)} of every enum definition."""
        found = {}
        for index, (leaf, text) in self.records.items():
            if leaf == "LF_ENUM" and "forward ref" not in text:
                name = re.search(r"\] `(.*)`\n", text).group(1)
                field_list = re.search(r"field list: (0x[0-9A-F]+|<no type>)", text).group(1)
                found[index] = (name, self.size(index), int(field_list, 16) if field_list.startswith("0x") else None)
        return found

    def enumerators(self, field_list):
        """[(name, value)] of an enum's field list and its continuations."""
        values = []
        seen = set()
        while field_list is not None and field_list not in seen:
            seen.add(field_list)
            text = self.records[field_list][1]
            values.extend((name, int(value)) for name, value in
                          re.findall(r"LF_ENUMERATE \[(.*) = (-?\d+)\]\n", text + "\n"))
            continued = re.search(r"LF_INDEX continuation = (0x[0-9A-F]+)", text)
            field_list = int(continued.group(1), 16) if continued else None
        return values

    def members(self, field_list):
        """[(name, type index, offset)] of a field list and its LF_INDEX continuations."""
        members = []
        seen = set()
        while field_list is not None and field_list not in seen:
            seen.add(field_list)
            text = self.records[field_list][1]
            members.extend((name, int(index, 16), int(offset)) for name, index, offset in re.findall(
                r"LF_MEMBER \[name = `([^`]*)`, Type = (0x[0-9A-F]+)[^,]*, offset = (\d+)", text))
            continued = re.search(r"LF_INDEX continuation = (0x[0-9A-F]+)", text)
            field_list = int(continued.group(1), 16) if continued else None
        return members

    def definition(self, index):
        """The definition of a forward reference: where llvm-pdbutil points it, else
        the definition with its unique name (or its name); None when there is none."""
        text = self.records[index][1]
        pointed = re.search(r"forward ref \(-> (0x[0-9A-F]+)\)", text)
        if pointed:
            return int(pointed.group(1), 16)
        if self._definitions is None:
            self._definitions = {}
            for other, (leaf, body) in sorted(self.records.items()):
                if leaf in ("LF_STRUCTURE", "LF_CLASS", "LF_UNION", "LF_INTERFACE", "LF_ENUM") \
                        and "forward ref" not in body:
                    self._definitions.setdefault(_udt_key(body), other)
        return self._definitions.get(_udt_key(text))

    def size(self, index, depth=0):
        assert depth < 64, "type 0x%x: a chain llvm-pdbutil's output does not end" % index
        if index < 0x1000:
            mode = (index >> 8) & 0xF
            if mode:
                return {4: 4, 6: 8}[mode]
            return LLVM_SIMPLE_SIZES[self.simple_names[index & 0xFF]]
        leaf, text = self.records[index]
        if leaf in ("LF_STRUCTURE", "LF_CLASS", "LF_UNION", "LF_INTERFACE", "LF_ENUM") and "forward ref" in text:
            definition = self.definition(index)
            return self.size(definition, depth + 1) if definition is not None else 0
        if leaf in ("LF_STRUCTURE", "LF_CLASS", "LF_UNION", "LF_INTERFACE"):
            return int(re.search(r"sizeof (\d+)", text).group(1))
        if leaf == "LF_ENUM":
            return self.size(int(re.search(r"underlying type: (0x[0-9A-F]+)", text).group(1), 16), depth + 1)
        if leaf == "LF_MODIFIER":
            return self.size(int(re.search(r"referent = (0x[0-9A-F]+)", text).group(1), 16), depth + 1)
        if leaf == "LF_BITFIELD":
            return self.size(int(re.search(r"type = (0x[0-9A-F]+)", text).group(1), 16), depth + 1)
        if leaf == "LF_ARRAY":
            return int(re.search(r"size: (\d+)", text).group(1))
        if leaf == "LF_POINTER":
            kind = re.search(r"kind = (\w+)", text).group(1)
            mode = re.search(r"mode = ([a-z ]+)", text).group(1)
            if "member" in mode:
                return None  # a pointer to member's size depends on the class's inheritance model
            return POINTER_KIND_SIZES[kind]
        return None


def _udt_key(text):
    unique = re.search(r"unique name: `([^`]*)`", text)
    return unique.group(1) if unique else re.search(r"\] `(.*)`\n", text).group(1)


def llvm_section_rvas(path):
    text = llvm_pdbutil("dump", "-section-headers", path)
    return [int(rva, 16) for rva in re.findall(r"\n\s+([0-9A-F]+) virtual address", text)]


def llvm_publics(path):
    """[(name, segment, offset)] of every S_PUB32 (from the GSI records where
    llvm-pdbutil refuses a /DEBUG:FASTLINK publics hash)."""
    try:
        text = llvm_pdbutil("dump", "-publics", path)
    except subprocess.CalledProcessError:
        text = llvm_pdbutil("dump", "-gsi-records", path)
    return [(name, int(segment), int(offset)) for name, segment, offset in
            re.findall(r"S_PUB32 \[size = \d+\] `(.*)`\n\s+flags = [^\n]*?addr = (\d+):(\d+)", text)]


def llvm_procedures(path):
    """[(name, segment, offset, code size)] of every procedure in the module streams."""
    text = llvm_pdbutil("dump", "-symbols", path)
    return [(name, int(segment), int(offset), int(size)) for name, segment, offset, size in re.findall(
        r"S_[GL]PROC32(?:_ID)? \[size = \d+\] `(.*)`\n\s+parent = \d+, end = \d+, addr = (\d+):(\d+), "
        r"code size = (\d+)", text)]


def dia_functions(path):
    """{rva: DIA's name} of the FUNC lines of a Breakpad .sym written with DIA."""
    with open(path) as handle:
        text = handle.read()
    return dict((int(rva, 16), name) for rva, name in
                re.findall(r"^FUNC (?:m )?([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ (.*)$", text, re.M))


def agreement(real):
    """{check: (agreeing, total, [disagreements])} of dbgext's reading of a real
    PDB against llvm-pdbutil (and DIA's addresses for the OMAP ones)."""
    from collections import Counter
    from dbgext.symbols.types import pdb_member_view
    pdb = PdbFile(real.pdb)
    results = {}
    try:
        rvas = llvm_section_rvas(real.for_llvm)

        def rva(segment, offset):
            return rvas[segment - 1] + offset if 1 <= segment <= len(rvas) else None

        # Publics: name and RVA (OMAP PDBs: the name, llvm-pdbutil does not translate).
        if real.omap:
            expected = Counter(name for name, segment, _ in llvm_publics(real.for_llvm) if 1 <= segment <= len(rvas))
            found = Counter(public.name for public in pdb.publics())
        else:
            # An absolute symbol (segment 0 or past the sections) has no RVA: dbgext leaves it out.
            expected = Counter((name, rva(segment, offset)) for name, segment, offset in llvm_publics(real.for_llvm)
                               if rva(segment, offset) is not None)
            found = Counter((public.name, public.rva) for public in pdb.publics())
        results["publics"] = _compare(expected, found)
        # Procedures: name, RVA and code size.
        procedures = llvm_procedures(real.for_llvm)
        if real.omap:
            expected = Counter((name, size) for name, _, _, size in procedures)
            found = Counter((procedure.name, procedure.size) for procedure in pdb.procedures())
        else:
            expected = Counter((name, rva(segment, offset), size) for name, segment, offset, size in procedures)
            found = Counter((p.name, p.rva, p.size) for p in pdb.procedures())
        results["procedures"] = _compare(expected, found)
        if real.omap:
            dia = dia_functions(real.sym)
            # DIA names them with their parameters and, for C, without the x86 underscore.
            placed = [p for p in pdb.procedures() if p.rva in dia
                      and p.name.lstrip("_@").split("@")[0].split("::")[-1] in dia[p.rva]]
            results["omap"] = (len(placed), len(pdb.procedures()),
                               [p for p in pdb.procedures() if p not in placed][:5])
        # Types: every named structure's members, by type index and size.
        if pdb.msf.stream_size(2):
            llvm = LlvmTypes(real.for_llvm)
            agree, wrong = 0, []
            definitions = llvm.named_definitions()
            for index, (name, size, field_list) in sorted(definitions.items()):
                record = pdb.types.get(index)
                expected_members = [(member, type_index, offset, llvm.size(type_index))
                                    for member, type_index, offset in llvm.members(field_list)]
                found_members = []
                for member in pdb.types.members(record):
                    view = pdb_member_view(pdb.types, member.name, member.offset, member.type_index)
                    untyped = pdb.types.strip(member.type_index).kind == "unknown" or "<simple" in view.text
                    known = "no type: " + view.text if untyped else view.size
                    found_members.append((member.name, member.type_index, member.offset, known))
                # A pointer to member's size is not in llvm-pdbutil's text: its index is compared.
                found_members = [found if expected[3] is not None else found[:3] + (None,)
                                 for found, expected in zip(found_members, expected_members)] + \
                    found_members[len(expected_members):]
                if (record.name, record.size, found_members) == (name, size, expected_members):
                    agree += 1
                else:
                    wrong.append((name, [(e, f) for e, f in zip(expected_members, found_members) if e != f][:3]))
            # Enums: name, size (the underlying type's) and enumerators.
            for index, (name, size, field_list) in sorted(llvm.enum_definitions().items()):
                record = pdb.types.get(index)
                found = (record.name, record.size, pdb.types.enumerators(record))
                if found == (name, size, llvm.enumerators(field_list)):
                    agree += 1
                else:
                    wrong.append((name, found[:2], (name, size)))
                definitions[index] = name
            results["types"] = (agree, len(definitions), wrong[:5])
    finally:
        pdb.close()
    return results


def _compare(expected, found):
    agree = sum((expected & found).values())
    missing = list((expected - found).elements())[:3]
    extra = list((found - expected).elements())[:3]
    return agree, max(sum(expected.values()), sum(found.values())), missing + extra


# -- hand-made MSF files, for claims no linker writes ------------------------------------------

def build_msf(streams, block_size=512, block_lists=None, sizes=None):
    """An MSF 7.0 file holding ``streams`` (a list of bytes, or None for a nil
    stream).  ``block_lists``/``sizes``: {stream index: blocks / size} stated in the
    directory instead of the true ones (a block listed twice, a size past the file)."""
    from dbgext.symbols.pdb import MSF_MAGIC, NIL_STREAM
    blocks = [b"", b"", b""]            # superblock, two free block maps
    lists, stated = [], []
    for index, data in enumerate(streams):
        if data is None:
            lists.append([])
            stated.append(NIL_STREAM)
            continue
        own = []
        for at in range(0, len(data), block_size):
            own.append(len(blocks))
            blocks.append(data[at:at + block_size])
        lists.append((block_lists or {}).get(index, own))
        stated.append((sizes or {}).get(index, len(data)))
    directory = struct.pack("<I", len(streams)) + struct.pack("<%dI" % len(stated), *stated)
    for own in lists:
        directory += struct.pack("<%dI" % len(own), *own)
    directory_blocks = []
    for at in range(0, len(directory), block_size):
        directory_blocks.append(len(blocks))
        blocks.append(directory[at:at + block_size])
    block_map = len(blocks)
    blocks.append(struct.pack("<%dI" % len(directory_blocks), *directory_blocks))
    blocks[0] = MSF_MAGIC + struct.pack("<6I", block_size, 1, len(blocks) + 1, len(directory), 0, block_map)
    return b"".join(block.ljust(block_size, b"\0") for block in blocks) + b"\0" * block_size


def info_stream(guid=b"\x11" * 16, age=1):
    return struct.pack("<III", 20000404, 0x12345678, age) + guid


def tpi_stream(records, first_index=0x1000):
    """A TPI stream (V80 header) holding ``records`` (each a leaf's bytes, kind first)."""
    body = b""
    for record in records:
        record += b"\0" * (-(len(record) + 2) % 4)
        body += struct.pack("<H", len(record)) + record
    header = struct.pack("<IIIIIHHIIiIiIiI", 20040203, 56, first_index, first_index + len(records), len(body),
                         0xFFFF, 0xFFFF, 4, 0, 0, 0, 0, 0, 0, 0)
    return header + body


def lf_enum(name, underlying, field_list=0):
    return struct.pack("<HHHII", 0x1507, 0, 0, underlying, field_list) + name.encode() + b"\0"
