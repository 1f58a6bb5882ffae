"""``dbgext ipt ...`` end to end: the --json contracts, dumps, WinDbg, bad input."""

import io
import json
import re

import pytest

from dbgext.cli import main
from dbgext.ipt import fixtures as F
from dbgext.ipt import sources
from dbgext.ipt.packets import PACKET_TYPES, PSB
from dbgext.testing.scenario import Scenario

BASE = 0xFFFFF80012341000
PROGRAM = F.sample_program(BASE)


def run(*argv, **options):
    stream = io.StringIO()
    code = main([str(arg) for arg in argv], stream=stream, **options)
    return code, stream.getvalue()


def run_json(*argv, **options):
    code, text = run(*(argv + ("--json",)), **options)
    assert code == 0, text
    return json.loads(text)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ipt")
    trace, expected = F.trace_program(PROGRAM, 300, seed=4, interrupt_every=80, timing=True)
    (folder / "trace.bin").write_bytes(trace)
    (folder / "code.bin").write_bytes(PROGRAM.code)
    scenario = Scenario("x64", "kernel")
    scenario.add_module("nt", 0xFFFFF80000000000, 0x10000, image="ntoskrnl.exe")
    scenario.add_symbol("nt", "KeBugCheckEx", 0x1000)
    info = F.add_sample_trace(scenario)
    scenario.build_loaded_module_list()
    dump = folder / "k.dmp"
    scenario.write_kernel_dump(str(dump))
    scenario.write_symbols(str(dump) + ".symbols")
    return {"folder": folder, "trace": folder / "trace.bin", "image": "%s@0x%x" % (folder / "code.bin", BASE),
            "expected": expected, "dump": dump, "info": info, "scenario": scenario}


def test_packets_json_contract(files):
    document = run_json("ipt", "packets", "--trace", files["trace"])
    assert set(document) >= {"packets", "errors"}
    packets = document["packets"]
    assert packets[0] == {"offset": 0, "type": "psb"}
    assert all(packet["type"] in PACKET_TYPES for packet in packets)
    tip = next(packet for packet in packets if packet["type"] == "tip")
    assert isinstance(tip["ip"], int) and tip["ipbytes"] in (1, 2, 3, 4, 6)
    tnt = next(packet for packet in packets if packet["type"] == "tnt8")
    assert re.match("^[TN]{1,6}$", tnt["bits"])
    mtc = next(packet for packet in packets if packet["type"] == "mtc")
    assert set(mtc) == {"offset", "type", "ctc"}
    assert document["errors"] == []


def test_packets_stats(files):
    document = run_json("ipt", "packets", "--trace", files["trace"], "--stats")
    stats = document["stats"]
    assert stats["bytes"] == len(files["trace"].read_bytes()) and stats["errors"] == 0
    assert stats["packets"] == sum(stats["types"].values())
    code, text = run("ipt", "packets", "--trace", files["trace"], "--stats")
    assert code == 0 and "tnt8" in text and "errors: 0" in text


def test_packets_position_reports_stored_offsets(files, tmp_path):
    trace = files["trace"].read_bytes()
    ring = trace[100:] + trace[:100]  # oldest data (offset 0 of the trace) now sits at 100 - len
    position = len(trace) - 100
    (tmp_path / "ring.bin").write_bytes(ring)
    document = run_json("ipt", "packets", "--trace", tmp_path / "ring.bin", "--position", position)
    assert document["packets"][0] == {"offset": position, "type": "psb"}
    straight = run_json("ipt", "packets", "--trace", files["trace"])["packets"]
    assert [p["type"] for p in document["packets"]] == [p["type"] for p in straight]


def test_flow_with_an_image_file_json_contract(files):
    document = run_json("ipt", "flow", "--trace", files["trace"], "--image", files["image"])
    assert document["instructions"] == files["expected"]
    assert document["errors"] == [] and document["warnings"] == []
    capped = run_json("ipt", "flow", "--trace", files["trace"], "--image", files["image"], "--max-insns", 10)
    assert capped["instructions"] == files["expected"][:10]


def test_flow_stats(files):
    document = run_json("ipt", "flow", "--trace", files["trace"], "--image", files["image"], "--stats")
    assert document["stats"]["instructions"] == len(files["expected"]) and document["stats"]["errors"] == 0


