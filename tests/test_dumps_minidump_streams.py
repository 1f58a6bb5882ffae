"""Exact minidumps: bytes that are not in the dump are unreadable to the byte, and
the thread list (with ThreadInfoList and names), the exception, MemoryInfoList and
the unloaded modules read back as written, cross-checked through the ``minidump``
package."""

import io
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dbgext
from dbgext.cli import main
from dbgext.errors import BadInput, UnreadableMemory
from dbgext.layouts.dump_formats import PAGE_SIZE
from dbgext.target.minidump import MinidumpBackend, protection_name
from minidump_writer import write_minidump
from dbgext.sample.scenario import Scenario

from dumps_support import minidump_read, minidump_reader, user_scenario

CRASH = {"thread_id": 0x1A4, "code": 0xC0000005, "address": 0x401234, "parameters": [1, 0xDEAD]}
THREAD_INFO = {0x1A0: {"flags": 0x2, "create_time": 0x01DB000000001000, "start_address": 0x7FF612341000,
                       "affinity": 3, "kernel_time": 10, "user_time": 20},
               0x1A4: {"flags": 0x4, "exit_status": 0xC0000005, "create_time": 0x01DB000000002000,
                       "exit_time": 0x01DB000000003000, "start_address": 0x7FF612342000, "affinity": 1}}
REGIONS = [
    {"base": 0x10000, "size": 0x10000, "state": 0x1000, "protect": 0x04, "type": 0x20000,
     "allocation_base": 0x10000, "allocation_protect": 0x04},
    {"base": 0x20000, "size": 0x1000, "state": 0x1000, "protect": 0x104, "type": 0x20000},
    {"base": 0x21000, "size": 0xF000, "state": 0x2000, "protect": 0, "type": 0x20000},
    {"base": 0x7FF612340000, "size": 0x5000, "state": 0x1000, "protect": 0x20, "type": 0x1000000},
    {"base": 0x7FF612345000, "size": 0x10000, "state": 0x10000, "protect": 0x1, "type": 0},
]
UNLOADED = [{"name": "old.dll", "base": 0x7FFB10000000, "size": 0x9000, "checksum": 0x1234,
             "time_date_stamp": 0x5F000000},
            {"name": "C:\\Windows\\System32\\gone.dll", "base": 0x7FFB20000000, "size": 0x3000}]


def captured_scenario(arch):
    """A scenario whose dump holds only windows of memory: 0x100 bytes in the middle
    of a blob page (WER's window around an IP) and the top 0x80 bytes of each stack."""
    scenario = user_scenario(arch, seed=21)
    blob_page = sorted(scenario.pages)[1]
    windows = [(blob_page + 0x200, 0x100)]
    for thread in scenario.threads:
        windows.append((thread.stack_base + thread.stack_size - 0x180, 0x80))
    return scenario, blob_page, windows


@pytest.fixture(params=["x64", "x86"])
def captured(request, tmp_path):
    scenario, blob_page, windows = captured_scenario(request.param)
    path = write_minidump(scenario, str(tmp_path / "captured.mdmp"), memory_list="memory", captured=windows)
    return scenario, blob_page, windows, path


# -- unreadable to the byte ------------------------------------------------------------------


def test_the_dump_holds_exactly_the_captured_windows(captured):
    scenario, blob_page, windows, path = captured
    reader = minidump_reader(path).get_reader()
    window, size = windows[0]
    assert reader.read(window, size) == scenario.read(window, size)
    assert minidump_read(reader, window - 1, 1) is None
    assert minidump_read(reader, window + size, 1) is None
    assert (window, window + size) in MinidumpBackend(path).mapped_ranges()


def test_the_backend_names_the_real_bytes_of_partly_captured_pages(captured):
    scenario, blob_page, windows, path = captured
    backend = MinidumpBackend(path)
    window, size = windows[0]
    partial = backend.partial_pages()
    assert partial[blob_page] == ((window, window + size),)
    page = backend.read_page(blob_page)
    assert page[0x200:0x300] == scenario.read(window, size)
    assert page[:0x200] == bytes(0x200) and page[0x300:] == bytes(PAGE_SIZE - 0x300)
    assert backend.info()["partial_pages"] == len(partial) and backend.info()["captured_bytes"] > 0


