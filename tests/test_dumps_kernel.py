"""Kernel crash dumps: what the writer produces reads back through kdmp-parser,
and dbgext's own reader agrees with kdmp-parser byte for byte."""

import os
import random
import struct

import pytest

import dbgext
from dbgext.render.text import hexaddr
from dbgext.layouts.dump_formats import (
    PAGE_SIZE, PTE_LARGE, PTE_PRESENT, PTE_PROTOTYPE, PTE_TRANSITION, PTE_WRITE)
from dbgext.target.kdump import KernelDumpBackend, debugger_module_name
from dbgext.sample.kdump_writer import (
    DEFAULT_DTB, KernelDumpHeader, write_kernel_dump, write_physical_dump)
from dbgext.sample.scenario import KLDR_X64, Scenario

from dumps_support import (
    NON_CANONICAL, NT_BASE, UNMAPPED_KERNEL, USER_BLOB, kdmp_loaded_modules, kdmp_read, kernel_scenario,
    open_kdmp, probe_addresses, random_bytes, scenario_bytes)


@pytest.fixture(scope="module", params=["full", "bitmap"])
def written(request, tmp_path_factory):
    """(scenario, path) of one kernel dump of each kind."""
    scenario = kernel_scenario(seed=7)
    path = str(tmp_path_factory.mktemp("kdump") / ("%s.dmp" % request.param))
    write_kernel_dump(scenario, path, bitmap=request.param == "bitmap")
    return scenario, path


# -- the writer, judged by kdmp-parser ---------------------------------------------------


def test_every_written_page_reads_back_identically_through_kdmp_parser(written):
    scenario, path = written
    dump = open_kdmp(path)
    for va, page in scenario.pages.items():
        assert dump.read_virtual_page(va) == page, hex(va)


def test_blobs_crossing_pages_and_user_addresses_read_back_through_kdmp_parser(written):
    scenario, path = written
    dump = open_kdmp(path)
    assert kdmp_read(dump, USER_BLOB, 0x40) == scenario.read(USER_BLOB, 0x40)
    assert kdmp_read(dump, NT_BASE + 0xFF8, 16) == scenario.read(NT_BASE + 0xFF8, 16)


def test_unmapped_addresses_are_unreadable_through_kdmp_parser(written, capfd):
    scenario, path = written
    dump = open_kdmp(path)
    for va in (UNMAPPED_KERNEL, 0x10000, NON_CANONICAL):
        assert dump.read_virtual_page(va) is None
    # kdmp-parser reports failed translations with printf on C stdout.
    assert "translation failed" in capfd.readouterr().out


def test_header_facts_read_back_through_kdmp_parser(written):
    scenario, path = written
    dump = open_kdmp(path)
    header = dump.header
    assert header.LooksGood()
    assert header.DirectoryTableBase == DEFAULT_DTB
    assert header.BugCheckCode == 0xE2 and list(header.BugCheckCodeParameter) == [1, 2, 3, 4]
    assert header.MinorVersion == scenario.build
    assert header.MachineImageType == 0x8664
    assert header.PsLoadedModuleList == scenario.ps_loaded_module_list != 0
    assert header.RequiredDumpSpace == os.path.getsize(path)
    assert dump.context.Rip == scenario.registers["rip"]
    assert dump.context.Rsp == scenario.registers["rsp"]
    assert dump.context.Rax == 0x1122334455667788
    assert dump.context.MxCsr == 0x1F80
    assert int(dump.type) == (5 if path.endswith("bitmap.dmp") else 1)


def test_kdmp_parser_sees_exactly_the_written_pages_plus_page_tables(written):
    scenario, path = written
    dump = open_kdmp(path)
    backend = KernelDumpBackend(path)
    assert sorted(dump.pages.keys()) == list(backend.physical_frames())
    assert len(list(backend.physical_frames())) > len(scenario.pages)  # + the page tables


