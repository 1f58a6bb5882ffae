"""The one shape every capability shares: problems, the address grammar with
registers, layouts from one lookup, and the command surface's streams and exit
codes."""

import json
import subprocess
import sys

import pytest

from dbgext.address import TargetResolver, evaluate
from dbgext.errors import EXIT_PROBLEMS, BadInput, LayoutNotFound, SymbolNotFound, WrongSignature
from dbgext.layouts import BuiltinLayouts, lookup_layout
from dbgext.problems import Problem, ProblemLog
from dbgext.sample.scenario import Scenario


# -- problems ------------------------------------------------------------------

def test_a_problem_is_kind_address_or_offset_message_and_severity():
    problem = Problem("bad_magic", 0xFFFFC08000001000, "Magic is 0x0", "warning")
    assert problem.as_dict() == {"kind": "bad_magic", "severity": "warning", "address": 0xFFFFC08000001000,
                                 "offset": None, "message": "Magic is 0x0"}
    assert str(problem) == "warning bad_magic at ffffc080`00001000: Magic is 0x0"
    assert str(Problem("bad_packet", offset=0x40, message="reserved bits")) == \
        "error bad_packet at offset 0x40: reserved bits"


def test_an_unknown_severity_is_refused():
    with pytest.raises(ValueError):
        Problem("x", None, "y", "fatal")


def test_the_problem_log_caps_each_kind_and_says_how_many_it_left_out():
    log = ProblemLog()
    for index in range(ProblemLog.MAX_PER_KIND + 5):
        log.add("loop", index, "cycle")
    log.add("other", 1, "once", "note")
    log.finish().finish()
    assert log.count("loop") == ProblemLog.MAX_PER_KIND + 5
    assert sum(1 for p in log if p.kind == "loop") == ProblemLog.MAX_PER_KIND
    truncated = [p for p in log if p.kind == "problems_truncated"]
    assert len(truncated) == 1 and "5 more loop problems" in truncated[0].message
    assert log.errors == ProblemLog.MAX_PER_KIND
    assert log.as_list()[-2]["kind"] == "other"


def test_the_problem_log_is_a_sequence_of_listed_problems_not_a_list_with_another_count():
    log = ProblemLog()
    log.add("loop", 1, "cycle")
    assert not isinstance(log, list) and not hasattr(log, "insert")
    assert len(log) == 1 and log[0].kind == "loop" and log == [Problem("loop", 1, "cycle")] and log
    assert not ProblemLog() and ProblemLog() == []


# -- addresses -----------------------------------------------------------------

def _kernel_target():
    scenario = Scenario("x64", "kernel")
    scenario.add_module("nt", 0xFFFFF80000000000, 0x200000, image="ntoskrnl.exe")
    scenario.add_symbol("nt", "KeBugCheckEx", 0x1000)
    scenario.registers = {"rip": 0xFFFFF80000001010, "rsp": 0xFFFFC08000002000}
    return scenario.target()


@pytest.mark.parametrize("text, value", [
    ("fffff800`00001000", 0xFFFFF80000001000),
    ("0x10+0n16", 0x20),
    ("nt!KeBugCheckEx+10", 0xFFFFF80000001010),
    ("nt+1000", 0xFFFFF80000001000),
    ("@rsp+8", 0xFFFFC08000002008),
    ("@rip-nt!KeBugCheckEx", 0x10),
])
def test_every_address_takes_windbgs_grammar(text, value):
    assert evaluate(text, TargetResolver(_kernel_target())) == value


@pytest.mark.parametrize("text, token, error", [
    ("nt!Nope+10", "nt!Nope", SymbolNotFound),
    ("10+zz$%", "zz$%", BadInput),
    ("@xmm99", "@xmm99", BadInput),
    ("10+", "+", BadInput),
])
def test_an_address_error_names_the_token_that_failed(text, token, error):
    with pytest.raises(error) as raised:
        evaluate(text, TargetResolver(_kernel_target()))
    assert token.lstrip("@") in str(raised.value)


def test_a_register_needs_a_context():
    target = Scenario("x64", "kernel").target()
    with pytest.raises(BadInput, match="no register context"):
        evaluate("@rsp", TargetResolver(target))


def test_threads_are_selected_by_id_or_index():
    scenario = Scenario("x64", "user")
    scenario.threads = []
    from dbgext.sample.scenario import Thread
    scenario.threads.append(Thread(0x1A4, registers={"rsp": 0x1000}))
    scenario.threads.append(Thread(0x2B8, registers={"rsp": 0x2000}))
    target = scenario.target()
    assert target.thread.id == 0x1A4
    assert target.select_thread("0x2b8").registers["rsp"] == 0x2000
    assert target.select_thread("~0").id == 0x1A4
    with pytest.raises(BadInput, match="no thread"):
        target.select_thread("7")