def test_flow_code_from_the_dump_with_views(files):
    info = files["info"]
    base = ["ipt", "flow", "--dump", files["dump"], "--address", "%x" % info["trace_address"],
            "--size", info["trace_size"]]
    document = run_json(*base)
    assert len(document["instructions"]) == info["instructions"] and document["errors"] == []
    path = run_json(*(base + ["--view", "path"]))["path"]
    assert path[0] == {"function": "iptdemo!Dispatch", "first": info["entry"], "instructions": 3}
    tree = run_json(*(base + ["--view", "calltree"]))["calltree"]
    assert tree["function"] == "iptdemo!Dispatch"
    assert {child["function"] for child in tree["children"]} == {"iptdemo!ValidateRequest",
                                                                 "iptdemo!CompleteRequest"}
    functions = run_json(*(base + ["--view", "functions"]))["functions"]
    assert sum(row["instructions"] for row in functions) == info["instructions"]
    code, text = run(*(base + ["--view", "path"]))
    assert code == 0 and "iptdemo!ValidateRequest" in text and "fffff800`12341000" in text


def test_event_in_the_dump(files):
    info = files["info"]
    document = run_json("ipt", "event", "--dump", files["dump"], "--address", "%x" % info["event_address"])
    assert document["event"]["TraceSize"] == info["trace_size"]
    assert document["event"]["IptOptionFields"]["TraceCodeModeText"] == "kernel"
    assert document["flow"]["instructions"] == info["instructions"]
    code, text = run("ipt", "event", "--dump", files["dump"], "--address", "%x" % info["event_address"])
    assert code == 0 and "TraceCodeMode    1 (kernel)" in text and "iptdemo!CompleteRequest" in text


def test_event_file_with_position(files, tmp_path):
    trace = files["trace"].read_bytes()
    ring = trace[50:] + trace[:50]
    payload = sources.encode_event_header(1, 4, 8, 0x1000001, len(ring), 0) + ring
    (tmp_path / "event.bin").write_bytes(payload)
    document = run_json("ipt", "event", "--trace", tmp_path / "event.bin", "--position", len(trace) - 50)
    assert document["source"]["position"] == len(trace) - 50
    assert document["errors"] == [] and document["packets"]["packets"] > 0


def test_scan_the_dump(files):
    document = run_json("ipt", "scan", "--dump", files["dump"])
    assert [event["address"] for event in document["events"]] == [files["info"]["event_address"]]


def test_scan_an_etl_file(files, tmp_path):
    from dbgext.etl import INTEL_PT_GUID, EtlWriter
    trace = files["trace"].read_bytes()
    payload = sources.encode_event_header(1, 4, 8, 0x1000001, len(trace), len(trace)) + trace
    writer = EtlWriter()
    writer.add_classic_event(INTEL_PT_GUID, 32, payload, thread_id=8, process_id=4)
    writer.add_classic_event(INTEL_PT_GUID, 32, b"short", thread_id=8, process_id=4)
    writer.add_system_event(0x55, 32, payload, thread_id=9, process_id=4)  # a group the reader cannot name
    writer.add_system_event(0x55, 33, b"\0" * 64, thread_id=9, process_id=4)
    path = tmp_path / "ipt.etl"
    writer.write(str(path))
    document = run_json("ipt", "scan", "--etl", path)
    assert [(e["process"], e["thread"], e["trace_size"], e["errors"]) for e in document["events"]] == \
        [(4, 8, len(trace), 0), (4, 8, len(trace), 0)]
    assert any("needs 32 bytes" in note for note in document["notes"])
    # the seed's workflow: the event from the .etl, the code from a dump of the same machine
    index = document["events"][0]["index"]
    event = run_json("ipt", "event", "--etl", path, "--index", index, "--dump", files["dump"])
    assert event["event"]["TraceSize"] == len(trace) and event["errors"] == []
    assert event["flow"]["instructions"] == len(files["expected"]) and event["flow"]["errors"] == []
    code, text = run("ipt", "event", "--etl", path, "--index", 99)
    assert code == 1 and "no IntelProcessorTrace event with index 99" in text


