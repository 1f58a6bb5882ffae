"""Layer 2: trace sources — ETW event header, _IPT_OPTION, wrapped rings, ipt.sys
process traces, target memory and scans."""

import struct

import pytest

import ipt_tracer as T
from dbgext.errors import BadInput, UnreadableMemory
from dbgext.ipt import fixtures as F
from dbgext.ipt import sources
from dbgext.ipt.flow import CodeImage, decode_flow
from dbgext.ipt.packets import PSB, decode_packets
from dbgext.sample.scenario import Scenario

BASE = 0xFFFFF80012341000
PROGRAM = T.random_program(BASE, functions=30, seed=8)
CODE = CodeImage(images=[(PROGRAM.base, PROGRAM.code)])


def test_ipt_option_decodes_field_by_field():
    value = ipt = sources.ipt_option_value({"TraceMode": 1, "TimeMode": 2, "MTCFreq": 3, "CycThresh": 4,
                                            "BufferSize": 2, "TraceSessionMode": 1, "TraceChild": 1,
                                            "TraceCodeMode": 2})
    assert value == 0x02924321
    fields = sources.decode_ipt_option(ipt)
    assert (fields["TraceMode"], fields["TimeMode"], fields["MTCFreq"], fields["CycThresh"]) == (1, 2, 3, 4)
    assert fields["BufferSize"] == 2 and fields["BufferBytes"] == 16384
    assert fields["TraceSessionModeText"] == "by image file name" and fields["TraceChild"] == 1
    assert fields["TraceCodeModeText"] == "user + kernel" and fields["Reserved"] == 0


def event_bytes(trace, position=None, buffer_size=0, option=None):
    option = option or {"TraceMode": 1, "BufferSize": buffer_size, "TraceCodeMode": 1}
    header = sources.encode_event_header(1234, 4, 8, sources.ipt_option_value(option), len(trace),
                                         len(trace) if position is None else position)
    return header + trace


def test_event_header_and_trace():
    trace, _ = T.trace_program(PROGRAM, 200, seed=1)
    buffer = sources.event_from_bytes(event_bytes(trace))
    assert buffer.data == trace and buffer.ring_start == 0
    assert buffer.header["Process"] == 4 and buffer.header["Thread"] == 8
    assert buffer.header["IptOptionFields"]["TraceCodeModeText"] == "kernel"


def test_event_header_too_short_is_bad_input():
    with pytest.raises(BadInput):
        sources.event_from_bytes(b"\x00" * 20)


def test_trace_size_larger_than_the_data_decodes_what_is_there():
    trace, _ = T.trace_program(PROGRAM, 200, seed=1)
    data = event_bytes(trace)[:-10]
    buffer = sources.event_from_bytes(data)
    assert len(buffer.data) == len(trace) - 10
    assert any("larger than" in note for note in buffer.notes)


def test_trace_position_beyond_the_trace_is_a_note_not_a_crash():
    trace, _ = T.trace_program(PROGRAM, 200, seed=1)
    buffer = sources.event_from_bytes(event_bytes(trace, position=len(trace) + 100))
    assert buffer.data == trace and any("beyond" in note for note in buffer.notes)


def ring_of(linear, size):
    """What a ring buffer of ``size`` bytes holds after the hardware wrote ``linear`` into it."""
    ring = bytearray(size)
    for index, byte in enumerate(linear):
        ring[index % size] = byte
    return bytes(ring), len(linear) % size


def first_psb_at_or_after(data, offset):
    return data.find(PSB, offset)


@pytest.fixture(scope="module")
def linear_trace():
    trace, _ = T.trace_program(PROGRAM, 6000, seed=2, psb_every=160, interrupt_every=300)
    return trace


