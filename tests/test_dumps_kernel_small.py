"""Kernel small memory dumps (DumpType 4): every field of TRIAGE_DUMP64 is read
(shared/reference/dump-formats.md §1.3a), the saved parts form one address space
and everything else is unreadable, and a damaged dump gives a reported problem
or one clear error — never a traceback.  No Linux reader accepts small dumps
(kdmp-parser refuses type 4), so the checks go by file offset."""

import io
import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies

import dbgext
from dbgext.address import TargetResolver, evaluate
from dbgext.cli import main
from dbgext.dumpinfo import analyze
from dbgext.errors import BadInput, DbgextError
from dbgext.layouts.dump_formats import (
    DUMP_DRIVER_ENTRY64, DUMP_HEADER64, PAGE_SIZE, TRIAGE_DATA_BLOCK_SIZE, TRIAGE_DUMP64, TRIAGE_OPTION_OVERFLOWED)
from dbgext.target.kdump import KernelDumpBackend, debugger_module_name
from dbgext.target.triage_dump import TriageDumpBackend

from dumps_support import (
    DATA_PAGE, DRIVER_BASE, FAULT_BLOCK, KDBG_ADDRESS, KI_PROCESSOR_BLOCK, NT_BASE, PRCB_ADDRESS, PROCESS_ADDRESS,
    SMALL_DUMP_OFFSETS, STACK_BYTES, STACK_POINTER, THREAD_ADDRESS, small_dump)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    dump = small_dump()
    path = str(tmp_path_factory.mktemp("small") / "Mini112326-01.dmp")
    fields = dump.write(path)
    return dump, fields, path


def rewritten(tmp_path, path, changes, cut=None):
    """A copy of ``path`` with {file offset: (fmt, value)} patched and optionally cut."""
    data = bytearray(open(path, "rb").read())
    for offset, (fmt, value) in changes.items():
        struct.pack_into(fmt, data, offset, value)
    out = str(tmp_path / "changed.dmp")
    with open(out, "wb") as handle:
        handle.write(bytes(data[:cut]))
    return out


def triage_field(name):
    return TRIAGE_DUMP64["offset"] + TRIAGE_DUMP64[name]


def kinds(target):
    return [problem["kind"] for problem in target.info()["problems"]]


# -- the header and TRIAGE_DUMP64 --------------------------------------------------------------


def test_a_small_dump_opens_with_its_own_backend(written):
    _, _, path = written
    target = dbgext.open(path)
    assert isinstance(target.backend, TriageDumpBackend)
    info = target.info()
    assert (info["kind"], info["dump_type"], info["build"]) == ("kernel-small-dump", 4, 19041)
    assert info["problems"] == []


def test_the_physical_memory_backend_refuses_a_small_dump_by_name(written):
    _, _, path = written
    with pytest.raises(BadInput, match="small memory dump"):
        KernelDumpBackend(path)


def test_every_triage_field_is_read_as_written(written):
    _, fields, path = written
    triage = dbgext.open(path).info()["triage"]
    for name, value in fields.items():
        if name in TRIAGE_DUMP64 and name not in ("offset", "size", "ArchitectureSpecific"):
            assert triage[name] == value, name


def test_size_of_dump_and_the_end_marker_agree_with_the_file(written):
    _, fields, path = written
    data = open(path, "rb").read()
    assert fields["SizeOfDump"] == len(data) == fields["size"]
    assert data[fields["ValidOffset"]:fields["ValidOffset"] + 4] == b"TRGD"


def test_mini_dump_fields_name_the_parts_present(written):
    _, _, path = written
    assert dbgext.open(path).info()["minidump_fields"] == [
        "context", "exception", "prcb", "process", "thread", "stack", "driver_list", "broken_driver", "mm_info",
        "data_page", "debugger_data", "data_blocks"]


def test_bug_check_and_context_come_from_the_header(written):
    dump, _, path = written
    target = dbgext.open(path)
    info = target.info()
    assert info["bugcheck"] == list(dump.header.bugcheck)
    assert target.register("rip") == DRIVER_BASE + 0x1234 and target.register("rsp") == STACK_POINTER
    assert info["registers"]["efl"] == 0x40286


