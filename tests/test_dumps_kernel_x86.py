"""x86 kernel dumps (PAGEDUMP): the 0x1000-byte DUMP_HEADER32, full, summary and
bitmap layouts, PAE and non-PAE page tables.  kdmp-parser refuses 32-bit dumps;
volatility3's WindowsCrashDump32Layer with its Intel/IntelPAE layers reads types
1 and 5 and is the oracle (a test-only dependency, never distributed: its licence,
the Volatility Software License, is not OSI-approved)."""

import random
import struct

import pytest

import dbgext
from dbgext.layouts.dump_formats import DUMP_HEADER32, PAGE_SIZE, PTE_LARGE
from dbgext.sample.kdump_writer import (
    KernelDumpHeader, build_physical_memory_x86, pack_debugger_data, write_physical_dump)
from requirements import need_module

KERNEL = 0x80400000
POOL = 0x81000000
USER = 0x00401000
KDBG = POOL + 0x2000
MODULE_LIST = POOL + 0x3000
REGISTERS = {"eip": KERNEL + 0x1234, "esp": POOL + 0x800, "ebp": POOL + 0x900, "eax": 0x11223344}


def x86_memory(seed=81):
    """Virtual pages of a small x86 kernel: nt's first pages, pool holding
    KDDEBUGGER_DATA64 and a PsLoadedModuleList of two modules, a user page."""
    rng = random.Random(seed)
    pages = {}
    for base, count in ((KERNEL, 3), (POOL, 6), (USER, 2)):
        for index in range(count):
            pages[base + index * PAGE_SIZE] = bytearray(rng.getrandbits(8 * PAGE_SIZE).to_bytes(PAGE_SIZE, "little"))

    def put(address, data):
        page, offset = address & ~0xFFF, address & 0xFFF
        pages[page][offset:offset + len(data)] = data

    put(KDBG, pack_debugger_data({"KernBase": 0xFFFFFFFF80400000, "PsLoadedModuleList": 0xFFFFFFFF00000000 | MODULE_LIST,
                                  "SizeEThread": 0x2B8, "OffsetKThreadInitialStack": 0x18}))
    entries = [MODULE_LIST + 0x100, MODULE_LIST + 0x200]
    names = ["ntkrpamp.exe", "hal.dll"]
    links = [MODULE_LIST] + entries + [MODULE_LIST]
    for index, entry in enumerate([MODULE_LIST] + entries):
        put(entry, struct.pack("<II", links[index + 1], links[index - 1] if index else entries[-1]))
    for index, (entry, name) in enumerate(zip(entries, names)):
        text = name.encode("utf-16-le")
        buffer = entry + 0x80
        put(entry + 0x18, struct.pack("<III", KERNEL + index * 0x100000, 0, 0x10000 + index))
        put(entry + 0x2C, struct.pack("<HHI", len(text), len(text) + 2, buffer))
        put(buffer, text + b"\0\0")
    return dict((va, bytes(data)) for va, data in pages.items())


def write_x86(path, pages, dump_type=1, pae=True, changes=None):
    physical, dtb = build_physical_memory_x86(pages, pae=pae)
    physical.update(changes(physical, dtb) if changes else {})
    header = KernelDumpHeader(directory_table_base=dtb, build=7601, registers=REGISTERS,
                              bugcheck=(0x7E, 0xC0000005, KERNEL + 0x1234, 3, 4), ps_loaded_module_list=MODULE_LIST,
                              kd_debugger_data_block=KDBG, processors=2)
    return write_physical_dump(path, physical, header, dump_type, arch="x86", pae=pae), dtb


@pytest.fixture(scope="module", params=[(1, True), (1, False), (2, True), (5, True), (5, False)],
                ids=["full-pae", "full", "summary-pae", "bitmap-pae", "bitmap"])
def written(request, tmp_path_factory):
    dump_type, pae = request.param
    pages = x86_memory()
    path, dtb = write_x86(str(tmp_path_factory.mktemp("x86") / "x86.dmp"), pages, dump_type, pae)
    return pages, path, dtb, dump_type, pae


def test_every_page_reads_back_and_nothing_else(written):
    pages, path, _, _, _ = written
    target = dbgext.open(path)
    assert target.arch == "x86" and target.pointer_size == 4
    for va, data in pages.items():
        assert target.read(va, PAGE_SIZE) == data, hex(va)
    for address in (KERNEL + 3 * PAGE_SIZE, 0x10000, 0xFFFFF000, 1 << 32):
        assert not target.is_readable(address), hex(address)


def test_mapped_ranges_are_the_written_pages(written):
    pages, path, _, _, _ = written
    ranges = dbgext.open(path).backend.mapped_ranges()
    assert sum(end - start for start, end in ranges) == len(pages) * PAGE_SIZE
    assert ranges[0] == (USER, USER + 2 * PAGE_SIZE)


def test_the_header_context_and_bug_check_are_read(written):
    _, path, dtb, dump_type, pae = written
    target = dbgext.open(path)
    info = target.info()
    assert info["dump_type"] == dump_type and info["paging"] == ("x86-pae" if pae else "x86")
    assert info["machine"] == 0x14C and info["processors"] == 2 and info["build"] == 7601
    assert info["bugcheck"] == [0x7E, 0xC0000005, KERNEL + 0x1234, 3, 4]
    assert info["directory_table_base"] == dtb and info["ps_loaded_module_list"] == MODULE_LIST
    assert target.register("eip") == KERNEL + 0x1234 and target.register("esp") == POOL + 0x800
    assert info["exception"]["address"] == KERNEL + 0x1234
    assert info["problems"] == []


