"""The commands/*.py scripts run exactly as WinDbg's !py runs them (no __file__,
recursion limit 500, str-only debugger stdout with DML, pykd = the fake)."""

import json
import os
import re

import pytest

from dbgext.sample.scenario import Scenario
from pykd_support import COMMANDS_DIR, NT_BASE, kernel_scenario, run_windbg_script

ENTRY_SCRIPTS = ["db", "dd", "dq", "dps", "lm", "rtltrace", "etwstacks", "ipt", "stackuse", "triage"]


@pytest.fixture(scope="module")
def world():
    return kernel_scenario()


def plain(text):
    """DML as the user reads it: tags removed, entities decoded."""
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")


def test_db_in_windbg_matches_the_offline_layout(world):
    scenario, at = world
    text, pykd = run_windbg_script("db", ["%x" % at.text, "L10"], scenario)
    assert plain(text) == (scenario.target().format_address(at.text) + "  48 65 6c 6c 6f 2c 20 57-69 6e 44 62 67 00 00 00  Hello, WinDbg...\n")
    assert pykd.fake_calls["loadBytes"] == 1


def test_markup_characters_in_memory_are_escaped_for_dml(world):
    scenario, at = world
    text, _ = run_windbg_script("db", ["%x" % (at.page + 0x30), "L10"], scenario)
    assert "&lt;=&gt;" in text
    assert plain(text).rstrip().endswith("0123456789:;<=>?")


def test_dd_and_dq_in_windbg(world):
    scenario, at = world
    text, _ = run_windbg_script("dd", ["%x" % (at.hole - 8), "L4"], scenario)
    assert plain(text).rstrip().endswith("fbfaf9f8 fffefdfc ???????? ????????")
    text, _ = run_windbg_script("dq", ["%x" % at.page, "L2"], scenario)
    assert plain(text).rstrip().endswith("07060504`03020100 0f0e0d0c`0b0a0908")


def test_dps_in_windbg_links_values_to_dps_and_symbols_to_u(world):
    scenario, at = world
    text, pykd = run_windbg_script("dps", ["%x" % at.pointers, "L2"], scenario)
    first = text.split("\n")[0]
    assert '<link cmd="dps 0x%x">' % (NT_BASE + 0x1010) in first
    assert '<link cmd="u 0x%x">nt!KiSystemStartup+0x10</link>' % (NT_BASE + 0x1010) in first
    assert plain(first).endswith("fffff800`00001010 nt!KiSystemStartup+0x10")
    assert pykd.fake_calls["findSymbol"] == 1


def test_lm_in_windbg_links_module_names(world):
    scenario, _ = world
    text, _ = run_windbg_script("lm", [], scenario)
    assert '<link cmd="lmvm nt">nt</link>' in text and "ntoskrnl.exe" in plain(text)


def test_a_bad_address_in_windbg_is_one_line_without_traceback(world):
    scenario, _ = world
    text, _ = run_windbg_script("db", ["nt!Nope"], scenario)
    assert plain(text) == "error: unknown symbol 'nt!Nope' in 'nt!Nope'\n"


def test_usage_errors_and_help_do_not_exit_the_debuggers_python(world):
    scenario, _ = world
    text, _ = run_windbg_script("db", [], scenario)
    # the usage line shows what the user typed: !py <full path of the script>
    assert "usage: !py %s" % os.path.join(COMMANDS_DIR, "db.py") in plain(text) and "required" in plain(text)
    text, _ = run_windbg_script("dps", ["-h"], scenario)
    assert "L<count>" in text  # argparse help is plain write(), not DML


def test_unreadable_memory_in_windbg_prints_question_marks(world):
    scenario, at = world
    text, _ = run_windbg_script("db", ["%x" % at.hole, "L4"], scenario)
    assert plain(text).endswith("  ?? ?? ?? ??" + " " * 36 + "  ????\n")


def test_windbg_json_output_goes_through_the_debugger_stream(world):
    scenario, at = world
    text, _ = run_windbg_script("dd", ["%x" % at.page, "L1", "--json"], scenario)
    assert json.loads(plain(text))["values"] == [50462976]


def test_a_dump_option_inside_windbg_reads_the_file_not_the_session(tmp_path, world):
    scenario, at = world
    path = str(tmp_path / "k.dmp")
    scenario.write_kernel_dump(path)
    text, pykd = run_windbg_script("dd", ["--dump", path, "%x" % at.page, "L1"], Scenario("x64", "kernel"))
    assert plain(text).rstrip().endswith("03020100")
    assert pykd.fake_calls["loadBytes"] == 0


PROBE = """
import sys
import pykd
seen = {
    "has_file": "__file__" in globals(),
    "argv": sys.argv,
    "limit": sys.getrecursionlimit(),
    "has_buffer": hasattr(sys.stdout, "buffer"),
    "encoding": sys.stdout.encoding,
    "pykd_is_fake": hasattr(pykd, "fake_calls"),
    "windbg_ext": pykd.isWindbgExt(),
}
try:
    sys.stdout.write(b"bytes")
    seen["bytes_rejected"] = False
except TypeError:
    seen["bytes_rejected"] = True
print(repr(seen))
"""


def test_the_harness_runs_scripts_as_windbg_does(tmp_path, world):
    import ast
    import sys
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    limit = sys.getrecursionlimit()
    text, _ = run_windbg_script(str(probe), ["a b", "-v"], world[0])
    seen = ast.literal_eval(text.strip())
    assert seen == {"has_file": False, "argv": [str(probe), "a b", "-v"], "limit": 500,
                    "has_buffer": False, "encoding": "ascii", "pykd_is_fake": True,
                    "windbg_ext": True, "bytes_rejected": True}
    assert sys.getrecursionlimit() == limit and "pykd" not in sys.modules


@pytest.mark.parametrize("name", ENTRY_SCRIPTS)
def test_every_entry_script_runs_its_own_command(name):
    path = os.path.join(COMMANDS_DIR, name + ".py")
    with open(path) as handle:
        source = handle.read()
    assert 'main(["%s"] + sys.argv[1:], windbg=True)' % name in source
    compile(source, path, "exec")


@pytest.mark.parametrize("name", ENTRY_SCRIPTS)
def test_every_entry_script_shows_its_help_inside_windbg(name, world):
    text, _ = run_windbg_script(name, ["-h"], world[0])
    assert text.startswith("usage: !py %s" % os.path.join(COMMANDS_DIR, name + ".py")) and "Traceback" not in text
