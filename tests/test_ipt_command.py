"""``dbgext ipt ...`` end to end: the --json contracts, dumps, WinDbg, bad input."""

import io
import json
import re
from pathlib import Path

import pytest

import ipt_tracer as T
from dbgext.cli import main
from dbgext.ipt import fixtures as F
from dbgext.ipt import sources
from dbgext.ipt.packets import PACKET_TYPES, PSB, PTDUMP_NAMES
from dbgext.sample.scenario import Scenario

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
    trace, expected = T.trace_program(PROGRAM, 300, seed=4, interrupt_every=80, timing=True)
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


def test_the_bundled_sample_trace_is_the_tracers_walk_of_the_sample_program():
    """The package keeps the sample's trace as bytes; the tracer still writes them."""
    program = F.sample_program(F.SAMPLE_MODULE[1] + F.SAMPLE_CODE_RVA)
    trace, executed = T.trace_program(program, 300, seed=7, interrupt_every=150, psb_every=0)
    assert trace == F.SAMPLE_TRACE
    assert len(executed) == F.SAMPLE_TRACE_INSTRUCTIONS


def only_buffer(document):
    assert len(document["buffers"]) == 1
    return document["buffers"][0]


def listed_ips(document):
    return [row["ip"] for row in only_buffer(document)["instructions"]]


def test_every_document_starts_with_its_schema_version(files):
    for argv in (["packets"], ["packets", "--stats"], ["flow", "--image", files["image"]],
                 ["flow", "--image", files["image"], "--stats"]):
        document = run_json("ipt", *(argv + ["--trace", files["trace"]]))
        assert list(document)[:2] == ["schema_version", "action"] and document["schema_version"] == 2
        assert document["problems_by_kind" if "--stats" in argv else "problems"] in ({}, [])


def test_packets_json_contract(files):
    document = run_json("ipt", "packets", "--trace", files["trace"])
    buffer = only_buffer(document)
    packets = buffer["packets"]
    assert packets[0] == {"offset": 0, "type": "psb"}
    assert all(packet["type"] in PACKET_TYPES for packet in packets)
    tip = next(packet for packet in packets if packet["type"] == "tip")
    assert isinstance(tip["ip"], int) and tip["ipbytes"] in (1, 2, 3, 4, 6)
    tnt = next(packet for packet in packets if packet["type"] == "tnt8")
    assert re.match("^[TN]{1,6}$", tnt["bits"])
    mtc = next(packet for packet in packets if packet["type"] == "mtc")
    assert set(mtc) == {"offset", "type", "ctc"}
    assert buffer["listing"] == {"listed": len(packets), "truncated": False}
    assert buffer["stats"]["packets"] == len(packets)


def test_packet_listing_cap_is_hex_and_totals_still_count_everything(files):
    everything = only_buffer(run_json("ipt", "packets", "--trace", files["trace"]))
    capped = only_buffer(run_json("ipt", "packets", "--trace", files["trace"], "--max-packets", "10"))
    assert len(capped["packets"]) == 0x10 and capped["listing"]["truncated"]
    assert capped["stats"] == everything["stats"]
    code, text = run("ipt", "packets", "--trace", files["trace"], "--max-packets", "0n5")
    assert code == 0 and "(listed 5 of %d packets" % everything["stats"]["packets"] in text


def test_packets_stats(files):
    buffer = only_buffer(run_json("ipt", "packets", "--trace", files["trace"], "--stats"))
    stats = buffer["stats"]
    assert "packets" not in buffer
    assert stats["bytes"] == len(files["trace"].read_bytes()) and stats["errors"] == 0
    assert stats["packets"] == sum(stats["types"].values())
    code, text = run("ipt", "packets", "--trace", files["trace"], "--stats")
    assert code == 0 and "tnt8" in text and "errors: 0" in text