def test_the_context_copy_serves_when_the_header_has_none(written, tmp_path):
    _, _, path = written
    flags = DUMP_HEADER64["ContextRecord"] + 0x30
    changed = rewritten(tmp_path, path, {flags: ("<I", 0), DUMP_HEADER64["ContextRecord"] + 0xF8: ("<Q", 0)})
    assert dbgext.open(changed).register("rip") == DRIVER_BASE + 0x1234


def test_the_exception_record_comes_from_exception_offset(written, tmp_path):
    _, fields, path = written
    changed = rewritten(tmp_path, path, {fields["ExceptionOffset"]: ("<I", 0xC0000005)})
    assert dbgext.open(changed).info()["exception"]["code"] == 0xC0000005


def test_triage_options_all_ones_mean_all_options_not_an_overflow(written):
    _, fields, path = written
    assert fields["TriageOptions"] == 0xFFFFFFFF   # what real writers store
    assert dbgext.open(path).info()["triage_overflowed"] is False


def test_the_overflow_bit_in_other_triage_options_is_reported(written, tmp_path):
    _, _, path = written
    changed = rewritten(tmp_path, path, {triage_field("TriageOptions"): ("<I", TRIAGE_OPTION_OVERFLOWED | 0x3)})
    assert dbgext.open(changed).info()["triage_overflowed"] is True
    changed = rewritten(tmp_path, path, {triage_field("TriageOptions"): ("<I", 0xFFFFFFFF & ~TRIAGE_OPTION_OVERFLOWED)})
    assert dbgext.open(changed).info()["triage_overflowed"] is False


@pytest.mark.parametrize("cleared, unread", [
    (0x200, [DATA_PAGE]), (0x800, [KI_PROCESSOR_BLOCK, FAULT_BLOCK]), (0x400, [KDBG_ADDRESS]),
    (0x01, [DATA_PAGE, KI_PROCESSOR_BLOCK, FAULT_BLOCK, KDBG_ADDRESS])],
    ids=["data page bit", "data blocks bit", "debugger data bit", "a basic part's bit"])
def test_mini_dump_fields_gate_the_data_page_debugger_data_and_data_blocks(written, tmp_path, cleared, unread):
    _, _, path = written
    fields = struct.unpack_from("<I", open(path, "rb").read(), DUMP_HEADER64["MiniDumpFields"])[0]
    changed = rewritten(tmp_path, path, {DUMP_HEADER64["MiniDumpFields"]: ("<I", fields & ~cleared)})
    target = dbgext.open(changed)
    for address in unread:
        assert not target.is_readable(address), hex(address)
    assert target.is_readable(STACK_POINTER)
    notes = [p for p in target.info()["problems"] if p["kind"] == "triage_part_not_announced"]
    assert notes and all(p["severity"] == "note" and "lacks 0x%x" % cleared in p["message"] for p in notes)


# -- one address space ----------------------------------------------------------------------------


def test_the_stack_copy_runs_up_from_the_stack_pointer(written):
    dump, _, path = written
    target = dbgext.open(path)
    assert target.read(STACK_POINTER, STACK_BYTES) == dump.stack[1]
    assert (STACK_POINTER, STACK_POINTER + STACK_BYTES) in target.backend.mapped_ranges()
    assert not target.is_readable(STACK_POINTER + STACK_BYTES + PAGE_SIZE)


def test_the_data_page_and_every_data_block_are_mapped(written):
    dump, _, path = written
    target = dbgext.open(path)
    assert target.read(DATA_PAGE, PAGE_SIZE) == dump.data_page[1]
    for address, data in dump.data_blocks:
        assert target.read(address, len(data)) == data
    assert target.read(FAULT_BLOCK + 0x8, 8) == dump.data_blocks[1][1][8:16]  # crosses a page boundary


