"""`dbgext stackuse ...` end to end: the functions --jsonl contract, chain, hogs,
options errors, and WinDbg DML links."""

import io
import json

import pytest

from dbgext.cli import main
from dbgext.stackuse.fixtures import build_pe, sample_driver_functions

CONTRACT_KEYS = {"module", "rva", "name", "frame_size", "dynamic", "realignment_padding", "source", "found_by",
                 "disagreement"}


@pytest.fixture
def driver_file(tmp_path):
    built = build_pe("x64", sample_driver_functions(), image_base=0x140000000,
                     imports=["ntoskrnl.exe!KeQueryTimeIncrement"], name="sampledrv.sys")
    path = tmp_path / "sampledrv.sys"
    path.write_bytes(built.data)
    return str(path), built


def run(*argv):
    stream = io.StringIO()
    code = main(list(argv), stream=stream)
    return code, stream.getvalue()


def test_functions_jsonl_is_one_contract_object_per_function(driver_file):
    path, built = driver_file
    code, text = run("stackuse", "functions", "--pe", path, "--jsonl")
    assert code == 0
    records = [json.loads(line) for line in text.splitlines()]
    assert all(set(record) == CONTRACT_KEYS for record in records)
    by_name = {record["name"]: record for record in records}
    assert by_name["DriverEntry"] == {"module": "sampledrv.sys", "rva": built.rvas["DriverEntry"],
                                      "name": "DriverEntry", "frame_size": 0x28, "dynamic": False,
                                      "realignment_padding": 0, "source": "both", "found_by": "pdata",
                                      "disagreement": None}
    assert by_name["Dispatch"]["frame_size"] == 0x228
    # CopyLeaf is not exported and has no .pdata entry: found through the call to it.
    leaf = [r for r in records if r["rva"] == built.rvas["CopyLeaf"]][0]
    assert (leaf["name"], leaf["frame_size"], leaf["source"]) == (None, 0, "prologue")


def test_functions_jsonl_with_depth_carries_the_worst_case_and_why_it_is_not_exact(driver_file):
    path, built = driver_file
    code, text = run("stackuse", "functions", "--pe", path, "--jsonl", "--depth")
    by_name = {record["name"]: record for record in map(json.loads, text.splitlines())}
    entry = by_name["DriverEntry"]
    # 8 (its return address) + 0x28 + 8 + 0x228 + 8 + 0x48 + 8 (CopyLeaf) = 696, and
    # Dispatch calls nt through the IAT: in a file that import cannot be followed.
    assert (entry["depth"], entry["depth_bound"]) == (696, "lower")
    assert "ntoskrnl!KeQueryTimeIncrement" in entry["depth_unknown"]
    dpc = by_name["DpcRoutine"]
    assert (dpc["depth"], dpc["depth_bound"], dpc["depth_unknown"]) == (8 + 0x28 + 8 + 0x48 + 8, "exact", None)


def test_functions_text_table(driver_file):
    path, _ = driver_file
    code, text = run("stackuse", "functions", "--pe", path)
    assert code == 0
    assert "sampledrv.sys (x64): 5 functions" in text
    assert any(line.split()[1:5] == ["Dispatch", "552", "both", "pdata"] for line in text.splitlines()
               if "Dispatch" in line)


def test_chain_lists_every_frame_with_the_sp_at_each_call(driver_file):
    path, built = driver_file
    code, text = run("stackuse", "chain", "DriverEntry", "--pe", path, "--json")
    document = json.loads(text)
    assert [frame["function"] for frame in document["frames"]] == ["DriverEntry", "Dispatch", "BuildRequest",
                                                                  "sampledrv.sys+0x%x" % built.rvas["CopyLeaf"]]
    assert [frame["sp_at_call"] for frame in document["frames"]] == [0x28, 0x228, 0x48, None]
    assert document["depth"] == 696
    code, text = run("stackuse", "chain", "0x%x" % (0x140000000 + built.rvas["DpcRoutine"]), "--pe", path)
    assert code == 0 and "worst case from DpcRoutine: 136 bytes" in text


def test_hogs_lists_largest_frames_and_chains_over_budget(driver_file):
    path, _ = driver_file
    code, text = run("stackuse", "hogs", "--pe", path, "--top", "2", "--budget", "0n600", "--json")
    document = json.loads(text)
    assert [record["name"] for record in document["largest_frames"]] == ["Dispatch", "BuildRequest"]
    assert [(r["name"], r["depth"]) for r in document["over_budget"]] == [("DriverEntry", 696), ("Dispatch", 648)]
    assert document["over_budget_count"] == 2
    code, text = run("stackuse", "hogs", "--pe", path, "--top", "1", "--budget", "258")
    assert "over the 600-byte budget (or unbounded): 2 function(s), the first 1 listed" in text
    code, text = run("stackuse", "hogs", "--pe", path)
    assert "worst case over the 24576-byte budget" in text


