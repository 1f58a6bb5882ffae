"""ARM64 kernel dumps of physical memory (full, bitmap, RDMP; MachineImageType
0xAA64), written by dbgext.sample.kdump_writer with ``arch="arm64"``: ARM64
descriptors (4 KiB pages, 2 MiB blocks, the access flag) and CONTEXT_ARM64 at
0x348.

The truth is the scenario's own virtual pages: every page the scenario holds
reads back byte for byte, every other address is unreadable.  The walk is also
checked against :func:`arm64_translation.translate` (tests/arm64_translation.py) over the file's
physical pages, and hand-made descriptors (a block at level 0, a level-3
descriptor with bit 1 clear, a frame beyond the dump) are refused as the MMU
refuses them.  kdmp-parser 0.7.4 has no ARM64 support (AMD64 CONTEXT, x64 page
walk only); it still reads these files' physical pages, which checks their
physical layout (runs, bitmap, RDMP ranges).

The crashing thread is found as Windows finds it: x18 holds the KPCR, the KPRCB
lies inside it (OffsetPcrContainedPrcb) or is pointed to (OffsetPcrCurrentPrcb),
and its CurrentThread is the KTHREAD whose InitialStack/StackLimit bound the
stack.  The scenario lays these out with KDDEBUGGER_DATA64's own offsets; the
real ARM64 small dump is the truth that x18 + 0x980 is KiProcessorBlock[Number]'s
KPRCB there."""

import io
import json
import os
import random
import struct

import pytest

import dbgext
from dbgext.cli import main
from dbgext.layouts.arm64 import CONTEXT_ARM64
from dbgext.layouts.dump_formats import DUMP_HEADER64, PAGE_SIZE
from dbgext.sample.kdump_writer import (
    DEFAULT_DTB, PREFERRED_SELF_MAP_INDEX, KernelDumpHeader, build_physical_memory, pack_debugger_data, write_kernel_dump, write_physical_dump)
from dbgext.problems import ProblemLog
from dbgext.stacks.threads import current_kernel_thread
from dbgext.target import arm64_paging
from dbgext.target.kdump import KernelDumpBackend

from dumps_support import (
    KERNEL_POOL, NON_CANONICAL, NT_BASE, SMALL_DUMP_OFFSETS, UNMAPPED_KERNEL, USER_BLOB, kernel_scenario,
    probe_addresses, scenario_bytes)

from arm64_support import ARM64_TRIAGE_DUMP
from arm64_translation import translate
from requirements import need_module

KDBG_ADDRESS = NT_BASE + 0x3000
# The crashing processor as Windows on ARM lays it out: x18 holds its KPCR, the
# KPRCB lies inside the KPCR (at 0x980, as on the real ARM64 dump), and the
# KPRCB's CurrentThread is the KTHREAD whose stack holds sp.
KPCR = 0xFFFFF80000E00000
CONTAINED_PRCB = 0x980
KTHREAD = 0xFFFFE00000011080
PROCESS = 0xFFFFE00000013040
STACK_LIMIT, INITIAL_STACK = KERNEL_POOL, KERNEL_POOL + 0x6000
KERNEL_STACK = KERNEL_POOL + 0x7C0
REGISTERS = {"pc": NT_BASE + 0x1230, "sp": KERNEL_POOL + 0x800, "fp": KERNEL_POOL + 0x900, "lr": NT_BASE + 0x1300,
             "x0": 0x1122334455667788, "x18": KPCR}
# The frame records (x29, x30) the fp chain holds: the callers' return addresses
# follow a bl in nt; the outermost record ends the chain.
CALLERS = (NT_BASE + 0x1400, NT_BASE + 0x1500)
BL = 0x94000000     # bl .+0: a call, what the walker wants before a return address
DUMP_TYPES = (1, 5, 8, 10)