def wrap_position_classes(trace):
    """Ring sizes whose write position lands: on a PSB start, inside a PSB, right after
    a PSB, inside a multi-byte packet, on a 1-byte packet, at 0 (no visible wrap)."""
    psb = trace.find(PSB, len(trace) // 2)
    packets = decode_packets(trace).packets
    multi = next(p for p in packets if p.offset > len(trace) // 2 and p.size > 2)
    single = next(p for p in packets if p.offset > len(trace) // 2 and p.size == 1)
    wanted = {"psb start": psb, "inside psb": psb + 7, "after psb": psb + 16, "mid packet": multi.offset + 1,
              "one-byte packet": single.offset}
    # A ring of len(trace) - offset bytes holds the trace from ``offset`` on: its oldest byte.
    sizes = {name: len(trace) - offset for name, offset in wanted.items()}
    sizes["no wrap"] = len(trace)
    return sizes


def test_wrapped_rings_decode_from_the_oldest_psb_at_every_wrap_position_class(linear_trace):
    classes = wrap_position_classes(linear_trace)
    assert set(classes) == {"psb start", "inside psb", "after psb", "mid packet", "one-byte packet", "no wrap"}
    for name, size in classes.items():
        ring, position = ring_of(linear_trace, size)
        buffer = sources.from_bytes(ring, position=position)
        oldest = len(linear_trace) - size
        assert buffer.data == linear_trace[oldest:]
        start = first_psb_at_or_after(linear_trace, oldest)
        expected = decode_packets(linear_trace, start=start)
        got = decode_packets(buffer.data)
        assert [(buffer.original_offset(p.offset), p.type, p.fields) for p in got.packets] == \
            [(p.offset % size, p.type, p.fields) for p in expected.packets], name
        assert got.problems == [], name
        flow = decode_flow(buffer.data, CODE)
        assert flow.instructions == decode_flow(linear_trace, CODE, start=start).instructions, name


def test_wrapped_event_uses_trace_position(linear_trace):
    size = 4096
    trace = linear_trace[:size + 777]
    ring, position = ring_of(trace, size)
    buffer = sources.event_from_bytes(event_bytes(ring, position=position, buffer_size=0))
    assert buffer.ring_start == position and any("wrapped" in note for note in buffer.notes)
    start = first_psb_at_or_after(trace, len(trace) - size)
    assert decode_flow(buffer.data, CODE).instructions == decode_flow(trace, CODE, start=start).instructions


def test_position_outside_the_buffer_is_bad_input():
    with pytest.raises(BadInput):
        sources.from_bytes(b"\0" * 10, position=10)


def process_trace(threads, pointer_size=8):
    body = b""
    for thread_id, trace, ring_offset in threads:
        body += struct.pack("<QIIIII" if pointer_size == 8 else "<IIIIII", thread_id, 0, 0, 0, ring_offset,
                            len(trace)) + trace
    return struct.pack("<HHI", 1, 1, len(body)) + body


def test_process_trace_has_one_ring_per_thread(linear_trace):
    first, _ = T.trace_program(PROGRAM, 300, seed=3)
    ring, position = ring_of(linear_trace, 3000)
    buffers = sources.process_trace_buffers(process_trace([(0x10, first, 0), (0x20, ring, position)]))
    assert [b.header["ThreadId"] for b in buffers] == [0x10, 0x20]
    assert buffers[0].data == first
    assert buffers[1].ring_start == position and buffers[1].data == ring[position:] + ring[:position]


def test_process_trace_28_byte_thread_header_on_x64():
    assert sources.thread_header_struct(8).size == 28 and sources.thread_header_struct(4).size == 24


def test_process_trace_bad_inputs():
    with pytest.raises(BadInput):
        sources.process_trace_buffers(b"\x02\x00\x01\x00\x00\x00\x00\x00")  # version 2
    with pytest.raises(BadInput):
        sources.process_trace_buffers(b"\x01\x00")
    truncated = process_trace([(0x10, PSB * 4, 0)])[:-20]
    buffers = sources.process_trace_buffers(truncated)
    assert len(buffers[0].data) == 44 and any("larger than" in n or "runs past" in n for n in buffers[0].notes)


def scenario_with_events():
    scenario = Scenario("x64", "kernel")
    info = F.add_sample_trace(scenario)
    noise = scenario.alloc(0x3000)
    scenario.write(noise, bytes((i * 37) & 0xFF for i in range(0x3000)))
    wrapped_trace = bytes(scenario.read(info["trace_address"], info["trace_size"]))
    ring, position = ring_of(wrapped_trace * 60, 4096)
    wrapped = scenario.alloc(32 + 4096)
    scenario.write(wrapped, event_bytes(ring, position=position))
    return scenario, info, wrapped


def test_scan_finds_events_in_memory_including_wrapped_ones():
    scenario, info, wrapped = scenario_with_events()
    scan = sources.scan_target(scenario.target())
    assert [event["address"] for event in scan.events] == [info["event_address"], wrapped]
    assert scan.events[0]["psb_at_start"] and scan.notes == []


def test_event_from_target_and_unreadable_trace():
    scenario, info, _ = scenario_with_events()
    target = scenario.target()
    buffer = sources.event_from_target(target, info["event_address"])
    assert len(buffer.data) == info["trace_size"]
    with pytest.raises(UnreadableMemory):
        sources.event_from_target(target, 0xFFFF900000000000)


def test_raw_trace_in_target_with_a_hole_is_reported():
    scenario = Scenario("x64", "kernel")
    address = scenario.alloc_pages(0x2000)
    scenario.write(address, PSB + b"\x06" * 0x1FF0)
    scenario.unmap(address + 0x1000, 0x1000)
    buffer = sources.from_target(scenario.target(), address, 0x2000)
    assert any("unreadable" in note for note in buffer.notes)
    with pytest.raises(BadInput):
        sources.from_target(scenario.target(), address, 0)


@pytest.mark.parametrize("chunk", [0x1000, 0x40, 0x10])
def test_scan_finds_each_event_once_whatever_the_chunk_boundaries(monkeypatch, chunk):
    scenario, info, wrapped = scenario_with_events()
    monkeypatch.setattr(sources, "SCAN_CHUNK", chunk)
    events = sources.scan_target(scenario.target()).events
    assert [event["address"] for event in events] == [info["event_address"], wrapped]


def test_scan_limits_are_notes():
    scenario, info, _ = scenario_with_events()
    scan = sources.scan_target(scenario.target(), max_events=1)
    assert len(scan.events) == 1 and scan.notes == ["stopped after 1 events"]
    scan = sources.scan_target(scenario.target(), max_bytes=1)
    assert scan.notes and scan.notes[0].startswith("stopped after scanning")


def test_incomplete_wrapped_event_is_decoded_as_stored_with_a_note():
    trace, _ = T.trace_program(PROGRAM, 200, seed=1)
    full_buffer = {"TraceMode": 1, "BufferSize": 0}
    padded = trace + bytes(4096 - len(trace))
    data = event_bytes(padded, position=len(trace), option=full_buffer)[:-5]
    buffer = sources.event_from_bytes(data)
    assert buffer.ring_start == 0 and any("incomplete" in note for note in buffer.notes)


def test_position_inside_a_buffer_that_is_not_full_is_only_a_note():
    trace, _ = T.trace_program(PROGRAM, 400, seed=1)
    buffer = sources.event_from_bytes(event_bytes(trace, position=len(trace) // 2, buffer_size=3))
    assert buffer.data == trace and any("a position of %d unrolls it" % (len(trace) // 2) in note for note in buffer.notes)


def test_user_position_overrides_the_event_header_on_the_stored_bytes(linear_trace):
    size = 4096
    trace = linear_trace[:size + 999]
    ring, position = ring_of(trace, size)
    stored = event_bytes(ring, position=position, buffer_size=0)  # the header's own TracePosition
    by_header = sources.event_from_bytes(stored)
    by_user = sources.event_from_bytes(stored, position=position)
    assert by_user.data == by_header.data and by_user.ring_start == position
    with pytest.raises(BadInput):
        sources.event_from_bytes(stored, position=size)
