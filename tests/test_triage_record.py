"""The per-dump triage record: identity, the bug check named with its arguments
labelled, the faulting frame and bucket, analysis plug-ins and the content hash —
built from in-memory scenarios, no dump files."""

import hashlib

import pytest

from dbgext.errors import BadInput
from dbgext.problems import Problem
from dbgext.symbols.module import EXPORT_SYMBOLS
from dbgext.triage import record as record_module
from dbgext.triage.bugchecks import BUGCHECK_NAMES, bugcheck_name, describe_crash
from dbgext.triage.record import (STATUS_FAILED, STATUS_OK, DumpRecord, build_record, content_hash,
                                  iso_time, register_analysis, select_analyses, unregister_analysis)

from triage_support import DRIVER_BASE, DRIVER_TIMESTAMP, crash_scenario


@pytest.fixture
def scratch_analyses():
    """Register analyses for one test only."""
    names = []

    def register(name, summarize):
        names.append(name)
        return register_analysis(name, summarize)

    yield register
    for name in names:
        unregister_analysis(name)


def test_a_crash_record_has_identity_the_named_bugcheck_and_the_faulting_function():
    target = crash_scenario("mydrv", "DispatchIoctl", 0xD1, salt=1).target()
    record = build_record(target, "x.dmp", 1234, "abc", analyses=[])
    assert (record.path, record.size, record.hash) == ("x.dmp", 1234, "abc")
    assert record.arch == "x64" and record.build == 19042
    assert record.bugcheck_code == 0xD1 and record.bugcheck_parameters[:3] == [0x11, 2, 0]
    assert record.bugcheck_name == "DRIVER_IRQL_NOT_LESS_OR_EQUAL"
    assert record.bugcheck_labels[0] == "memory referenced"
    assert record.bugcheck_labels[3] == "address of the instruction that referenced the memory"
    faulting = record.faulting
    # The bug check's Arg4 names the instruction, and the stack has a frame there.
    assert faulting.address == record.bugcheck_parameters[3] and faulting.how in ("unwind", "scan")
    assert (faulting.function, faulting.module, faulting.image) == ("mydrv!DispatchIoctl", "mydrv", "mydrv.sys")
    assert (faulting.module_timestamp, faulting.module_size) == (DRIVER_TIMESTAMP, 0x10000)
    assert faulting.module_offset == faulting.address - DRIVER_BASE and faulting.function_offset == 0x41
    assert (record.bucket, record.bucket_basis) == ("0xD1_mydrv!DispatchIoctl", "symbol")
    assert record.signature == "mydrv!DispatchIoctl"
    assert record.status == STATUS_OK


def test_dumps_with_one_crash_share_a_bucket_whatever_the_offsets():
    buckets = {build_record(crash_scenario(salt=salt).target(), analyses=[]).bucket for salt in range(4)}
    assert buckets == {"0xD1_mydrv!DispatchIoctl"}


def test_without_symbols_the_bucket_is_module_plus_offset_with_the_image_identity():
    scenario = crash_scenario(salt=1)
    scenario.module_symbols["mydrv"].symbols.clear()
    record = build_record(scenario.target(), analyses=[])
    assert (record.bucket, record.bucket_basis) == ("0xD1_mydrv+0x2041", "offset")
    assert record.faulting.function is None and record.signature == "mydrv+0x2041"
    assert (record.faulting.module_timestamp, record.faulting.module_size) == (DRIVER_TIMESTAMP, 0x10000)


def test_a_module_known_only_by_its_exports_is_bucketed_by_offset(monkeypatch):
    # The export nearest below an address is often not the function holding it.
    target = crash_scenario(salt=1).target()
    monkeypatch.setattr(target.symbols, "status", lambda module_name: EXPORT_SYMBOLS)
    record = build_record(target, analyses=[])
    assert (record.bucket, record.bucket_basis) == ("0xD1_mydrv+0x2041", "offset")
    assert record.faulting.name == "mydrv!DispatchIoctl+0x41" and record.faulting.symbols == EXPORT_SYMBOLS


def test_a_module_without_its_pe_headers_in_the_dump_keeps_its_loader_size_and_no_timestamp():
    scenario = crash_scenario(salt=1)
    scenario.write(DRIVER_BASE, b"\0" * 0x200)
    record = build_record(scenario.target(), analyses=[])
    assert (record.faulting.module_timestamp, record.faulting.module_size) == (None, 0x10000)


def test_a_named_faulting_address_the_stack_does_not_have_is_noted_and_the_stack_decides():
    scenario = crash_scenario()
    code, p1, p2, p3, _ = scenario.bugcheck
    scenario.bugcheck = (code, p1, p2, p3, 0x4141414141410000)
    record = build_record(scenario.target(), analyses=[])
    assert (record.bucket, record.bucket_basis) == ("0xD1_mydrv!DispatchIoctl", "symbol")
    notes = [p for p in record.problems["signature"] if p.kind == "faulting_address_elsewhere"]
    assert notes[0].address == 0x4141414141410000 and notes[0].severity == "note"
    assert "mydrv!DispatchIoctl+0x40" in notes[0].message