def test_debugger_data_is_mapped_at_the_headers_address_and_decoded(written):
    dump, _, path = written
    target = dbgext.open(path)
    assert target.read(KDBG_ADDRESS, len(dump.debugger_data)) == dump.debugger_data
    facts = target.info()["debugger_data"]
    assert facts["kernel_base"] == NT_BASE and facts["ki_processor_block"] == KI_PROCESSOR_BLOCK
    assert target.backend.layout_hints("_KTHREAD")["fields"]["InitialStack"] == 0x28


def test_kprcb_ethread_and_eprocess_copies_sit_where_they_point_at_each_other(written):
    dump, _, path = written
    target = dbgext.open(path)
    assert target.read(PRCB_ADDRESS, len(dump.prcb)) == dump.prcb
    assert target.read(THREAD_ADDRESS, len(dump.thread)) == dump.thread
    assert target.read(PROCESS_ADDRESS, len(dump.process)) == dump.process
    assert target.u64(PRCB_ADDRESS + SMALL_DUMP_OFFSETS["OffsetPrcbCurrentThread"]) == THREAD_ADDRESS
    assert target.u64(THREAD_ADDRESS + SMALL_DUMP_OFFSETS["OffsetKThreadApcProcess"]) == PROCESS_ADDRESS


def test_the_current_thread_is_the_ethread_with_its_stack_bounds(written):
    _, _, path = written
    thread = dbgext.open(path).thread
    assert thread.kernel_thread == THREAD_ADDRESS
    assert thread.stack_base == STACK_POINTER + STACK_BYTES
    assert thread.stack_limit == STACK_POINTER + STACK_BYTES - 0x6000


def test_everything_else_is_unreadable(written):
    _, _, path = written
    target = dbgext.open(path)
    for address in (NT_BASE, DRIVER_BASE + 0x1234, DATA_PAGE + 2 * PAGE_SIZE, 0x10000):
        assert not target.is_readable(address), hex(address)
    ranges = target.backend.mapped_ranges()
    assert sum(end - start for start, end in ranges) == sum(
        part["mapped"] for part in target.info()["parts"])
    assert all(start < end for start, end in ranges)


# -- drivers, unloaded drivers, Mm -------------------------------------------------------------------


def test_the_string_pool_holds_full_paths_with_lengths_in_characters(written):
    _, fields, path = written
    data = open(path, "rb").read()
    length = struct.unpack_from("<I", data, fields["string:0"])[0]
    text = data[fields["string:0"] + 4:fields["string:0"] + 4 + 2 * length].decode("utf-16-le")
    assert (length, text) == (33, "\\SystemRoot\\system32\\ntoskrnl.exe")
    assert [d["name"] for d in dbgext.open(path).info()["drivers"]] == [
        "\\SystemRoot\\system32\\ntoskrnl.exe", "\\SystemRoot\\System32\\drivers\\mydrv.sys",
        "\\SystemRoot\\System32\\drivers\\ACPI.sys"]


def test_modules_come_from_the_driver_list_and_string_pool(written):
    _, _, path = written
    modules = dbgext.open(path).modules()
    assert [(m.name, m.base, m.size, m.image) for m in modules] == [
        ("nt", NT_BASE, 0x200000, "ntoskrnl.exe"), ("mydrv", DRIVER_BASE, 0x6000, "mydrv.sys"),
        ("ACPI", 0xFFFFF80012400000, 0x8A000, "ACPI.sys")]


def test_drivers_carry_what_a_symbol_store_lookup_needs(written):
    _, fields, path = written
    drivers = dbgext.open(path).info()["drivers"]
    assert [(d["timestamp"], d["checksum"]) for d in drivers] == [
        (0x5E2B8A3C, 0xA1B2C3), (0x61000001, 0x1234), (0x5F00AA00, 0x8C3D1)]
    assert drivers[1]["entry_offset"] == fields["DriverListOffset"] + DUMP_DRIVER_ENTRY64["size"]


def test_the_broken_driver_is_named(written):
    _, _, path = written
    assert dbgext.open(path).info()["broken_driver"] == "mydrv.sys"


