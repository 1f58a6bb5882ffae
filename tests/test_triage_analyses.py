"""The analysis adapters: each installed analysis contributes a compact summary
(and its problems, with addresses) to the record of the bundled sample scenario,
which carries one of everything; scanning analyses skip targets that cannot list
their memory instead of probing the whole address space."""

import json

import pytest

from dbgext.sample import build_sample_scenario
from dbgext.target.base import Target
from dbgext.target.image import ImageBackend
from dbgext.triage.record import build_record, load_plugins, select_analyses


@pytest.fixture(scope="module")
def sample():
    load_plugins()
    scenario, manifest = build_sample_scenario()
    return scenario, manifest


def record_of(scenario, names):
    return build_record(scenario.target(), analyses=select_analyses(names))


def test_trace_databases_are_counted_with_their_top_traces(sample):
    scenario, manifest = sample
    summary = record_of(scenario, ["rtltrace"]).analyses["rtltrace"]
    assert summary["databases"] == 1 and summary["suspicious"] == 0
    assert summary["per_database"][0]["address"] == manifest["contents"]["rtltrace"]
    assert summary["traces"] > 0 and summary["hits"] >= summary["traces"]
    counts = [trace["count"] for trace in summary["top_traces"]]
    assert counts == sorted(counts, reverse=True) and 0 < len(counts) <= 5
    assert all(len(trace["frames"]) <= 3 for trace in summary["top_traces"])


def test_a_damaged_trace_database_makes_the_dump_suspicious(sample):
    from dbgext.render.text import hexaddr
    from dbgext.rtltrace import find
    scenario, manifest = sample
    address = manifest["contents"]["rtltrace"]
    layout = find(scenario.target(), walk=True).databases[0].layout
    damaged = build_sample_scenario()[0]
    damaged.write_pointer(address + layout.database.offsets["NoOfTraces"], 0x7777)
    record = record_of(damaged, ["rtltrace"])
    assert record.analyses["rtltrace"]["suspicious"] == 1
    problems = list(record.problems["rtltrace"])
    assert problems and all(problem.kind and problem.kind != "rtltrace" for problem in problems)
    assert any(hexaddr(address) in problem.message for problem in problems)
    assert record.status == "ok"


def test_etw_stack_caches_are_summarised(sample):
    scenario, manifest = sample
    summary = record_of(scenario, ["etwstacks"]).analyses["etwstacks"]
    assert summary["caches"] >= 1 and summary["stacks"] > 0
    cache = summary["per_cache"][0]
    assert set(cache) >= {"logger", "cache", "stacks", "free_pieces", "total_pieces", "problems"}


def test_ipt_events_are_found(sample):
    scenario, manifest = sample
    summary = record_of(scenario, ["ipt"]).analyses["ipt"]
    assert summary["events"] >= 1
    assert summary["top_events"][0]["address"] == manifest["contents"]["ipt"]["event_address"]


def test_the_faulting_threads_stack_usage_names_its_biggest_frames(sample):
    scenario, manifest = sample
    summary = record_of(scenario, ["stackuse"]).analyses["stackuse"]
    assert summary["used"] > 0 and summary["limit"] >= summary["used"]
    biggest = summary["biggest_frames"]
    assert biggest and all("+0x" not in frame["function"] for frame in biggest)
    assert [frame["bytes"] for frame in biggest] == sorted((frame["bytes"] for frame in biggest), reverse=True)


def test_a_record_with_every_analysis_stays_compact(sample):
    scenario, manifest = sample
    record = build_record(scenario.target())
    assert record.status == "ok", record.reason
    assert len(json.dumps(record.as_dict(), default=str)) < 16 * 1024


class _LiveLikeBackend(ImageBackend):
    """Memory that cannot be enumerated, like a live debugging session."""

    def mapped_ranges(self):
        return None


def test_scanning_analyses_skip_a_target_that_cannot_list_its_memory(sample):
    scenario, manifest = sample
    names = ["rtltrace", "ipt"]
    image = scenario.target().backend
    live = Target(_LiveLikeBackend(image._pages, image.arch, image.modules(), image.symbols(), image.info()))
    record = build_record(live, analyses=select_analyses(names))
    for name in names:
        assert "cannot list its memory" in record.analyses[name]["skipped"]
    assert record.status == "ok"
