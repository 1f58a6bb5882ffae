"""The PDB reader on 26 PDBs written by Microsoft's linker (../shared/realworld/pdb),
against llvm-pdbutil and, for the OMAP-relinked ones, Microsoft DIA's addresses:
every public (name, RVA), every procedure (name, RVA, code size), every named
structure's members (name, offset, type index, size), every enum (size and
enumerators) and every procedure of an OMAP PDB at the address DIA gives it."""

import pytest

from symbols_support import RealPdb, agreement, llvm_pdbutil, realworld_entries

from dbgext.pe import PEImage, undecorate
from dbgext.symbols.pdb import PdbFile

ENTRIES = realworld_entries()


def test_the_real_pdbs_are_there():
    assert len(ENTRIES) == 26, "../shared/realworld/pdb holds %d entries, not 26" % len(ENTRIES)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return str(tmp_path_factory.mktemp("realworld-pdb"))


@pytest.fixture(scope="module")
def agreements(scratch):
    return {}


def _agreement(entry, scratch, agreements):
    if entry not in agreements:
        agreements[entry] = agreement(RealPdb(entry, scratch))
    return agreements[entry]


@pytest.mark.parametrize("entry", ENTRIES)
def test_guid_and_age_match_the_image_and_llvm_pdbutil(entry, scratch):
    real = RealPdb(entry, scratch)
    pdb = PdbFile(real.pdb)
    try:
        summary = llvm_pdbutil("dump", "-summary", real.for_llvm)
        assert "GUID: {%s}" % pdb.guid_text in summary and "Age: %d\n" % pdb.age in summary
        if real.image is not None:
            codeview = PEImage.from_file(real.image).codeview
            assert pdb.matches(codeview.guid, codeview.age)
    finally:
        pdb.close()


@pytest.mark.parametrize("check", ["publics", "procedures", "types"])
@pytest.mark.parametrize("entry", ENTRIES)
def test_every_public_procedure_and_structure_member_agrees_with_llvm_pdbutil(entry, check, scratch, agreements):
    agree, total, wrong = _agreement(entry, scratch, agreements)[check]
    assert agree == total, "%s %s: %d of %d agree; first disagreements: %r" % (entry, check, agree, total, wrong)


@pytest.mark.parametrize("entry", [entry for entry in ENTRIES if "omap" in entry])
def test_every_procedure_of_an_omap_pdb_is_where_dia_puts_it(entry, scratch, agreements):
    agree, total, wrong = _agreement(entry, scratch, agreements)["omap"]
    assert (agree, total) == (158, 158), "%s: %d of %d at DIA's address; %r" % (entry, agree, total, wrong)


def test_an_omap_pdb_without_original_section_headers_maps_main_as_dia_does(scratch):
    pdb = PdbFile(RealPdb("msvc2010-x86-omap-reorder-funcs", scratch).pdb)
    try:
        main = [procedure for procedure in pdb.procedures() if procedure.name == "main"]
        assert [procedure.rva for procedure in main] == [0x41E2]
        # The other direction: the image's address back to where the compiler put it.
        assert pdb.source_rva(0x41E2) == 0x1000
    finally:
        pdb.close()


def test_an_80_bit_long_double_member_has_a_type_and_a_size(scratch):
    from dbgext.symbols.types import pdb_type_view
    pdb = PdbFile(RealPdb("msvc2017-x86-basic32-cab", scratch).pdb)
    try:
        view = pdb_type_view(pdb.types, pdb.types.find("DispLocals"))
        fac = view.member("Fac")
        assert (fac.offset, fac.text, fac.size) == (0xA, "Float10B", 10)
    finally:
        pdb.close()


def test_the_x86_fpo_and_frame_data_streams_are_the_ones_llvm_pdbutil_reads(scratch):
    """What an FPO/FrameData reader is given: the optional debug streams' bytes
    (FPO_DATA 16 bytes and FRAMEDATA 32 bytes a record, RVA first); an x64 PDB
    has neither."""
    import re
    import struct
    from dbgext.symbols.pdb import OPTIONAL_DEBUG_FPO, OPTIONAL_DEBUG_FRAME_DATA
    real = RealPdb("msvc2010-x86-omap-reorder-funcs", scratch)
    text = llvm_pdbutil("dump", "-fpo", real.for_llvm)
    old, new = text.split("New FPO Data")
    pdb = PdbFile(real.pdb)
    try:
        fpo = pdb.debug_stream(OPTIONAL_DEBUG_FPO)
        assert [struct.unpack_from("<I", fpo, at)[0] for at in range(0, len(fpo), 16)] == \
            [int(rva, 16) for rva in re.findall(r"\n([0-9A-F]{8}) \|", old)]
        frames = pdb.debug_stream(OPTIONAL_DEBUG_FRAME_DATA)
        assert [struct.unpack_from("<I", frames, at)[0] for at in range(0, len(frames), 32)] == \
            [int(rva, 16) for rva in re.findall(r"\n([0-9A-F]{8}) \|", new)]
    finally:
        pdb.close()
    pdb = PdbFile(RealPdb("msvc2013-x64-kmdf-driver", scratch).pdb)
    try:
        assert pdb.debug_stream(OPTIONAL_DEBUG_FPO) is None and pdb.debug_stream(OPTIONAL_DEBUG_FRAME_DATA) is None
    finally:
        pdb.close()


@pytest.mark.parametrize("entry", [entry for entry in ENTRIES if "omap" in entry])
def test_the_publics_dia_lists_of_an_omap_pdb_are_at_its_addresses(entry, scratch):
    import re
    real = RealPdb(entry, scratch)
    with open(real.sym) as handle:
        dia = [(int(rva, 16), name) for rva, name in
               re.findall(r"^PUBLIC (?:m )?([0-9a-f]+) [0-9a-f]+ (.*)$", handle.read(), re.M)]
    pdb = PdbFile(real.pdb)
    try:
        ours = set((public.rva, undecorate(public.name)) for public in pdb.publics())
    finally:
        pdb.close()
    assert len(dia) == 4 and all((rva, name) in ours for rva, name in dia)