def test_the_packet_listing_names_packets_as_ptdump_does_and_the_json_keeps_its_types(files):
    packets = only_buffer(run_json("ipt", "packets", "--trace", files["trace"]))["packets"]
    code, text = run("ipt", "packets", "--trace", files["trace"])
    listed = [line.split()[1] for line in text.splitlines() if re.match(r"^0x[0-9a-f]+ ", line)]
    assert code == 0 and "tnt8" in {packet["type"] for packet in packets}
    assert listed == [PTDUMP_NAMES[packet["type"]] for packet in packets]
    assert "tnt.8" in listed and "tnt8" not in listed


def test_packets_position_is_hex_and_reports_stored_offsets(files, tmp_path):
    trace = files["trace"].read_bytes()
    ring = trace[100:] + trace[:100]  # oldest data (offset 0 of the trace) now sits at 100 - len
    position = len(trace) - 100
    (tmp_path / "ring.bin").write_bytes(ring)
    document = run_json("ipt", "packets", "--trace", tmp_path / "ring.bin", "--position", "%x" % position)
    assert only_buffer(document)["packets"][0] == {"offset": position, "type": "psb"}
    straight = only_buffer(run_json("ipt", "packets", "--trace", files["trace"]))["packets"]
    assert [p["type"] for p in only_buffer(document)["packets"]] == [p["type"] for p in straight]


def test_flow_with_an_image_file_json_contract(files):
    document = run_json("ipt", "flow", "--trace", files["trace"], "--image", files["image"])
    buffer = only_buffer(document)
    assert listed_ips(document) == files["expected"]
    assert buffer["instruction_count"] == len(files["expected"])
    assert buffer["listing"] == {"listed": len(files["expected"]), "limit": 100000, "truncated": False}
    assert buffer["instructions"][0] == {"index": 0, "ip": BASE, "symbol": "code+0x0", "text": "sub rsp, 0x28"}
    assert document["problems"] == []


def test_the_instruction_cap_applies_to_the_listing_only(files):
    capped = run_json("ipt", "flow", "--trace", files["trace"], "--image", files["image"], "--max-insns", "0n10")
    assert listed_ips(capped) == files["expected"][:10]
    buffer = only_buffer(capped)
    assert buffer["listing"] == {"listed": 10, "limit": 10, "truncated": True}
    assert buffer["instruction_count"] == len(files["expected"])
    for view in ("path", "functions"):
        document = run_json("ipt", "flow", "--trace", files["trace"], "--image", files["image"], "--max-insns", "1",
                            "--view", view)
        rows = only_buffer(document)[view]
        rows = rows["entries"] if view == "path" else rows
        assert sum(row["instructions"] for row in rows) == len(files["expected"])
    code, text = run("ipt", "flow", "--trace", files["trace"], "--image", files["image"], "--max-insns", "0n10")
    assert "(listed 10 of %d instructions: --max-insns N lists more" % len(files["expected"]) in text


def test_flow_stats_decode_everything(files):
    document = run_json("ipt", "flow", "--trace", files["trace"], "--image", files["image"], "--stats",
                        "--max-insns", "1")
    buffer = only_buffer(document)
    assert buffer["instruction_count"] == len(files["expected"]) and document["problems_by_kind"] == {}
    assert "instructions" not in buffer and document["view"] is None
    code, text = run("ipt", "flow", "--trace", files["trace"], "--image", files["image"], "--stats")
    assert "instructions: %d" % len(files["expected"]) in text