def test_the_pml4_self_map_reads_back_the_pml4(written):
    _, path = written
    dump = open_kdmp(path)
    pml4 = dump.read_physical_page(DEFAULT_DTB)
    assert dump.read_virtual_page(0xFFFFF6FB7DBED000) == pml4
    assert struct.unpack_from("<Q", pml4, 0x1ED * 8)[0] & ~0xFFF == DEFAULT_DTB


def test_nt_is_mapped_by_a_large_page(written):
    _, path = written
    dump = open_kdmp(path)
    pml4 = dump.read_physical_page(DEFAULT_DTB)
    pdpt = dump.read_physical_page(struct.unpack_from("<Q", pml4, ((NT_BASE >> 39) & 0x1FF) * 8)[0] & ~0xFFF)
    pd = dump.read_physical_page(struct.unpack_from("<Q", pdpt, ((NT_BASE >> 30) & 0x1FF) * 8)[0] & ~0xFFF)
    assert struct.unpack_from("<Q", pd, ((NT_BASE >> 21) & 0x1FF) * 8)[0] & PTE_LARGE


# -- dbgext's reader agrees with kdmp-parser ------------------------------------------------


def test_dbgext_and_kdmp_parser_agree_on_random_addresses(written):
    scenario, path = written
    dump = open_kdmp(path)
    target = dbgext.open(path)
    rng = random.Random(3)
    for address in probe_addresses(scenario, rng, 300):
        size = rng.choice([1, 8, 0x100, PAGE_SIZE, 0x1800])
        expected = kdmp_read(dump, address, size)
        assert expected == scenario_bytes(scenario, address, size)
        if expected is None:
            assert not target.is_readable(address, size)
            assert not target.try_read(address, size).complete
        else:
            assert target.read(address, size) == expected


def test_the_hole_in_the_middle_of_an_allocation_is_unreadable(written):
    scenario, path = written
    target = dbgext.open(path)
    holes = [va + PAGE_SIZE for va in scenario.pages
             if va + PAGE_SIZE not in scenario.pages and va + 2 * PAGE_SIZE in scenario.pages]
    assert holes
    partial = target.try_read(holes[0] - 8, PAGE_SIZE + 16)
    assert partial.holes == [(holes[0], holes[0] + PAGE_SIZE)]
    assert partial.data[:8] == scenario.read(holes[0] - 8, 8)


def test_mapped_ranges_cover_exactly_the_scenario_pages_outside_the_self_map(written):
    scenario, path = written
    backend = KernelDumpBackend(path)
    self_map = (0xFFFFF68000000000, 0xFFFFF70000000000)
    pages = set()
    for start, end in backend.mapped_ranges():
        if self_map[0] <= start < self_map[1]:
            continue
        pages.update(range(start, end, PAGE_SIZE))
    assert pages == set(scenario.pages)


def test_read_pages_matches_read_page_across_mapped_and_unmapped_pages(written):
    scenario, path = written
    backend = KernelDumpBackend(path)
    first = min(va for va in scenario.pages if va >> 47) - 4 * PAGE_SIZE
    run = backend.read_pages(first, 64)
    assert run == [backend.read_page(first + i * PAGE_SIZE) for i in range(64)]
    assert None in run and any(page is not None for page in run)


def test_modules_come_from_ps_loaded_module_list(written):
    scenario, path = written
    modules = dbgext.open(path).modules()
    assert [(m.name, m.base, m.size, m.image) for m in modules] == [
        ("nt", NT_BASE, 0x200000, "ntoskrnl.exe"), ("mydrv", 0xFFFFF80012340000, 0x6000, "mydrv.sys")]


def test_dbgext_and_kdmp_parser_agree_on_the_module_list(written):
    _, path = written
    expected = kdmp_loaded_modules(open_kdmp(path))
    assert [(m.base, m.size, m.image) for m in dbgext.open(path).modules()] == expected
    assert len(expected) == 2