def test_without_a_stack_the_named_faulting_address_decides_even_outside_every_module():
    scenario = crash_scenario(stack_readable=False)
    scenario.registers = {"rip": 0, "rsp": 0}
    code, p1, p2, p3, _ = scenario.bugcheck
    scenario.bugcheck = (code, p1, p2, p3, 0x4141414141410000)
    target = scenario.target()
    target.backend.current_thread = lambda: None     # a target that holds no context at all
    record = build_record(target, analyses=[])
    assert record.frames == [] and record.faulting.how == "bugcheck_argument"
    assert (record.bucket, record.bucket_basis) == ("0xD1_UNKNOWN_MODULE", "unknown")


@pytest.mark.parametrize("code, name", [
    (0xD1, "DRIVER_IRQL_NOT_LESS_OR_EQUAL"), (0x0A, "IRQL_NOT_LESS_OR_EQUAL"), (0x139, "KERNEL_SECURITY_CHECK_FAILURE"),
    (0x1000007E, "SYSTEM_THREAD_EXCEPTION_NOT_HANDLED_M"), (0xC000021A, "WINLOGON_FATAL_ERROR"),
    (0x1D5, "DRIVER_PNP_WATCHDOG"), (0xDEADDEAD, "MANUALLY_INITIATED_CRASH1"), (0x12345, None),
])
def test_bug_checks_are_named_from_the_complete_table(code, name):
    assert bugcheck_name(code) == name


def test_the_table_names_every_code_of_the_sdk_list_once():
    assert len(BUGCHECK_NAMES) > 500 and len(set(BUGCHECK_NAMES.values())) == len(BUGCHECK_NAMES)
    assert all(name == name.upper() and " " not in name for name in BUGCHECK_NAMES.values())


def test_undocumented_arguments_have_no_label():
    name, arguments = describe_crash(0xE2, [0, 0, 0, 0])
    assert name == "MANUALLY_INITIATED_CRASH" and [a.label for a in arguments] == [None] * 4


def test_a_minidump_is_named_by_its_exception():
    name, arguments = describe_crash(0xC0000005, [1, 0x10], user_mode=True)
    assert name == "ACCESS_VIOLATION" and arguments[1] == (0x10, "inaccessible address")


def test_without_a_named_faulting_address_the_first_frame_past_the_plumbing_is_blamed():
    scenario = crash_scenario()
    scenario.bugcheck = (0xE2, 0, 0, 0, 0)    # MANUALLY_INITIATED_CRASH names no instruction
    record = build_record(scenario.target(), analyses=[])
    assert record.frames[0].name.startswith("nt!KeBugCheckEx") and record.frames[0].how == "context"
    assert record.faulting.function == "mydrv!DispatchIoctl" and record.bucket == "0xE2_mydrv!DispatchIoctl"
    assert record.faulting.how in ("unwind", "frame_chain", "scan")


def test_plumbing_is_recognised_by_export_names_too(monkeypatch):
    scenario = crash_scenario()
    scenario.bugcheck = (0xE2, 0, 0, 0, 0)
    target = scenario.target()
    monkeypatch.setattr(target.symbols, "status", lambda module_name: EXPORT_SYMBOLS)
    record = build_record(target, analyses=[])
    assert record.faulting.name == "mydrv!DispatchIoctl+0x40"
    assert (record.bucket, record.bucket_basis) == ("0xE2_mydrv+0x2040", "offset")


def test_a_zero_context_and_no_faulting_address_give_an_unknown_module_bucket():
    scenario = crash_scenario()
    scenario.registers = {"rip": 0, "rsp": 0}
    scenario.bugcheck = (0xE2, 0, 0, 0, 0)
    record = build_record(scenario.target(), analyses=[])
    assert record.faulting.module is None and record.signature == "0x0"
    assert (record.bucket, record.bucket_basis) == ("0xE2_UNKNOWN_MODULE", "unknown")


def test_the_walk_problems_are_kept_under_signature():
    record = build_record(crash_scenario(stack_readable=False).target(), analyses=[])
    assert record.status == STATUS_OK and record.problems["signature"].count() >= 1
    assert record.bucket == "0xD1_mydrv!DispatchIoctl"   # the bug check still names the instruction


