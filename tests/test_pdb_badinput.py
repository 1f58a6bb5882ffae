"""A PDB is input like any other: a broken one is refused with one error naming
the file and the field (PdbError, a BadInput), never another exception."""

import random
import struct

import pytest

from symbols_support import build_dll, read_everything

from dbgext.errors import BadInput
from dbgext.symbols.pdb import MSF_MAGIC, PdbError, PdbFile


@pytest.fixture(scope="module")
def good_pdb(tmp_path_factory):
    built = build_dll(str(tmp_path_factory.mktemp("pdb-bad")), "x64")
    return open(built.pdb, "rb").read()


def write(tmp_path, data, name="bad.pdb"):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def superblock(good, **fields):
    names = ["block_size", "free_block_map", "block_count", "directory_bytes", "unknown", "block_map"]
    values = list(struct.unpack_from("<6I", good, len(MSF_MAGIC)))
    for key, value in fields.items():
        values[names.index(key)] = value
    return good[:len(MSF_MAGIC)] + struct.pack("<6I", *values) + good[len(MSF_MAGIC) + 24:]


@pytest.mark.parametrize("mutate, field", [
    (lambda good: b"", "superblock"),
    (lambda good: good[:40], "superblock"),
    (lambda good: b"Microsoft C/C++ program database 2.00\r\n" + good[40:], "MSF signature"),
    (lambda good: superblock(good, block_size=3), "block size"),
    (lambda good: superblock(good, block_count=0x7FFFFFFF), "block count"),
    (lambda good: superblock(good, directory_bytes=0xFFFFFFF0), "stream directory size"),
    (lambda good: superblock(good, block_map=0), "block map address"),
    (lambda good: good[:len(good) // 2], "block count"),
])
def test_a_broken_container_is_refused_naming_the_file_and_the_field(tmp_path, good_pdb, mutate, field):
    path = write(tmp_path, mutate(good_pdb))
    with pytest.raises(PdbError) as caught:
        PdbFile(path)
    assert path in str(caught.value) and field in str(caught.value)


def test_a_missing_file_is_bad_input(tmp_path):
    with pytest.raises(BadInput, match="cannot read"):
        PdbFile(str(tmp_path / "absent.pdb"))


def test_mutated_pdbs_raise_only_dbgexts_errors(tmp_path, good_pdb):
    """Bit flips, byte runs and truncations anywhere in the file, read through
    everything dbgext reads (a bounded campaign; scripts/fuzz.py runs long ones)."""
    generator = random.Random(1011)
    path = str(tmp_path / "mutated.pdb")
    outcomes = {"read": 0, "refused": 0}
    for _ in range(300):
        data = bytearray(good_pdb)
        choice = generator.random()
        if choice < 0.5:
            for _ in range(generator.randint(1, 8)):
                data[generator.randrange(len(data))] ^= 1 << generator.randrange(8)
        elif choice < 0.8:
            at = generator.randrange(len(data))
            data[at:at + generator.randint(1, 64)] = bytes([generator.choice((0, 0xFF))]) * 64
        else:
            del data[generator.randrange(len(data)):]
        with open(path, "wb") as handle:
            handle.write(bytes(data[:len(good_pdb)]))
        try:
            read_everything(path)
            outcomes["read"] += 1
        except BadInput:
            outcomes["refused"] += 1
    assert outcomes["read"] and outcomes["refused"]
