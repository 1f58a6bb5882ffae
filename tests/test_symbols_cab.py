"""``.pd_`` cabinets: the real one symstore wrote expands to the PDB its DLL names;
cabinets written here (MSZIP blocks with zlib, each block's history the one
before) round-trip; a broken or hostile cabinet is one CabinetError naming the
field, and the output never passes the size the cabinet states or the cap."""

import io
import os
import random
import struct
import zlib

import pytest

from symbols_support import REALWORLD_PDB

from dbgext.errors import BadInput
from dbgext.pe import PEImage
from dbgext.symbols.cab import CabinetError, expand_cabinet
from dbgext.symbols.pdb import PdbFile

BLOCK = 32768


def cabinet(data, name=b"x.pdb", compression=1, file_size=None, unpacked_sizes=None, files=1):
    """A one-file cabinet of ``data`` in MSZIP blocks (``compression`` 0: stored)."""
    blocks = []
    history = b""
    for index, at in enumerate(range(0, len(data), BLOCK)):
        piece = data[at:at + BLOCK]
        if compression == 1:
            packer = zlib.compressobj(9, zlib.DEFLATED, -15, zdict=history) if history else \
                zlib.compressobj(9, zlib.DEFLATED, -15)
            packed = b"CK" + packer.compress(piece) + packer.flush()
        else:
            packed = piece
        unpacked = (unpacked_sizes or {}).get(index, len(piece))
        blocks.append(struct.pack("<IHH", 0, len(packed), unpacked) + packed)
        history = (history + piece)[-BLOCK:]
    files_at = 36 + 8
    entry = struct.pack("<IIHHHH", len(data) if file_size is None else file_size, 0, 0, 0, 0, 0x20) + name + b"\0"
    data_at = files_at + len(entry)
    header = struct.pack("<4sIIIIIBBHHHHH", b"MSCF", 0, 0, 0, files_at, 0, 3, 1, 1, files, 0, 0, 0)
    folder = struct.pack("<IHH", data_at, len(blocks), compression)
    return header + folder + entry + b"".join(blocks)


def expand(raw, max_bytes=1 << 30):
    output = io.BytesIO()
    name, size = expand_cabinet(io.BytesIO(raw), output, "test.pd_", max_bytes)
    return name, output.getvalue()


def test_the_real_pd_expands_to_the_pdb_its_dll_names(tmp_path):
    folder = os.path.join(REALWORLD_PDB, "msvc2017-x86-basic32-cab")
    path = tmp_path / "basic32.pdb"
    with open(os.path.join(folder, "basic32.pd_"), "rb") as source, open(str(path), "wb") as output:
        assert expand_cabinet(source, output, "basic32.pd_", 1 << 30) == ("basic32.pdb", 6590464)
    codeview = PEImage.from_file(os.path.join(folder, "basic32.dll")).codeview
    pdb = PdbFile(str(path))
    assert pdb.matches(codeview.guid, codeview.age)
    pdb.close()


@pytest.mark.parametrize("compression", [1, 0])
def test_written_cabinets_round_trip_across_blocks(compression):
    generator = random.Random(2024)
    data = bytes(generator.getrandbits(8) for _ in range(3 * BLOCK + 1234)) + b"repeat" * 20000
    assert expand(cabinet(data, compression=compression)) == ("x.pdb", data)


@pytest.mark.parametrize("mutate, field", [
    (lambda raw: raw[:20], "CFHEADER"),
    (lambda raw: b"MSCX" + raw[4:], "signature"),
    (lambda raw: raw[:-100], "CFDATA"),
    (lambda raw: cabinet(b"a" * 100, compression=3), "compression"),
    (lambda raw: cabinet(b"a" * 100, files=2), "CFHEADER"),
    (lambda raw: cabinet(b"a" * 100, unpacked_sizes={0: 40000}), "CFDATA 0"),
    (lambda raw: cabinet(b"a" * 100, file_size=50), "CFDATA 0"),
    (lambda raw: cabinet(b"a" * 100, file_size=5000), "CFDATA"),
])
def test_a_broken_cabinet_is_one_error_naming_the_field(mutate, field):
    raw = mutate(cabinet(b"z" * 70000))
    with pytest.raises(CabinetError, match="bad cabinet test.pd_: %s" % field):
        expand(raw)


def test_a_cabinet_stating_more_than_the_cap_is_refused_before_expanding():
    with pytest.raises(BadInput, match="CFFILE size.*more than the 1000 allowed"):
        expand(cabinet(b"\0" * (4 * BLOCK)), max_bytes=1000)


def test_a_block_that_inflates_past_what_it_states_is_refused():
    """A 32 KiB bomb block stating 100 bytes: inflated no further than 101 bytes."""
    raw = cabinet(b"\0" * BLOCK, unpacked_sizes={0: 100}, file_size=100)
    with pytest.raises(CabinetError, match="CFDATA 0.*more than the 100 bytes the block states"):
        expand(raw)