def test_analysis_summaries_and_problems_go_into_the_record(scratch_analyses):
    scratch_analyses("counting", lambda target: {"items": 3, "problems": [
        Problem("bad_link", 0xFFFFC08000000010, "bad link"), Problem("odd_count", None, "odd", "warning")]})
    record = build_record(crash_scenario().target(), analyses=select_analyses(["counting"]))
    assert record.analyses == {"counting": {"items": 3}}
    assert list(record.problems["counting"]) == [Problem("bad_link", 0xFFFFC08000000010, "bad link"),
                                                 Problem("odd_count", None, "odd", "warning")]
    first = [p for p in record.as_dict()["problems"] if p["analysis"] == "counting"][0]
    assert first == {"analysis": "counting", "kind": "bad_link", "severity": "error", "address": 0xFFFFC08000000010,
                     "offset": None, "message": "bad link"}
    assert record.status == STATUS_OK


def test_an_analysis_reporting_problems_of_another_shape_fails_naming_itself(scratch_analyses):
    scratch_analyses("strings", lambda target: {"problems": ["plain text"]})
    record = build_record(crash_scenario().target(), analyses=select_analyses(["strings"]))
    assert record.status == STATUS_FAILED and "strings" in record.reason and "Problem objects" in record.reason


def test_an_analysis_that_raises_fails_the_record_but_keeps_the_rest(scratch_analyses):
    def broken(target):
        raise KeyError("oops")
    scratch_analyses("fine", lambda target: {"ok": True})
    scratch_analyses("broken", broken)
    record = build_record(crash_scenario().target(), analyses=select_analyses(["broken", "fine"]))
    assert record.status == STATUS_FAILED
    assert record.reason == "broken: KeyError: 'oops'"
    assert record.analyses == {"fine": {"ok": True}}
    assert record.bucket == "0xD1_mydrv!DispatchIoctl"


def test_an_analysis_whose_package_fails_to_import_fails_in_the_record_not_silently(scratch_analyses):
    def needs_missing(target):
        import dbgext.no_such_package  # noqa: F401
    scratch_analyses("needs-missing", needs_missing)
    assert "needs-missing" in [a.name for a in select_analyses()]
    record = build_record(crash_scenario("mydrv", "DispatchIoctl", 0xD1, salt=1).target(),
                          analyses=select_analyses(["needs-missing"]))
    assert record.status == STATUS_FAILED and "No module named 'dbgext.no_such_package'" in record.reason


def test_an_unknown_analysis_name_is_bad_input():
    with pytest.raises(BadInput, match="unknown analysis nonsense"):
        select_analyses(["nonsense"])


def test_a_missing_plugin_module_is_bad_input():
    with pytest.raises(BadInput, match="cannot import triage plug-in"):
        record_module.load_plugins(["no_such_triage_plugin"])
    with pytest.raises(BadInput, match="has no function"):
        record_module.load_plugins(["triage_support:no_such_function"])


def test_records_round_trip_through_plain_dicts():
    record = build_record(crash_scenario().target(), "p", 1, "h", analyses=[])
    again = DumpRecord.from_dict(record.as_dict())
    assert again.as_dict() == record.as_dict()


def test_the_content_hash_depends_on_content_not_on_the_name(tmp_path):
    first, second, other = tmp_path / "a.dmp", tmp_path / "b.dmp", tmp_path / "c.dmp"
    first.write_bytes(b"PAGEDU64" + b"x" * 5000)
    second.write_bytes(b"PAGEDU64" + b"x" * 5000)
    other.write_bytes(b"PAGEDU64" + b"x" * 4999 + b"y")
    assert content_hash(str(first)) == content_hash(str(second)) != content_hash(str(other))


def test_the_content_hash_covers_every_byte_of_a_big_file(tmp_path):
    path = tmp_path / "big.dmp"
    size = 8 * 1024 * 1024
    with open(str(path), "wb") as handle:
        handle.truncate(size)
    before = content_hash(str(path))
    with open(str(path), "r+b") as handle:          # one byte far from the head and the tail
        handle.seek(size // 2 + 12345)
        handle.write(b"\x01")
    assert content_hash(str(path)) != before
    assert before == hashlib.sha256(b"\0" * size).hexdigest()


def test_an_unreadable_file_cannot_be_hashed(tmp_path):
    with pytest.raises(BadInput, match="cannot read"):
        content_hash(str(tmp_path / "missing.dmp"))


@pytest.mark.parametrize("value, expected", [
    (0x01DB000000000000, "2024-09-06T01:56:33Z"),   # FILETIME
    (1700000000, "2023-11-14T22:13:20Z"),           # time_t (minidump)
    (0, None), (None, None), (-5, None),
])
def test_dump_times_become_iso_8601(value, expected):
    assert iso_time(value) == expected


def test_a_script_triages_an_open_target_through_the_public_api():
    import dbgext.triage
    record = dbgext.triage.analyze(crash_scenario(salt=1).target(), analyses=[])
    document = record.as_dict()
    assert list(document)[0] == "schema_version" and document["bucket"] == "0xD1_mydrv!DispatchIoctl"
    assert isinstance(record, dbgext.triage.DumpRecord) and record.faulting.image == "mydrv.sys"
