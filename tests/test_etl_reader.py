"""The .etl reader against files the writer makes: buffers, every header kind,
StackWalk decoding, provider filtering (IPT events), and damaged files."""

import os
import struct
import uuid

import pytest

from dbgext.errors import BadInput
from dbgext.etl import INTEL_PT_GUID, STACKWALK_GUID, EtlReader, iter_events
from dbgext.etl import format as fmt
from etl_writer import EtlWriter
from dbgext.etl.stackwalk import decode, stack_walk_records

KERNEL = [0xFFFFF80000001000, 0xFFFFF80000002000]


def test_events_span_buffers_and_come_back_in_order():
    writer = EtlWriter(buffer_size=0x400)
    for index in range(60):
        writer.add_stack_walk(KERNEL + [index], process_id=100 + index, thread_id=7)
    data = writer.to_bytes()
    reader = EtlReader(data)
    buffers = list(reader.buffers())
    assert len(buffers) > 3 and all(b.size == 0x400 for b in buffers)
    assert [b.sequence for b in buffers] == list(range(len(buffers)))
    events = list(reader.events())
    assert events[0].group == fmt.EVENT_TRACE_GROUP and events[0].opcode == 0  # logfile header
    walks = [decode(e) for e in events[1:]]
    assert [w.frames[-1] for w in walks] == list(range(60))
    assert [w.process_id for w in walks] == [100 + i for i in range(60)]
    assert reader.problems == []


@pytest.mark.parametrize("header", ["system", "compact", "perfinfo"])
def test_stackwalk_events_in_every_system_header_form(header):
    writer = EtlWriter()
    writer.add_stack_walk(KERNEL, process_id=4, thread_id=8, timestamp=1234, header=header)
    writer.add_stack_key(0xFFFFC08000001000, user=True, process_id=4, thread_id=8, header=header)
    writer.add_stack_definition(0xFFFFC08000001000, KERNEL, header=header)
    records, summary = stack_walk_records(writer.to_bytes())
    assert list(summary.problems) == [] and summary.note() is None
    assert [r.kind for r in records] == ["walk", "user_reference", "delete_definition"]
    assert records[0].frames == tuple(KERNEL) and records[0].timestamp == 1234
    assert (records[0].process_id, records[0].thread_id) == (4, 8)
    assert records[1].key == records[2].key == 0xFFFFC08000001000
    assert records[2].frames == tuple(KERNEL)


def test_system_events_carry_the_stackwalk_guid_and_hook_id():
    writer = EtlWriter()
    writer.add_stack_definition(0x10, [1, 2], rundown=True)
    event = list(EtlReader(writer.to_bytes()).events())[-1]
    assert event.provider == STACKWALK_GUID and event.hook_id == 0x1824


def test_32_bit_traces_use_4_byte_frames():
    writer = EtlWriter(pointer_size=4)
    writer.add_stack_walk([0x80001000, 0x80002000])
    [record], _ = stack_walk_records(writer.to_bytes())
    assert record.frames == (0x80001000, 0x80002000)


def test_ipt_events_are_found_by_provider_and_opcode():
    header = struct.pack("<QIIII", 99, 4, 8, 6, 0)
    writer = EtlWriter()
    writer.add_stack_walk(KERNEL)
    writer.add_classic_event(INTEL_PT_GUID, 32, header + b"\x02\x82" * 8, process_id=4, thread_id=8)
    writer.add_manifest_event(INTEL_PT_GUID, 1, header + b"\x00", opcode=32)
    writer.add_classic_event(uuid.UUID(int=5), 32, b"other provider")
    found = list(iter_events(writer.to_bytes(), provider=str(INTEL_PT_GUID), opcode=32))
    assert [e.payload[:24] for e in found] == [header, header]
    assert found[0].process_id == 4 and found[0].thread_id == 8
    assert found[0].header_type == fmt.FULL_HEADER64 and found[1].header_type == fmt.EVENT_HEADER64