def several_windows(tmp_path):
    """Three windows in one page, the last running 0x80 bytes into the next page."""
    scenario = user_scenario("x64", seed=27)
    page = sorted(scenario.pages)[1]
    while page + PAGE_SIZE not in scenario.pages:
        page += PAGE_SIZE
    windows = [(page + 0x100, 0x100), (page + 0x800, 0x100), (page + 0xF80, 0x100)]
    path = write_minidump(scenario, str(tmp_path / "windows.mdmp"), memory_list="memory", captured=windows)
    return scenario, page, path


def test_several_windows_in_one_page_and_one_across_a_page_boundary(tmp_path):
    _, page, path = several_windows(tmp_path)
    partial = MinidumpBackend(path).partial_pages()
    assert partial[page] == ((page + 0x100, page + 0x200), (page + 0x800, page + 0x900),
                             (page + 0xF80, page + 0x1000))
    assert partial[page + PAGE_SIZE] == ((page + PAGE_SIZE, page + PAGE_SIZE + 0x80),)


def test_the_holes_between_windows_are_exact(tmp_path):
    scenario, page, path = several_windows(tmp_path)
    partial = dbgext.open(path).try_read(page, 2 * PAGE_SIZE)
    assert partial.holes == [(page, page + 0x100), (page + 0x200, page + 0x800), (page + 0x900, page + 0xF80),
                             (page + 0x1080, page + 2 * PAGE_SIZE)]
    assert partial.data[0xF80:0x1080] == scenario.read(page + 0xF80, 0x100)


def test_whole_pages_are_not_partial(tmp_path):
    scenario = user_scenario("x64", seed=22)
    backend = MinidumpBackend(write_minidump(scenario, str(tmp_path / "full.mdmp")))
    assert backend.partial_pages() == {}


def test_reads_stop_at_the_last_captured_byte(captured):
    scenario, blob_page, windows, path = captured
    target = dbgext.open(path)
    window, size = windows[0]
    assert target.read(window, size) == scenario.read(window, size)
    for address, length in ((window + size - 4, 8), (window - 1, 2), (blob_page, 8), (window + size, 1)):
        with pytest.raises(UnreadableMemory):
            target.read(address, length)
    with pytest.raises(UnreadableMemory) as error:
        target.read(window, size + 0x10)
    assert error.value.address == window + size
    assert target.is_readable(window, size) and not target.is_readable(window, size + 1)
    partial = target.try_read(blob_page, 2 * PAGE_SIZE)
    assert partial.holes[0] == (blob_page, window)
    assert partial.holes[1][0] == window + size
    assert partial.data[0x200:0x300] == scenario.read(window, size)


def test_a_partly_captured_page_stays_exact_after_it_was_read_once(captured):
    scenario, blob_page, windows, path = captured
    target = dbgext.open(path)
    window, size = windows[0]
    target.try_read(blob_page, PAGE_SIZE)
    with pytest.raises(UnreadableMemory):
        target.u64(window - 8)
    assert target.u32(window) == struct.unpack("<I", scenario.read(window, 4))[0]


def run(argv):
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stream=out, error_stream=err)
    return code, out.getvalue(), err.getvalue()


def test_db_shows_question_marks_beyond_the_captured_bytes(captured):
    scenario, blob_page, windows, path = captured
    window, size = windows[0]
    code, out, err = run(["db", "--dump", path, "%x" % (window + size - 8), "L10"])
    assert code == 0, err
    [line] = [line for line in out.splitlines() if line.strip()]
    cells = line.split("  ")[1].replace("-", " ").split()
    expected = ["%02x" % b for b in scenario.read(window + size - 8, 8)]
    assert cells == expected + ["??"] * 8


