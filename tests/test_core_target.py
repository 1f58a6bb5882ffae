"""The Target protocol: reads, holes, typed helpers, list walks, scans, symbols."""

import struct

import pytest

from dbgext.errors import BadInput, UnreadableMemory
from dbgext.target.base import PAGE_SIZE
from dbgext.sample.scenario import Scenario

NT_BASE = 0xFFFFF80000000000


@pytest.fixture
def scenario():
    s = Scenario(arch="x64", mode="kernel")
    s.add_module("nt", NT_BASE, 0x20000, image="ntoskrnl.exe")
    s.add_module("mydrv", 0xFFFFF80100000000, 0x8000, image="mydrv.sys")
    s.add_symbol("nt", "KeBugCheckEx", 0x1000)
    s.add_symbol("nt", "KiSystemCall64", 0x2000)
    s.add_type("nt", "_LIST_ENTRY", 16, {"Flink": 0, "Blink": 8})
    s.add_type("nt", "_KTHREAD", 0x430, {"InitialStack": 0x28, "StackLimit": 0x30,
                                        "Header": (0, "_DISPATCHER_HEADER")})
    s.add_type("nt", "_DISPATCHER_HEADER", 0x18, {"WaitListHead": (8, "_LIST_ENTRY")})
    return s


def test_a_read_spanning_pages_returns_exactly_the_bytes_placed(scenario):
    address = scenario.alloc(3 * PAGE_SIZE)
    payload = bytes(range(256)) * 40
    scenario.write(address + 100, payload)
    target = scenario.target()
    assert target.read(address + 100, len(payload)) == payload


def test_an_unreadable_byte_raises_naming_the_first_unreadable_address(scenario):
    address = scenario.alloc_pages(2 * PAGE_SIZE)
    scenario.unmap(address + PAGE_SIZE, PAGE_SIZE)
    target = scenario.target()
    with pytest.raises(UnreadableMemory) as caught:
        target.read(address + PAGE_SIZE - 8, 16)
    assert caught.value.address == address + PAGE_SIZE
    assert target.format_address(address + PAGE_SIZE) in str(caught.value)


def test_try_read_keeps_going_past_holes_and_lists_them(scenario):
    address = scenario.alloc_pages(3 * PAGE_SIZE)
    scenario.write(address, b"A" * (3 * PAGE_SIZE))
    scenario.unmap(address + PAGE_SIZE, PAGE_SIZE)
    partial = scenario.target().try_read(address + 16, 3 * PAGE_SIZE - 32)
    assert partial.holes == [(address + PAGE_SIZE, address + 2 * PAGE_SIZE)]
    assert partial.data[:PAGE_SIZE - 16] == b"A" * (PAGE_SIZE - 16)
    assert partial.data[PAGE_SIZE - 16:2 * PAGE_SIZE - 16] == bytes(PAGE_SIZE)
    assert partial.readable(address + 16, 8) and not partial.readable(address + PAGE_SIZE, 1)


def test_addresses_outside_the_pointer_range_are_unreadable_not_errors(scenario):
    target = scenario.target()
    with pytest.raises(UnreadableMemory):
        target.read(0xFFFFFFFFFFFFFFF8, 16)
    assert target.try_read(0xFFFFFFFFFFFFFFF8, 16).holes[-1][1] == 0x10000000000000008
    assert not target.is_readable(-1, 4)


def test_field_by_field_reads_cost_one_backend_call_per_page(scenario):
    address = scenario.alloc_pages(PAGE_SIZE)
    target = scenario.target()
    for offset in range(0, PAGE_SIZE, 8):
        target.u64(address + offset)
    assert target.stats.backend_calls == 1
    assert target.stats.reads == PAGE_SIZE // 8