def test_a_file_is_read_from_disk(tmp_path):
    path = str(tmp_path / "t.etl")
    writer = EtlWriter()
    writer.add_stack_walk(KERNEL)
    writer.write(path)
    assert len(list(EtlReader(path).events())) == 2


def _open_descriptors():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_readers_close_their_files(tmp_path):
    path = str(tmp_path / "t.etl")
    writer = EtlWriter()
    writer.add_stack_walk(KERNEL)
    writer.write(path)
    not_etl = str(tmp_path / "not.etl")
    with open(not_etl, "wb") as handle:
        handle.write(b"MDMP" + bytes(100))
    before = _open_descriptors()
    with EtlReader(path) as reader:
        assert len(list(reader.events())) == 2
    assert len(list(iter_events(path))) == 2
    events = iter_events(path)
    next(events)
    events.close()                      # a caller that stops early
    with pytest.raises(BadInput):
        EtlReader(not_etl)
    assert _open_descriptors() == before


def test_not_an_etl_file_is_bad_input(tmp_path):
    with pytest.raises(BadInput):
        EtlReader(b"MDMP" + bytes(100))
    with pytest.raises(BadInput):
        EtlReader(b"short")
    with pytest.raises(BadInput):
        EtlReader(str(tmp_path / "missing.etl"))


def test_truncated_file_keeps_complete_buffers_and_says_so():
    writer = EtlWriter(buffer_size=0x400)
    for _ in range(40):
        writer.add_stack_walk(KERNEL)
    data = writer.to_bytes()
    reader = EtlReader(data[:0x400 * 2 + 100])
    assert len(list(reader.buffers())) == 2
    assert reader.problems[0].kind == "etl_truncated" and "truncated" in reader.problems[0].message


def test_corrupt_event_ends_its_buffer_only():
    writer = EtlWriter(buffer_size=0x400)
    for _ in range(40):
        writer.add_stack_walk(KERNEL)
    data = bytearray(writer.to_bytes())
    per_buffer = [len(list(EtlReader(bytes(data[i:i + 0x400])).events()))
                  for i in range(0, len(data), 0x400)]
    data[0x48 + 2] = 0x77  # first event of buffer 0: unknown header type
    struct.pack_into("<H", data, 0x400 + 0x48 + 4, 0xFFF0)  # buffer 1: size runs past the buffer
    reader = EtlReader(bytes(data))
    events = list(reader.events())
    assert len(events) == sum(per_buffer[2:])
    assert [p.kind for p in reader.problems] == ["etl_event_corrupt"] * 2
    assert "unknown header type" in reader.problems[0].message


def test_impossible_buffer_size_stops_the_walk():
    writer = EtlWriter(buffer_size=0x400)
    for _ in range(40):
        writer.add_stack_walk(KERNEL)
    data = bytearray(writer.to_bytes())
    struct.pack_into("<I", data, 0x400, 0x10)
    reader = EtlReader(bytes(data))
    assert len(list(reader.buffers())) == 1
    assert "impossible BufferSize" in reader.problems[0].message


def test_short_stackwalk_payloads_decode_to_nothing():
    writer = EtlWriter()
    writer.add_system_event(fmt.STACKWALK_GROUP, fmt.STACK_WALK, b"\x01\x02")
    writer.add_system_event(fmt.STACKWALK_GROUP, fmt.STACK_KEY_KERNEL, bytes(16))
    records, _ = stack_walk_records(writer.to_bytes())
    assert records == []


def test_writer_refuses_events_that_cannot_fit():
    writer = EtlWriter(buffer_size=0x400)
    with pytest.raises(ValueError):
        writer.add_classic_event(INTEL_PT_GUID, 32, bytes(0x400))
    with pytest.raises(ValueError):
        EtlWriter(buffer_size=0x100)


def test_an_empty_file_is_bad_input(tmp_path):
    path = tmp_path / "empty.etl"
    path.write_bytes(b"")
    with pytest.raises(BadInput):
        EtlReader(str(path))