def test_unloaded_drivers_keep_their_twelve_character_names(written):
    _, fields, path = written
    data = open(path, "rb").read()
    entry = fields["UnloadedDriversOffset"] + 8 + 0x38
    assert struct.unpack_from("<HH", data, entry) == (24, 24)   # Name.Length capped at DriverName's 24 bytes
    assert dbgext.open(path).info()["unloaded_drivers"] == [
        {"name": "oldfilter.sy", "start": 0xFFFFF80013000000, "end": 0xFFFFF80013010000},
        {"name": "averyveryver", "start": 0xFFFFF80014000000, "end": 0xFFFFF80014002000}]


def test_mm_information_is_read(written):
    dump, _, path = written
    assert dbgext.open(path).info()["mm"] == dump.mm


# -- damaged small dumps ----------------------------------------------------------------------------


def test_a_small_dump_cut_inside_its_triage_header_is_one_error(written, tmp_path):
    _, _, path = written
    cut = rewritten(tmp_path, path, {}, cut=TRIAGE_DUMP64["offset"] + 0x40)
    with pytest.raises(BadInput, match="truncated small memory dump") as caught:
        dbgext.open(cut)
    assert cut in str(caught.value)


def test_a_valid_offset_beyond_the_file_is_a_reported_problem(written, tmp_path):
    _, fields, path = written
    changed = rewritten(tmp_path, path, {triage_field("ValidOffset"): ("<I", fields["size"] + 0x100)})
    target = dbgext.open(changed)
    assert kinds(target) == ["triage_valid_offset"]
    assert target.modules()  # the rest stays usable


def test_a_missing_end_marker_is_a_reported_problem(written, tmp_path):
    _, fields, path = written
    changed = rewritten(tmp_path, path, {fields["ValidOffset"]: ("<4s", b"XXXX")})
    assert kinds(dbgext.open(changed)) == ["triage_valid_marker"]


def test_a_dump_truncated_inside_its_data_blocks_keeps_what_it_holds(written, tmp_path):
    dump, fields, path = written
    # Cut in the middle of the second data block's bytes (the table comes after them).
    second = struct.unpack_from("<QII", open(path, "rb").read(), fields["DataBlocksOffset"] + TRIAGE_DATA_BLOCK_SIZE)
    cut = rewritten(tmp_path, path, {}, cut=second[1] + 0x10)
    target = dbgext.open(cut)
    assert "triage_data_blocks_cut" in kinds(target) or "triage_part_outside_file" in kinds(target)
    assert target.read(STACK_POINTER, 16) == dump.stack[1][:16]


def test_a_data_block_cut_by_the_end_of_the_file_keeps_its_first_bytes(written, tmp_path):
    _, fields, path = written
    second = fields["DataBlocksOffset"] + TRIAGE_DATA_BLOCK_SIZE
    changed = rewritten(tmp_path, path, {second + 8: ("<I", fields["size"] - 4), second + 12: ("<I", 0x100)})
    target = dbgext.open(changed)
    assert kinds(target) == ["triage_part_truncated"]
    assert target.read(FAULT_BLOCK, 4) == b"TRGD"
    assert (FAULT_BLOCK, FAULT_BLOCK + 4) in target.backend.mapped_ranges()


def test_a_data_block_outside_the_file_is_reported_and_skipped(written, tmp_path):
    _, fields, path = written
    changed = rewritten(tmp_path, path, {fields["DataBlocksOffset"] + 8: ("<I", 0x7FFFFFF0)})
    target = dbgext.open(changed)
    assert "triage_part_outside_file" in kinds(target)
    assert not target.is_readable(KI_PROCESSOR_BLOCK)