def test_typed_readers_decode_little_endian_values(scenario):
    address = scenario.alloc(64)
    scenario.pack(address, "<BHIQi", 0x12, 0x3456, 0x789ABCDE, 0x1122334455667788, -5)
    target = scenario.target()
    assert target.u8(address) == 0x12
    assert target.u16(address + 1) == 0x3456
    assert target.u32(address + 3) == 0x789ABCDE
    assert target.u64(address + 7) == 0x1122334455667788
    assert target.i32(address + 15) == -5
    assert target.pointer(address + 7) == 0x1122334455667788
    assert target.array("H", address + 1, 1) == [0x3456]


def test_strings_stop_at_the_terminator_or_the_bound(scenario):
    address = scenario.alloc(0x100)
    scenario.write(address, b"hello\0world")
    scenario.write(address + 0x40, "wide".encode("utf-16-le") + b"\0\0")
    buffer = scenario.alloc(32)
    scenario.write(buffer, "mydrv.sys".encode("utf-16-le"))
    scenario.pack(address + 0x80, "<HHxxxxQ", 18, 20, buffer)
    target = scenario.target()
    assert target.cstring(address) == "hello"
    assert target.cstring(address, max_length=3) == "hel"
    assert target.wstring(address + 0x40) == "wide"
    assert target.unicode_string(address + 0x80) == "mydrv.sys"


def test_a_corrupt_unicode_string_is_bad_input(scenario):
    address = scenario.alloc(16)
    scenario.pack(address, "<HHxxxxQ", 40, 10, address)
    with pytest.raises(BadInput):
        scenario.target().unicode_string(address)


def _list(scenario, count):
    head = scenario.alloc(16)
    nodes = [scenario.alloc(16) for _ in range(count)]
    chain = [head] + nodes
    for index, node in enumerate(chain):
        scenario.pack(node, "<QQ", chain[(index + 1) % len(chain)], chain[index - 1])
    return head, nodes


def test_walk_list_returns_entries_in_flink_order(scenario):
    head, nodes = _list(scenario, 5)
    walk = scenario.target().walk_list(head)
    assert walk.entries == nodes and walk.problem is None


def test_walk_list_stops_on_a_cycle_that_misses_the_head(scenario):
    head, nodes = _list(scenario, 4)
    scenario.pack(nodes[3], "<Q", nodes[1])
    walk = scenario.target().walk_list(head)
    assert walk.problem == "cycle" and walk.problem_address == nodes[1]
    assert walk.entries == nodes


def test_walk_list_reports_an_unreadable_link_with_its_address(scenario):
    head, nodes = _list(scenario, 3)
    scenario.pack(nodes[1], "<Q", 0xFFFF900000000000)
    walk = scenario.target().walk_list(head)
    assert walk.entries == nodes[:2] + [0xFFFF900000000000]
    assert walk.problem == "unreadable" and walk.problem_address == 0xFFFF900000000000


def test_walk_list_is_bounded(scenario):
    head, nodes = _list(scenario, 50)
    walk = scenario.target().walk_list(head, max_entries=10)
    assert len(walk.entries) == 10 and walk.problem == "limit"


def test_scan_finds_patterns_across_page_boundaries_and_skips_holes(scenario):
    address = scenario.alloc_pages(4 * PAGE_SIZE)
    scenario.write(address + PAGE_SIZE - 2, b"\xCC\xCC\xCD\xAB")
    scenario.write(address + 3 * PAGE_SIZE + 8, b"\xCC\xCC\xCD\xAB")
    scenario.unmap(address + 2 * PAGE_SIZE, PAGE_SIZE)
    found = scenario.target().scan(b"\xCC\xCC\xCD\xAB", start=address, end=address + 4 * PAGE_SIZE)
    assert found == [address + PAGE_SIZE - 2, address + 3 * PAGE_SIZE + 8]


