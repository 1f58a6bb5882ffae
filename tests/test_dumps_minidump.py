"""Minidumps (x64 and x86, Memory64List and MemoryList): what the writer
produces reads back through the ``minidump`` package, and dbgext's own reader
agrees with it."""

import logging
import os
import random
import struct

import pytest

import dbgext
from dbgext.layouts.dump_formats import PAGE_SIZE
from dbgext.target.minidump import MinidumpBackend
from minidump_writer import memory_ranges, write_minidump
from dbgext.sample.scenario import Scenario, Thread

from dumps_support import minidump_read, minidump_reader, probe_addresses, scenario_bytes, user_scenario

CRASH = {"thread_id": 0x1A4, "code": 0xC0000005, "address": 0x401234, "parameters": [1, 0xDEAD]}


@pytest.fixture(scope="module", params=[("x64", "memory64"), ("x64", "memory"),
                                        ("x86", "memory64"), ("x86", "memory")],
                ids=lambda p: "-".join(p))
def written(request, tmp_path_factory):
    arch, memory_list = request.param
    scenario = user_scenario(arch, seed=5)
    path = str(tmp_path_factory.mktemp("mdmp") / ("%s-%s.mdmp" % request.param))
    write_minidump(scenario, path, memory_list=memory_list, exception=CRASH)
    return scenario, path


# -- the writer, judged by the minidump package ------------------------------------------


def test_every_written_page_reads_back_through_the_minidump_package(written):
    scenario, path = written
    reader = minidump_reader(path).get_reader()
    for va, page in scenario.pages.items():
        assert reader.read(va, PAGE_SIZE) == page, hex(va)


def test_touching_pages_are_one_range_so_reads_may_cross_pages(written):
    scenario, path = written
    reader = minidump_reader(path).get_reader()
    segments = sorted((s.start_virtual_address, s.end_virtual_address) for s in reader.memory_segments)
    assert segments == [(start, start + len(data)) for start, data in memory_ranges(scenario)]
    for (_, end), (start, _) in zip(segments, segments[1:]):
        assert end < start  # never touching: they would have been merged


def test_unmapped_addresses_are_unreadable_in_both_readers(written):
    scenario, path = written
    reader = minidump_reader(path).get_reader()
    target = dbgext.open(path)
    unmapped = max(scenario.pages) + 0x10 * PAGE_SIZE
    assert minidump_read(reader, unmapped, 8) is None
    assert not target.is_readable(unmapped, 8)


def test_the_package_parses_modules_threads_and_the_peb(written, caplog):
    scenario, path = written
    with caplog.at_level(logging.ERROR):
        dump = minidump_reader(path)
    assert not [r for r in caplog.records if "PEB" in r.getMessage()]
    assert dump.peb is not None and dump.peb.image_base_address == scenario.modules[0].base
    assert [(m.name, m.baseaddress, m.size) for m in dump.modules.modules] == [
        (m.image, m.base, m.size) for m in scenario.modules]
    assert dump.sysinfo.BuildNumber == scenario.build
    threads = dump.threads.threads
    assert [(t.ThreadId, t.Teb) for t in threads] == [(t.thread_id, t.teb) for t in scenario.threads]
    pc = "Rip" if scenario.arch == "x64" else "Eip"
    sp = "Rsp" if scenario.arch == "x64" else "Esp"
    for parsed, thread in zip(threads, scenario.threads):
        assert getattr(parsed.ContextObject, pc) == thread.registers[pc.lower()]
        assert getattr(parsed.ContextObject, sp) == thread.registers[sp.lower()]
        assert parsed.Stack.StartOfMemoryRange == thread.stack_base


def test_the_package_reads_the_exception_stream(written):
    _, path = written
    exception = minidump_reader(path).exception.exception_records[0]
    assert exception.ThreadId == CRASH["thread_id"]
    assert exception.ExceptionRecord.ExceptionAddress == CRASH["address"]
    assert exception.ExceptionRecord.ExceptionInformation[:2] == CRASH["parameters"]


# -- dbgext's reader agrees with the minidump package --------------------------------------


def test_dbgext_and_the_minidump_package_agree_on_random_addresses(written):
    scenario, path = written
    reader = minidump_reader(path).get_reader()
    target = dbgext.open(path)
    rng = random.Random(4)
    for address in probe_addresses(scenario, rng, 300):
        size = rng.choice([1, 4, 0x100, PAGE_SIZE])
        expected = minidump_read(reader, address, size)
        assert expected == scenario_bytes(scenario, address, size)
        if expected is None:
            assert not target.try_read(address, size).complete
        else:
            assert target.read(address, size) == expected


def test_dbgext_and_the_minidump_package_agree_on_the_module_list(written):
    _, path = written
    expected = [(m.baseaddress, m.size, m.name) for m in minidump_reader(path).modules.modules]
    assert [(m.base, m.size, m.image) for m in dbgext.open(path).modules()] == expected