def test_stats_print_totals_only_however_many_events_and_problems(files, tmp_path):
    """Packets by type, instructions, events by kind, problems by kind: never a list."""
    trace, expected = T.trace_program(PROGRAM, 3000, seed=8, interrupt_every=10)
    broken = trace + b"\x02\x99" + trace[16:] * 3 + b"\x02\x99" * 300  # undecodable bytes, then more errors
    (tmp_path / "noisy.bin").write_bytes(broken)
    argv = ["ipt", "flow", "--trace", tmp_path / "noisy.bin", "--image", files["image"], "--stats"]
    document = run_json(*argv)
    buffer = only_buffer(document)
    assert "problems" not in document and "events" not in buffer
    assert buffer["events_by_kind"]["interrupt"] > 100 and sum(buffer["events_by_kind"].values()) == \
        buffer["event_count"]
    assert document["problems_by_kind"] == {"ipt_packet_error": buffer["packets"]["errors"]}
    assert sum(buffer["packets"]["types"].values()) == buffer["packets"]["packets"]
    code, text = run(*argv)
    assert len(text.splitlines()) < 40
    assert "events: %d" % buffer["event_count"] in text and "instructions: %d" % buffer["instruction_count"] in text
    assert "problems: %d" % buffer["packets"]["errors"] in text
    packets = run_json("ipt", "packets", "--trace", tmp_path / "noisy.bin", "--stats")
    assert packets["problems_by_kind"] == document["problems_by_kind"] and "problems" not in packets
    code, text = run("ipt", "packets", "--trace", tmp_path / "noisy.bin", "--stats")
    assert len(text.splitlines()) < 40 and "ipt_packet_error" in text


def test_flow_code_from_the_dump_with_views(files):
    info = files["info"]
    base = ["ipt", "flow", "--dump", files["dump"], "--address", "%x" % info["trace_address"],
            "--size", "%x" % info["trace_size"]]
    document = run_json(*base)
    assert only_buffer(document)["instruction_count"] == info["instructions"] and document["problems"] == []
    path = only_buffer(run_json(*(base + ["--view", "path"])))["path"]
    assert path["entries"][0] == {"function": "iptdemo!Dispatch", "first": info["entry"], "index": 0,
                                  "instructions": 3}
    tree = only_buffer(run_json(*(base + ["--view", "calltree"])))["calltree"]
    assert tree["function"] == "iptdemo!Dispatch"
    assert {child["function"] for child in tree["children"]} >= {"iptdemo!ValidateRequest",
                                                                 "iptdemo!CompleteRequest"}
    functions = only_buffer(run_json(*(base + ["--view", "functions"])))["functions"]
    assert sum(row["instructions"] for row in functions) == info["instructions"]
    code, text = run(*(base + ["--view", "path"]))
    assert code == 0 and "iptdemo!ValidateRequest" in text and "fffff800`12341000" in text


def test_size_and_address_take_windbg_numbers(files):
    info = files["info"]
    hex_size = run_json("ipt", "packets", "--dump", files["dump"], "--address", "%x" % info["trace_address"],
                        "--size", "%x" % info["trace_size"], "--stats")
    decimal_size = run_json("ipt", "packets", "--dump", files["dump"], "--address",
                            "0x%x" % info["trace_address"], "--size", "0n%d" % info["trace_size"], "--stats")
    assert hex_size == decimal_size
    assert only_buffer(hex_size)["source"]["size"] == info["trace_size"]
    by_symbol = run_json("ipt", "flow", "--dump", files["dump"], "--address", "%x" % info["trace_address"],
                         "--size", "%x" % info["trace_size"], "--stats", "--image",
                         "%s@iptdemo+1000" % (files["folder"] / "code.bin"))
    assert only_buffer(by_symbol)["instruction_count"] == info["instructions"]


def test_interrupts_get_their_own_node_in_the_call_tree(files, tmp_path):
    """FUP + TIP into the handler and iretq back: the handler's instructions are
    charged to a node of its own (via "interrupt"), not to the interrupted function."""
    writer = T.PacketWriter()
    writer.psb_plus(PROGRAM.entry)
    validate = PROGRAM.labels["ValidateRequest"]
    writer.fup(validate + 1)                 # interrupted after push rbx
    writer.tip(PROGRAM.interrupt_handler)
    writer.tip(validate + 1)                 # iretq
    writer.tnt(True)                         # jbe taken
    writer.tnt(True)                         # ret
    (tmp_path / "irq.bin").write_bytes(writer.bytes())
    document = run_json("ipt", "flow", "--trace", tmp_path / "irq.bin", "--image", files["image"], "--view",
                        "calltree")
    tree = only_buffer(document)["calltree"]
    validate_node = tree["children"][0]
    assert validate_node["via"] == "call" and validate_node["instructions"] == 6
    handler = validate_node["children"][0]
    assert (handler["via"], handler["instructions"], handler["calls"]) == ("interrupt", 3, 1)
    assert [event["kind"] for event in validate_node["events"]] == ["interrupt"]


