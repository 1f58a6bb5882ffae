"""Stack streams from an RTL_TRACE_DATABASE in the target, and the whole command
over a real kernel dump file (PAGEDU64 written by the scenario) with ISF symbols."""

import os

import pytest

from dbgext.etwcache import replay
from dbgext.etwcache.streams import load_rtltrace_stream
from dbgext.rtltrace.fixtures import TraceDatabaseBuilder
from dbgext.stackhash import stack_trace_hash_frames

from etwcache_support import NT_BASE, kernel_scenario, random_stacks, run, run_json, scenario_with_cache


def database_scenario():
    scenario = kernel_scenario()
    builder = TraceDatabaseBuilder(scenario, layout="kernel-x64", buckets=37)
    hot = [NT_BASE + 0x1000, NT_BASE + 0x2000]
    cold = [NT_BASE + 0x3000]
    for _ in range(3):
        builder.add(hot)
    builder.add(cold)
    return scenario, builder.sync(), hot, cold


def test_rtltrace_traces_are_expanded_by_hit_count_round_robin():
    scenario, database, hot, cold = database_scenario()
    stream = load_rtltrace_stream(scenario.target(), database)
    assert sorted(stream.stacks) == sorted([tuple(hot), tuple(cold)])
    names = [stream.stacks[i] for i in stream.sequence]
    assert names.count(tuple(hot)) == 3 and names.count(tuple(cold)) == 1
    # Round-robin: both traces appear in the first pass.
    assert set(names[:2]) == {tuple(hot), tuple(cold)}
    assert "round-robin" in stream.source


def test_simulate_from_rtltrace_in_the_command():
    scenario, database, _hot, _cold = database_scenario()
    code, document = run_json(["etwstacks", "--simulate", "--rtltrace", "%x" % database,
                               "--bucket-count", "0n257", "--cache-size", "300000"], scenario.target())
    assert code == 0 and document["events"] == 4 and document["points"][0]["hits"] == 2


def test_what_the_database_could_not_give_is_in_the_simulations_problems():
    scenario, database, hot, cold = database_scenario()
    used = {stack_trace_hash_frames(frames) % 37 for frames in (hot, cold)}
    empty = min(set(range(37)) - used)
    bucket_array = database + 0xD8 + 0x38  # after the kernel header and the first segment header
    scenario.write_pointer(bucket_array + 8 * empty, 0xFFFFC0DEAD000000)  # an empty bucket's chain into nowhere
    code, document = run_json(["etwstacks", "--simulate", "--rtltrace", "%x" % database], scenario.target())
    assert code == 0 and document["schema_version"] == 1
    assert any(p["kind"] == "unreadable" and p["address"] == 0xFFFFC0DEAD000000 for p in document["problems"])


def test_rtltrace_at_an_unreadable_address_gives_problems_not_a_crash():
    scenario = kernel_scenario()
    code, text = run(["etwstacks", "--simulate", "--rtltrace", "ffffc0dead000000"], scenario.target())
    assert code in (0, 1) and "Traceback" not in text


@pytest.fixture(scope="module")
def dump_path(tmp_path_factory):
    stacks = random_stacks(800, distinct=100, seed=21)
    scenario, context, builder = scenario_with_cache(stacks, "B", 257, 400)
    directory = str(tmp_path_factory.mktemp("etwdump"))
    path = os.path.join(directory, "etw.dmp")
    scenario.write_kernel_dump(path)
    scenario.write_symbols(path + ".symbols")
    return path, scenario, builder, stacks


def test_kernel_dump_file_reads_the_same_cache_as_memory(dump_path):
    path, scenario, builder, stacks = dump_path
    code, document = run_json(["etwstacks", "--dump", path, "--validate"])
    assert code == 0
    [logger] = document["loggers"]
    cache = logger["cache"]
    assert cache["address"] == builder.address and cache["problems"] == []
    stream = replay.StackStream()
    for frames in stacks:
        stream.add(frames)
    result = replay.simulate(stream, 257, 400)
    from_dump = {}
    for entry in sorted(cache["entries"], key=lambda e: (e["bucket"], e["position"])):
        from_dump.setdefault(entry["bucket"], []).append(tuple(entry["frames"]))
    assert from_dump == replay.final_state(result, stream)


def test_kernel_dump_without_symbols_needs_a_profile_or_an_address(dump_path, tmp_path):
    path, scenario, builder, _stacks = dump_path
    empty = tmp_path / "nosyms"
    empty.mkdir()
    code, text = run(["etwstacks", "--dump", path, "--symbols", str(empty), "--cache", "%x" % builder.address])
    assert code == 0 and "variant B" in text
