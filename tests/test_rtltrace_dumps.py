"""Databases in real dump files: kernel x64 in a kernel dump, user x64/x86 in
minidumps, read through ``dbgext rtltrace --dump``."""

import io
import json

import pytest

from dbgext.cli import main
from dbgext.errors import EXIT_PROBLEMS
from dbgext.rtltrace.fixtures import add_sample_database
from dbgext.sample.scenario import Scenario

from rtltrace_support import database
from dbgext.sample.kdump_writer import write_kernel_dump
from minidump_writer import write_minidump

CASES = [("kernel-x64", write_kernel_dump), ("user-x64", write_minidump), ("user-x86", write_minidump)]


def cli(argv):
    stream = io.StringIO()
    code = main(["rtltrace"] + argv, stream=stream)
    return code, stream.getvalue()


@pytest.fixture(scope="module", params=CASES, ids=[layout for layout, _ in CASES])
def dump(request, tmp_path_factory):
    layout, writer = request.param
    scenario, builder = database(layout, distinct=150, adds=450)
    path = str(tmp_path_factory.mktemp(layout) / "db.dmp")
    writer(scenario, path)
    scenario.write_symbols(path + ".symbols")
    return layout, path, builder


def test_the_database_reads_the_same_from_the_dump_file(dump):
    layout, path, builder = dump
    code, text = cli(["--dump", path, "0x%x" % builder.address, "--json"])
    assert code == 0, text
    document = json.loads(text)
    assert document["layout"] == layout
    assert document["problems"] == []
    assert (document["traces"], document["hits"], document["blocks_found"]) == (150, 300, 150)
    assert document["hash_function"]["kind"] == "default"
    assert document["hash_function"]["symbol"].endswith("!RtlStackTraceHashFunction")


def test_summary_symbolizes_frames_from_the_isf_files(dump):
    layout, path, builder = dump
    code, text = cli(["--dump", path, "0x%x" % builder.address, "--limit", "2"])
    assert code == 0
    assert "Top 2 traces by hit count" in text
    assert ("mydrv!" if layout == "kernel-x64" else "app!") in text


def test_find_scans_the_dump(dump):
    layout, path, builder = dump
    code, text = cli(["--dump", path, "--find", "--json"])
    assert code == 0, text
    assert [c["address"] for c in json.loads(text)["candidates"]] == [builder.address]


def test_a_dump_with_pages_left_out_reports_them(tmp_path):
    scenario, builder = database("kernel-x64", distinct=150, adds=150)
    scenario.excluded_pages.add(builder.segments[1])
    path = str(tmp_path / "holes.dmp")
    scenario.write_kernel_dump(path, bitmap=True)
    code, text = cli(["--dump", path, "0x%x" % builder.address, "--validate", "--json"])
    assert code == EXIT_PROBLEMS
    document = json.loads(text)
    unreadable = [p for p in document["problems"] if p["kind"] == "unreadable"]
    assert unreadable and all(builder.segments[1] <= p["address"] < builder.segments[1] + 0x1000
                              for p in unreadable)


def test_the_sample_database_in_a_kernel_dump(tmp_path):
    scenario = Scenario("x64", "kernel")
    scenario.add_module("nt", 0xFFFFF80000000000, 0x100000, image="ntoskrnl.exe")
    address = add_sample_database(scenario)
    path = str(tmp_path / "sample.dmp")
    scenario.write_kernel_dump(path)
    scenario.write_symbols(path + ".symbols")
    code, text = cli(["--dump", path, "tracedrv!g_TraceDatabase", "--validate"])
    assert code == 0
    assert "Problems: none" in text
    assert "HashCounter overflow" in text
    assert "%08x`%08x" % (address >> 32, address & 0xFFFFFFFF) in text