def test_sample_driver_in_a_kernel_dump_follows_the_import_into_nt(tmp_path):
    from dbgext.stackuse.fixtures import add_sample_driver
    from dbgext.sample.scenario import Scenario
    scenario = Scenario("x64", "kernel")
    add_sample_driver(scenario)
    dump = str(tmp_path / "sample.dmp")
    scenario.write_kernel_dump(dump)
    scenario.write_symbols(dump + ".symbols")
    code, text = run("stackuse", "functions", "--dump", dump, "--module", "sampledrv", "--jsonl", "--depth")
    assert code == 0
    entry = [json.loads(line) for line in text.splitlines() if '"DriverEntry"' in line][0]
    assert (entry["depth"], entry["depth_bound"]) == (696, "exact")
    code, text = run("stackuse", "chain", "sampledrv!Dispatch", "--dump", dump)
    assert code == 0 and "KeQueryTimeIncrement" not in text.split("note:")[-1]


def test_option_errors_are_one_line_messages(driver_file, tmp_path):
    path, _ = driver_file
    assert run("stackuse", "functions") == (1, "error: give --pe FILE, or --dump FILE with --module NAME\n")
    code, text = run("stackuse", "chain", "NoSuchFunction", "--pe", path)
    assert code == 1 and text.startswith("error: no function named 'NoSuchFunction'")
    code, text = run("stackuse", "chain", "--pe", path)
    assert code == 1 and "needs a function" in text
    code, text = run("stackuse", "thread", "--pe", path)
    assert code == 1 and "needs a target" in text
    code, text = run("stackuse", "hogs", "--pe", path, "--budget", "lots")
    assert code == 1 and "'lots' is not a number" in text


def test_windbg_output_links_functions_to_their_disassembly(driver_file):
    path, built = driver_file

    class DebuggerStream(object):
        def __init__(self):
            self.parts = []

        def write(self, text):
            self.parts.append(text)

        def writedml(self, text):
            self.parts.append(text)

    stream = DebuggerStream()
    assert main(["stackuse", "functions", "--pe", path], stream=stream) == 0
    text = "".join(stream.parts)
    assert '<link cmd="uf 0x%x">DriverEntry</link>' % (0x140000000 + built.rvas["DriverEntry"]) in text


def test_symbols_name_functions_of_a_pe_file(driver_file, tmp_path):
    from dbgext.symbols.module import ModuleSymbols, write_isf_file
    path, built = driver_file
    directory = tmp_path / "symbols"
    directory.mkdir()
    write_isf_file(ModuleSymbols("sampledrv", {"CopyLeaf": built.rvas["CopyLeaf"]}), str(directory))
    code, text = run("stackuse", "chain", "CopyLeaf", "--pe", path, "--symbols", str(directory), "--json")
    assert code == 0
    assert json.loads(text)["frames"][0]["function"] == "CopyLeaf"


def test_every_json_document_starts_with_its_schema_version(driver_file):
    path, _ = driver_file
    for argv in (["functions", "--pe", path, "--json"], ["chain", "DriverEntry", "--pe", path, "--json"],
                 ["hogs", "--pe", path, "--json"]):
        code, text = run("stackuse", *argv)
        assert code == 0
        assert list(json.loads(text))[0] == "schema_version" and json.loads(text)["schema_version"] == 1


def test_problems_are_objects_with_a_kind_and_an_address(driver_file, tmp_path):
    path, built = driver_file
    with open(path, "rb") as handle:
        data = handle.read()
    cut = tmp_path / "cut.sys"
    cut.write_bytes(data[:built.rvas["DriverEntry"] + 0x10])
    code, text = run("stackuse", "functions", "--pe", str(cut), "--json")
    problems = json.loads(text)["problems"]
    assert problems and all(set(problem) == {"kind", "severity", "address", "offset", "message"}
                            for problem in problems)
    assert problems[0]["kind"] == "pe_truncated" and isinstance(problems[0]["address"], int)


def test_options_and_subjects_in_any_order_with_the_address_grammar(tmp_path):
    from dbgext.stackuse.fixtures import add_sample_driver
    from dbgext.sample.scenario import Scenario
    scenario = Scenario("x64", "kernel")
    info = add_sample_driver(scenario)
    dump = str(tmp_path / "sample.dmp")
    scenario.write_kernel_dump(dump)
    scenario.write_symbols(dump + ".symbols")
    thread = "%x" % info["thread"]
    first = run("stackuse", "thread", "--dump", dump, thread, "--json")
    second = run("stackuse", "thread", thread, "--json", "--dump", dump)
    assert first[0] == 0 and first == second
    # module!symbol+offset, module+offset and backticked hex all name the same function.
    entry = info["functions"]["DriverEntry"]
    texts = ["sampledrv!DriverEntry", "sampledrv!DriverEntry+0", "sampledrv+%x" % (entry - info["base"]),
             "%08x`%08x" % (entry >> 32, entry & 0xFFFFFFFF)]
    documents = [json.loads(run("stackuse", "chain", text, "--dump", dump, "--json")[1]) for text in texts]
    assert all(document["frames"][0]["rva"] == documents[0]["frames"][0]["rva"] for document in documents)
