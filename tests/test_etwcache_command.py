"""`dbgext etwstacks`: discovery (types, build profile, explicit addresses), the
--json contract, --buckets/--key/--entries/--validate, --simulate, bad input."""

import json

import pytest

from etl_writer import EtlWriter
from dbgext.etwcache import fixtures, layouts

from dbgext.errors import EXIT_PROBLEMS
from dbgext.render.text import hexaddr

from etwcache_support import kernel_scenario, random_stacks, run, run_json, scenario_with_cache

STACKS = random_stacks(600, distinct=80, seed=11)


@pytest.fixture(scope="module")
def cached():
    scenario, context, builder = scenario_with_cache(STACKS, "B", 257, 300)
    return scenario, context, builder


def test_json_contract_for_every_logger_with_a_cache(cached):
    scenario, context, builder = cached
    code, document = run_json(["etwstacks"], scenario.target())
    assert code == 0 and document["schema_version"] == 1
    assert document["layout_sources"] == {"logger_context": "isf nt", "silo_state": "isf nt"}
    [logger] = document["loggers"]
    assert (logger["logger_id"], logger["name"], logger["context"]) == (3, "Test Logger", context)
    cache = logger["cache"]
    for field in ("address", "variant", "bucket_count", "total_pieces", "free_pieces", "used_pieces",
                  "stacks", "occupancy", "entries", "problems"):
        assert field in cache
    assert cache["address"] == builder.address and cache["variant"] == "B"
    assert cache["total_pieces"] == 300 and cache["free_pieces"] == len(builder.free)
    assert cache["used_pieces"] + cache["free_pieces"] == 300
    assert sum(cache["occupancy"]) == 257 and cache["stacks"] == len(cache["entries"])
    entry = cache["entries"][0]
    assert set(entry) == {"key", "bucket", "position", "refcount", "hash", "frame_count", "pieces", "frames"}
    assert entry["pieces"][0] == entry["key"]
    assert entry["frames"] == list(builder.stack_frames(entry["key"]))
    assert cache["problems"] == []


def test_discovery_without_types_uses_the_build_profile():
    scenario, context, builder = scenario_with_cache(STACKS, "A", 257, 300)
    code, document = run_json(["etwstacks"], scenario.target(with_types=False))
    assert code == 0
    assert document["loggers"][0]["cache"]["address"] == builder.address
    assert document["loggers"][0]["cache"]["variant"] == "A"


def test_older_build_profile_places_stack_cache_at_0x348():
    scenario, context, builder = scenario_with_cache(STACKS, "A", 257, 300, build=17763, with_types=False)
    assert scenario.read(context + 0x348, 8) == builder.address.to_bytes(8, "little")
    code, document = run_json(["etwstacks"], scenario.target(with_types=False))
    assert document["loggers"][0]["cache"]["address"] == builder.address


def test_unknown_build_without_types_asks_for_addresses():
    scenario, context, builder = scenario_with_cache(STACKS, "B", 257, 300, build=30000, with_types=False)
    code, text = run(["etwstacks"], scenario.target(with_types=False))
    assert code == 1 and "give the logger context's or the stack cache's address" in text
    code, document = run_json(["etwstacks", "--cache", "%x" % builder.address], scenario.target(with_types=False))
    assert code == 0
    [logger] = document["loggers"]
    assert logger["logger_id"] is None and logger["name"] is None and logger["context"] is None
    assert logger["cache"]["address"] == builder.address


def test_logger_context_option_skips_discovery(cached):
    scenario, context, builder = cached
    code, document = run_json(["etwstacks", "--logger-context", "0x%x" % context], scenario.target())
    assert code == 0 and document["loggers"][0]["logger_id"] == 3


def test_loggers_without_a_cache_are_skipped():
    scenario = kernel_scenario()
    fixtures.add_logger_context(scenario, 2, "No Cache")
    code, text = run(["etwstacks"], scenario.target())
    assert code == 0 and "no logger has stack caching enabled" in text