def test_info_reports_the_crash(written):
    scenario, path = written
    info = dbgext.open(path).info()
    assert info["kind"] == ("kernel-bitmap-dump" if path.endswith("bitmap.dmp") else "kernel-dump")
    assert info["arch"] == "x64" and info["build"] == 19045
    assert info["bugcheck"] == [0xE2, 1, 2, 3, 4]
    assert info["system_time"] == scenario.system_time
    assert info["registers"]["rip"] == scenario.registers["rip"]
    assert info["registers"]["efl"] == 0x40246
    assert info["problems"] == []


def test_the_cli_lists_modules_from_a_kernel_dump(written):
    import io
    from dbgext.cli import main
    _, path = written
    stream = io.StringIO()
    assert main(["lm", "--dump", path], stream=stream) == 0
    assert "mydrv" in stream.getvalue() and "nt" in stream.getvalue()


# -- writer options and limits -------------------------------------------------------------


def test_a_live_kernel_dump_is_a_bitmap_dump_of_type_6(tmp_path):
    scenario = kernel_scenario(seed=8, blobs=4)
    path = write_kernel_dump(scenario, str(tmp_path / "live.dmp"), dump_type=6)
    dump = open_kdmp(path)
    assert int(dump.type) == 6
    target = dbgext.open(path)
    assert target.info()["kind"] == "live-kernel-dump"
    for va, page in scenario.pages.items():
        assert target.read(va, PAGE_SIZE) == page == dump.read_virtual_page(va)


def test_without_large_pages_every_page_has_a_pte(tmp_path):
    scenario = kernel_scenario(seed=9, blobs=2)
    path = write_kernel_dump(scenario, str(tmp_path / "small.dmp"), large_pages=False)
    dump = open_kdmp(path)
    target = dbgext.open(path)
    for va, page in scenario.pages.items():
        assert dump.read_virtual_page(va) == page == target.read(va, PAGE_SIZE)


def test_excluded_pages_are_left_out_of_the_dump(tmp_path):
    scenario = kernel_scenario(seed=10, blobs=2)
    kept, dropped = sorted(va for va in scenario.pages if va >> 47)[-2:]
    scenario.excluded_pages.add(dropped)
    path = write_kernel_dump(scenario, str(tmp_path / "excluded.dmp"))
    target = dbgext.open(path)
    assert target.read(kept, 8) == scenario.read(kept, 8)
    assert not target.is_readable(dropped)
    assert open_kdmp(path).read_virtual_page(dropped) is None


def test_only_x64_kernel_scenarios_make_kernel_dumps(tmp_path):
    with pytest.raises(ValueError):
        write_kernel_dump(Scenario("x64", "user"), str(tmp_path / "u.dmp"))
    with pytest.raises(ValueError):
        write_kernel_dump(Scenario("x86", "user"), str(tmp_path / "u.dmp"))


def test_more_than_42_physical_runs_is_refused(tmp_path):
    physical = {(2 * i) << 12: bytes(PAGE_SIZE) for i in range(43)}
    with pytest.raises(ValueError, match="42"):
        write_physical_dump(str(tmp_path / "runs.dmp"), physical, KernelDumpHeader())


def test_non_canonical_virtual_pages_are_refused(tmp_path):
    scenario = Scenario("x64", "kernel")
    scenario.write(NON_CANONICAL, b"x")
    with pytest.raises(ValueError, match="canonical"):
        write_kernel_dump(scenario, str(tmp_path / "nc.dmp"))


def test_unknown_register_names_are_refused(tmp_path):
    scenario = kernel_scenario(seed=11, blobs=1)
    scenario.registers = {"eip": 1}
    with pytest.raises(ValueError, match="eip"):
        write_kernel_dump(scenario, str(tmp_path / "regs.dmp"))


# -- hand-made page tables: 1 GiB pages, transition PTEs --------------------------------------

GIB_VA = 0xFFFF800040000000       # PML4 0x100, PDPT 1: a 1 GiB page at PA 1 GiB
SMALL_VA = 0x0000000000400000     # PML4 0, PDPT 0, PD 2: a page table
TABLE_FLAGS = PTE_PRESENT | PTE_WRITE


