"""Garbage page tables cost bounded work, and a dump file that shrinks under the
reader ends in one line naming the file and the offset — never a signal.

Work is counted in page-table pages read from the file, not in seconds
(scripts/bench_pagetables.py has the timings)."""

import os
import struct
import subprocess
import sys

import pytest

import dbgext
from dbgext.layouts.dump_formats import DUMP_TYPE_BITMAP, DUMP_TYPE_FULL, PAGE_SIZE, PTE_LARGE, PTE_PRESENT
from dbgext.target import kdump
from dbgext.target.dumpfile import DumpFileChanged
from dbgext.target.kdump import KernelDumpBackend
from dbgext.sample.kdump_writer import (
    KernelDumpHeader, build_physical_memory, write_kernel_dump, write_physical_dump)

from dumps_support import KERNEL_POOL, NT_BASE, USER_BLOB, kernel_scenario

GARBAGE = b"\xff" * PAGE_SIZE


def tables_of(physical, dtb, va):
    """Physical addresses of the PML4, PDPT, PD and PT on the way to ``va``."""
    path = [dtb]
    for shift in (39, 30, 21):
        entry = struct.unpack_from("<Q", physical[path[-1]], ((va >> shift) & 0x1FF) * 8)[0]
        if not entry & PTE_PRESENT or entry & PTE_LARGE:
            break
        path.append(entry & 0x000FFFFFFFFFF000)
    return path


@pytest.fixture(scope="module")
def memory():
    scenario = kernel_scenario(seed=61, blobs=12)
    scenario.build_loaded_module_list()
    pages = {va: bytes(data) for va, data in scenario.pages.items()}
    physical, dtb = build_physical_memory(pages)
    return scenario, physical, dtb


def dump_with(tmp_path, memory, changes, dump_type=DUMP_TYPE_BITMAP, name="garbage.dmp"):
    scenario, physical, dtb = memory
    changed = dict(physical)
    changed.update(changes)
    header = KernelDumpHeader(directory_table_base=dtb, build=19045, registers=scenario.registers,
                              ps_loaded_module_list=scenario.ps_loaded_module_list)
    return write_physical_dump(str(tmp_path / name), changed, header, dump_type)


def table_page_count(physical):
    return len([pa for pa in physical if pa < 0x1000000])  # the writer puts tables below the data


@pytest.mark.parametrize("level", [1, 2, 3], ids=["PDPT", "PD", "PT"])
@pytest.mark.parametrize("dump_type", [DUMP_TYPE_FULL, DUMP_TYPE_BITMAP], ids=["full", "bitmap"])
def test_a_0xff_table_page_maps_nothing_and_costs_no_extra_table_reads(tmp_path, memory, level, dump_type):
    scenario, physical, dtb = memory
    table = tables_of(physical, dtb, KERNEL_POOL)[level]
    path = dump_with(tmp_path, memory, {table: GARBAGE}, dump_type)
    backend = KernelDumpBackend(path)
    ranges = backend.mapped_ranges()
    assert backend.table_pages_read <= table_page_count(physical)
    assert not any(start <= KERNEL_POOL < end for start, end in ranges)
    target = dbgext.open(path)
    assert not target.is_readable(KERNEL_POOL)
    assert target.read(USER_BLOB, 0x40) == scenario.read(USER_BLOB, 0x40)  # the user half is intact


def test_four_0xff_pages_cost_no_more_than_one(tmp_path, memory):
    _, physical, dtb = memory
    tables = [pa for pa in sorted(physical) if pa < 0x1000000 and pa != dtb][:4]
    backend = KernelDumpBackend(dump_with(tmp_path, memory, dict((pa, GARBAGE) for pa in tables)))
    backend.mapped_ranges()
    assert backend.table_pages_read <= table_page_count(physical)


def test_entries_pointing_beyond_the_dumps_memory_are_not_present(tmp_path, memory):
    _, physical, dtb = memory
    pd = tables_of(physical, dtb, KERNEL_POOL)[2]
    beyond = bytearray(physical[pd])
    for index in range(512):
        struct.pack_into("<Q", beyond, index * 8, (0x7FFFF000000 + index * PAGE_SIZE) | 0x63)
    backend = KernelDumpBackend(dump_with(tmp_path, memory, {pd: bytes(beyond)}))
    assert backend.translate(KERNEL_POOL) is None
    backend.mapped_ranges()
    assert backend.table_pages_read <= table_page_count(physical)


def test_a_large_page_with_reserved_bits_set_is_not_present(tmp_path, memory):
    _, physical, dtb = memory
    pd = tables_of(physical, dtb, NT_BASE)[2]
    entry_offset = ((NT_BASE >> 21) & 0x1FF) * 8
    entry = struct.unpack_from("<Q", physical[pd], entry_offset)[0]
    assert entry & PTE_LARGE
    broken = bytearray(physical[pd])
    struct.pack_into("<Q", broken, entry_offset, entry | 0x2000)  # bit 13: reserved in a 2 MiB PDE
    backend = KernelDumpBackend(dump_with(tmp_path, memory, {pd: bytes(broken)}))
    assert backend.translate(NT_BASE) is None
    assert not dbgext.open(backend.path).is_readable(NT_BASE)


