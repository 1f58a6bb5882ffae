"""Inside WinDbg the debugger is the symbol source: ``ln``, ``x``, ``lm`` and
stackuse name the functions WinDbg names (non-exported ones included), through
pykd's symbol enumeration — here a faithful fake pykd over the sample driver."""

import json

from pykd_support import run_windbg_script

from dbgext.stackuse.fixtures import add_sample_driver
from dbgext.sample.scenario import Scenario


def sample():
    scenario = Scenario("x64", "kernel")
    return scenario, add_sample_driver(scenario)


def test_x_lists_a_function_the_driver_does_not_export(tmp_path):
    scenario, info = sample()
    text, _ = run_windbg_script("x", ["sampledrv!Copy*", "--json"], scenario, mode="kernel")
    document = json.loads(text)
    assert [(hit["name"], hit["address"]) for hit in document["symbols"]] == [
        ("CopyLeaf", info["functions"]["CopyLeaf"])]


def test_ln_names_the_nearest_debugger_symbols():
    scenario, info = sample()
    text, _ = run_windbg_script("ln", ["%x" % (info["functions"]["CopyLeaf"] + 1), "--json"], scenario,
                                mode="kernel")
    document = json.loads(text)
    assert [hit["name"] for hit in document["before"]] == ["CopyLeaf"]
    assert document["before"][0]["displacement"] == 1 and document["symbols"] == "pdb symbols"


def test_lm_shows_the_debuggers_symbol_file():
    scenario, _ = sample()
    text, _ = run_windbg_script("lm", ["--json"], scenario, mode="kernel")
    modules = dict((module["name"], module) for module in json.loads(text)["modules"])
    assert modules["sampledrv"]["symbols"] == "pdb symbols"
    assert modules["sampledrv"]["symbol_file"] == "c:\\symbols\\sampledrv.pdb"


def test_stackuse_chain_finds_a_non_exported_function_by_name():
    scenario, _ = sample()
    text, _ = run_windbg_script("stackuse", ["chain", "sampledrv!CopyLeaf", "--json"], scenario, mode="kernel")
    document = json.loads(text)
    assert document["function"].endswith("CopyLeaf")