def writer_at_the_indirect_call():
    """A trace from Dispatch through ValidateRequest up to Dispatch's call rax."""
    writer = T.PacketWriter()
    writer.psb_plus(PROGRAM.entry)
    writer.tnt(True)    # jbe taken: no Checksum
    writer.tnt(True)    # ret
    writer.tnt(False)   # jz not taken: the indirect call follows
    return writer


def test_events_appear_in_every_view(files, tmp_path):
    writer = writer_at_the_indirect_call()
    writer.pgd(PROGRAM.labels["CompleteRequest"])  # off at the indirect call
    writer.pge(PROGRAM.labels["Dispatch_skip"])
    writer.tnt(False)
    writer.ovf()
    writer.fup(PROGRAM.entry)
    (tmp_path / "events.bin").write_bytes(writer.bytes())
    for view in ("instructions", "path", "calltree", "functions"):
        code, text = run("ipt", "flow", "--trace", tmp_path / "events.bin", "--image", files["image"], "--view", view)
        assert code == 0
        for words in ("[synchronized at fffff800`12341000", "[tracing disabled at fffff800`1234105f",
                      "[tracing enabled at fffff800`12341022", "[overflow: packets lost",
                      "[resumed after the overflow at fffff800`12341000"):
            assert words in text, (view, words)
    kinds = [event["kind"] for event in only_buffer(run_json(
        "ipt", "flow", "--trace", tmp_path / "events.bin", "--image", files["image"]))["events"]]
    assert kinds == ["sync", "disabled", "enabled", "overflow", "resumed"]


def test_unreadable_code_is_a_gap_event_and_a_warning(files, tmp_path):
    """The indirect call goes outside the image; the ret's TIP brings the trace back."""
    writer = writer_at_the_indirect_call()
    writer.tip(0xFFFFF80099990000)                # into code we do not have
    writer.tnt(True)                              # its branches, lost
    writer.tip(PROGRAM.labels["Dispatch_skip"])   # its uncompressed return
    writer.tnt(False)                             # jnz not taken
    (tmp_path / "gap.bin").write_bytes(writer.bytes())
    document = run_json("ipt", "flow", "--trace", tmp_path / "gap.bin", "--image", files["image"])
    buffer = only_buffer(document)
    assert [(event["kind"], event["ip"]) for event in buffer["events"]] == [
        ("sync", PROGRAM.entry), ("gap", 0xFFFFF80099990000), ("resync", PROGRAM.labels["Dispatch_skip"])]
    # call rax (reported: the code it calls is the gap), then dec ecx and jnz after the return
    assert listed_ips(document)[-3:] == [PROGRAM.labels["Dispatch_skip"] + offset for offset in (-2, 0, 2)]
    [gap] = document["problems"]
    assert (gap["kind"], gap["severity"], gap["address"]) == ("ipt_gap", "warning", 0xFFFFF80099990000)
    code, text = run("ipt", "flow", "--trace", tmp_path / "gap.bin", "--image", files["image"], "--view", "path")
    assert "[gap: no code at fffff800`99990000" in text and "[resynchronized at fffff800`12341022" in text


def test_cpu_selects_libipt_errata(files):
    document = run_json("ipt", "flow", "--trace", files["trace"], "--image", files["image"], "--cpu", "6/0x5c/9",
                        "--stats")
    assert document["cpu"] == [6, 0x5C, 9] and document["errata"] == ["apl11", "apl12"]
    code, text = run("ipt", "flow", "--trace", files["trace"], "--image", files["image"], "--cpu", "skylake")
    assert code == 1 and "a CPU is FAMILY/MODEL" in text and "Traceback" not in text


