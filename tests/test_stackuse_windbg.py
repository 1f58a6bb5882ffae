"""``!py commands/stackuse.py`` inside (a faithful fake of) WinDbg with pykd: no
``__file__``, recursion limit 500, a str-only stdout with DML."""

import json

from pykd_support import run_windbg_script

from dbgext.stackuse.fixtures import add_sample_driver
from dbgext.sample.scenario import Scenario


def sample():
    scenario = Scenario("x64", "kernel")
    return scenario, add_sample_driver(scenario)


def test_functions_of_a_loaded_module_link_to_their_disassembly():
    scenario, info = sample()
    text, _ = run_windbg_script("stackuse", ["functions", "--module", "sampledrv", "--depth"], scenario,
                                mode="kernel")
    assert '<link cmd="uf 0x%x">Dispatch</link>' % info["functions"]["Dispatch"] in text
    assert "Traceback" not in text


def test_chain_and_thread_in_the_debugger():
    scenario, info = sample()
    text, _ = run_windbg_script("stackuse", ["chain", "sampledrv!DriverEntry", "--json"], scenario, mode="kernel")
    document = json.loads(text)
    assert (document["depth"], document["depth_bound"]) == (696, "exact")
    # The sample thread is the current one: its live registers start the walk.
    for args in (["thread", "--json"], ["thread", "0x%x" % info["thread"], "--json"]):
        text, _ = run_windbg_script("stackuse", args, scenario, mode="kernel")
        document = json.loads(text)
        assert document["thread"] == info["thread"]
        assert [frame["function"].split("+")[0] for frame in document["frames"]][:2] == [
            "sampledrv!CopyLeaf", "sampledrv!BuildRequest"]