def test_text_summary_shows_configuration_histograms_and_advice(cached):
    scenario, _context, _builder = cached
    code, text = run(["etwstacks"], scenario.target())
    assert code == 0
    assert 'logger 3 "Test Logger"' in text
    assert "variant B (high confidence" in text
    assert "BucketCount 257 (prime)" in text and "300 total" in text
    assert "occupancy" in text and "frames per stack" in text and "advice" in text


def test_buckets_lists_the_first_limit_non_empty_buckets_each_in_mru_order(cached):
    scenario, _context, builder = cached
    non_empty = [index for index in range(257) if builder.bucket_entries(index)]
    # Enough buckets to reach the first one holding more than one stack.
    limit = 1 + next(n for n, index in enumerate(non_empty) if len(builder.bucket_entries(index)) > 1)
    code, text = run(["etwstacks", "--buckets", "--limit", "0n%d" % limit], scenario.target())
    assert code == 0 and "position 0 = most recently used" in text and "--limit 0n%d" % limit in text
    table = text.split("buckets (position 0 = most recently used):")[1].split("(more non-empty")[0]
    rows = [line.split()[:3] for line in table.strip().splitlines()[2:]]
    # The builder's bucket lists run from the list head's Flink: most recently used first.
    assert rows == [[str(index), str(position), hexaddr(key)] for index in non_empty[:limit]
                    for position, key in enumerate(builder.bucket_entries(index))]


def test_key_lookup_symbolizes_the_stack(cached):
    scenario, _context, builder = cached
    key = next(k for i in range(257) for k in builder.bucket_entries(i))
    code, text = run(["etwstacks", "--key", "%x" % key], scenario.target())
    assert code == 0 and ("StackKey %s" % hexaddr(key)) in text and "nt!" in text
    code, document = run_json(["etwstacks", "--key", "0x%x" % key], scenario.target())
    assert document["schema_version"] == 1 and document["found"] and document["entry"]["key"] == key
    assert document["entry"]["symbols"][0].startswith("nt")


def test_key_of_a_free_piece_says_it_was_evicted(cached):
    scenario, _context, builder = cached
    code, text = run(["etwstacks", "--key", "%x" % builder.free[-1]], scenario.target())
    assert code == 1 and "free list" in text


def test_entries_and_validate(cached):
    scenario, _context, _builder = cached
    code, text = run(["etwstacks", "--entries", "--validate"], scenario.target())
    assert code == 0 and "problems: none" in text and text.count("StackKey") > 10


def test_damaged_cache_reports_problems_not_tracebacks(cached):
    scenario, context, builder = scenario_with_cache(STACKS, "B", 257, 300)
    key = next(k for i in range(257) for k in builder.bucket_entries(i))
    scenario.pack(key, "<Q", key)          # entry loops onto itself
    scenario.pack(builder.address + 0x10, "<Q", 7)  # depth 7
    code, document = run_json(["etwstacks", "--validate"], scenario.target())
    assert code == EXIT_PROBLEMS
    found = {p["kind"] for p in document["loggers"][0]["cache"]["problems"]}
    assert {"cycle", "free_depth"} <= found


def test_unreadable_cache_pointer_is_a_clear_problem():
    scenario = kernel_scenario()
    fixtures.add_logger_context(scenario, 4, "Broken", stack_cache=0xFFFFC0DEAD000000)
    code, text = run(["etwstacks"], scenario.target())
    assert code == 0 and "cannot be read" in text and "ffffc0de`ad000000" in text


def test_bad_addresses_and_limits_are_refused(cached):
    scenario, _context, _builder = cached
    assert run(["etwstacks", "--cache", "zz"], scenario.target())[0] == 1
    assert run(["etwstacks", "--buckets", "--limit", "0"], scenario.target())[0] == 1


