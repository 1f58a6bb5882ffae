"""PykdBackend over the fake pykd: pages, runs, modules, symbols, types, info."""

import sys

import pytest

from dbgext.errors import DbgextError, UnreadableMemory
from dbgext.target.base import PAGE_SIZE
from dbgext.target.pykd_backend import PykdBackend, open_pykd_target
from fake_pykd import make_fake_pykd
from dbgext.sample.scenario import Scenario
from pykd_support import DRIVER_BASE, NT_BASE, kernel_scenario
from minidump_writer import write_minidump


@pytest.fixture
def session():
    scenario, at = kernel_scenario()
    pykd = make_fake_pykd(scenario)
    return pykd, open_pykd_target(pykd), at


def test_reading_a_thousand_fields_of_one_page_is_one_load_bytes(session):
    pykd, target, at = session
    pykd.fake_calls.clear()
    total = sum(target.u32(at.page + 4 * (index % 1024)) for index in range(1000))
    assert total > 0
    assert pykd.fake_calls["loadBytes"] == 1
    assert target.stats.backend_calls == 1


def test_a_run_of_pages_is_one_load_bytes_when_all_are_valid(session):
    pykd, target, at = session
    pykd.fake_calls.clear()
    data = target.read(NT_BASE, 4 * PAGE_SIZE)
    assert len(data) == 4 * PAGE_SIZE
    assert pykd.fake_calls["loadBytes"] == 1


def test_a_short_run_with_an_invalid_page_is_read_page_by_page(session):
    pykd, target, at = session
    pykd.fake_calls.clear()
    partial = target.try_read(at.page, 2 * PAGE_SIZE)
    assert partial.holes == [(at.hole, at.hole + PAGE_SIZE)]
    assert partial.data[:4] == b"\x00\x01\x02\x03"
    assert pykd.fake_calls["loadBytes"] == 3  # the run, then each page alone


def run_with_holes(pages, holes):
    """A fake pykd over ``pages`` mapped pages with the pages at ``holes`` unmapped."""
    scenario = Scenario("x64", "kernel")
    base = scenario.alloc_pages(pages * PAGE_SIZE)
    for index in holes:
        scenario.unmap(base + index * PAGE_SIZE, PAGE_SIZE)
    pykd = make_fake_pykd(scenario)
    return pykd, open_pykd_target(pykd, cache_pages=0), base


def test_a_long_run_with_one_hole_is_split_until_the_hole_is_found():
    pykd, target, base = run_with_holes(256, [200])
    partial = target.try_read(base, 256 * PAGE_SIZE)
    assert partial.holes == [(base + 200 * PAGE_SIZE, base + 201 * PAGE_SIZE)]
    assert pykd.fake_calls["loadBytes"] <= 20  # not 257: one per page
    assert not {"isValid", "isVaRegionValid"} & set(pykd.fake_calls)  # no validity queries of our own


def test_every_other_page_missing_costs_little_more_than_page_by_page():
    pykd, target, base = run_with_holes(256, range(1, 256, 2))
    partial = target.try_read(base, 256 * PAGE_SIZE)
    assert len(partial.holes) == 128
    assert pykd.fake_calls["loadBytes"] <= 1.25 * 256 + 64


def test_unreadable_memory_is_an_unreadable_memory_error_naming_the_address(session):
    pykd, target, at = session
    with pytest.raises(UnreadableMemory) as caught:
        target.u64(at.hole + 0x10)
    assert caught.value.address == at.hole + 0x10


def test_modules_come_from_get_modules_list(session):
    pykd, target, at = session
    assert [(m.name, m.base, m.size, m.image) for m in target.modules()] == [
        ("nt", NT_BASE, 0x20000, "ntoskrnl.exe"), ("mydrv", DRIVER_BASE, 0x3000, "mydrv.sys")]
    assert target.module_at(DRIVER_BASE + 0x10).name == "mydrv"


def test_symbols_use_dbgext_displacement_format(session):
    pykd, target, at = session
    assert target.symbolize(NT_BASE + 0x101A) == "nt!KiSystemStartup+0x1a"
    assert target.symbolize(NT_BASE + 0x1000) == "nt!KiSystemStartup"
    assert target.symbolize(NT_BASE + 0x20) == "nt+0x20"
    assert target.symbolize(0x7FFD1234) == "0x7ffd1234"
    assert target.symbols.function_of(NT_BASE + 0x2004) == "nt!KeBugCheckEx"
    assert target.symbols.function_of(0x1234) is None
    assert target.symbol_address("nt!KeBugCheckEx") == NT_BASE + 0x2000
    assert target.symbol_address("nt!Nope") is None
    assert target.symbol_address("zz!Nope") is None
    assert not target.symbols.empty


