"""Real compressed .etl files (../shared/realworld/etl/): PerfView's traces store
their buffers compressed with plain LZ77 XPRESS, announced by the logfile header
(EVENT_TRACE_COMPRESSED_MODE, State 3).  ``derived/`` holds the same files with
every buffer decompressed by dissect.util: the byte-exact reference.  dissect.etl,
an independent event reader, counts the stack lookups the simulator must see."""

import collections
import json
import struct
from pathlib import Path

import pytest

from dbgext.etl import EtlReader
from dbgext.etl import format as fmt
from dbgext.etwcache.layouts import KERNEL_SPACE_START
from requirements import need_module
from realworld import REALWORLD, real_file, run

ETL = REALWORLD / "etl"
COMPRESSED = ["perfview__net.4.5.2.x64", "perfview__net.4.5.2.x86", "perfview__SelfDescribingSingleEvent"]


real = real_file


def stored_buffers(path):
    """(file offset, buffer bytes) of every buffer of a file, walked by BufferSize."""
    data = Path(path).read_bytes()
    offset = 0
    while offset + fmt.BUFFER_HEADER_SIZE <= len(data):
        size = struct.unpack_from("<I", data, offset)[0]
        yield offset, data[offset:offset + size]
        offset += size


@pytest.mark.parametrize("name", COMPRESSED)
def test_every_compressed_buffer_decompresses_byte_identical_to_the_reference(name):
    reader = EtlReader(real(ETL / (name + ".etl")))
    assert reader.compression_format == fmt.COMPRESSION_FORMAT_XPRESS
    decoded = list(reader.decoded_buffers())
    reference = list(stored_buffers(real(ETL / "derived" / (name + ".decompressed.etl"))))
    assert len(decoded) == len(reference) == reader.summary.buffers
    compared = 0
    for buffer, (_, expected) in zip(decoded, reference):
        assert len(buffer.data) == len(expected), buffer.index
        assert buffer.data[fmt.BUFFER_HEADER_SIZE:] == expected[fmt.BUFFER_HEADER_SIZE:], buffer.index
        compared += 1
    summary = reader.summary
    assert summary.compressed == {"perfview__net.4.5.2.x64": 359, "perfview__net.4.5.2.x86": 275,
                                  "perfview__SelfDescribingSingleEvent": 2}[name]
    assert (summary.undecodable, summary.bombs, summary.note()) == (0, 0, None)
    assert compared == len(reference)


def dissect_stack_lookups(path):
    """Stack lookups counted with dissect.etl over a decompressed trace: each walk's
    kernel part and user part (the cache holds them apart), plus every key
    reference whose key a Delete or Rundown Definition defines in the file."""
    from dissect.etl.etl import ETL, Buffer
    walks, references, defined = [], [], set()
    with open(path, "rb") as handle:
        etl = ETL(handle)
        for offset, _ in stored_buffers(path):   # dissect.etl 3.1 assumes one buffer size; walk them here
            for record in Buffer(etl, offset):
                header = record.header
                if getattr(header, "group", None) != fmt.STACKWALK_GROUP:   # system headers only have one
                    continue
                char = "<Q" if header.is_64bit else "<I"
                size = struct.calcsize(char)
                payload = bytes(header.payload)
                if header.opcode == fmt.STACK_WALK:
                    walks.append([struct.unpack_from(char, payload, at)[0] for at in range(16, len(payload), size)])
                elif header.opcode in (fmt.STACK_DELETE_DEFINITION, fmt.STACK_RUNDOWN_DEFINITION):
                    defined.add(struct.unpack_from(char, payload)[0])
                elif header.opcode in (fmt.STACK_KEY_KERNEL, fmt.STACK_KEY_USER):
                    references.append(struct.unpack_from(char, payload, 16)[0])
    parts = sum(any(f >= KERNEL_SPACE_START for f in walk) + any(f < KERNEL_SPACE_START for f in walk)
                for walk in walks)
    return parts + sum(key in defined for key in references), collections.Counter(
        walks=len(walks), references=len(references))


@pytest.mark.parametrize("name, lookups", [("perfview__net.4.5.2.x64", 9359), ("perfview__net.4.5.2.x86", 12401)])
def test_etwstacks_simulate_sees_the_stack_lookups_dissect_etl_finds(name, lookups):
    need_module("dissect.etl")
    expected, _ = dissect_stack_lookups(real(ETL / "derived" / (name + ".decompressed.etl")))
    assert expected == lookups
    code, out, err = run(["etwstacks", "--simulate", "--stacks", real(ETL / (name + ".etl")), "--bucket-count",
                          "0n1021", "--json"])
    assert code == 0, err
    document = json.loads(out)
    assert document["events"] == expected   # the lookups replayed
    assert "could not be decoded" not in out


def test_ipt_scan_etl_searches_the_compressed_buffers_and_says_so():
    code, out, _ = run(["ipt", "scan", "--etl", real(ETL / "perfview__net.4.5.2.x64.etl")])
    assert code == 0
    assert "no IntelProcessorTrace events in the 360 buffers searched (359 of them decompressed)" in out