# -- layouts -------------------------------------------------------------------

KTHREAD = BuiltinLayouts({"_KTHREAD": [
    {"arch": "x64", "builds": (22000, 26100), "size": 0x480,
     "fields": {"InitialStack": (0x28, "P"), "StackLimit": (0x30, "P")}},
    {"arch": "x64", "builds": (10240, 21999), "size": 0x430,
     "fields": {"InitialStack": (0x28, "P"), "StackLimit": (0x38, "P")}},
]})


def test_the_builtin_layout_for_the_targets_build_is_taken_and_says_so():
    layout = lookup_layout(Scenario("x64", "kernel", build=19041).target(), "nt!_KTHREAD", KTHREAD)
    assert (layout.size, layout.offset("StackLimit"), layout.source) == (0x430, 0x38, "built-in (build 19041)")
    assert layout.format("StackLimit") == "<Q"


def test_type_information_wins_over_the_builtin_table():
    scenario = Scenario("x64", "kernel", build=19041)
    scenario.add_module("nt", 0xFFFFF80000000000, 0x200000, image="ntoskrnl.exe")
    scenario.add_type("nt", "_KTHREAD", 0x500, {"InitialStack": 0x40, "StackLimit": 0x48})
    layout = lookup_layout(scenario.target(), "nt!_KTHREAD", KTHREAD)
    assert (layout.size, layout.offset("StackLimit"), layout.format("StackLimit")) == (0x500, 0x48, "<Q")
    assert layout.source != "built-in (build 19041)"


def test_no_source_is_one_clear_error_naming_the_type():
    with pytest.raises(LayoutNotFound, match="_KTHREAD"):
        lookup_layout(Scenario("x64", "kernel", build=9600).target(), "nt!_KTHREAD", KTHREAD)


def test_layout_reads_a_field_from_target_memory():
    scenario = Scenario("x64", "kernel", build=19041)
    thread = scenario.alloc(0x430)
    scenario.write(thread + 0x38, (0xFFFFC08000010000).to_bytes(8, "little"))
    layout = lookup_layout(scenario.target(), "_KTHREAD", KTHREAD)
    assert layout.read(scenario.target(), thread, "StackLimit") == 0xFFFFC08000010000


# -- the command surface -------------------------------------------------------

def test_a_wrong_signature_names_what_was_found():
    error = WrongSignature("RTL_TRACE_DATABASE", 0xFFFFC08000000000, "Magic 0x00000000")
    assert str(error) == ("no RTL_TRACE_DATABASE at ffffc080`00000000: found Magic 0x00000000 there "
                          "(force=True walks it anyway)")
    assert EXIT_PROBLEMS == 4


def test_from_the_console_errors_go_to_stderr_and_results_stay_clean(tmp_path):
    not_a_dump = tmp_path / "x.dmp"
    not_a_dump.write_bytes(b"GIF89a" + bytes(100))
    result = subprocess.run([sys.executable, "-m", "dbgext", "lm", "--json", "--dump", str(not_a_dump)],
                            capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr


def test_debug_and_target_options_work_anywhere_on_the_line(tmp_path):
    missing = str(tmp_path / "none.dmp")
    for argv in (["--debug", "lm", "--dump", missing], ["lm", "--dump", missing, "--debug"]):
        result = subprocess.run([sys.executable, "-m", "dbgext"] + argv, capture_output=True, text=True)
        assert result.returncode == 1 and "cannot open" in result.stderr, argv


def test_thread_selects_whose_registers_an_address_means(tmp_path):
    import io
    from dumps_support import user_scenario
    from minidump_writer import write_minidump
    from dbgext.cli import main
    scenario = user_scenario("x64")
    path = str(tmp_path / "two-threads.mdmp")
    write_minidump(scenario, path)
    first, second = scenario.threads[:2]
    answers = []
    for selection in ([], ["--thread", "~1"], ["--thread", "0x%x" % second.thread_id]):
        out = io.StringIO()
        assert main(["dq", "--dump", path, "@rsp", "L1", "--json"] + selection, stream=out) == 0
        answers.append(json.loads(out.getvalue())["address"])
    assert answers == [first.registers["rsp"], second.registers["rsp"], second.registers["rsp"]]
    out = io.StringIO()
    assert main(["dq", "--dump", path, "@rsp", "--thread", "~7"], stream=out) == 1
    assert "no thread '~7'" in out.getvalue()
