"""Walking well-formed databases: layout choice, the JSON contract, the views."""

import pytest

from dbgext.errors import EXIT_PROBLEMS
from dbgext.render.text import hexaddr
from dbgext.rtltrace import find, name_frames, walk
from dbgext.rtltrace.render import shown_traces, top_traces
from dbgext.rtltrace.fixtures import TraceDatabaseBuilder
from dbgext.rtltrace.hashing import pointer_sum_hash

from rtltrace_support import add_database_type, database, problem_kinds, run, run_json, scenario_for

LAYOUTS = ["user-x64", "kernel-x64", "user-x86"]


@pytest.fixture(scope="module", params=LAYOUTS)
def built(request):
    scenario, builder = database(request.param)
    return request.param, scenario, builder, scenario.target()


def test_a_windows_built_database_has_no_problems(built):
    layout, scenario, builder, target = built
    db = walk(target, builder.address)
    assert db.layout.name == layout
    assert "recognised from memory" in db.layout.reason
    assert db.problems == []
    assert len(db.blocks) == builder.traces == 300
    assert db.external_finds == 0
    assert db.hash_function["kind"] == "default"


def test_json_output_follows_the_contract(built):
    layout, scenario, builder, target = built
    document = run_json(["0x%x" % builder.address], target=target)
    assert document["address"] == builder.address
    assert document["arch"] == scenario.arch
    assert document["layout"] == layout
    assert document["magic_ok"] is True
    assert document["flags"] & (2 if layout == "kernel-x64" else 1)
    assert document["buckets"] == builder.buckets
    assert (document["traces"], document["hits"]) == (300, 600)
    assert document["current_size"] == builder.current_size
    assert document["maximum_size"] == 0
    assert document["hash_function"]["address"] == builder.hash_function_address
    assert document["hash_function"]["kind"] == "default"
    assert [s["address"] for s in document["segments"]] == builder.segments
    assert set(document["segments"][0]) >= {"address", "start", "end", "free", "total_size"}
    assert document["blocks_found"] == 300
    entry = document["trace_list"][0]
    assert set(entry) == {"address", "bucket", "count", "depth", "frames", "symbols"}
    assert entry["frames"] == builder.frames_of(entry["address"])
    assert len(entry["symbols"]) == len(entry["frames"]) and all(entry["symbols"])   # what the text shows
    assert entry["bucket"] == builder.bucket_of(entry["frames"])
    assert entry["count"] == builder.block_count(entry["frames"])
    assert document["problems"] == []
    assert sum(t["count"] - 1 for t in document["trace_list"]) == document["hits"]


def test_overflow_into_the_first_segment_magic_is_a_note_not_a_problem():
    scenario, builder = database("user-x64", distinct=3000, adds=3000)
    assert builder.first_segment_magic != 0xABCDBBBB
    document = run_json(["0x%x" % builder.address], target=scenario.target())
    assert document["problems"] == []
    assert document["hash_counter_overflow"] == builder.first_segment_magic - 0xABCDBBBB
    assert any("HashCounter overflow" in note for note in document["notes"])


@pytest.mark.parametrize("layout,buckets", [("user-x64", 9000), ("kernel-x64", 600)])
def test_bucket_array_past_the_first_segment_end_is_a_note(layout, buckets):
    scenario, builder = database(layout, distinct=200, adds=200, buckets=buckets)
    document = run_json(["0x%x" % builder.address], target=scenario.target())
    assert document["problems"] == []
    assert any("runs past the first segment" in note for note in document["notes"])


def test_layout_comes_from_type_information_when_the_symbols_have_it():
    scenario, builder = database("user-x64", distinct=20, adds=20)
    add_database_type(scenario)
    document = run_json(["0x%x" % builder.address], target=scenario.target())
    assert document["layout"] == "user-x64"
    assert document["layout_reason"].startswith("type information for ntdll!_RTL_TRACE_DATABASE")
    assert document["layout_sources"]["segment"] == "built-in"  # no segment type in the symbols
    assert document["problems"] == []


