"""Every physical-memory kernel dump type opens: the summary dump (DumpType 2)
and the RDMP dumps of new dbgeng (8, 9, 10) next to types 1, 5 and 6.  kdmp-parser
reads 8, 9 and 10 and is the oracle for them; type 2, which no Linux reader
accepts, is checked by its file layout.  KDDEBUGGER_DATA64 is decoded from the
header's pointer, its offsets become layout hints, and the crashing context is
the target's current thread."""

import random
import struct

import pytest

import dbgext
from dbgext.layouts import BuiltinLayouts, lookup_layout
from dbgext.layouts.dump_formats import DUMP_HEADER64, PAGE_SIZE, RDMP_HEADER64, SUMMARY_DUMP_OLD
from dbgext.target.kdump import KernelDumpBackend
from dbgext.sample.kdump_writer import pack_debugger_data, write_kernel_dump

from dumps_support import (
    NT_BASE, SMALL_DUMP_OFFSETS, UNMAPPED_KERNEL, kernel_scenario, open_kdmp, probe_addresses)

KDBG_ADDRESS = NT_BASE + 0x3000


def scenario_with_debugger_data(seed=51):
    scenario = kernel_scenario(seed=seed, blobs=6)
    scenario.build_loaded_module_list()
    values = dict(SMALL_DUMP_OFFSETS)
    values.update(KernBase=NT_BASE, PsLoadedModuleList=scenario.ps_loaded_module_list)
    scenario.write(KDBG_ADDRESS, pack_debugger_data(values))
    scenario.kd_debugger_data_block = KDBG_ADDRESS
    return scenario


def written_as(dump_type, tmp_path_factory):
    scenario = scenario_with_debugger_data()
    path = str(tmp_path_factory.mktemp("types") / ("type%d.dmp" % dump_type))
    write_kernel_dump(scenario, path, dump_type=dump_type)
    return dump_type, scenario, path


@pytest.fixture(scope="module", params=[2, 8, 9, 10])
def typed(request, tmp_path_factory):
    return written_as(request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=[8, 9, 10])