def test_a_ps_bit_in_a_pml4_entry_is_not_present(tmp_path, memory):
    _, physical, dtb = memory
    index = (KERNEL_POOL >> 39) & 0x1FF
    pml4 = bytearray(physical[dtb])
    entry = struct.unpack_from("<Q", pml4, index * 8)[0]
    struct.pack_into("<Q", pml4, index * 8, entry | PTE_LARGE)
    backend = KernelDumpBackend(dump_with(tmp_path, memory, {dtb: bytes(pml4)}))
    assert backend.translate(KERNEL_POOL) is None


def test_a_pdpt_aliasing_all_memory_512_times_is_cut_at_the_page_budget(tmp_path, memory):
    _, physical, dtb = memory
    pdpt = tables_of(physical, dtb, KERNEL_POOL)[1]
    # Every entry a 1 GiB page over PFN 0: each maps every frame the dump holds.
    aliased = b"".join(struct.pack("<Q", 0x83) for _ in range(512))
    backend = KernelDumpBackend(dump_with(tmp_path, memory, {pdpt: aliased}))
    ranges = backend.mapped_ranges()
    mapped_pages = sum(end - start for start, end in ranges) >> 12
    assert mapped_pages <= kdump.mapped_page_budget(backend.physical_pages) < 512 * backend.physical_pages
    assert [p.kind for p in backend.problems] == ["mapped_page_budget"]


def test_one_table_hung_under_every_entry_is_cut_at_the_work_budget(tmp_path, memory, monkeypatch):
    _, physical, dtb = memory
    pdpt, pd, pt = tables_of(physical, dtb, KERNEL_POOL)[1:4]
    # Every PD entry points at the same page table, every PDPT entry at the same PD.
    same_pd = b"".join(struct.pack("<Q", pd | 0x63) for _ in range(512))
    same_pt = b"".join(struct.pack("<Q", pt | 0x63) for _ in range(512))
    backend = KernelDumpBackend(dump_with(tmp_path, memory, {pdpt: same_pd, pd: same_pt}))
    backend.mapped_ranges()
    assert backend.table_pages_read <= table_page_count(physical)
    assert "page_table_budget" in [p.kind for p in backend.problems]


def test_the_table_page_budget_stops_a_walk_over_many_tables(tmp_path, memory, monkeypatch):
    _, physical, _ = memory
    monkeypatch.setattr(kdump, "MIN_TABLE_PAGE_BUDGET", 3)
    backend = KernelDumpBackend(dump_with(tmp_path, memory, {}))
    backend.mapped_ranges()
    assert backend.table_pages_read <= max(3, backend.physical_pages // 64) < table_page_count(physical)
    assert [p.kind for p in backend.problems] == ["page_table_budget"]


def test_a_clean_dump_is_walked_without_budget_problems(tmp_path, memory):
    scenario, physical, _ = memory
    backend = KernelDumpBackend(dump_with(tmp_path, memory, {}))
    ranges = backend.mapped_ranges()
    assert list(backend.problems) == []
    assert backend.table_pages_read == table_page_count(physical)
    assert any(start <= KERNEL_POOL < end for start, end in ranges)


# -- the file shrinking under the reader -------------------------------------------------------

SHRINK_SCRIPT = """
import os, sys
import dbgext
from dbgext.cli import main
path, command = sys.argv[1], sys.argv[2:]
target = dbgext.open(path)
os.truncate(path, 0x2000 + 0x1000)
sys.exit(main(command + ["--dump", path], target=target))
"""


@pytest.mark.parametrize("command", [["db", "fffff800`00000000", "L10"], ["dq", "%x" % KERNEL_POOL]])
def test_a_dump_truncated_after_open_ends_in_one_line_naming_file_and_offset(tmp_path, command):
    path = write_kernel_dump(kernel_scenario(seed=62, blobs=2), str(tmp_path / "shrinking.dmp"), bitmap=True)
    result = subprocess.run([sys.executable, "-c", SHRINK_SCRIPT, path] + command, capture_output=True,
                            text=True, timeout=120, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert result.returncode == 1, (result.returncode, result.stderr)
    lines = result.stderr.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert path in lines[0] and "changed while being read" in lines[0] and "offset 0x" in lines[0]


def test_a_read_past_the_new_end_raises_naming_file_and_offset(tmp_path):
    path = write_kernel_dump(kernel_scenario(seed=63, blobs=2), str(tmp_path / "cut.dmp"))
    target = dbgext.open(path)
    os.truncate(path, 0x3000)
    with pytest.raises(DumpFileChanged) as caught:
        target.read(NT_BASE, 16)
    assert caught.value.path == path and caught.value.offset >= 0x3000
    target.close()