def test_type_information_lacking_fields_the_walk_reads_is_not_taken():
    scenario, builder = database("user-x64", distinct=20, adds=20)
    add_database_type(scenario, {"Magic": 0, "NoOfBuckets": 0x58, "Buckets": 0x60})
    document = run_json(["0x%x" % builder.address], target=scenario.target())
    assert document["layout_reason"].startswith("recognised from memory")
    assert document["layout_sources"]["database"] == "built-in"


def test_layout_option_overrides_and_a_wrong_one_shows_problems():
    scenario, builder = database("kernel-x64", distinct=20, adds=20)
    document = run_json(["0x%x" % builder.address, "--layout", "user-x64"], target=scenario.target())
    assert document["layout"] == "user-x64"
    assert document["layout_reason"] == "chosen by name"
    assert document["layout_sources"]["database"] == "built-in"
    assert document["problems"]


def test_traces_view_sorts_and_limits(built):
    layout, scenario, builder, target = built
    code, text = run(["0x%x" % builder.address, "--traces", "--sort", "depth", "--limit", "5"], target=target)
    assert code == 0
    assert "Traces (5, by depth)" in text
    document = run_json(["0x%x" % builder.address, "--traces", "--sort", "address", "--limit", "7"],
                        target=target)
    addresses = [t["address"] for t in document["trace_list"]]
    assert addresses == sorted(addresses) and len(addresses) == 7
    counts = [t["count"] for t in run_json(["0x%x" % builder.address, "--traces"], target=target)["trace_list"]]
    assert counts == sorted(counts, reverse=True)


def test_trace_view_shows_one_block_with_symbolized_frames(built):
    layout, scenario, builder, target = built
    block = builder.bucket_chain(next(b for b in range(builder.buckets) if builder.bucket_chain(b)))[0]
    code, text = run(["0x%x" % builder.address, "--trace", "0x%x" % block], target=target)
    assert code == 0
    assert "RTL_TRACE_BLOCK at %s" % target.format_address(block) in text
    for frame in builder.frames_of(block):
        assert target.symbolize(frame) in text


def test_bucket_view_lists_the_chain_newest_first():
    scenario, builder = database("kernel-x64")
    bucket = max(range(builder.buckets), key=lambda b: len(builder.bucket_chain(b)))
    document = run_json(["0x%x" % builder.address, "--bucket", "0n%d" % bucket], target=scenario.target())
    assert [t["address"] for t in document["trace_list"]] == builder.bucket_chain(bucket)
    assert document["selection"] == "bucket"


def test_module_view_keeps_traces_with_a_frame_in_the_module():
    scenario, builder = database("user-x64")
    target = scenario.target()
    document = run_json(["0x%x" % builder.address, "--module", "netio"], target=target)
    netio = target.module_named("netio")
    assert document["trace_list"]
    assert all(any(netio.contains(f) for f in t["frames"]) for t in document["trace_list"])
    assert len(document["trace_list"]) < 300


def test_summary_shows_header_segments_buckets_totals_and_top_traces(built):
    layout, scenario, builder, target = built
    code, text = run(["0x%x" % builder.address, "--limit", "3"], target=target)
    assert code == 0
    for expected in ("NoOfBuckets", "Segments (newest first)", "chain length", "HashCounter",
                     "Totals: 300 traces", "Top 3 traces by hit count", "Problems: none"):
        assert expected in text
    assert "%s layout" % layout in text


def test_validate_lists_no_problems_for_a_good_database(built):
    layout, scenario, builder, target = built
    code, text = run(["0x%x" % builder.address, "--validate"], target=target)
    assert code == 0 and "Problems: none" in text


def test_a_symbol_holding_a_pointer_to_the_database_is_followed():
    scenario, builder = database("kernel-x64", distinct=10, adds=10)
    global_address = scenario.add_symbol("mydrv", "g_Db", 0x1F000)
    scenario.write_pointer(global_address, builder.address)
    document = run_json(["mydrv!g_Db"], target=scenario.target())
    assert document["address"] == builder.address
    assert any("holds a pointer" in note for note in document["notes"])