def test_dps_shows_question_marks_below_the_captured_stack(captured):
    scenario, blob_page, windows, path = captured
    window = windows[1][0]
    pointer = scenario.pointer_size
    code, out, err = run(["dps", "--dump", path, "%x" % (window - 2 * pointer), "L4"])
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.strip()]
    assert "?" * 8 in lines[0] and "?" * 8 in lines[1]
    value = struct.unpack("<Q" if pointer == 8 else "<I", scenario.read(window, pointer))[0]
    assert ("%08x" % (value & 0xFFFFFFFF)) in lines[2] and "?" not in lines[2].split()[1]


# -- threads ------------------------------------------------------------------------------------


@pytest.fixture(params=["x64", "x86"])
def full(request, tmp_path):
    scenario = user_scenario(request.param, seed=23)
    for thread in scenario.threads:
        thread.registers.update({"efl": 0x246})
    path = write_minidump(scenario, str(tmp_path / "threads.mdmp"), exception=CRASH, thread_info=THREAD_INFO,
                          thread_names={0x1A0: "main", 0x1A4: "worker pool"}, memory_info=REGIONS,
                          unloaded_modules=UNLOADED)
    return scenario, path


def test_threads_have_their_ids_registers_and_teb(full):
    scenario, path = full
    threads = MinidumpBackend(path).threads()
    pc, sp = ("rip", "rsp") if scenario.arch == "x64" else ("eip", "esp")
    assert [t.id for t in threads] == [t.thread_id for t in scenario.threads]
    for thread, written in zip(threads, scenario.threads):
        assert thread.registers[pc] == written.registers[pc]
        assert thread.registers[sp] == written.registers[sp]
        assert thread.registers["efl"] == 0x246
        assert thread.teb == (written.teb or None)
    parsed = minidump_reader(path).threads.threads
    assert [(t.ThreadId, t.Teb) for t in parsed] == [(t.id, t.teb or 0) for t in threads]


def test_thread_names_come_from_the_thread_names_stream(full):
    _, path = full
    assert [t.name for t in MinidumpBackend(path).threads()] == ["main", "worker pool"]


def test_stack_bounds_are_the_captured_stack_without_an_nt_tib(full):
    scenario, path = full
    first = scenario.threads[0]
    thread = MinidumpBackend(path).threads()[0]
    # The writer's TEB holds no NT_TIB (zeros), so the captured stack range is used.
    assert (thread.stack_base, thread.stack_limit) == (first.stack_base + first.stack_size, first.stack_base)


def test_stack_bounds_read_from_a_filled_nt_tib(tmp_path):
    scenario = user_scenario("x64", seed=24)
    first = scenario.threads[0]
    first.teb = scenario.alloc_pages(PAGE_SIZE)
    scenario.pack(first.teb + 8, "<QQ", 0x5000000, 0x4FF0000)
    path = write_minidump(scenario, str(tmp_path / "tib.mdmp"))
    thread = MinidumpBackend(path).threads()[0]
    assert (thread.stack_base, thread.stack_limit) == (0x5000000, 0x4FF0000)


def test_the_current_thread_is_the_exception_thread_with_the_exception_context(full):
    scenario, path = full
    backend = MinidumpBackend(path)
    current = backend.current_thread()
    assert current.id == CRASH["thread_id"]
    pc = "rip" if scenario.arch == "x64" else "eip"
    assert current.registers[pc] == scenario.threads[1].registers[pc]
    assert backend.info()["current_thread_id"] == CRASH["thread_id"]
    target = dbgext.open(path)
    assert target.thread.id == CRASH["thread_id"]
    assert target.register(pc) == scenario.threads[1].registers[pc]


def test_without_an_exception_the_first_thread_is_current(tmp_path):
    scenario = user_scenario("x86", seed=25)
    backend = MinidumpBackend(write_minidump(scenario, str(tmp_path / "noexc.mdmp")))
    assert backend.current_thread().id == scenario.threads[0].thread_id
    assert backend.info()["exception"] is None


def test_a_dump_without_threads_has_no_current_thread(tmp_path):
    scenario = Scenario("x64", "user")
    scenario.add_module("app", 0x140000000, 0x2000, image="app.exe")
    backend = MinidumpBackend(write_minidump(scenario, str(tmp_path / "none.mdmp")))
    assert backend.threads() == [] and backend.current_thread() is None
    assert backend.info()["thread_count"] == 0 and backend.info()["registers"] == {}