def test_simulate_from_a_json_stack_file(tmp_path):
    path = tmp_path / "stacks.json"
    path.write_text(json.dumps({"stacks": [{"frames": ["fffff800`00001000", 2], "count": 3},
                                           [0xFFFFF80000002000]]}))
    code, document = run_json(["etwstacks", "--simulate", "--stacks", str(path), "--bucket-count", "7,0n257",
                               "--cache-size", "0x1000", "--no-clamp"])
    assert code == 0
    assert document["events"] == 7 and document["distinct_stacks"] == 3  # kernel/user split
    assert [p["bucket_count"] for p in document["points"]] == [7, 257]
    point = document["points"][0]
    assert point["hits"] == 4 and point["misses"] == 3 and point["cache_size"] == 0x1000 // 0x128 * 0x128
    assert document["recommendation"]["bucket_count"] in (7, 257)


def test_simulate_from_a_text_stack_file_clamps_by_default(tmp_path):
    path = tmp_path / "stacks.txt"
    path.write_text("# hot stack\n5: fffff80000001000 fffff80000001010\nfffff80000003000,fffff80000003010\n\n")
    code, text = run(["etwstacks", "--simulate", "--stacks", str(path), "--bucket-count", "8"])
    assert code == 0 and "clamped" in text and "recommendation" in text and "6 stack lookups" in text


def test_simulate_from_an_etl_file(tmp_path):
    writer = EtlWriter(buffer_size=0x1000)
    kernel = [0xFFFFF80000001000, 0xFFFFF80000001100]
    for _ in range(3):
        writer.add_stack_walk(kernel + [0x7FF700001000])
    writer.add_stack_key(0xFFFFC08000001000)
    writer.add_stack_key(0xFFFFC08000001000)
    writer.add_stack_definition(0xFFFFC08000001000, kernel, rundown=True)
    writer.add_stack_key(0xFFFFC08000009999)  # never defined
    path = str(tmp_path / "trace.etl")
    writer.write(path)
    code, document = run_json(["etwstacks", "--simulate", "--etl", path, "--bucket-count", "0n257",
                               "--cache-size", "300000"])
    assert document["points"][0]["bucket_count"] == 257 and document["points"][0]["cache_size"] >= 0x2ff000
    assert code == 0
    assert document["events"] == 8 and document["distinct_stacks"] == 2
    assert document["points"][0]["hits"] == 6
    assert any("1 key references had no definition" in note for note in document["notes"])


def test_simulate_needs_exactly_one_source_and_sane_numbers(tmp_path):
    assert run(["etwstacks", "--simulate"])[0] == 1
    path = tmp_path / "s.txt"
    path.write_text("1 2 3\n")
    assert run(["etwstacks", "--simulate", "--stacks", str(path), "--bucket-count", "0"])[0] == 1
    assert run(["etwstacks", "--simulate", "--stacks", str(path), "--cache-size", "12"])[0] == 1
    bad = tmp_path / "bad.json"
    bad.write_text('[["nothex"]]')
    code, text = run(["etwstacks", "--simulate", "--stacks", str(bad)])
    assert code == 1 and "not a frame address" in text
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    assert run(["etwstacks", "--simulate", "--stacks", str(empty)])[0] == 1
    assert run(["etwstacks", "--simulate", "--stacks", str(tmp_path / "missing")])[0] == 1
    assert run(["etwstacks", "--simulate", "--etl", str(path)])[0] == 1  # not an .etl