def test_dml_links_go_from_traces_to_frames_and_from_buckets_to_chains(monkeypatch):
    scenario, builder = database("user-x64", distinct=10, adds=10)
    monkeypatch.setattr("sys.argv", [r"C:\dbgext\commands\rtltrace.py"])
    code, text = run(["%x" % builder.address, "--traces"], target=scenario.target(), windbg=True)
    assert code == 0
    block = builder.bucket_chain(next(b for b in range(builder.buckets) if builder.bucket_chain(b)))[0]
    depth = len(builder.frames_of(block))
    assert '<link cmd="dps 0x%x L0x%x">' % (block + 0x38, depth) in text
    assert '<link cmd="!py C:\\dbgext\\commands\\rtltrace.py 0x%x --bucket 0x%x --layout user-x64">' % (
        builder.address, builder.bucket_of(builder.frames_of(block))) in text


def test_a_custom_hash_function_is_recognised_and_placement_checks_skipped():
    scenario = scenario_for("user-x64")
    builder = TraceDatabaseBuilder(scenario, "user-x64", buckets=101,
                                   hash_function=lambda frames: len(frames) * 7919 + frames[-1] // 3,
                                   hash_function_address=0x7FF6A0001230)
    for i in range(100):
        builder.add([0x7FFA10001000 + 0x44 * i, 0x7FF6A0002000 + 8 * (i % 7)])
    builder.sync()
    document = run_json(["0x%x" % builder.address], target=scenario.target())
    assert document["hash_function"]["kind"] == "custom"
    assert "wrong_bucket" not in problem_kinds(document)
    assert any("custom hash" in note for note in document["notes"])


def test_the_documented_pointer_sum_hash_is_recognised():
    scenario = scenario_for("user-x86")
    builder = TraceDatabaseBuilder(scenario, "user-x86", buckets=64, hash_function=pointer_sum_hash,
                                   hash_function_address=0x00401000)
    for i in range(60):
        builder.add([0x77A01000 + 4 * i, 0x00402000 + 12 * i])
    builder.sync()
    document = run_json(["0x%x" % builder.address], target=scenario.target())
    assert document["hash_function"]["kind"] == "pointer-sum"
    assert document["problems"] == []


def two_databases(adds=30):
    """(scenario, first, second): a debug-heap-sized database and a small one after it."""
    scenario, first = database("user-x64", distinct=30, adds=adds)
    second = TraceDatabaseBuilder(scenario, "user-x64", buckets=97)
    second.add([0x7FFA10001000, 0x7FF6A0001000])
    second.sync()
    return scenario, first, second


def test_find_lists_every_database_in_memory():
    scenario, first, second = two_databases()
    target = scenario.target()
    found = run_json(["--find"], target=target)["candidates"]
    assert [c["address"] for c in found] == [first.address, second.address]
    assert found[0]["buckets"] == 6263 and found[0]["traces"] == 30
    assert found[0]["segments"] == len(first.segments)
    only = run_json(["--find", "--range", "0x%x" % second.address, "0x%x" % (second.address + 0x1000)],
                    target=target)["candidates"]
    assert [c["address"] for c in only] == [second.address]
    code, text = run(["--find"], target=target)
    assert code == 0 and "Trace databases found: 2" in text


def test_the_walk_reads_memory_in_bulk_not_per_field():
    scenario, builder = database("user-x64", distinct=3000, adds=3000)
    target = scenario.target()
    walk(target, builder.address)
    stats = target.stats
    assert stats.backend_calls <= stats.backend_pages
    assert stats.backend_calls < 60 < stats.backend_pages  # a few calls per 16-page segment
    assert stats.reads < 100  # the blocks are decoded from segment buffers


