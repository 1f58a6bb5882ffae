"""``!py commands/rtltrace.py`` inside (a faithful fake of) WinDbg with pykd."""

import json

import pytest

from dbgext.target.base import PAGE_SIZE

from pykd_support import COMMANDS_DIR, memory_engine_calls, run_windbg_script
from rtltrace_support import add_database_type, database

SCRIPT = COMMANDS_DIR + "/rtltrace.py"
CONSTANT = 32  # the header, symbol and layout look-ups: not per page


def test_trace_list_links_to_dps_and_to_the_bucket_view():
    scenario, builder = database("user-x64", distinct=20, adds=40)
    text, _ = run_windbg_script("rtltrace", ["%x" % builder.address, "--traces"], scenario)
    block = builder.bucket_chain(next(b for b in range(builder.buckets) if builder.bucket_chain(b)))[0]
    frames = builder.frames_of(block)
    assert '<link cmd="dps 0x%x L0x%x">' % (block + 0x38, len(frames)) in text
    assert '<link cmd="!py %s 0x%x --bucket 0x%x --layout user-x64">' % (
        SCRIPT, builder.address, builder.bucket_of(frames)) in text


def test_the_bucket_link_target_runs_and_lists_that_chain():
    scenario, builder = database("kernel-x64", distinct=60, adds=60)
    bucket = max(range(builder.buckets), key=lambda b: len(builder.bucket_chain(b)))
    text, _ = run_windbg_script("rtltrace", ["0x%x" % builder.address, "--bucket", "%x" % bucket,
                                             "--layout", "kernel-x64"], scenario, mode="kernel")
    assert "Bucket 0x%x (of 211)" % bucket in text
    for block in builder.bucket_chain(bucket):
        assert '<link cmd="dps 0x%x' % (block + 0x38) in text


def test_json_inside_windbg_is_plain_json():
    scenario, builder = database("user-x86", distinct=10, adds=10)
    text, _ = run_windbg_script("rtltrace", ["%x" % builder.address, "--json"], scenario)
    assert json.loads(text)["layout"] == "user-x86"


def test_find_in_a_live_session_asks_for_a_range():
    scenario, builder = database("user-x64", distinct=10, adds=10)
    text, _ = run_windbg_script("rtltrace", ["--find"], scenario, dump=False)
    assert "--range" in text and "Traceback" not in text
    text, _ = run_windbg_script("rtltrace", ["--find", "--range", "%x" % builder.address,
                                             "%x" % (builder.address + 0x1000)], scenario, dump=False)
    assert "Trace databases found: 1" in text


def test_the_debuggers_type_information_chooses_the_layout():
    scenario, builder = database("user-x64", distinct=20, adds=40)
    add_database_type(scenario)
    text, _ = run_windbg_script("rtltrace", ["%x" % builder.address, "--json"], scenario)
    document = json.loads(text)
    assert document["layout_reason"].startswith("type information for ntdll!_RTL_TRACE_DATABASE")
    assert document["problems"] == []


@pytest.mark.parametrize("layout", ["user-x64", "kernel-x64", "user-x86"])
def test_a_walk_costs_at_most_3_engine_calls_per_page_of_the_database(layout):
    scenario, builder = database(layout, distinct=3000, adds=6000)
    text, fake = run_windbg_script("rtltrace", ["%x" % builder.address, "--validate"], scenario)
    assert "Problems: none" in text
    granularity = 0x10000 if layout.startswith("user") else 0x1000
    pages = sum(-(-len(region.data) // PAGE_SIZE) for region in builder.regions)
    assert pages >= len(builder.segments) * granularity // PAGE_SIZE
    assert memory_engine_calls(fake) <= 3 * pages + CONSTANT


def test_a_user_database_is_read_in_runs_of_pages():
    scenario, builder = database("user-x64", distinct=3000, adds=6000)
    _, fake = run_windbg_script("rtltrace", ["%x" % builder.address], scenario)
    assert fake.fake_calls["loadBytes"] <= len(builder.regions) + CONSTANT  # one run per 64 KiB segment