def test_overlapping_data_blocks_whose_bytes_agree_are_not_a_problem(written, tmp_path):
    dump, fields, path = written
    second = fields["DataBlocksOffset"] + TRIAGE_DATA_BLOCK_SIZE
    first_offset = struct.unpack_from("<I", open(path, "rb").read(), fields["DataBlocksOffset"] + 8)[0]
    # The second block maps 0x10 of the first block's own file bytes again, at their own address.
    changed = rewritten(tmp_path, path, {second: ("<Q", KI_PROCESSOR_BLOCK + 0x10),
                                         second + 8: ("<I", first_offset + 0x10), second + 12: ("<I", 0x10)})
    target = dbgext.open(changed)
    assert [p for p in target.info()["problems"] if p["kind"] == "triage_parts_overlap"] == []
    assert target.read(KI_PROCESSOR_BLOCK, 0x20) == dump.data_blocks[0][1]


def test_overlapping_data_blocks_keep_the_first_blocks_bytes(written, tmp_path):
    dump, fields, path = written
    second = fields["DataBlocksOffset"] + TRIAGE_DATA_BLOCK_SIZE
    changed = rewritten(tmp_path, path, {second: ("<Q", KI_PROCESSOR_BLOCK + 0x10)})
    target = dbgext.open(changed)
    problems = [p for p in target.info()["problems"] if p["kind"] == "triage_parts_overlap"]
    assert [(p["address"], p["severity"]) for p in problems] == [(KI_PROCESSOR_BLOCK + 0x10, "warning")]
    assert "with different bytes" in problems[0]["message"]
    assert target.read(KI_PROCESSOR_BLOCK, 0x20) == dump.data_blocks[0][1]
    assert target.read(KI_PROCESSOR_BLOCK + 0x20, 0x30) == dump.data_blocks[1][1][0x10:]


def test_a_driver_name_outside_the_string_pool_is_reported(written, tmp_path):
    _, fields, path = written
    entry = fields["DriverListOffset"] + DUMP_DRIVER_ENTRY64["size"]
    changed = rewritten(tmp_path, path, {entry: ("<I", fields["DataPageOffset"])})
    target = dbgext.open(changed)
    assert [m.name for m in target.modules()][1] == "Unknown_Module_%016x" % DRIVER_BASE
    problems = [p for p in target.info()["problems"] if p["kind"] == "driver_name_outside_pool"]
    assert [p["address"] for p in problems] == [DRIVER_BASE]


def test_a_driver_name_running_past_the_pool_is_cut_and_reported(written, tmp_path):
    _, fields, path = written
    last = fields["string:2"]
    changed = rewritten(tmp_path, path, {last: ("<I", 0x7000)})
    target = dbgext.open(changed)
    assert target.modules()[2].image == "ACPI.sys"  # the NUL still ends it
    nul = last + 4 + 2 * struct.unpack_from("<I", open(path, "rb").read(), last)[0]
    changed = rewritten(tmp_path, path, {last: ("<I", 0x7000), nul: ("<H", 0x41)})
    target = dbgext.open(changed)
    assert target.modules()[2].image.startswith("ACPI.sys")
    assert "driver_name_outside_pool" in kinds(target)


def test_an_impossible_driver_count_reads_the_entries_the_file_holds(written, tmp_path):
    _, _, path = written
    changed = rewritten(tmp_path, path, {triage_field("DriverCount"): ("<I", 0xFFFFFFF)})
    target = dbgext.open(changed)
    assert len(target.modules()) >= 3
    assert "triage_driver_list_cut" in kinds(target)


def test_an_impossible_data_block_count_reads_the_entries_the_file_holds(written, tmp_path):
    _, _, path = written
    changed = rewritten(tmp_path, path, {triage_field("DataBlocksCount"): ("<I", 0xFFFFFFF)})
    assert "triage_data_blocks_cut" in kinds(dbgext.open(changed))


def test_without_ki_processor_block_the_kprcb_copy_stays_unplaced(written, tmp_path):
    _, fields, path = written
    changed = rewritten(tmp_path, path, {fields["DataBlocksOffset"]: ("<Q", 0xFFFFF80000AAA000)})
    target = dbgext.open(changed)
    assert not target.is_readable(PRCB_ADDRESS)
    assert target.read(THREAD_ADDRESS, 8)  # the thread pointer still comes from the copy
    assert [(p["kind"], p["severity"]) for p in target.info()["problems"]] == [("triage_copy_unplaced", "note")]