def arm64_scenario(seed=61, pcr_offsets=(("OffsetPcrContainedPrcb", CONTAINED_PRCB),)):
    """The kernel scenario with KDDEBUGGER_DATA64 (the small dump's offsets plus
    ``pcr_offsets``) and the crashing processor's KPCR, KPRCB and KTHREAD."""
    scenario = kernel_scenario(seed=seed, blobs=12)
    scenario.build_loaded_module_list()
    values = dict(SMALL_DUMP_OFFSETS)
    values.update(pcr_offsets, KernBase=NT_BASE, PsLoadedModuleList=scenario.ps_loaded_module_list)
    scenario.write(KDBG_ADDRESS, pack_debugger_data(values))
    scenario.kd_debugger_data_block = KDBG_ADDRESS
    scenario.write(KPCR, bytes(CONTAINED_PRCB + values["SizePrcb"]))
    scenario.write_pointer(KPCR + CONTAINED_PRCB + values["OffsetPrcbCurrentThread"], KTHREAD)
    scenario.write(KTHREAD, bytes(values["SizeEThread"]))
    for field, value in (("InitialStack", INITIAL_STACK), ("StackLimit", STACK_LIMIT),
                         ("KernelStack", KERNEL_STACK), ("ApcProcess", PROCESS)):
        scenario.write_pointer(KTHREAD + values["OffsetKThread" + field], value)
    scenario.write(PROCESS, bytes(values["SizeEProcess"]))
    if "OffsetPcrCurrentPrcb" in values:
        scenario.write_pointer(KPCR + values["OffsetPcrCurrentPrcb"], KPCR + CONTAINED_PRCB)
    record = REGISTERS["fp"]
    for index, caller in enumerate(CALLERS):
        following = record + 0x100 if index + 1 < len(CALLERS) else 0
        scenario.pack(record, "<QQ", following, caller)
        scenario.pack(caller - 4, "<I", BL)
        record = following
    return scenario


@pytest.fixture(scope="module")
def scenario():
    return arm64_scenario()


@pytest.fixture(scope="module", params=DUMP_TYPES)
def written(request, scenario, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("arm64") / ("type%d.dmp" % request.param))
    write_kernel_dump(scenario, path, dump_type=request.param, arch="arm64", registers=REGISTERS)
    return request.param, path


def test_the_header_names_arm64_and_the_context_is_the_arm64_one(written):
    dump_type, path = written
    with open(path, "rb") as handle:
        header = handle.read(DUMP_HEADER64["size"])
    assert struct.unpack_from("<I", header, DUMP_HEADER64["MachineImageType"])[0] == 0xAA64
    assert struct.unpack_from("<Q", header, DUMP_HEADER64["ContextRecord"] + CONTEXT_ARM64["registers"]["pc"][0])[
        0] == REGISTERS["pc"]
    with dbgext.open(path) as target:
        info = target.info()
        assert (target.arch, info["dump_type"], info["paging"], info["machine"]) == ("arm64", dump_type, "arm64",
                                                                                     0xAA64)
        assert dict((name, target.thread.registers[name]) for name in REGISTERS) == REGISTERS
        assert info["exception"]["address"] == REGISTERS["pc"] and info["problems"] == []


def test_every_scenario_page_reads_back_and_nothing_else_does(written, scenario):
    _, path = written
    with dbgext.open(path) as target:
        for va, page in scenario.pages.items():
            assert target.read(va, PAGE_SIZE) == page, hex(va)
        rng = random.Random(7)
        for address in probe_addresses(scenario, rng) + [UNMAPPED_KERNEL, NON_CANONICAL]:
            expected = scenario_bytes(scenario, address, 8)
            assert (target.try_read(address, 8).data if target.is_readable(address, 8) else None) == expected, \
                hex(address)


def test_the_mapped_ranges_are_the_scenarios_pages_in_both_halves_plus_the_self_map(written, scenario):
    _, path = written
    with dbgext.open(path) as target:
        mapped = set()
        for start, end in target.backend.mapped_ranges():
            mapped.update(range(start, end, PAGE_SIZE))
    self_map = 0xFFFF000000000000 | PREFERRED_SELF_MAP_INDEX << 39   # the root maps itself there
    assert set(scenario.pages) <= mapped
    assert all(self_map <= va < self_map + (1 << 39) for va in mapped - set(scenario.pages))
    assert USER_BLOB & ~0xFFF in mapped and NT_BASE in mapped


def test_dumpinfo_says_arm64_and_never_offers_x64_tables_for_arm64_structures(written):
    _, path = written
    out = io.StringIO()
    assert main(["dumpinfo", "--dump", path], stream=out, error_stream=io.StringIO()) == 0
    text = out.getvalue()
    assert "Machine:          ARM64, processors: 1, build 19045" in text
    assert "Context:          pc=fffff800`00001230 sp=ffffc080`00000800" in text
    assert "_KTHREAD   from KDDEBUGGER_DATA64" in text
    assert "_KPCR      from KDDEBUGGER_DATA64" in text