def test_a_block_not_reached_through_the_buckets_can_still_be_shown():
    scenario, builder = database("user-x86", distinct=40, adds=40)
    bucket = next(b for b in range(builder.buckets) if len(builder.bucket_chain(b)) == 1)
    block = builder.bucket_chain(bucket)[0]
    scenario.write_pointer(builder.buckets_address + 4 * bucket, 0)
    target = scenario.target()
    code, text = run(["0x%x" % builder.address, "--trace", "0x%x" % block], target=target)
    assert code == 0
    assert "not reached through the buckets" in text
    assert target.symbolize(builder.frames_of(block)[0]) in text


def test_the_address_takes_windbgs_grammar_symbols_offsets_and_registers():
    scenario, builder = database("user-x64", distinct=20, adds=20)
    app = scenario.module("app")
    holder = app.base + 0x7000
    scenario.add_symbol("app", "g_TraceDatabase", holder - app.base)
    scenario.write_pointer(holder, builder.address)
    scenario.registers = {"rip": app.base + 0x1000, "rcx": builder.address - 0x10}
    target = scenario.target()
    expected = run_json(["0x%x" % builder.address], target=target)
    for expression in ("app!g_TraceDatabase", "app+7000", "app!g_TraceDatabase-8+8", "@rcx+10",
                       hexaddr(builder.address)):
        document = run_json([expression], target=target)
        assert (document["address"], document["blocks_found"]) == (expected["address"], 20), expression
    assert "holds a pointer to the database" in " ".join(run_json(["app!g_TraceDatabase"], target=target)["notes"])


def test_bucket_and_limit_counts_are_hex_unless_0n():
    scenario, builder = database("kernel-x64")
    bucket = max(range(builder.buckets), key=lambda b: len(builder.bucket_chain(b)))
    target = scenario.target()
    by_hex = run_json(["0x%x" % builder.address, "--bucket", "%x" % bucket], target=target)
    by_decimal = run_json(["0x%x" % builder.address, "--bucket", "0n%d" % bucket], target=target)
    assert by_hex["trace_list"] == by_decimal["trace_list"] and by_hex["selection"] == "bucket"
    assert len(run_json(["0x%x" % builder.address, "--limit", "10"], target=target)["trace_list"]) == 16


def test_validate_exits_4_when_it_finds_problems_and_0_when_not():
    scenario, builder = database("user-x64", distinct=20, adds=20)
    assert run(["0x%x" % builder.address, "--validate"], target=scenario.target())[0] == 0
    scenario.pack(builder.address + 0x70, "<Q", 21)  # NoOfTraces off by one
    code, text = run(["0x%x" % builder.address, "--validate"], target=scenario.target())
    assert code == EXIT_PROBLEMS and "count_mismatch" in text


def test_a_script_walks_and_finds_through_the_public_api_alone():
    scenario, first, second = two_databases(adds=60)
    target = scenario.target()
    db = walk(target, first.address)
    document = db.as_dict()
    assert list(document)[0] == "schema_version" and document["schema_version"] == 1
    assert db.statistics["blocks_found"] == 30 and len(db.selection.blocks) == 30
    search = find(target, walk=True)  # every database in memory, each walked
    assert [database.address for database in search.databases] == [first.address, second.address]
    assert search.as_dict()["schema_version"] == 1 and not search.problems


def test_the_display_choices_order_and_cut_the_traces_outside_the_walk():
    scenario, first, _ = two_databases(adds=60)
    db = walk(scenario.target(), first.address)
    deepest = shown_traces(db, "depth", 3)
    assert [block.size for block in deepest] == sorted((b.size for b in db.blocks), reverse=True)[:3]
    assert top_traces(db, 1)[0].count == max(block.count for block in db.blocks)


def test_the_json_of_the_traces_shown_carries_the_names_of_their_frames():
    scenario, first, _ = two_databases(adds=60)
    target = scenario.target()
    db = walk(target, first.address)
    shown = shown_traces(db, "count", 2)
    document = name_frames(target, db, shown).as_dict(traces=shown)
    assert [trace["address"] for trace in document["trace_list"]] == [block.address for block in shown]
    for trace in document["trace_list"]:
        assert trace["symbols"] == [target.symbolize(frame) for frame in trace["frames"]] and trace["symbols"]