def test_event_in_the_dump(files):
    info = files["info"]
    document = run_json("ipt", "event", "--dump", files["dump"], "--address", "%x" % info["event_address"])
    assert document["event"]["TraceSize"] == info["trace_size"]
    assert document["event"]["IptOptionFields"]["TraceCodeModeText"] == "kernel"
    assert document["flow"]["instruction_count"] == info["instructions"]
    assert document["flow"]["path"]["entries"][0]["function"] == "iptdemo!Dispatch"
    code, text = run("ipt", "event", "--dump", files["dump"], "--address", "%x" % info["event_address"])
    assert code == 0 and "TraceCodeMode    1 (kernel)" in text and "iptdemo!CompleteRequest" in text


def test_an_event_address_that_holds_no_event_is_refused_in_one_line(files):
    code, text = run("ipt", "event", "--dump", files["dump"], "--address", "iptdemo+1000")
    assert code == 1 and len(text.strip().splitlines()) == 1
    assert "no IntelProcessorTrace event header at fffff800`12341000: found" in text and "--force" in text


def test_a_picture_is_not_an_event(tmp_path):
    picture = tmp_path / "pic.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    code, text = run("ipt", "event", "--trace", picture)
    assert code == 1 and len(text.strip().splitlines()) == 1
    assert "is not an IntelProcessorTrace event: found a PNG image (TraceMode" in text and "--force" in text
    code, text = run("ipt", "event", "--trace", picture, "--force")
    assert code == 0 and "IntelProcessorTrace event" in text


def test_event_file_with_position(files, tmp_path):
    trace = files["trace"].read_bytes()
    ring = trace[50:] + trace[:50]
    payload = sources.encode_event_header(1, 4, 8, 0x1000001, len(ring), 0) + ring
    (tmp_path / "event.bin").write_bytes(payload)
    document = run_json("ipt", "event", "--trace", tmp_path / "event.bin", "--position", "%x" % (len(trace) - 50))
    assert document["source"]["position"] == len(trace) - 50
    assert document["problems"] == [] and document["packets"]["packets"] > 0 and document["flow"] is None


def test_scan_the_dump(files):
    document = run_json("ipt", "scan", "--dump", files["dump"])
    assert [event["address"] for event in document["events"]] == [files["info"]["event_address"]]


REALWORLD = Path(__file__).resolve().parents[1].parent / "shared" / "realworld"


def test_scan_of_a_small_memory_dump_says_it_needs_a_bigger_dump():
    code, text = run("ipt", "scan", "--dump", REALWORLD / "kernel" / "rizin__triage_x64.dmp")
    assert code == 1 and "(none)" not in text
    assert "needs a kernel, full or active memory dump: a small memory dump holds only" in text


def test_scan_of_a_minidump_that_finds_nothing_says_why_in_one_line():
    code, text = run("ipt", "scan", "--dump", REALWORLD / "minidumps" / "breakpad__minidump2.dmp")
    assert code == 0 and "(none)" in text
    why = [line for line in text.splitlines() if "ipt_scan_empty" in line]
    assert len(why) == 1
    assert "0x16fc readable bytes searched (3 ranges)" in why[0] and "a minidump holds one process's memory" in why[0]


def test_scan_of_a_dump_that_finds_nothing_says_how_much_it_searched(tmp_path):
    scenario = Scenario("x64", "kernel")
    scenario.write(scenario.alloc_pages(0x1000), b"\x90" * 0x1000)
    dump = tmp_path / "empty.dmp"
    scenario.write_kernel_dump(str(dump))
    document = run_json("ipt", "scan", "--dump", dump)
    assert document["events"] == []
    empty = [problem for problem in document["problems"] if problem["kind"] == "ipt_scan_empty"]
    assert len(empty) == 1 and "readable bytes searched" in empty[0]["message"]
    assert "minidump" not in empty[0]["message"]