def test_modules_and_kddebugger_data64_come_through_the_arm64_walk(written):
    _, path = written
    with dbgext.open(path) as target:
        assert [(module.name, module.base) for module in target.modules()][:2] == [("nt", NT_BASE),
                                                                                    ("mydrv", 0xFFFFF80012340000)]
        debugger_data = target.info()["debugger_data"]
        assert debugger_data["present"] and debugger_data["kernel_base"] == NT_BASE
        assert target.symbolize(REGISTERS["pc"]) == "nt+0x1230"


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stream=out, error_stream=err)
    return code, out.getvalue(), err.getvalue()


def address_of(path, expression):
    """What ``dq EXPRESSION`` takes as its address."""
    code, out, err = run(["dq", "--dump", path, expression, "L1", "--json"])
    assert code == 0, err
    return json.loads(out)["address"]


EXPECTED_FRAMES = [(REGISTERS["sp"], REGISTERS["pc"], "context"),
                   (REGISTERS["fp"] + 0x10, CALLERS[0], "frame_chain"),
                   (REGISTERS["fp"] + 0x110, CALLERS[1], "frame_chain")]


def test_k_finds_the_crashing_kthread_through_the_kpcr_in_x18_and_walks_the_fp_chain(written):
    _, path = written
    code, out, err = run(["k", "--dump", path, "--json"])
    assert code == 0, err
    walked = json.loads(out)
    assert walked["thread"] == {"id": 0, "kernel_thread": KTHREAD, "source": "crashing processor",
                                "stack_base": INITIAL_STACK, "stack_limit": STACK_LIMIT}
    assert [(frame["child_sp"], frame["ip"], frame["found_by"]) for frame in walked["frames"]] == EXPECTED_FRAMES
    assert "layout_missing" not in err and "sp_outside_stack" not in err
    code, out, _ = run(["k", "--dump", path])
    assert out.splitlines()[0] == "crashing processor (KTHREAD ffffe000`00011080)"


def test_stackuse_thread_takes_the_bounds_from_the_kthread_kddebugger_data64_describes(written):
    _, path = written
    code, out, err = run(["stackuse", "thread", "--dump", path, "--json"])
    assert code == 0, err
    usage = json.loads(out)
    assert (usage["thread"], usage["initial_stack"], usage["stack_limit"], usage["kernel_stack"]) == (
        KTHREAD, INITIAL_STACK, STACK_LIMIT, KERNEL_STACK)
    assert (usage["sp"], usage["used"], usage["remaining"]) == (
        REGISTERS["sp"], INITIAL_STACK - REGISTERS["sp"], REGISTERS["sp"] - STACK_LIMIT)
    assert [(frame["child_sp"], frame["uses"]) for frame in usage["frames"]] == [
        (REGISTERS["sp"], 0x110), (REGISTERS["fp"] + 0x10, 0x100), (REGISTERS["fp"] + 0x110, None)]


def test_thread_and_proc_pseudo_registers_are_the_kthread_and_its_apc_state_process(written):
    _, path = written
    assert address_of(path, "@$thread") == KTHREAD
    assert address_of(path, "@$proc") == PROCESS
    assert address_of(path, "@$proc+8") == PROCESS + 8


def test_a_kpcr_that_points_at_its_kprcb_by_current_prcb_leads_to_the_same_thread(tmp_path):
    path = str(tmp_path / "current_prcb.dmp")
    write_kernel_dump(arm64_scenario(pcr_offsets=(("OffsetPcrCurrentPrcb", 0x20),)), path, dump_type=5,
                      arch="arm64", registers=REGISTERS)
    assert address_of(path, "@$thread") == KTHREAD


