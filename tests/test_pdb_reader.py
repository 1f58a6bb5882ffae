"""The PDB reader against PDBs that clang and lld-link made, cross-checked with
llvm-pdbutil and with the DLL's own section table and CodeView record."""

import re

import pytest

from symbols_support import build_dll, llvm_pdbutil

from dbgext.symbols.pdb import Omap, PdbFile
from dbgext.symbols.types import pdb_type_text, pdb_type_view


@pytest.fixture(scope="module", params=["x64", "x86"])
def built(request, tmp_path_factory):
    return build_dll(str(tmp_path_factory.mktemp("pdb-" + request.param)), request.param)


@pytest.fixture
def pdb(built):
    opened = PdbFile(built.pdb)
    yield opened
    opened.close()


def section_rva(built, segment, offset):
    """segment:offset through the DLL's own section table (not the PDB's)."""
    return built.image.sections[segment - 1].rva + offset


def test_identity_matches_the_dll_codeview_record_and_llvm_pdbutil(built, pdb):
    codeview = built.image.codeview
    assert pdb.matches(codeview.guid, codeview.age)
    summary = llvm_pdbutil("dump", "-summary", built.pdb)
    assert "GUID: {%s}" % pdb.guid_text in summary
    assert "Age: %d" % pdb.age in summary
    assert pdb.machine == (0x8664 if built.arch == "x64" else 0x14C)


def test_publics_are_llvm_pdbutils_with_rvas_from_the_section_table(built, pdb):
    text = llvm_pdbutil("dump", "-publics", built.pdb)
    expected = {}
    for name, flags, segment, offset in re.findall(r"S_PUB32 \[size = \d+\] `([^`]+)`\s+flags = ([^,]+), "
                                                   r"addr = (\d+):(\d+)", text):
        expected[name] = (section_rva(built, int(segment), int(offset)), "function" in flags)
    found = dict((public.name, (public.rva, public.is_function)) for public in pdb.publics())
    assert found == expected
    prefix = "_" if built.arch == "x86" else ""
    assert found[prefix + "ExportedEntry"][1] and not found[prefix + "GlobalCounter"][1]


def test_procedures_have_llvm_pdbutils_addresses_and_code_sizes(built, pdb):
    text = llvm_pdbutil("dump", "-symbols", built.pdb)
    expected = {}
    for kind, name, segment, offset, size in re.findall(
            r"S_([GL])PROC32 \[size = \d+\] `([^`]+)`\s+parent = \d+, end = \d+, addr = (\d+):(\d+), "
            r"code size = (\d+)", text):
        expected[name] = (section_rva(built, int(segment), int(offset)), int(size), kind == "G")
    found = dict((p.name, (p.rva, p.size, p.is_global)) for p in pdb.procedures())
    assert found == expected
    # The static function only the PDB names.
    assert found["CopyLeaf"][2] is False
    assert "CopyLeaf" not in [public.name.lstrip("_") for public in pdb.publics()]


def test_data_comes_from_module_streams_and_the_globals_as_llvm_pdbutil_lists_it(built, pdb):
    text = llvm_pdbutil("dump", "-symbols", "-globals", built.pdb)
    expected = set()
    for kind, name, segment, offset in re.findall(r"S_([GL])DATA32 \[size = \d+\] `([^`]+)`\s+type = [^,]+, "
                                                  r"addr = (\d+):(\d+)", text):
        expected.add((name, section_rva(built, int(segment), int(offset)), kind == "G"))
    assert set((d.name, d.rva, d.is_global) for d in pdb.data()) == expected
    assert set(name for name, _, _ in expected) == {"HiddenCounter", "GlobalCounter", "SampleThread"}


def test_cpp_functions_and_static_members_have_their_qualified_names(tmp_path):
    from symbols_support import SOURCE
    import os
    from dbgext.symbols.match import PdbModuleSymbols
    cpp = build_dll(str(tmp_path), "x64", os.path.join(os.path.dirname(SOURCE), "cpp_names.cpp"), "cpp_names")
    opened = PdbFile(cpp.pdb)
    symbols = PdbModuleSymbols("cpp_names", opened, lambda kind, message: None).symbols
    assert sorted(symbols) == ["Entry", "drv::Queue::Push", "drv::Queue::count"]
    assert all(not name.startswith("?") for name in symbols)
    opened.close()


def _pdbutil_members(built, struct_name):
    """{member: offset} and sizeof of a structure's definition per llvm-pdbutil."""
    text = llvm_pdbutil("dump", "-types", built.pdb)
    records = re.split(r"\n\s+(?=0x[0-9A-F]+ \|)", text)
    by_index = dict((record.split(" |", 1)[0].strip(), record) for record in records)
    for record in records:
        if "LF_STRUCTURE" in record and "`%s`" % struct_name in record and "forward ref" not in record:
            field_list = re.search(r"field list: (0x[0-9A-F]+)", record).group(1)
            size = int(re.search(r"sizeof (\d+)", record).group(1))
            members = re.findall(r"LF_MEMBER \[name = `([^`]+)`, Type = [^,]+, offset = (\d+)",
                                 by_index[field_list])
            return dict((name, int(offset)) for name, offset in members), size
    raise AssertionError("llvm-pdbutil shows no %s" % struct_name)