def test_scan_an_etl_file(files, tmp_path):
    from dbgext.etl import INTEL_PT_GUID
    from etl_writer import EtlWriter
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
    assert [(p["kind"], p["severity"]) for p in document["problems"]] == [("ipt_event_unreadable", "warning")]
    assert "needs 32 bytes" in document["problems"][0]["message"]
    # the seed's workflow: the event from the .etl, the code from a dump of the same machine
    index = document["events"][0]["index"]
    event = run_json("ipt", "event", "--etl", path, "--index", "%x" % index, "--dump", files["dump"])
    assert event["event"]["TraceSize"] == len(trace) and event["problems"] == []
    assert event["flow"]["instruction_count"] == len(files["expected"])
    code, text = run("ipt", "event", "--etl", path, "--index", "0n99")
    assert code == 1 and "no IntelProcessorTrace event with index 99" in text


def test_a_compressed_etl_is_decoded_and_undecodable_buffers_are_counted_once(files, tmp_path):
    from xpress_support import compress_etl
    from dbgext.etl import INTEL_PT_GUID
    from etl_writer import EtlWriter
    trace = files["trace"].read_bytes()
    payload = sources.encode_event_header(1, 4, 8, 0x1000001, len(trace), len(trace)) + trace
    writer = EtlWriter(buffer_size=0x1000)
    for _ in range(120):  # events spread over several buffers
        writer.add_classic_event(INTEL_PT_GUID, 32, payload, thread_id=8, process_id=4)
    plain = writer.to_bytes()
    buffers = len(plain) // 0x1000
    path = tmp_path / "compressed.etl"
    path.write_bytes(compress_etl(plain, corrupt=(2, 3)))
    document = run_json("ipt", "scan", "--etl", path)
    assert 0 < len(document["events"]) < 120
    undecodable = [p for p in document["problems"] if p["kind"] == "etl_buffers_undecodable"]
    assert len(undecodable) == 1 and ("2 of %d buffers could not be decoded" % buffers) in undecodable[0]["message"]
    code, text = run("ipt", "scan", "--etl", path)
    assert code == 0 and text.count("could not be decoded") == 1


def test_windbg_event_and_flow_over_the_live_target(files):
    from pykd_support import run_windbg_script
    info = files["info"]
    text, _ = run_windbg_script("ipt", ["event", "--address", "%x" % info["event_address"]], files["scenario"])
    assert "IntelProcessorTrace event" in text and "iptdemo!Dispatch" in text
    text, _ = run_windbg_script("ipt", ["flow", "--address", "%x" % info["trace_address"], "--size",
                                        "%x" % info["trace_size"], "--view", "path"], files["scenario"])
    assert '<link cmd="u fffff800`12341000">' in text and "iptdemo!ValidateRequest" in text
    text, _ = run_windbg_script("ipt", ["flow", "--address", "%x" % info["trace_address"], "--size",
                                        "%x" % info["trace_size"]], files["scenario"])
    assert '<link cmd="u fffff800`12341000 L1">' in text and "sub rsp, 0x28" in text
    text, _ = run_windbg_script("ipt", ["scan"], files["scenario"])
    assert "give a range to scan" in text  # a live session cannot list its memory
    text, _ = run_windbg_script("ipt", ["scan", "--start", "%x" % (info["event_address"] - 0x1000),
                                        "--length", "3000"], files["scenario"])
    assert "ipt.py event --address" in text  # a DML link to decode the event


@pytest.mark.parametrize("argv, message", [
    (["ipt"], "choose one of"),
    (["ipt", "packets"], "give a trace: trace (a file)"),
    (["ipt", "flow", "--trace", "TRACE"], "flow needs code"),
    (["ipt", "flow", "--trace", "TRACE", "--image", "nobase"], "FILE@BASE"),
    (["ipt", "packets", "--trace", "/nonexistent/trace.bin"], "cannot read"),
    (["ipt", "packets", "--trace", "TRACE", "--position", "999999"], "outside"),
    (["ipt", "packets", "--trace", "TRACE", "--size", "12zz"], "'12zz'"),
    (["ipt", "event", "--dump", "DUMP", "--address", "zz"], "zz"),
])
def test_bad_arguments_are_one_line_errors(files, argv, message):
    argv = [{"TRACE": str(files["trace"]), "DUMP": str(files["dump"])}.get(arg, arg) for arg in argv]
    code, text = run(*argv)
    assert code == 1 and message in text and "Traceback" not in text
    assert len(text.strip().splitlines()) == 1