@pytest.mark.parametrize("pcr_offsets, x18, note", [
    ((), KPCR, "note layout_missing: no offset of nt!_KPCR.Prcb (or CurrentPrcb) in type information or "
               "KDDEBUGGER_DATA64: the current thread's KTHREAD is unknown"),
    (None, 0x000000E0A1B2C000, "note no_kpcr at 000000e0`a1b2c000: x18 (000000e0`a1b2c000) is not a kernel "
                               "address, so not the KPCR: the current thread's KTHREAD is unknown"),
], ids=["no-kpcr-offsets", "x18-a-user-address"])
def test_without_the_kpcr_offsets_or_a_kernel_x18_the_thread_is_refused_in_one_line(tmp_path, pcr_offsets, x18,
                                                                                        note):
    path = str(tmp_path / "no_thread.dmp")
    scenario = arm64_scenario() if pcr_offsets is None else arm64_scenario(pcr_offsets=pcr_offsets)
    registers = dict(REGISTERS, x18=x18)
    write_kernel_dump(scenario, path, dump_type=1, arch="arm64", registers=registers)
    code, out, err = run(["k", "--dump", path])
    assert code == 0 and out.splitlines()[0] == "crashing processor"
    assert [line for line in err.splitlines() if "KTHREAD" in line] == [note]
    code, out, err = run(["dq", "--dump", path, "@$thread", "L1"])
    assert code != 0 and out == ""
    assert err.strip() == "error: @$thread: the selected thread's KTHREAD is unknown"


def test_dumpinfo_offers_no_x64_kpcr_table_when_kddebugger_data64_lacks_the_kpcr_offsets(tmp_path):
    path = str(tmp_path / "no_kpcr_offsets.dmp")
    write_kernel_dump(arm64_scenario(pcr_offsets=()), path, dump_type=1, arch="arm64", registers=REGISTERS)
    code, out, _ = run(["dumpinfo", "--dump", path])
    assert code == 0
    assert "_KPCR      from none (no type information, no KDDEBUGGER_DATA64 offsets, no built-in ARM64 table)" in out


def test_on_the_real_arm64_dump_x18_plus_the_contained_prcb_offset_is_the_processor_blocks_kprcb():
    """Truth from the real file: its KiProcessorBlock[Prcb.Number] is x18 + 0x980
    (KDDEBUGGER_DATA64's OffsetPcrContainedPrcb), and that KPRCB's CurrentThread is
    the thread whose copy the small dump holds."""
    if not os.path.isfile(ARM64_TRIAGE_DUMP):
        pytest.fail("%s is missing: the real-world files live in ../shared/realworld" % ARM64_TRIAGE_DUMP)
    with dbgext.open(ARM64_TRIAGE_DUMP) as target:
        data = target.backend.debugger_data()
        registers = dict(target.thread.registers)
        assert data["OffsetPcrContainedPrcb"] == 0x980 and registers["x18"] == 0xFFFFF803EFD00000
        prcb = registers["x18"] + 0x980
        number = target.u16(prcb + data["OffsetPrcbNumber"])
        assert target.pointer(data["KiProcessorBlock"] + 8 * number) == prcb
        problems = ProblemLog()
        assert current_kernel_thread(target, registers, problems) == target.thread.kernel_thread == 0xFFFFBB8EB1719180
        assert problems.as_list() == []


def test_the_walk_agrees_with_a_whole_table_walk_and_maps_nt_by_a_2_mib_block(scenario):
    virtual_pages = dict((va, bytes(data)) for va, data in scenario.pages.items())
    physical, dtb = build_physical_memory(virtual_pages, arch="arm64")

    def read_entry(address):
        page = physical.get(address & ~0xFFF)
        return None if page is None else struct.unpack_from("<Q", page, address & 0xFFF)[0]

    block = translate(NT_BASE + 0x1234, dtb, dtb, read_entry)
    assert (block.level, block.size, block.access_flag) == (2, 1 << 21, True)
    user = translate(USER_BLOB, dtb, dtb, read_entry)
    assert user.user and user.size == PAGE_SIZE
    for va in sorted(virtual_pages):
        found = translate(va + 0x10, dtb, dtb, read_entry)
        assert found and physical[found.physical & ~0xFFF] == virtual_pages[va], hex(va)


DATA = 0x200000   # 2 MiB-aligned: a block maps [DATA, DATA + 2 MiB)


