"""Hostile input built on purpose (issue 27; the cases are in ``tests/hostile.py``):
sizes and counts near 2**32 that the file does not hold, structures that point at
themselves or nest without end, compressed data that decodes to far more than it
is, and links planted where a command writes.  Each command line runs in a fresh
interpreter under a 4 GiB address-space limit and must end with exit code 0, 1 or
4, within 1 s + 2 s per MB of input, growing its peak memory by less than 300 MB
beyond the input's size; a planted link or an existing file is refused in one
line and left as it was."""

import pytest

import hostile


@pytest.mark.parametrize("name", hostile.CI_CASES)
def test_hostile_input_ends_cleanly_within_the_time_and_memory_limits(name, tmp_path):
    case = hostile.case_named(name)
    result = hostile.run_case(case, str(tmp_path))
    assert result["failures"] == [], result


@pytest.mark.parametrize("name", [case.name for case in hostile.LINKS])
def test_a_planted_link_or_an_existing_file_where_a_command_writes_is_refused(name, tmp_path):
    case = hostile.case_named(name)
    command_lines, _ = case.build(str(tmp_path))
    for argv in command_lines:
        report = hostile.run_command(argv)
        assert report["code"] == 1, report
        assert len(report["stderr"].splitlines()) == 1, report["stderr"]
        assert "symbolic link" in report["stderr"] or "already exists" in report["stderr"], report["stderr"]
    assert case.check(str(tmp_path)) is None


def test_every_family_has_cases_that_ci_runs():
    assert set(hostile.case_named(name).family for name in hostile.CI_CASES) == set(hostile.FAMILIES)