def test_symbols_resolve_both_ways(scenario):
    target = scenario.target()
    assert target.symbol_address("nt!KeBugCheckEx") == NT_BASE + 0x1000
    assert target.symbol_address("KiSystemCall64") == NT_BASE + 0x2000
    assert target.symbol_address("nt!NoSuchThing") is None
    assert target.symbolize(NT_BASE + 0x1000) == "nt!KeBugCheckEx"
    assert target.symbolize(NT_BASE + 0x2010) == "nt!KiSystemCall64+0x10"
    assert target.symbolize(NT_BASE + 0x10) == "nt+0x10"
    assert target.symbolize(0xFFFFF80100000040) == "mydrv+0x40"
    assert target.symbolize(0x1234) == "0x1234"
    assert target.symbols.function_of(NT_BASE + 0x2010) == "nt!KiSystemCall64"


def test_type_information_gives_sizes_and_nested_field_offsets(scenario):
    target = scenario.target()
    assert target.type_size("nt!_KTHREAD") == 0x430
    assert target.field_offset("nt!_KTHREAD", "StackLimit") == 0x30
    assert target.field_offset("_KTHREAD", "Header.WaitListHead.Blink") == 0x10
    assert target.field_offset("nt!_KTHREAD", "NoSuchField") is None
    assert target.field_offset("nt!_NOPE", "X") is None


def test_targets_without_type_information_answer_none(scenario):
    target = scenario.target(with_types=False)
    assert target.field_offset("nt!_KTHREAD", "StackLimit") is None
    assert target.symbol_address("nt!KeBugCheckEx") == NT_BASE + 0x1000


def test_modules_are_sorted_and_found_by_name_or_image(scenario):
    target = scenario.target()
    assert [m.name for m in target.modules()] == ["nt", "mydrv"]
    assert target.module_named("ntoskrnl.exe").base == NT_BASE
    assert target.module_at(0xFFFFF80100000010).name == "mydrv"
    assert target.module_at(0x10) is None


def test_x86_targets_read_four_byte_pointers():
    s = Scenario(arch="x86", mode="user")
    address = s.alloc(16)
    s.pack(address, "<II", 0x80001000, 0x7)
    target = s.target()
    assert target.pointer_size == 4
    assert target.pointer(address) == 0x80001000
    assert target.pointers(address, 2) == [0x80001000, 7]
    assert target.format_address(0x80001000) == "80001000"


def test_loaded_module_list_is_laid_out_like_windows(scenario):
    head = scenario.build_loaded_module_list()
    target = scenario.target()
    walk = target.walk_list(head)
    assert walk.problem is None and len(walk.entries) == 2
    names = [target.unicode_string(entry + 0x58) for entry in walk.entries]
    bases = [struct.unpack("<Q", target.read(entry + 0x30, 8))[0] for entry in walk.entries]
    assert names == ["ntoskrnl.exe", "mydrv.sys"] and bases == [NT_BASE, 0xFFFFF80100000000]
    assert target.symbol_address("nt!PsLoadedModuleList") == head


def test_dml_tables_link_exactly_the_requested_cell():
    from dbgext.render.output import Output

    class DebuggerOutput(object):
        def __init__(self):
            self.text = ""

        def write(self, text):
            self.text += text

        def writedml(self, text):
            self.text += text

    stream = DebuggerOutput()
    out = Output(stream)
    assert out.dml
    out.table([["abc", "abc <x>"], ["d", "e"]], ["name", "detail"], links={(0, 1): "dps abc"})
    lines = stream.text.split("\n")
    assert lines[2].split() == ["abc", '<link', 'cmd="dps', 'abc">abc', "&lt;x&gt;</link>"]
    assert "link" not in lines[3]


def test_a_size_the_target_claims_cannot_make_dbgext_allocate_it():
    from dbgext.target.base import MAX_READ
    target = Scenario("x64", "kernel").target()
    address = 0xFFFFC08000000000
    for reader in (target.read, target.try_read):
        with pytest.raises(UnreadableMemory) as raised:
            reader(address, 0xFFFFFFFF)
        assert raised.value.address == address and "larger than" in str(raised.value)
    assert MAX_READ >= 64 << 20  # big enough for any real driver image