def test_unreadable_trace_address_in_the_dump(files):
    code, text = run("ipt", "packets", "--dump", files["dump"], "--address", "ffff900000000000", "--size", "40")
    assert code == 1 and "unreadable" in text


def test_random_bytes_give_problems_not_a_crash(tmp_path):
    import random
    generator = random.Random(3)
    data = bytes(generator.getrandbits(8) for _ in range(5000))
    (tmp_path / "noise.bin").write_bytes(data[:2000] + PSB + data[2000:])
    document = run_json("ipt", "packets", "--trace", tmp_path / "noise.bin")
    assert document["problems"] and {problem["kind"] for problem in document["problems"]} == {"ipt_packet_error"}
    assert all(isinstance(problem["offset"], int) for problem in document["problems"])
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
    trace, expected = T.trace_program(program, 200, seed=5)
    (tmp_path / "t.bin").write_bytes(trace)
    image = "%s@0x%x" % (pe, image_base)
    document = run_json("ipt", "flow", "--trace", tmp_path / "t.bin", "--image", image)
    assert listed_ips(document) == expected and document["problems"] == []
    assert only_buffer(document)["instructions"][0]["symbol"] == "iptpe!Dispatch"
    functions = run_json("ipt", "flow", "--trace", tmp_path / "t.bin", "--image", image, "--view", "functions")
    assert {row["function"] for row in only_buffer(functions)["functions"]} >= {"iptpe!Dispatch",
                                                                                 "iptpe!ValidateRequest"}


def test_a_path_into_kebugcheckex_is_flagged(files, tmp_path):
    writer = T.PacketWriter()
    writer.psb_plus(0xFFFFF80000001000)  # nt!KeBugCheckEx in the dump's symbols
    writer.tnt(True)
    (tmp_path / "bugcheck.bin").write_bytes(writer.bytes())
    document = run_json("ipt", "flow", "--trace", tmp_path / "bugcheck.bin", "--dump", files["dump"])
    warning = document["problems"][0]
    assert (warning["kind"], warning["severity"], warning["address"]) == (
        "ipt_suspicious_path", "warning", 0xFFFFF80000001000)
    assert "nt!KeBugCheckEx" in warning["message"]


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_long_decodes_show_progress_on_a_terminal_only(files, tmp_path):
    program = T.random_program(BASE, functions=40, seed=1)
    trace, expected = T.trace_program(program, 300000, seed=2)
    (tmp_path / "big.bin").write_bytes(trace)
    (tmp_path / "code.bin").write_bytes(program.code)
    argv = ["ipt", "flow", "--trace", str(tmp_path / "big.bin"), "--image", "%s@%x" % (tmp_path / "code.bin", BASE),
            "--stats"]
    terminal, results = Terminal(), io.StringIO()
    assert main(argv, stream=results, error_stream=terminal) == 0
    assert "\rdecoding: " in terminal.getvalue() and "instructions: %d" % len(expected) in results.getvalue()
    plain = io.StringIO()
    assert main(argv, stream=io.StringIO(), error_stream=plain) == 0
    assert plain.getvalue() == ""


def test_scripts_use_the_public_api(files):
    import dbgext.ipt
    result = dbgext.ipt.reconstruct_flow(trace=str(files["trace"]), images=[(str(files["folder"] / "code.bin"), BASE)],
                                         view="functions")
    assert isinstance(result, dbgext.ipt.FlowAnalysis) and result.problems == []
    assert result.buffers[0].instruction_count == len(files["expected"])
    document = result.as_dict()
    assert document["schema_version"] == dbgext.ipt.SCHEMA_VERSION == 2
    assert json.loads(json.dumps(document)) == document