def test_symbol_answers_are_cached(session):
    pykd, target, at = session
    pykd.fake_calls.clear()
    for _ in range(5):
        target.symbolize(NT_BASE + 0x1010)
        target.symbol_address("nt!KeBugCheckEx")
        target.field_offset("nt!_WIDGET", "Tag")
    assert pykd.fake_calls["findSymbol"] == 1
    assert pykd.fake_calls["getOffset"] == 1


def test_types_come_from_the_debugger(session):
    pykd, target, at = session
    assert target.type_size("nt!_WIDGET") == 0x28
    assert target.field_offset("nt!_WIDGET", "Tag") == 0x18
    assert target.field_offset("nt!_WIDGET", "Links.Blink") == 0x10
    assert target.field_offset("nt!_WIDGET", "Nope") is None
    assert target.type_size("nt!_NOPE") is None


def test_info_describes_a_kernel_dump(session):
    pykd, target, at = session
    info = target.info()
    assert info["kind"] == "pykd" and info["arch"] == "x64"
    assert info["mode"] == "kernel" and info["source"] == "dump"
    assert info["bugcheck"] == [0xD1, 0x10, 2, 0, NT_BASE + 0x2010]
    assert info["build"] == 19045
    assert info["registers"]["rip"] == NT_BASE + 0x2010
    assert info["current_thread"] == at.kthread and info["processor"] == 0
    calls = sum(pykd.fake_calls.values())
    assert target.info() == info and sum(pykd.fake_calls.values()) == calls  # asked once


def test_info_of_a_live_user_session_has_no_bugcheck():
    scenario = Scenario("x86", "user")
    target = open_pykd_target(make_fake_pykd(scenario, dump=False, registers={"eip": 0x401000}))
    info = target.info()
    assert info["arch"] == "x86" and target.pointer_size == 4
    assert info["mode"] == "user" and info["source"] == "live"
    assert "bugcheck" not in info and info["registers"] == {"eip": 0x401000}


def test_a_live_target_has_no_memory_map():
    backend = PykdBackend(make_fake_pykd(Scenario("x64", "kernel")))
    assert backend.mapped_ranges() is None


def test_without_pykd_the_error_says_where_it_works(monkeypatch):
    monkeypatch.setitem(sys.modules, "pykd", None)  # makes "import pykd" fail
    with pytest.raises(DbgextError, match="inside WinDbg"):
        open_pykd_target()


def test_the_backend_reads_a_real_kernel_dump_through_the_fake(tmp_path):
    scenario, at = kernel_scenario()
    path = str(tmp_path / "k.dmp")
    scenario.write_kernel_dump(path)
    scenario.write_symbols(path + ".symbols")
    pykd = make_fake_pykd(path)
    target = open_pykd_target(pykd)
    assert target.read(at.text, 13) == b"Hello, WinDbg"
    assert not target.is_readable(at.hole)
    assert target.symbolize(NT_BASE + 0x2010) == "nt!KeBugCheckEx+0x10"
    assert target.info()["bugcheck"][0] == 0xD1


def test_the_backend_reads_a_user_minidump_through_the_fake(tmp_path):
    from dbgext.sample.scenario import Thread
    s = Scenario("x64", "user")
    s.add_module("app", 0x7FF700000000, 0x3000, image="app.exe")
    s.add_symbol("app", "main", 0x1000)
    text = s.alloc(0x100)
    s.write(text, b"hello\0")
    s.map(0x200000, 0x1000)
    s.registers = {"rip": 0x7FF700001010, "rsp": 0x200800}
    s.threads.append(Thread(0x1234, teb=0x300000, stack_base=0x200000, stack_size=0x1000,
                            registers=dict(s.registers)))
    path = str(tmp_path / "u.mdmp")
    write_minidump(s, path)
    s.write_symbols(path + ".symbols")
    pykd = make_fake_pykd(path)
    assert not pykd.isKernelDebugging()
    assert pykd.getCurrentThread() == 0x300000 and pykd.getThreadSystemID() == 0x1234
    target = open_pykd_target(pykd)
    assert target.cstring(text) == "hello"
    assert target.symbolize(0x7FF700001010) == "app!main+0x10"
    info = target.info()
    assert info["mode"] == "user" and "bugcheck" not in info
    assert info["registers"]["rip"] == 0x7FF700001010
    assert info["current_thread"] == 0x300000
    assert info["threads"] == [{"thread_id": 0x1234, "teb": 0x300000}]


def test_x86_addresses_stay_32_bit_although_pykd_sign_extends_them():
    s = Scenario("x86", "user")
    s.add_module("app", 0x80400000, 0x2000, image="app.exe")
    s.add_symbol("app", "main", 0x1000)
    s.pack(0x80401000, "<I", 0xC3C3C3C3)
    target = open_pykd_target(make_fake_pykd(s))
    assert [(m.name, m.base) for m in target.modules()] == [("app", 0x80400000)]
    assert target.symbol_address("app!main") == 0x80401000
    assert target.symbolize(0x80401002) == "app!main+0x2"
    assert target.u32(0x80401000) == 0xC3C3C3C3