def handmade_physical_memory():
    """Page tables mapping a 1 GiB page (only three of its frames in the dump), and a
    page table with a valid, a transition, a prototype and a missing-frame PTE."""
    pml4, pdpt_kernel, pdpt_user, pd_user, pt_user = (DEFAULT_DTB + i * PAGE_SIZE for i in range(5))
    tables = {pa: bytearray(PAGE_SIZE) for pa in (pml4, pdpt_kernel, pdpt_user, pd_user, pt_user)}
    struct.pack_into("<Q", tables[pml4], 0x100 * 8, pdpt_kernel | TABLE_FLAGS)
    struct.pack_into("<Q", tables[pdpt_kernel], 1 * 8, 0x40000000 | TABLE_FLAGS | PTE_LARGE)
    struct.pack_into("<Q", tables[pml4], 0, pdpt_user | TABLE_FLAGS)
    struct.pack_into("<Q", tables[pdpt_user], 0, pd_user | TABLE_FLAGS)
    struct.pack_into("<Q", tables[pd_user], 2 * 8, pt_user | TABLE_FLAGS)
    frames = {0x40000000: b"G0", 0x40001000: b"G1", 0x40123000: b"G2", 0x300000: b"valid",
              0x301000: b"transition", 0x302000: b"prototype"}
    struct.pack_into("<Q", tables[pt_user], 0 * 8, 0x300000 | TABLE_FLAGS)
    struct.pack_into("<Q", tables[pt_user], 1 * 8, 0x301000 | PTE_TRANSITION)
    struct.pack_into("<Q", tables[pt_user], 2 * 8, 0x302000 | PTE_TRANSITION | PTE_PROTOTYPE)
    struct.pack_into("<Q", tables[pt_user], 3 * 8, 0x7770000 | TABLE_FLAGS)  # frame not in the dump
    physical = {pa: bytes(table) for pa, table in tables.items()}
    for pa, tag in frames.items():
        physical[pa] = tag.ljust(PAGE_SIZE, b"\0")
    return physical


@pytest.fixture(scope="module", params=[1, 5])
def handmade(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("handmade") / ("type%d.dmp" % request.param))
    return write_physical_dump(path, handmade_physical_memory(), KernelDumpHeader(), request.param)


def test_a_1gib_page_reads_the_frames_the_dump_holds_in_both_readers(handmade):
    dump = open_kdmp(handmade)
    backend = KernelDumpBackend(handmade)
    for offset, tag in ((0, b"G0"), (0x1000, b"G1"), (0x123000, b"G2")):
        assert dump.read_virtual_page(GIB_VA + offset)[:2] == tag
        assert backend.read_page(GIB_VA + offset)[:2] == tag
    assert dump.read_virtual_page(GIB_VA + 0x2000) is None
    assert backend.read_page(GIB_VA + 0x2000) is None


def test_transition_ptes_are_resolved_like_windbg_and_unlike_kdmp_parser(handmade):
    dump = open_kdmp(handmade)
    backend = KernelDumpBackend(handmade)
    assert backend.read_page(SMALL_VA)[:5] == dump.read_virtual_page(SMALL_VA)[:5] == b"valid"
    assert backend.read_page(SMALL_VA + PAGE_SIZE)[:10] == b"transition"
    assert dump.read_virtual_page(SMALL_VA + PAGE_SIZE) is None


def test_prototype_ptes_and_frames_missing_from_the_dump_are_unreadable(handmade):
    dump = open_kdmp(handmade)
    backend = KernelDumpBackend(handmade)
    for va in (SMALL_VA + 2 * PAGE_SIZE, SMALL_VA + 3 * PAGE_SIZE, SMALL_VA + 4 * PAGE_SIZE):
        assert backend.read_page(va) is None
        assert dump.read_virtual_page(va) is None