def test_windbg_event_and_flow_over_the_live_target(files):
    from pykd_support import run_windbg_script
    info = files["info"]
    text, _ = run_windbg_script("ipt", ["event", "--address", "%x" % info["event_address"]], files["scenario"])
    assert "IntelProcessorTrace event" in text and "iptdemo!Dispatch" in text
    text, _ = run_windbg_script("ipt", ["flow", "--address", "%x" % info["trace_address"], "--size",
                                        info["trace_size"], "--view", "path"], files["scenario"])
    assert '<link cmd="u fffff800`12341000">' in text and "iptdemo!ValidateRequest" in text
    text, _ = run_windbg_script("ipt", ["scan"], files["scenario"])
    assert "give a range to scan" in text  # a live session cannot list its memory
    text, _ = run_windbg_script("ipt", ["scan", "--start", "%x" % (info["event_address"] - 0x1000),
                                        "--length", "0x3000"], files["scenario"])
    assert "ipt.py event --address" in text  # a DML link to decode the event


@pytest.mark.parametrize("argv, message", [
    (["ipt"], "choose one of"),
    (["ipt", "packets"], "give --trace FILE"),
    (["ipt", "flow", "--trace", "TRACE"], "flow needs code"),
    (["ipt", "flow", "--trace", "TRACE", "--image", "nobase"], "FILE@BASE"),
    (["ipt", "packets", "--trace", "/nonexistent/trace.bin"], "cannot read"),
    (["ipt", "packets", "--trace", "TRACE", "--position", "999999"], "outside"),
    (["ipt", "event", "--trace", "TRACE", "--address", "zz"], "not an address"),
])
def test_bad_arguments_are_one_line_errors(files, argv, message):
    argv = [str(files["trace"]) if arg == "TRACE" else arg for arg in argv]
    code, text = run(*argv)
    assert code == 1 and message in text and "Traceback" not in text


def test_unreadable_trace_address_in_the_dump(files):
    code, text = run("ipt", "packets", "--dump", files["dump"], "--address", "ffff900000000000", "--size", 64)
    assert code == 1 and "unreadable" in text


def test_random_bytes_give_errors_not_a_crash(tmp_path):
    import random
    generator = random.Random(3)
    data = bytes(generator.getrandbits(8) for _ in range(5000))
    (tmp_path / "noise.bin").write_bytes(data[:2000] + PSB + data[2000:])
    document = run_json("ipt", "packets", "--trace", tmp_path / "noise.bin")
    assert document["errors"] and all("offset" in error for error in document["errors"])
    code, text = run("ipt", "flow", "--trace", tmp_path / "noise.bin", "--image", "%s@0x%x" % (
        tmp_path / "noise.bin", BASE))
    assert code == 0


def test_position_with_a_process_trace_is_refused(files):
    code, text = run("ipt", "packets", "--trace", files["trace"], "--format", "process", "--position", "4")
    assert code == 1 and "RingBufferOffset" in text


def test_flow_over_a_pe_file_maps_its_sections_and_names_exports(tmp_path):
    from ipt_support import build_pe
    image_base = 0xFFFFF80030000000
    program = F.sample_program(image_base + 0x1000)
    exports = {name: address - image_base for name, address in program.labels.items() if "_" not in name}
    pe = tmp_path / "iptpe.sys"
    pe.write_bytes(build_pe(program.code, image_base, exports))
    trace, expected = F.trace_program(program, 200, seed=5)
    (tmp_path / "t.bin").write_bytes(trace)
    image = "%s@0x%x" % (pe, image_base)
    document = run_json("ipt", "flow", "--trace", tmp_path / "t.bin", "--image", image, "--view", "functions")
    assert document["instructions"] == expected and document["errors"] == []
    assert {row["function"] for row in document["functions"]} >= {"iptpe!Dispatch", "iptpe!ValidateRequest"}


def test_a_path_into_kebugcheckex_is_flagged(files, tmp_path):
    writer = F.PacketWriter()
    writer.psb_plus(0xFFFFF80000001000)  # nt!KeBugCheckEx in the dump's symbols
    writer.tnt(True)
    (tmp_path / "bugcheck.bin").write_bytes(writer.bytes())
    document = run_json("ipt", "flow", "--trace", tmp_path / "bugcheck.bin", "--dump", files["dump"])
    assert any("nt!KeBugCheckEx" in warning for warning in document["warnings"])