def rdmp(request, tmp_path_factory):
    return written_as(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    return written_as(2, tmp_path_factory)


def test_every_page_of_every_type_reads_back(typed):
    _, scenario, path = typed
    target = dbgext.open(path)
    for va, page in scenario.pages.items():
        assert target.read(va, PAGE_SIZE) == page, hex(va)
    assert not target.is_readable(UNMAPPED_KERNEL)


def test_rdmp_dumps_round_trip_through_kdmp_parser(rdmp):
    dump_type, scenario, path = rdmp
    dump = open_kdmp(path)
    assert int(dump.type) == dump_type
    for va, page in scenario.pages.items():
        assert dump.read_virtual_page(va) == page
    backend = KernelDumpBackend(path)
    assert sorted(dump.pages.keys()) == list(backend.physical_frames())


def test_dbgext_and_kdmp_parser_agree_on_random_addresses_of_rdmp_dumps(rdmp, capfd):
    dump_type, scenario, path = rdmp
    dump = open_kdmp(path)
    target = dbgext.open(path)
    for address in probe_addresses(scenario, random.Random(dump_type)):
        theirs = dump.read_virtual_page(address)
        ours = target.try_read(address & ~0xFFF, PAGE_SIZE)
        assert (theirs is None) == (not ours.complete), hex(address)
        if theirs is not None:
            assert ours.data == theirs
    capfd.readouterr()


def test_the_rdmp_header_obeys_kdmp_parsers_size_rule(rdmp):
    _, _, path = rdmp
    with open(path, "rb") as handle:
        head = handle.read(RDMP_HEADER64["offset"] + PAGE_SIZE)[RDMP_HEADER64["offset"]:]
    marker, signature, metadata, first_page = struct.unpack_from("<I8s4xQQ", head)
    assert (marker, signature) == (0x40, b"RDMPDUMP")
    assert metadata - 0x20 == first_page - 0x2040 and first_page % PAGE_SIZE == 0


def test_the_summary_dump_keeps_its_bitmap_after_u32_fields(summary):
    _, _, path = summary
    layout = SUMMARY_DUMP_OLD
    with open(path, "rb") as handle:
        data = handle.read()
    head = data[layout["offset"]:]
    assert head[0:8] == b"SDMPDUMP"
    first_page, bits, present = struct.unpack_from("<III", head, layout["HeaderSize"])
    backend = KernelDumpBackend(path)
    assert present == backend.physical_pages and bits % 64 == 0
    assert first_page + present * PAGE_SIZE == len(data)
    assert bin(int.from_bytes(head[layout["Bitmap"]:layout["Bitmap"] + bits // 8], "little")).count("1") == present


def test_each_type_is_named_in_info(typed):
    dump_type, _, path = typed
    info = dbgext.open(path).info()
    assert info["dump_type"] == dump_type
    assert info["kind"] == {2: "kernel-summary-dump", 8: "kernel-memory-dump", 9: "kernel-and-user-memory-dump",
                            10: "complete-memory-dump"}[dump_type]
    assert info["problems"] == []


# -- KDDEBUGGER_DATA64 ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def with_kdbg(tmp_path_factory):
    scenario = scenario_with_debugger_data()
    path = str(tmp_path_factory.mktemp("kdbg") / "full.dmp")
    write_kernel_dump(scenario, path)
    return scenario, path


def test_debugger_data_is_decoded_from_the_headers_pointer(with_kdbg):
    scenario, path = with_kdbg
    facts = dbgext.open(path).info()["debugger_data"]
    assert facts["present"] and facts["address"] == KDBG_ADDRESS
    assert facts["kernel_base"] == NT_BASE
    assert facts["ps_loaded_module_list"] == scenario.ps_loaded_module_list
    assert facts["ki_processor_block"] == SMALL_DUMP_OFFSETS["KiProcessorBlock"]
    assert facts["fields"]["SizeEThread"] == SMALL_DUMP_OFFSETS["SizeEThread"]
    assert facts["layouts"] == ["_EPROCESS", "_ETHREAD", "_KPRCB", "_KTHREAD"]


def test_layout_hints_give_the_published_offsets(with_kdbg):
    _, path = with_kdbg
    backend = dbgext.open(path).backend
    kthread = backend.layout_hints("nt!_KTHREAD")
    assert kthread["fields"]["InitialStack"] == 0x28 and kthread["fields"]["ApcState.Process"] == 0xB8
    assert backend.layout_hints("_ETHREAD")["size"] == SMALL_DUMP_OFFSETS["SizeEThread"]
    assert backend.layout_hints("_KPRCB")["fields"]["CurrentThread"] == 8
    assert backend.layout_hints("_POOL_HEADER") is None


def test_layout_lookup_takes_debugger_data_before_builtin_tables(with_kdbg):
    _, path = with_kdbg
    builtin = BuiltinLayouts({"_KTHREAD": [{"arch": "x64", "size": 0x430,
                                            "fields": {"InitialStack": (0x99, "Q"), "StackLimit": (0x98, "Q")}}]})
    layout = lookup_layout(dbgext.open(path), "_KTHREAD", builtin)
    assert layout.source == "KDDEBUGGER_DATA64"
    assert (layout.offset("InitialStack"), layout.offset("StackLimit")) == (0x28, 0x30)
    assert layout.format("InitialStack") == "<Q" and layout.size == 0x430


def test_a_dump_without_debugger_data_has_no_hints(tmp_path):
    path = write_kernel_dump(kernel_scenario(seed=52, blobs=1), str(tmp_path / "plain.dmp"))
    target = dbgext.open(path)
    assert target.backend.layout_hints("_KTHREAD") is None
    assert target.info()["debugger_data"]["present"] is False


def test_debugger_data_without_its_tag_is_a_warning_not_a_failure(tmp_path):
    scenario = scenario_with_debugger_data(seed=53)
    scenario.write(KDBG_ADDRESS + 0x10, b"XXXX")  # e.g. still encoded (KdpDataBlockEncoded)
    target = dbgext.open(write_kernel_dump(scenario, str(tmp_path / "encoded.dmp")))
    info = target.info()
    assert info["debugger_data"]["present"] is False
    assert [p["kind"] for p in info["problems"]] == ["debugger_data_tag"]
    assert info["problems"][0]["severity"] == "warning"


def test_debugger_data_at_an_unreadable_address_is_a_warning(tmp_path):
    scenario = kernel_scenario(seed=54, blobs=1)
    scenario.kd_debugger_data_block = UNMAPPED_KERNEL
    info = dbgext.open(write_kernel_dump(scenario, str(tmp_path / "nokdbg.dmp"))).info()
    assert [(p["kind"], p["address"]) for p in info["problems"]] == [("debugger_data_unreadable", UNMAPPED_KERNEL)]


def test_the_module_list_falls_back_to_the_debugger_datas_head(tmp_path):
    scenario = scenario_with_debugger_data(seed=55)
    path = write_kernel_dump(scenario, str(tmp_path / "nohead.dmp"))
    with open(path, "r+b") as handle:  # a test fixture, not a dump under analysis
        handle.seek(DUMP_HEADER64["PsLoadedModuleList"])
        handle.write(struct.pack("<Q", 0))
    assert [m.name for m in dbgext.open(path).modules()] == ["nt", "mydrv"]


# -- threads -----------------------------------------------------------------------------------


def test_the_crashing_context_is_the_current_thread(with_kdbg):
    scenario, path = with_kdbg
    target = dbgext.open(path)
    thread = target.thread
    assert thread.registers["rip"] == scenario.registers["rip"]
    assert thread.registers["rsp"] == scenario.registers["rsp"]
    assert target.register("rax") == 0x1122334455667788
    assert [t.id for t in target.threads()] == [0]


def test_the_build_comes_from_the_header(with_kdbg):
    _, path = with_kdbg
    assert dbgext.open(path).build == 19045