def test_sample_logger_coexists_with_other_loggers_and_types():
    scenario = kernel_scenario()
    scenario.add_type("nt", "_WMI_LOGGER_CONTEXT", 0x550, {"IptData": 0x3F8})
    fixtures.add_logger_context(scenario, fixtures.SAMPLE_LOGGER_ID, "Someone Else")
    info = fixtures.add_sample_logger(scenario)
    assert info["logger_id"] != fixtures.SAMPLE_LOGGER_ID and info["stacks"] > 0
    fields = scenario.module_symbols["nt"].types["_WMI_LOGGER_CONTEXT"]["fields"]
    assert {"IptData", "StackCache", "LoggerName"} <= set(fields)
    code, document = run_json(["etwstacks", "--validate"], scenario.target())
    [logger] = document["loggers"]
    assert logger["cache"]["address"] == info["cache"] and logger["cache"]["problems"] == []
    modules = scenario.modules
    for entry in logger["cache"]["entries"]:
        assert all(any(m.contains(frame) for m in modules) for frame in entry["frames"])
    assert layouts.is_prime(logger["cache"]["bucket_count"])


def test_inside_windbg_buckets_link_to_the_frames(cached):
    from pykd_support import run_windbg_script
    scenario, _context, builder = cached
    text, _fake = run_windbg_script("etwstacks", ["--buckets", "--limit", "3"], scenario)
    assert "Traceback" not in text and 'logger 3 "Test Logger"' in text
    key = next(k for i in range(257) for k in builder.bucket_entries(i))
    assert '<link cmd="dps %s L0x' % hexaddr(key + 0x28) in text
    text, _fake = run_windbg_script("etwstacks", ["--cache", "0xffffc0dead000000"], scenario)
    assert "no ETW stack cache header can be read at ffffc0de`ad000000" in text and "Traceback" not in text


def test_an_unreadable_logger_name_is_a_problem_of_that_logger():
    scenario, context, builder = scenario_with_cache(STACKS, "B", 257, 300)
    scenario.pack(context + 0x98, "<HHxxxxQ", 8, 10, 0xFFFFC0DEAD000000)
    code, document = run_json(["etwstacks"], scenario.target())
    [logger] = document["loggers"]
    assert code == 0 and logger["name"] is None
    assert any(p["kind"] == "logger_name" for p in logger["cache"]["problems"])


def test_x86_targets_are_refused_with_a_message():
    from dbgext.sample.scenario import Scenario
    scenario = Scenario("x86", "user")
    code, text = run(["etwstacks", "--cache", "1000"], scenario.target())
    assert code == 1 and "x64" in text


def test_memory_that_is_no_cache_is_refused_in_one_line_and_force_walks_it(cached):
    scenario, context, builder = cached
    code, text = run(["etwstacks", "--cache", "%x" % context], scenario.target())
    assert code == 1 and text.count("\n") == 1
    assert text.startswith("error: no ETW stack cache at %s: found memory that fits no cache header variant"
                           % hexaddr(context))
    code, document = run_json(["etwstacks", "--cache", "%x" % context, "--force"], scenario.target())
    assert code == 0 and "variant" in {p["kind"] for p in document["problems"]}


def test_addresses_take_windbgs_grammar(cached):
    scenario, context, builder = cached
    nt = scenario.module("nt")
    scenario.add_symbol("nt", "TestCacheHolder", 0x20000)
    target = scenario.target()
    offset = builder.address - nt.base
    by_symbol = run_json(["etwstacks", "--cache", "nt+%x" % offset], target)[1]
    by_number = run_json(["etwstacks", "--cache", hexaddr(builder.address)], target)[1]
    assert by_symbol["loggers"][0]["cache"]["address"] == by_number["loggers"][0]["cache"]["address"] == builder.address
    key = next(k for i in range(257) for k in builder.bucket_entries(i))
    code, document = run_json(["etwstacks", "--key", "nt!TestCacheHolder-%x+%x" % (0x20000 + nt.base - key, 0)], target)
    assert code == 0 and document["entry"]["key"] == key


def test_text_says_where_the_logger_layouts_came_from():
    scenario, _context, _builder = scenario_with_cache(STACKS, "B", 257, 300)
    code, text = run(["etwstacks"], scenario.target(with_types=False))
    assert code == 0 and "_WMI_LOGGER_CONTEXT from built-in (build 19041)" in text
    assert "built-in variant B" in text