def test_selecting_a_thread_switches_the_registers(full):
    scenario, path = full
    target = dbgext.open(path)
    pc = "rip" if scenario.arch == "x64" else "eip"
    target.select_thread(0x1A0)
    assert target.register(pc) == scenario.threads[0].registers[pc]
    target.select_thread("~1")
    assert target.thread.id == 0x1A4


def test_thread_info_list_facts_are_in_the_info(full):
    _, path = full
    rows = {row["thread_id"]: row for row in MinidumpBackend(path).info()["threads"]}
    assert rows[0x1A0]["dump_flags"] == ["writing_thread"]
    assert rows[0x1A4]["dump_flags"] == ["exited_thread"]
    assert rows[0x1A4]["exit_status"] == 0xC0000005
    assert rows[0x1A0]["start_address"] == 0x7FF612341000 and rows[0x1A0]["affinity"] == 3
    parsed = {info.ThreadId: info for info in minidump_reader(path).thread_info.infos}
    for thread_id, row in rows.items():
        assert (parsed[thread_id].CreateTime, parsed[thread_id].ExitTime, parsed[thread_id].StartAddress,
                parsed[thread_id].KernelTime) == (row["create_time"], row["exit_time"], row["start_address"],
                                                   row["kernel_time"])


# -- exception, memory info, unloaded modules ------------------------------------------------------


def test_the_exception_stream(full):
    _, path = full
    exception = MinidumpBackend(path).info()["exception"]
    assert (exception["thread_id"], exception["code"], exception["address"], exception["parameters"]) == (
        CRASH["thread_id"], CRASH["code"], CRASH["address"], CRASH["parameters"])


def test_memory_regions_with_their_protections(full):
    _, path = full
    regions = MinidumpBackend(path).memory_regions()
    assert [(r.base, r.size) for r in regions] == [(r["base"], r["size"]) for r in REGIONS]
    listing = [(r.state_name, r.protect_name, r.type_name) for r in regions]
    assert listing == [("MEM_COMMIT", "PAGE_READWRITE", "MEM_PRIVATE"),
                       ("MEM_COMMIT", "PAGE_READWRITE|PAGE_GUARD", "MEM_PRIVATE"),
                       ("MEM_RESERVE", "", "MEM_PRIVATE"),
                       ("MEM_COMMIT", "PAGE_EXECUTE_READ", "MEM_IMAGE"),
                       ("MEM_FREE", "", "")]
    parsed = minidump_reader(path).memory_info.infos
    assert [(i.BaseAddress, i.RegionSize, i.State.value, i.Type.value if i.Type else 0) for i in parsed] == [
        (r.base, r.size, r.state, r.type) for r in regions]
    assert regions[0].as_dict()["allocation_base"] == 0x10000


def test_the_memory_info_summary_adds_up_bytes(full):
    _, path = full
    summary = MinidumpBackend(path).info()["memory_info"]
    assert summary["regions"] == 5
    assert summary["by_state"] == {"MEM_COMMIT": 0x16000, "MEM_RESERVE": 0xF000, "MEM_FREE": 0x10000}
    assert summary["by_type"] == {"MEM_PRIVATE": 0x11000, "MEM_IMAGE": 0x5000}
    assert summary["by_protection"] == {"PAGE_READWRITE": 0x10000, "PAGE_READWRITE|PAGE_GUARD": 0x1000,
                                        "PAGE_EXECUTE_READ": 0x5000}


def test_a_dump_without_memory_info_says_so(tmp_path):
    backend = MinidumpBackend(write_minidump(user_scenario("x64", seed=26), str(tmp_path / "m.mdmp")))
    assert backend.memory_regions() is None and backend.info()["memory_info"] is None


def test_protection_names():
    assert protection_name(0x40) == "PAGE_EXECUTE_READWRITE"
    assert protection_name(0x302) == "PAGE_READONLY|PAGE_GUARD|PAGE_NOCACHE"
    assert protection_name(0x40000020) == "PAGE_EXECUTE_READ|0x40000000"
    assert protection_name(0) == "0x0"


