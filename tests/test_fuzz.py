"""Hostile input, as property tests: whatever mutation hits a dump, trace, PE, .etl
or symbol file, every command that reads it ends with a clean exit code (0, 1, 2
or 4) within its time budget — never an internal error, never a traceback.

The example count is bounded for CI (``DBGEXT_FUZZ_EXAMPLES``, default 25 per
kind); ``scripts/fuzz.py`` runs the long campaigns over the same cases."""

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzzing
from requirements import need_tool

EXAMPLES = int(os.environ.get("DBGEXT_FUZZ_EXAMPLES", "25"))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    """``seed_of(case)``: (seed bytes, run directory) of ``case``, built when a test
    first asks for it.  A case whose seed needs a tool that is missing skips its own
    tests (which fails the run), never another case's."""
    built = {}

    def seed_of(case):
        need_tool(*case.tools)
        if case.name not in built:
            built[case.name] = (fuzzing.prepare(case, str(tmp_path_factory.mktemp(case.name))),
                                str(tmp_path_factory.mktemp(case.name + "-run")))
        return built[case.name]
    return seed_of


@pytest.mark.parametrize("case", fuzzing.CASES, ids=lambda case: case.name)
def test_the_unmutated_seed_is_read_cleanly(case, seeds):
    seed, directory = seeds(case)
    assert fuzzing.run_input(case, seed, directory) == []


@pytest.mark.parametrize("case", fuzzing.CASES, ids=lambda case: case.name)
def test_mutated_input_never_ends_in_an_internal_error_or_over_budget(case, seeds):
    seed, directory = seeds(case)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    # The input is drawn from a random number, not built from Hypothesis' own
    # values: those favour 0 and small numbers, which would mutate only headers.
    # A failure names the number; scripts/fuzz.py rebuilds the same input from it.
    @given(number=st.integers(0, 2 ** 32 - 1))
    def check(number):
        data = fuzzing.mutated_input(case, seed, random.Random(number))
        assert fuzzing.run_input(case, data, directory) == []

    check()


def test_wrong_typed_symbol_file_fields_are_reported_not_crashed_on(seeds):
    """The fuzz campaign's biggest finding: ISF fields of the wrong JSON type."""
    import json
    case = fuzzing.case_named("isf")
    seed, directory = seeds(case)
    for path, value in ((("metadata",), 5), (("symbols",), []), (("metadata", "dbgext"), "x")):
        document = json.loads(seed.decode("utf-8"))
        node = document
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
        assert fuzzing.run_input(case, json.dumps(document).encode("utf-8"), directory) == [], path
