"""A PDB is input like any other: a broken one is refused with one error naming
the file and the field (PdbError, a BadInput), never another exception."""

import random
import struct

import pytest

from symbols_support import build_dll, build_msf, info_stream, lf_enum, read_everything, tpi_stream

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


# -- claims and cycles (issue #27): what the file says it holds, bounded by what it holds ------

def test_a_block_listed_twice_in_a_stream_is_a_bad_pdb_refused_at_open(tmp_path):
    """The info stream lists one block 65,536 times (it cost 2 GB when the blocks
    were copied before anything was checked): refused at open, by its size when
    that is past the file, else by the repeated block."""
    path = write(tmp_path, build_msf([None, info_stream()], block_size=4096, block_lists={1: [3] * 65536},
                                     sizes={1: 65536 * 4096}))
    with pytest.raises(PdbError, match="stream 1 size"):
        PdbFile(path)
    path = write(tmp_path, build_msf([None, info_stream()], block_size=4096, block_lists={1: [3] * 65536},
                                     sizes={1: 60 * 4096}))
    with pytest.raises(PdbError, match="stream 1 block list.*block 3 listed twice"):
        PdbFile(path)


def test_a_stream_longer_than_the_file_is_a_bad_pdb(tmp_path):
    path = write(tmp_path, build_msf([None, info_stream()], sizes={1: 1 << 30}))
    with pytest.raises(PdbError, match="stream 1 size.*1073741824 bytes in a file of"):
        PdbFile(path)


def test_only_the_identity_of_the_info_stream_is_read_before_the_guid_check(tmp_path, monkeypatch):
    from dbgext.symbols.pdb import MsfFile
    read = []
    original = MsfFile._join

    def recording(self, blocks, size):
        read.append(size)
        return original(self, blocks, size)

    monkeypatch.setattr(MsfFile, "_join", recording)
    path = write(tmp_path, build_msf([None, info_stream() + b"\xAA" * 100000]))
    pdb = PdbFile(path)
    assert pdb.guid == b"\x11" * 16 and pdb.age == 1
    assert read[1:] == [28]        # the directory, then 28 bytes of the 100 KB info stream
    pdb.close()


def test_an_enum_naming_itself_as_its_underlying_type_reads_as_an_unsized_enum():
    from dbgext.symbols.pdb import TypeTable
    from dbgext.symbols.types import pdb_type_text, pdb_type_view
    types = TypeTable(tpi_stream([lf_enum("_SELF", 0x1000)]), "self.pdb", 8)
    record = types.find("_SELF")
    assert (record.kind, record.name, record.size) == ("enum", "_SELF", None)
    assert pdb_type_view(types, record).enumerators == [] and pdb_type_text(types, 0x1000) == "_SELF"


def test_a_long_enum_chain_ends_at_the_depth_bound_without_recursion():
    """2,000 enums, each the next one's underlying type, and the last an Int4B:
    past MAX_TYPE_DEPTH the size is unknown, never a RecursionError."""
    import sys
    from dbgext.symbols.pdb import MAX_TYPE_DEPTH, TypeTable
    count = 2000
    records = [lf_enum("E%d" % index, 0x1000 + index + 1) for index in range(count - 1)] + [lf_enum("Last", 0x74)]
    types = TypeTable(tpi_stream(records), "chain.pdb", 8)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # a recursion per link would need 2,000 frames
    try:
        assert types.find("E0").size is None
        assert types.find("E%d" % (count - MAX_TYPE_DEPTH + 1)).size == 4
        assert len(types.names()) == count
    finally:
        sys.setrecursionlimit(limit)


def test_a_cycle_of_enums_reads_as_unsized():
    from dbgext.symbols.pdb import TypeTable
    types = TypeTable(tpi_stream([lf_enum("A", 0x1001), lf_enum("B", 0x1000)]), "cycle.pdb", 8)
    assert types.find("A").size is None and types.find("B").size is None