def test_modules_come_from_the_x86_loaded_module_list(written):
    _, path, _, _, _ = written
    modules = dbgext.open(path).modules()
    assert [(m.name, m.base, m.size) for m in modules] == [("nt", KERNEL, 0x10000), ("hal", KERNEL + 0x100000, 0x10001)]


def test_debugger_data_pointers_are_32_bit(written):
    _, path, _, _, _ = written
    facts = dbgext.open(path).info()["debugger_data"]
    assert facts["kernel_base"] == KERNEL and facts["ps_loaded_module_list"] == MODULE_LIST
    assert dbgext.open(path).backend.layout_hints("_ETHREAD")["size"] == 0x2B8


# volatility3 reads x86 dump types 1 and 5, not summary dumps.
@pytest.mark.parametrize("dump_type, pae", [(1, True), (1, False), (5, True), (5, False)],
                         ids=["full-pae", "full", "bitmap-pae", "bitmap"])
def test_volatility_reads_the_same_bytes(tmp_path, dump_type, pae):
    need_module("volatility3")
    pages = x86_memory()
    path, dtb = write_x86(str(tmp_path / "x86.dmp"), pages, dump_type, pae)
    from volatility3.framework import contexts
    from volatility3.framework.exceptions import InvalidAddressException
    from volatility3.framework.layers import crash, intel, physical
    ctx = contexts.Context()
    ctx.config["file.location"] = "file://" + path
    ctx.add_layer(physical.FileLayer(ctx, "file", "file"))
    ctx.config["phys.base_layer"] = "file"
    ctx.add_layer(crash.WindowsCrashDump32Layer(ctx, "phys", "phys"))
    ctx.config["virt.memory_layer"] = "phys"
    ctx.config["virt.page_map_offset"] = dtb
    virtual = (intel.IntelPAE if pae else intel.Intel)(ctx, "virt", "virt")
    target = dbgext.open(path)
    for va in sorted(pages):
        assert bytes(virtual.read(va, PAGE_SIZE)) == target.read(va, PAGE_SIZE)
    with pytest.raises(InvalidAddressException):
        virtual.read(KERNEL + 3 * PAGE_SIZE, 4)


def pde_patch(va, make_entry, pae):
    """A ``changes`` function setting the page-directory entry for ``va``."""
    def changes(physical, dtb):
        if pae:
            pdpte = struct.unpack_from("<Q", physical[dtb & ~0xFFF], (dtb & 0xFFF) + ((va >> 30) & 3) * 8)[0]
            directory, index, fmt = pdpte & 0x000FFFFFFFFFF000, (va >> 21) & 0x1FF, "<Q"
        else:
            directory, index, fmt = dtb, va >> 22, "<I"
        table = bytearray(physical[directory])
        struct.pack_into(fmt, table, index * struct.calcsize(fmt), make_entry(physical))
        return {directory: bytes(table)}
    return changes


@pytest.mark.parametrize("pae", [True, False], ids=["pae", "no-pae"])
def test_a_large_page_maps_the_frames_under_it(tmp_path, pae):
    pages = x86_memory()
    size = (1 << 21) if pae else (1 << 22)
    region = 0xA0000000
    path, _ = write_x86(str(tmp_path / "large.dmp"), pages, pae=pae,
                        changes=pde_patch(region, lambda physical: 0x1000000 | PTE_LARGE | 0x63, pae))
    target = dbgext.open(path)
    data_page = 0x1000000  # the first data frame the writer placed: the user page at USER
    assert target.read(region, 16) == pages[USER][:16]
    assert target.backend.translate(region + 0x1234) == data_page + 0x1234
    assert not target.is_readable(region + size)


def test_a_0xff_page_directory_maps_nothing(tmp_path):
    pages = x86_memory()

    def garbage(physical, dtb):
        return {dtb: b"\xff" * PAGE_SIZE}
    path, _ = write_x86(str(tmp_path / "ff.dmp"), pages, pae=False, changes=garbage)
    backend = dbgext.open(path).backend
    assert backend.mapped_ranges() == []
    assert backend.translate(KERNEL) is None and backend.table_pages_read == 1


def test_an_x86_dump_missing_its_last_page_is_truncated(tmp_path):
    path, _ = write_x86(str(tmp_path / "cut.dmp"), x86_memory())
    data = open(path, "rb").read()
    with open(path, "wb") as handle:
        handle.write(data[:-PAGE_SIZE])
    with pytest.raises(dbgext.errors.BadInput, match="truncated"):
        dbgext.open(path)


def test_x86_small_and_rdmp_dumps_are_refused_by_name(tmp_path):
    path, _ = write_x86(str(tmp_path / "t4.dmp"), x86_memory())
    data = bytearray(open(path, "rb").read())
    struct.pack_into("<I", data, DUMP_HEADER32["DumpType"], 4)
    open(path, "wb").write(bytes(data))
    with pytest.raises(dbgext.errors.BadInput, match="unsupported x86 kernel dump type 4"):
        dbgext.open(path)