def test_dbgext_modules_use_debugger_names(written):
    scenario, path = written
    modules = dbgext.open(path).modules()
    assert [(m.name, m.base, m.size, m.image) for m in modules] == [
        ("app", scenario.modules[0].base, 0x5000, "app.exe"),
        ("ntdll", scenario.modules[1].base, 0x3000, "ntdll.dll")]


def test_dbgext_info_has_threads_registers_and_the_exception(written):
    scenario, path = written
    info = dbgext.open(path).info()
    assert info["kind"] == "minidump" and info["mode"] == "user"
    assert info["arch"] == scenario.arch and info["build"] == scenario.build
    pc = "rip" if scenario.arch == "x64" else "eip"
    assert [(t["thread_id"], t["teb"], t["stack_start"], t["stack_size"], t["registers"][pc])
            for t in info["threads"]] == [
        (t.thread_id, t.teb, t.stack_base, t.stack_size, t.registers[pc]) for t in scenario.threads]
    assert info["exception"]["code"] == 0xC0000005
    assert info["exception"]["parameters"] == [1, 0xDEAD]
    # The crash context is the exception thread's.
    assert info["registers"][pc] == scenario.threads[1].registers[pc]


def test_the_pointer_size_follows_the_dump(written):
    scenario, path = written
    target = dbgext.open(path)
    assert target.pointer_size == scenario.pointer_size
    teb = scenario.threads[0].teb
    peb_offset = 0x60 if scenario.arch == "x64" else 0x30
    assert target.pointer(teb + peb_offset) == struct.unpack(
        "<Q" if scenario.pointer_size == 8 else "<I", scenario.read(teb + peb_offset, scenario.pointer_size))[0]


def test_mapped_ranges_are_the_written_ranges(written):
    scenario, path = written
    backend = MinidumpBackend(path)
    assert backend.mapped_ranges() == [(start, start + len(data)) for start, data in memory_ranges(scenario)]


def test_read_pages_matches_read_page(written):
    scenario, path = written
    backend = MinidumpBackend(path)
    first = min(scenario.pages) - 2 * PAGE_SIZE
    run = backend.read_pages(first, 40)
    assert run == [backend.read_page(first + i * PAGE_SIZE) for i in range(40)]
    assert None in run and any(page is not None for page in run)


# -- details ------------------------------------------------------------------------------


def test_a_scenario_without_threads_has_no_thread_list(tmp_path):
    scenario = Scenario("x64", "user")
    scenario.add_module("app", 0x140000000, 0x2000, image="app.exe")
    path = write_minidump(scenario, str(tmp_path / "nothreads.mdmp"))
    assert minidump_reader(path).threads is None
    assert dbgext.open(path).info()["threads"] == []


def test_an_existing_peb_chain_is_kept(tmp_path):
    scenario = user_scenario("x64", seed=6, blobs=1)
    teb, peb = scenario.alloc_pages(PAGE_SIZE), scenario.alloc_pages(PAGE_SIZE)
    scenario.pack(teb + 0x60, "<Q", peb)
    scenario.threads[0].teb = teb
    path = write_minidump(scenario, str(tmp_path / "peb.mdmp"))
    assert minidump_reader(path).peb.address == peb


def test_only_user_mode_scenarios_make_minidumps(tmp_path):
    with pytest.raises(ValueError):
        write_minidump(Scenario("x64", "kernel"), str(tmp_path / "k.mdmp"))
    with pytest.raises(ValueError):
        write_minidump(Scenario("x64", "user"), str(tmp_path / "k.mdmp"), memory_list="memory32")


def test_an_exception_on_an_unknown_thread_is_refused(tmp_path):
    scenario = user_scenario("x86", seed=8, blobs=1)
    with pytest.raises(ValueError, match="thread"):
        write_minidump(scenario, str(tmp_path / "e.mdmp"), exception=dict(CRASH, thread_id=1))


def test_x86_thread_contexts_are_0x2cc_bytes_with_the_registers_in_place(tmp_path):
    scenario = Scenario("x86", "user")
    scenario.add_module("app", 0x400000, 0x1000, image="app.exe")
    registers = {"eax": 1, "ebx": 2, "ecx": 3, "edx": 4, "esi": 5, "edi": 6, "ebp": 7, "esp": 8,
                 "eip": 9, "efl": 0x246}
    scenario.threads.append(Thread(7, 0, 0, 0, registers))
    path = write_minidump(scenario, str(tmp_path / "ctx.mdmp"))
    thread = minidump_reader(path).threads.threads[0]
    assert thread.ThreadContext.DataSize == 0x2CC
    context = thread.ContextObject
    assert (context.Eax, context.Ebx, context.Ecx, context.Edx, context.Esi, context.Edi, context.Ebp,
            context.Esp, context.Eip, context.EFlags) == (1, 2, 3, 4, 5, 6, 7, 8, 9, 0x246)
    assert dbgext.open(path).info()["registers"] == dict(
        MinidumpBackend(path).threads()[0].registers, **registers)
    assert os.path.getsize(path) > 0x2CC