def test_without_debugger_data_the_copies_are_unsized_and_unmapped(written, tmp_path):
    _, _, path = written
    changed = rewritten(tmp_path, path, {triage_field("DebuggerDataOffset"): ("<I", 0)})
    target = dbgext.open(changed)
    assert not target.is_readable(THREAD_ADDRESS)
    assert set(kinds(target)) == {"triage_copy_unplaced"}
    assert target.backend.layout_hints("_KTHREAD") is None


def test_a_bad_kdbg_tag_is_a_warning(written, tmp_path):
    _, fields, path = written
    changed = rewritten(tmp_path, path, {fields["DebuggerDataOffset"] + 0x10: ("<4s", b"GBDK")})
    assert "debugger_data_tag" in kinds(dbgext.open(changed))


# -- commands on a small dump ------------------------------------------------------------------------


def run(argv):
    out = io.StringIO()
    code = main(argv, stream=out)
    return code, out.getvalue()


def test_lm_lists_the_driver_list(written):
    _, _, path = written
    code, text = run(["lm", "--dump", path, "--json"])
    assert code == 0
    assert [m["name"] for m in json.loads(text)["modules"]] == ["nt", "mydrv", "ACPI"]


def test_module_names_work_in_the_address_grammar(written):
    _, _, path = written
    code, text = run(["lm", "m", "acpi", "--dump", path])
    assert code == 0 and "ACPI" in text and "mydrv" not in text
    target = dbgext.open(path)
    assert evaluate("mydrv+0x1234", TargetResolver(target)) == DRIVER_BASE + 0x1234
    assert evaluate("nt", TargetResolver(target)) == NT_BASE


def test_dps_reads_the_stack_at_rsp(written):
    dump, _, path = written
    code, text = run(["dps", "--dump", path, "@rsp", "L2"])
    assert code == 0
    first = struct.unpack_from("<Q", dump.stack[1])[0]
    assert text.split("\n")[0].split()[1] == "%08x`%08x" % (first >> 32, first & 0xFFFFFFFF)


def test_db_outside_the_saved_parts_shows_unreadable_bytes(written):
    _, _, path = written
    code, text = run(["db", "--dump", path, "%x" % NT_BASE, "L10"])
    assert code in (0, 1) and "??" in text or "unreadable" in text


def test_partly_held_pages_name_the_bytes_they_hold(written):
    dump, _, path = written
    partial = dbgext.open(path).backend.partial_pages()
    stack_page = STACK_POINTER & ~0xFFF
    assert partial[stack_page] == ((STACK_POINTER, stack_page + PAGE_SIZE),)
    assert partial[FAULT_BLOCK & ~0xFFF] == ((FAULT_BLOCK, (FAULT_BLOCK | 0xFFF) + 1),)
    assert DATA_PAGE not in partial


def test_bytes_below_the_stack_pointer_are_unreadable(written):
    _, _, path = written
    target = dbgext.open(path)
    assert not target.is_readable(STACK_POINTER - 8, 8)
    assert target.is_readable(STACK_POINTER, 8)


# -- any TRIAGE_DUMP64 field, any value --------------------------------------------------------------

TRIAGE_U32_FIELDS = sorted(name for name in TRIAGE_DUMP64 if name not in (
    "offset", "size", "TopOfStack", "ArchitectureSpecific", "DataPageAddress"))
INTERESTING = strategies.sampled_from([0, 1, 8, 0x10, 0x2000, 0x2080, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFF0,
                                       0xFFFFFFFF])


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=strategies.lists(strategies.tuples(strategies.sampled_from(TRIAGE_U32_FIELDS),
                                                  strategies.one_of(INTERESTING, strategies.integers(0, 0xFFFFFFFF))),
                                min_size=1, max_size=4))
def test_any_triage_field_value_gives_a_dump_or_one_error(written, tmp_path, changes):
    _, _, path = written
    changed = rewritten(tmp_path, path, dict((triage_field(name), ("<I", value)) for name, value in changes))
    try:
        target = dbgext.open(changed)
        analyze(target).as_dict()
        target.try_read(STACK_POINTER, 0x100)
        list(target.readable_ranges())
        target.close()
    except DbgextError as error:
        assert "\n" not in str(error)