def test_the_public_api_is_one_function_per_action_each_returning_one_result_type(files):
    import dbgext.ipt
    trace = str(files["trace"])
    assert isinstance(dbgext.ipt.list_packets(trace=trace, stats=True), dbgext.ipt.PacketsResult)
    with dbgext.open(str(files["dump"])) as target:
        assert isinstance(dbgext.ipt.scan_events(target), dbgext.ipt.ScanResult)
        assert isinstance(dbgext.ipt.decode_event(target, address=files["info"]["event_address"]),
                          dbgext.ipt.EventResult)
    assert not hasattr(dbgext.ipt, "analyze")
    # the functions do not shadow the decoder modules
    assert dbgext.ipt.packets.__name__ == "dbgext.ipt.packets" and dbgext.ipt.flow.__name__ == "dbgext.ipt.flow"


def test_a_mistyped_keyword_fails_at_the_call_naming_it(files):
    import dbgext.ipt
    with pytest.raises(TypeError, match="max_insn"):
        dbgext.ipt.reconstruct_flow(trace=str(files["trace"]), max_insn=10)
    with pytest.raises(TypeError, match="positional"):
        dbgext.ipt.list_packets(None, str(files["trace"]))


@pytest.mark.parametrize("call, message", [
    (lambda ipt: ipt.list_packets(), "give a trace: trace (a file), data (bytes), or address (with size)"),
    (lambda ipt: ipt.list_packets(data=PSB, format="process", position=4), "position does not apply to format"),
    (lambda ipt: ipt.reconstruct_flow(data=PSB), "the flow needs code: images [(file, base)], or a target"),
    (lambda ipt: ipt.decode_event(), "give an event: address (with a target), trace (a file), or etl"),
    (lambda ipt: ipt.decode_event(address=0x1000), "an event at an address needs a target"),
    (lambda ipt: ipt.scan_events(), "a scan of memory needs a target"),
])
def test_library_errors_name_parameters_not_flags(call, message):
    import dbgext.ipt
    from dbgext.errors import BadInput
    with pytest.raises(BadInput) as raised:
        call(dbgext.ipt)
    assert message in str(raised.value) and "--" not in str(raised.value)


def test_no_bad_input_message_in_the_ipt_library_names_a_flag():
    import ast
    import dbgext.ipt
    folder = Path(dbgext.ipt.__file__).parent
    flagged = []
    for path in sorted(folder.glob("*.py")):
        if path.name == "command.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "BadInput":
                texts = [part.value for part in ast.walk(node) if isinstance(part, ast.Constant)
                         and isinstance(part.value, str)]
                flagged.extend("%s:%d" % (path.name, node.lineno) for text in texts if re.search(r"--[a-z]", text))
    assert flagged == []


def test_a_raw_trace_given_as_an_event_is_named_as_such(files):
    code, text = run("ipt", "event", "--trace", files["trace"])
    assert code == 1 and "found a raw trace starting with a PSB" in text


def test_events_are_counted_past_the_ones_kept_and_the_call_tree_sees_them_all(files, tmp_path, monkeypatch):
    import dbgext.ipt.flow
    monkeypatch.setattr(dbgext.ipt.flow, "MAX_EVENTS", 3)
    trace, expected = T.trace_program(PROGRAM, 2000, seed=8, interrupt_every=30)
    (tmp_path / "irqs.bin").write_bytes(trace)
    document = run_json("ipt", "flow", "--trace", tmp_path / "irqs.bin", "--image", files["image"], "--view",
                        "calltree")
    buffer = only_buffer(document)
    assert len(buffer["events"]) == 3 and buffer["event_count"] > 3

    def handler_calls(node):
        own = node["calls"] if node["via"] == "interrupt" else 0
        return own + sum(handler_calls(child) for child in node["children"])

    assert handler_calls(buffer["calltree"]) == buffer["event_count"] - 1  # every event but the sync
    code, text = run("ipt", "flow", "--trace", tmp_path / "irqs.bin", "--image", files["image"])
    assert "(listed 3 of %d events)" % buffer["event_count"] in text