def test_unloaded_modules(full):
    _, path = full
    unloaded = MinidumpBackend(path).info()["unloaded_modules"]
    assert [(m["name"], m["base"], m["size"], m["time_date_stamp"]) for m in unloaded] == [
        (m["name"], m["base"], m["size"], m.get("time_date_stamp", 0)) for m in UNLOADED]
    parsed = minidump_reader(path).unloaded_modules.modules
    assert [(m.name, m.baseaddress, m.size, m.checksum) for m in parsed] == [
        (m["name"], m["base"], m["size"], m["checksum"]) for m in unloaded]


def test_the_info_is_what_dumpinfo_shows(full):
    _, path = full
    info = MinidumpBackend(path).info()
    for key in ("exception", "thread_count", "current_thread_id", "memory_info", "unloaded_modules",
                "memory_ranges", "captured_bytes", "partial_pages"):
        assert key in info
    assert info["thread_count"] == 2


# -- bad input -------------------------------------------------------------------------------------


def stream_location(path, stream_type):
    data = open(path, "rb").read()
    count, directory = struct.unpack_from("<II", data, 8)
    for index in range(count):
        kind, size, rva = struct.unpack_from("<III", data, directory + 12 * index)
        if kind == stream_type:
            return size, rva
    raise AssertionError("no stream %d" % stream_type)


def patched(path, offset, fmt, *values):
    data = bytearray(open(path, "rb").read())
    struct.pack_into(fmt, data, offset, *values)
    open(path, "wb").write(bytes(data))
    return path


@pytest.mark.parametrize("stream_type, field, fmt, value, message", [
    (17, 4, "<I", 16, "ThreadInfoList"),                             # SizeOfEntry below the structure
    (16, 8, "<Q", 0xFFFFFFFFFFFF, "too few for"),                    # a count the stream cannot hold
    (14, 12 + 20, "<I", 0x7FFFFFF0, "a string at file offset 0x7ffffff0"),   # a name outside the file
], ids=["entry-size", "count", "name-rva"])
def test_a_corrupt_list_stream_is_bad_input_naming_what_is_wrong(full, stream_type, field, fmt, value, message):
    _, path = full
    _, rva = stream_location(path, stream_type)
    patched(path, rva + field, fmt, value)
    with pytest.raises(BadInput, match=message):
        MinidumpBackend(path)


@settings(max_examples=int(os.environ.get("DBGEXT_FUZZ_EXAMPLES", "12")) * 5, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 0x1800), st.integers(0, 255)), min_size=1, max_size=12))
def test_mutated_stream_metadata_ends_only_in_bad_input(tmp_path, flips):
    scenario = user_scenario("x64", seed=28, blobs=2)
    path = write_minidump(scenario, str(tmp_path / "seed.mdmp"), exception=CRASH, thread_info=THREAD_INFO,
                          thread_names={0x1A0: "main"}, memory_info=REGIONS, unloaded_modules=UNLOADED)
    data = bytearray(open(path, "rb").read())
    for position, value in flips:      # the header, directory and stream bodies come first
        data[position % len(data)] = value
    open(path, "wb").write(bytes(data))
    try:
        backend = MinidumpBackend(path)
    except BadInput:
        return
    backend.threads()
    backend.current_thread()
    backend.info()
    for start, end in backend.mapped_ranges()[:20]:
        backend.read_pages(start & ~(PAGE_SIZE - 1), 2)
    backend.close()


def test_a_dump_that_shrinks_while_read_ends_with_one_line_naming_file_and_offset(full):
    scenario, path = full
    target = dbgext.open(path)
    address = max(scenario.pages)
    os.truncate(path, os.path.getsize(path) - 3 * PAGE_SIZE)
    with pytest.raises(BadInput) as error:
        target.read(address, 8)
    message = str(error.value)
    assert path in message and "offset 0x" in message and "\n" not in message
    code, out, err = run(["db", "--dump", path, "%x" % address, "L8"])
    assert code != 0 and "Traceback" not in err