def test_mapped_ranges_of_hand_made_tables(handmade):
    backend = KernelDumpBackend(handmade)
    assert backend.mapped_ranges() == [
        (SMALL_VA, SMALL_VA + 2 * PAGE_SIZE),
        (GIB_VA, GIB_VA + 2 * PAGE_SIZE), (GIB_VA + 0x123000, GIB_VA + 0x124000)]


# -- the loaded module list ----------------------------------------------------------------


def test_debugger_names_of_kernel_modules():
    assert debugger_module_name("ntoskrnl.exe") == "nt"
    assert debugger_module_name("ntkrnlmp.exe") == "nt"
    assert debugger_module_name("ACPI.sys") == "ACPI"
    assert debugger_module_name("hal.dll") == "hal"
    assert debugger_module_name("noextension") == "noextension"


def _broken_list_dump(tmp_path, corrupt):
    scenario = kernel_scenario(seed=12, blobs=1)
    scenario.add_module("third", 0xFFFFF80013000000, 0x2000, image="third.sys")
    scenario.build_loaded_module_list()
    head = scenario.ps_loaded_module_list
    first = struct.unpack("<Q", scenario.read(head, 8))[0]
    second = struct.unpack("<Q", scenario.read(first, 8))[0]
    corrupt(scenario, first, second)
    return write_kernel_dump(scenario, str(tmp_path / "broken.dmp"))


def test_an_unreadable_module_link_gives_the_modules_found_so_far(tmp_path):
    path = _broken_list_dump(tmp_path, lambda s, first, second: s.pack(second, "<Q", UNMAPPED_KERNEL))
    target = dbgext.open(path)
    assert [m.name for m in target.modules()] == ["nt", "mydrv"]
    assert any(problem["kind"] == "module_list_unreadable" and problem["address"] == UNMAPPED_KERNEL
               for problem in target.info()["problems"])


def test_a_cycle_in_the_module_list_ends_the_walk(tmp_path):
    path = _broken_list_dump(tmp_path, lambda s, first, second: s.pack(second, "<Q", first))
    target = dbgext.open(path)
    assert [m.name for m in target.modules()] == ["nt", "mydrv"]
    assert [problem["kind"] for problem in target.info()["problems"]] == ["module_list_cycle"]


def test_a_module_entry_with_an_unreadable_name_is_skipped_and_reported(tmp_path):
    def corrupt(scenario, first, second):
        scenario.pack(second + KLDR_X64["BaseDllName"] + 8, "<Q", UNMAPPED_KERNEL)
    target = dbgext.open(_broken_list_dump(tmp_path, corrupt))
    assert [m.name for m in target.modules()] == ["nt", "third"]
    assert any(problem["kind"] == "module_entry_unreadable" and hexaddr(UNMAPPED_KERNEL) in problem["message"]
               for problem in target.info()["problems"])


def test_a_dump_without_a_module_list_has_no_modules(tmp_path):
    physical = handmade_physical_memory()
    path = write_physical_dump(str(tmp_path / "nolist.dmp"), physical, KernelDumpHeader())
    assert dbgext.open(path).modules() == []


# -- bulk reads across physical runs, and scans ---------------------------------------------


@pytest.fixture(scope="module", params=["full", "bitmap"])
def fragmented(request, tmp_path_factory):
    """A dump whose consecutive virtual pages sit in physical runs of 5 pages with
    holes between them, so bulk reads keep crossing run boundaries."""
    import dbgext.sample.kdump_writer as writer
    scenario = Scenario("x64", "kernel")
    region = scenario.alloc_pages(40 * PAGE_SIZE)
    scenario.write(region, random_bytes(random.Random(40), 40 * PAGE_SIZE))
    scenario.unmap(region + 17 * PAGE_SIZE, PAGE_SIZE)
    path = str(tmp_path_factory.mktemp("fragmented") / ("%s.dmp" % request.param))
    saved = writer.PAGES_PER_DATA_RUN
    writer.PAGES_PER_DATA_RUN = 5
    try:
        write_kernel_dump(scenario, path, bitmap=request.param == "bitmap", large_pages=False)
    finally:
        writer.PAGES_PER_DATA_RUN = saved
    return scenario, path, region