@pytest.mark.parametrize("argv, what", [(["rtltrace", "--find"], "finding trace databases"),
                                        (["etwstacks"], "finding the ETW loggers")])
def test_analyses_that_scan_kernel_memory_say_in_one_line_why_they_need_a_bigger_dump(written, argv, what):
    _, _, path = written
    code, text = run(argv + ["--dump", path])
    assert code == 1
    assert text.startswith("error: %s needs a kernel, full or active memory dump: a small memory dump holds only"
                           % what)
    assert len(text.strip().split("\n")) == 1


@pytest.mark.parametrize("path, name", [
    ("\\SystemRoot\\system32\\ntoskrnl.exe", "nt"), ("\\SystemRoot\\system32\\ntkrnlmp.exe", "nt"),
    ("ntkrnlpa.exe", "nt"), ("ntkrpamp.exe", "nt"), ("\\SystemRoot\\System32\\drivers\\amdppm.sys", "amdppm"),
    ("\\??\\C:\\Windows\\system32\\drivers\\AsIO2.sys", "AsIO2"), ("\\SystemRoot\\system32\\hal.dll", "hal"),
    ("noextension", "noextension")])
def test_a_module_is_named_by_its_file_name_without_extension_and_the_kernel_is_nt(path, name):
    assert debugger_module_name(path) == name


# -- secondary data after SizeOfDump ------------------------------------------------------------------

BLOB_TAG = "54c84888-01d1-4c1e-bed6-282c98241303"


def with_secondary_data(tmp_path, path, tail):
    out = tmp_path / "secondary.dmp"
    out.write_bytes(open(path, "rb").read() + tail)
    return str(out)


def blob(data, tag=BLOB_TAG, post_pad=0, announced=None):
    import uuid
    size = len(data) if announced is None else announced
    return struct.pack("<I16sIII", 0x20, uuid.UUID(tag).bytes_le, size, 0, post_pad) + data + bytes(post_pad)


def test_dumpblob_records_after_size_of_dump_are_listed_with_tag_and_size(written, tmp_path):
    _, fields, path = written
    tail = b"DumpBlob" + struct.pack("<II", 0x10, 19041) + blob(b"A" * 0x44, post_pad=4) + blob(b"B" * 0x10)
    target = dbgext.open(with_secondary_data(tmp_path, path, tail))
    start = fields["SizeOfDump"] + 0x10
    assert target.info()["secondary_data"] == [
        {"tag": BLOB_TAG, "size": 0x44, "offset": start + 0x20},
        {"tag": BLOB_TAG, "size": 0x10, "offset": start + 0x20 + 0x44 + 4 + 0x20}]
    assert target.info()["problems"] == []
    code, text = run(["dumpinfo", "--dump", with_secondary_data(tmp_path, path, tail)])
    assert "Secondary data after SizeOfDump (2 DumpBlob records, 0x54 bytes of data):" in text


def test_a_dumpblob_record_cut_by_the_end_of_the_file_is_a_reported_problem(written, tmp_path):
    _, _, path = written
    tail = b"DumpBlob" + struct.pack("<II", 0x10, 19041) + blob(b"A" * 0x10) + blob(b"B" * 8, announced=0x1000)
    target = dbgext.open(with_secondary_data(tmp_path, path, tail))
    assert [b["size"] for b in target.info()["secondary_data"]] == [0x10]
    assert kinds(target) == ["secondary_data_cut"]


def test_bytes_after_size_of_dump_that_are_not_dumpblob_records_are_a_note(written, tmp_path):
    _, _, path = written
    target = dbgext.open(with_secondary_data(tmp_path, path, b"garbage!" * 4))
    assert target.info()["secondary_data"] == []
    assert [(p["kind"], p["severity"]) for p in target.info()["problems"]] == [("secondary_data_unknown", "note")]
