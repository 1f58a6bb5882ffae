"""The per-dump triage record: identity, bug check, stack signature, analysis
plug-ins and the content hash — built from in-memory scenarios, no dump files."""

import os

import pytest

from dbgext.errors import BadInput
from dbgext.triage import record as record_module
from dbgext.triage.record import (STATUS_FAILED, STATUS_OK, Analysis, DumpRecord, build_record, content_hash,
                                  iso_time, register_analysis, select_analyses, unregister_analysis)
from dbgext.triage.signature import faulting_signature, follows_call

from triage_support import DRIVER_BASE, crash_scenario


@pytest.fixture
def scratch_analyses():
    """Register analyses for one test only."""
    names = []

    def register(name, summarize, requires=None):
        names.append(name)
        return register_analysis(name, summarize, requires)

    yield register
    for name in names:
        unregister_analysis(name)


def test_a_crash_record_has_identity_bugcheck_and_the_faulting_function():
    target = crash_scenario("mydrv", "DispatchIoctl", 0xD1, salt=1).target()
    record = build_record(target, "x.dmp", 1234, "abc", analyses=[])
    assert (record.path, record.size, record.hash) == ("x.dmp", 1234, "abc")
    assert record.arch == "x64" and record.build == 19042
    assert record.bugcheck_code == 0xD1 and record.bugcheck_parameters[:3] == [0x11, 2, 0]
    assert record.frames == ["nt!KeBugCheckEx", "nt!KiBugCheckDispatch", "nt!KiPageFault",
                             "mydrv!DispatchIoctl", "nt!IofCallDriver"]
    assert record.signature == "mydrv!DispatchIoctl"
    assert record.status == STATUS_OK and record.problems == []


def test_dumps_with_one_crash_share_a_signature_whatever_the_offsets():
    signatures = {build_record(crash_scenario(salt=salt).target(), analyses=[]).signature for salt in range(4)}
    assert signatures == {"mydrv!DispatchIoctl"}


def test_an_unreadable_stack_is_a_problem_with_its_address_not_a_failure():
    scenario = crash_scenario(stack_readable=False)
    record = build_record(scenario.target(), analyses=[])
    assert record.status == STATUS_OK
    assert record.frames == ["nt!KeBugCheckEx"]
    rsp = scenario.registers["rsp"]
    assert record.problems == [{"analysis": "signature", "message": "stack at 0x%x is unreadable" % rsp,
                                "address": rsp}]


def test_a_dump_without_a_context_has_no_signature():
    scenario = crash_scenario()
    scenario.registers = {"rip": 0, "rsp": 0}
    record = build_record(scenario.target(), analyses=[])
    assert record.frames == [] and record.signature is None and record.problems == []


def test_stack_values_that_do_not_follow_a_call_are_not_frames():
    scenario = crash_scenario()
    rsp = scenario.registers["rsp"]
    scenario.pack(rsp, "<Q", DRIVER_BASE + 0x3010)  # inside the driver, but no call before it
    assert "mydrv!ProcessPacket" not in faulting_signature(scenario.target()).frames


@pytest.mark.parametrize("code, expected", [
    (b"\x90\x90\xe8\x01\x02\x03\x04", True),     # call rel32
    (b"\x90\x90\x90\x90\x90\xff\xd0", True),     # call rax
    (b"\x90\x90\x90\x90\x41\xff\xd3", True),     # call r11
    (b"\x90\xff\x15\x00\x10\x00\x00", True),     # call [rip+0x1000]
    (b"\x90\x90\x90\x90\xff\x50\x08", True),     # call [rax+8]
    (b"\x90\x90\x90\x90\x90\x90\x90", False),
    (b"\x48\x83\xec\x28\x90\x90\xc3", False),
])
def test_return_addresses_are_recognised_by_the_call_before_them(code, expected):
    assert follows_call(code) is expected


def test_analysis_summaries_and_problems_go_into_the_record(scratch_analyses):
    scratch_analyses("counting", lambda target: {"items": 3, "problems": [
        "plain text problem", {"message": "bad link", "address": 0xFFFFC08000000010}]})
    record = build_record(crash_scenario().target(), analyses=select_analyses(["counting"]))
    assert record.analyses == {"counting": {"items": 3}}
    assert record.problems == [
        {"analysis": "counting", "message": "plain text problem", "address": None},
        {"analysis": "counting", "message": "bad link", "address": 0xFFFFC08000000010}]
    assert record.status == STATUS_OK


def test_an_analysis_that_raises_fails_the_record_but_keeps_the_rest(scratch_analyses):
    def broken(target):
        raise KeyError("oops")
    scratch_analyses("fine", lambda target: {"ok": True})
    scratch_analyses("broken", broken)
    record = build_record(crash_scenario().target(), analyses=select_analyses(["broken", "fine"]))
    assert record.status == STATUS_FAILED
    assert record.reason == "broken: KeyError: 'oops'"
    assert record.analyses == {"fine": {"ok": True}}
    assert record.signature == "mydrv!DispatchIoctl"


def test_an_analysis_whose_package_is_missing_is_simply_absent(scratch_analyses):
    scratch_analyses("needs-missing", lambda target: {"x": 1}, requires="dbgext.no_such_package")
    assert "needs-missing" not in [a.name for a in select_analyses()]
    assert select_analyses(["needs-missing"]) == []
    assert not Analysis("x", None, requires="dbgext.no_such_package").available()


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


def test_big_files_are_hashed_from_bounded_samples(tmp_path):
    path = tmp_path / "big.dmp"
    size = 8 * 1024 * 1024
    with open(str(path), "wb") as handle:
        handle.truncate(size)
    before = content_hash(str(path))
    with open(str(path), "r+b") as handle:          # a byte in the first 64 KiB sample
        handle.seek(100)
        handle.write(b"\x01")
    assert content_hash(str(path)) != before
    assert os.path.getsize(str(path)) == size


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