@pytest.mark.parametrize("name", ["_KTHREAD", "_DISPATCHER_HEADER", "_KPROCESS", "_LIST_ENTRY"])
def test_structures_match_llvm_pdbutil_member_for_member(built, pdb, name):
    expected, size = _pdbutil_members(built, name)
    record = pdb.types.find(name)
    assert not record.forward and record.size == size
    assert dict((member.name, member.offset) for member in pdb.types.members(record)) == expected


def test_forward_references_resolve_to_their_definitions(pdb):
    kthread = pdb.types.find("_KTHREAD")
    process = [m for m in pdb.types.members(kthread) if m.name == "Process"][0]
    pointee = pdb.types.get(pdb.types.get(process.type_index).element)
    assert pointee.forward and pointee.size == 0
    assert pdb.types.resolve(pointee).name == "_KPROCESS" and pdb.types.resolve(pointee).size > 0


def test_kernel_shaped_members_read_as_windbg_dt_shows_them(built, pdb):
    view = pdb_type_view(pdb.types, pdb.types.find("_KTHREAD"))
    pointer = "Ptr64" if built.arch == "x64" else "Ptr32"
    text = dict((member.name, member.text) for member in view.members)
    assert text["InitialStack"] == pointer + " Void"
    assert text["StackLimit"] == pointer + " Void"          # volatile pointer: the modifier is not shown
    assert text["QuantumTarget"] == "Uint8B"
    assert text["AutoBoostActive"] == "Pos 0, 1 Bit"
    assert text["Reserved"] == "Pos 3, 29 Bits"
    assert text["MiscFlags"] == "Int4B"                      # anonymous union members are the struct's own
    assert text["State"] == "_KTHREAD_STATE"                 # const enum
    assert text["Name"] == "[16] Char"
    assert text["Counters"] == "[4] [2] Uint4B"
    assert text["Process"] == pointer + " _KPROCESS"
    assert text["ThreadListEntry"] == "_LIST_ENTRY"
    assert text["Callback"] == pointer + "     Int4B"
    members = dict((member.name, member) for member in view.members)
    assert members["Reserved"].bits == (3, 29)
    assert members["State"].enumerators == {0: "Initialized", 1: "Ready", 2: "Running", 5: "Waiting"}
    assert members["Counters"].fmt == "8I" and members["Name"].fmt == "16b"
    assert members["Header"].nested is not None


def test_nested_anonymous_members_keep_their_offsets(pdb):
    header = pdb_type_view(pdb.types, pdb.types.find("_DISPATCHER_HEADER"))
    offsets = dict((member.name, member.offset) for member in header.members)
    assert offsets["Lock"] == offsets["Type"] == 0
    assert offsets["Size"] == 2 and offsets["SignalState"] == 4 and offsets["WaitListHead"] == 8


def test_simple_and_unknown_type_indices_do_not_raise(pdb):
    assert pdb_type_text(pdb.types, 0x0603 if pdb.machine == 0x8664 else 0x0403).endswith("Void")
    assert pdb.types.get(0xFFFFFF).kind == "unknown"
    assert pdb.types.find("NoSuchType") is None


def test_an_omap_moves_addresses_as_the_optimizer_moved_the_code(pdb):
    """Segment RVAs are pre-optimization addresses; the OMAP maps them to the
    image's (a zero target: code the optimizer removed)."""
    pdb._sections = ([0x1000, 0x5000], Omap([(0x1000, 0x3000), (0x1100, 0), (0x1200, 0x2000)], None))
    assert pdb.rva(1, 0x10) == 0x3010
    assert pdb.rva(1, 0x150) is None
    assert pdb.rva(2, 0x4) == 0x2000 + 0x5004 - 0x1200
    assert pdb.rva(3, 0) is None and pdb.rva(0, 0) is None


def test_a_pdb_with_one_omap_direction_maps_both_ways_by_its_inverse():
    """OMAP-to-source alone (image -> source) also answers source -> image, and
    the other way round; each direction is sorted whatever order the file has."""
    to_source = Omap(None, [(0x3000, 0x1000), (0x2000, 0x1200), (0x3100, 0)])
    assert to_source.to_source(0x3010) == 0x1010 and to_source.to_source(0x3150) is None
    assert to_source.to_image(0x1010) == 0x3010 and to_source.to_image(0x1204) == 0x2004
    from_source = Omap([(0x1000, 0x3000), (0x1200, 0x2000)], None)
    assert from_source.to_source(0x2004) == 0x1204 and from_source.to_source(0x1000) is None