def test_bulk_reads_across_physical_runs_agree_with_kdmp_parser(fragmented):
    scenario, path, region = fragmented
    dump = open_kdmp(path)
    backend = KernelDumpBackend(path)
    pages = backend.read_pages(region - PAGE_SIZE, 42)
    expected = [dump.read_virtual_page(region + (i - 1) * PAGE_SIZE) for i in range(42)]
    assert pages == [bytes(page) if page is not None else None for page in expected]
    assert pages[18] is None and pages[0] is None and pages[41] is None


def test_try_read_across_physical_runs_returns_the_scenario_bytes(fragmented):
    scenario, path, region = fragmented
    partial = dbgext.open(path).try_read(region + 3, 40 * PAGE_SIZE - 6)
    assert partial.holes == [(region + 17 * PAGE_SIZE, region + 18 * PAGE_SIZE)]
    assert partial.data[:17 * PAGE_SIZE - 3] == scenario.read(region + 3, 17 * PAGE_SIZE - 3)
    assert partial.data[18 * PAGE_SIZE - 3:] == scenario.read(region + 18 * PAGE_SIZE, 22 * PAGE_SIZE - 3)


def test_scan_finds_patterns_straddling_chunk_and_page_boundaries(tmp_path):
    scenario = Scenario("x64", "kernel")
    region = scenario.alloc_pages(12 * PAGE_SIZE)
    pattern = b"\xfeDBGEXT-PATTERN\xef"
    places = [region + 5, region + PAGE_SIZE - 7, region + 3 * PAGE_SIZE - 1,
              region + 8 * PAGE_SIZE - len(pattern), region + 12 * PAGE_SIZE - len(pattern)]
    for address in places:
        scenario.write(address, pattern)
    path = write_kernel_dump(scenario, str(tmp_path / "scan.dmp"))
    target = dbgext.open(path)
    for chunk in (PAGE_SIZE, 2 * PAGE_SIZE, 0x100000):
        assert target.scan(pattern, chunk=chunk) == places
    assert target.scan(pattern, chunk=PAGE_SIZE, limit=2) == places[:2]
    assert target.scan(pattern, alignment=4) == [a for a in places if a % 4 == 0]
    assert target.scan(pattern, start=region + 6, end=region + 3 * PAGE_SIZE + 0x20) == places[1:3]


def test_big_scenarios_stay_within_the_42_runs_of_the_header(monkeypatch, tmp_path):
    import dbgext.sample.kdump_writer as writer
    monkeypatch.setattr(writer, "PAGES_PER_DATA_RUN", 1)
    scenario = Scenario("x64", "kernel")
    region = scenario.alloc_pages(100 * PAGE_SIZE)
    scenario.write(region, random_bytes(random.Random(100), 100 * PAGE_SIZE))
    path = write_kernel_dump(scenario, str(tmp_path / "many.dmp"), large_pages=False)
    dump = open_kdmp(path)
    assert dump.header.PhysicalMemoryBlock.NumberOfRuns <= 42
    assert dbgext.open(path).read(region, 100 * PAGE_SIZE) == scenario.read(region, 100 * PAGE_SIZE)


def test_scan_of_a_range_starting_mid_page_finds_every_match(tmp_path):
    scenario = Scenario("x64", "kernel")
    region = scenario.alloc_pages(6 * PAGE_SIZE)
    pattern = b"\xfeMID-PAGE\xef"
    places = [region + 0xFFB, region + 2 * PAGE_SIZE - 3, region + 4 * PAGE_SIZE + 0x7FF]
    for address in places:
        scenario.write(address, pattern)
    target = dbgext.open(write_kernel_dump(scenario, str(tmp_path / "mid.dmp")))
    for chunk in (PAGE_SIZE, 3 * PAGE_SIZE):
        assert target.scan(pattern, start=region + 0xFFA, chunk=chunk) == places
        assert target.scan(pattern, start=region + 0xFFC, chunk=chunk) == places[1:]