def hand_made_dump(tmp_path, leaves):
    """A full ARM64 dump whose tables map VA 0xFFFF8000`00000000 + i * 2 MiB by
    the level-2 descriptors ``leaves`` (for a tuple: a level-3 table of those
    descriptors); every data frame from DATA holds its own address in each u64."""
    valid_table = arm64_paging.DESCRIPTOR_VALID | arm64_paging.DESCRIPTOR_TABLE_OR_PAGE
    root, level1, level2, level3 = DEFAULT_DTB, DEFAULT_DTB + 0x1000, DEFAULT_DTB + 0x2000, DEFAULT_DTB + 0x3000
    tables = dict((pa, bytearray(PAGE_SIZE)) for pa in (root, level1, level2, level3))
    struct.pack_into("<Q", tables[root], 8 * 256, level1 | valid_table)
    struct.pack_into("<Q", tables[level1], 0, level2 | valid_table)
    for index, leaf in enumerate(leaves):
        if isinstance(leaf, tuple):
            struct.pack_into("<Q", tables[level2], 8 * index, level3 | valid_table)
            for slot, descriptor in enumerate(leaf):
                struct.pack_into("<Q", tables[level3], 8 * slot, descriptor)
        else:
            struct.pack_into("<Q", tables[level2], 8 * index, leaf)
    physical = dict((pa, bytes(table)) for pa, table in tables.items())
    for frame in range(DATA, DATA + 0x200000, PAGE_SIZE):
        physical[frame] = struct.pack("<Q", frame) * (PAGE_SIZE // 8)
    path = str(tmp_path / "hand.dmp")
    write_physical_dump(path, physical, KernelDumpHeader(directory_table_base=root, registers={"pc": 0}),
                        arch="arm64")
    return path


def test_valid_pages_and_blocks_read_and_invalid_or_reserved_descriptors_do_not(tmp_path):
    base = 0xFFFF800000000000
    valid, table_or_page = arm64_paging.DESCRIPTOR_VALID, arm64_paging.DESCRIPTOR_TABLE_OR_PAGE
    access = arm64_paging.DESCRIPTOR_ACCESS_FLAG
    page, block = valid | table_or_page | access, valid | access
    level3 = ((DATA + 0x1000) | page,                      # 0: a page
              (DATA + 0x2000) | valid | table_or_page,     # 1: access flag clear: still mapped
              (DATA + 0x3000) | valid,                     # 2: bit 1 clear at level 3: reserved
              (DATA + 0x4000) | table_or_page | access,    # 3: invalid
              0x7F000000000 | page,                        # 4: a frame beyond the dump
              (DATA + 0x5000) | page | arm64_paging.DESCRIPTOR_PXN | arm64_paging.DESCRIPTOR_UXN | (0xF << 55))
    path = hand_made_dump(tmp_path, [level3, DATA | block, 0x40000000 | block, (DATA | 0x1000) | block])
    backend = KernelDumpBackend(path)
    try:
        translate = backend.translate
        assert [translate(base + slot * PAGE_SIZE + 8) for slot in range(7)] == [
            DATA + 0x1008, DATA + 0x2008, None, None, None, DATA + 0x5008, None]
        two_mib = 1 << 21
        assert translate(base + two_mib + 0x12345) == DATA + 0x12345                 # a 2 MiB block
        assert translate(base + 2 * two_mib) is None                                 # a block beyond the dump
        assert translate(base + 3 * two_mib + 0x10) == DATA + 0x10                   # low address bits ignored
        assert translate(base + 4 * two_mib) is None and translate(0xFFFF000000000000) is None
        target = dbgext.open(path)
        assert target.u64(base + two_mib + 0x2000) == DATA + 0x2000
        assert target.read(base + 0x1000, 16) == struct.pack("<QQ", DATA + 0x2000, DATA + 0x2000)
        assert not target.is_readable(base + 2 * PAGE_SIZE)
    finally:
        backend.close()


def test_kdmp_parser_reads_the_physical_pages_of_the_arm64_files(written, scenario):
    kdmp_parser = need_module("kdmp_parser", "kdmp-parser")  # the physical-layout oracle
    _, path = written
    dump = kdmp_parser.KernelDumpParser(path)
    backend = KernelDumpBackend(path)
    try:
        frames = list(backend.physical_frames())
        assert sorted(dump.pages.keys()) == frames
        assert all(bytes(dump.read_physical_page(pa)) == backend.read_physical_page(pa) for pa in frames[::7])
    finally:
        backend.close()
