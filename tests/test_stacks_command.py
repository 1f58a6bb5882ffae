"""``dbgext k``: WinDbg's k/kf/kv over minidumps (any thread with a context),
kernel dumps, and inside WinDbg through pykd with DML links."""

import io
import json
import os

import pytest

from pykd_support import run_windbg_script
from stacks_support import build, run

from dbgext.cli import main
from dbgext.stackuse.fixtures import KTHREAD_FIELDS, KTHREAD_SIZE, add_sample_driver
from dbgext.sample.scenario import Scenario, Thread
from minidump_writer import write_minidump


def k(*args):
    out, err = io.StringIO(), io.StringIO()
    code = main(["k"] + list(args), stream=out, error_stream=err)
    return code, out.getvalue(), err.getvalue()


def minidump_with_two_threads(tmp_path):
    """An executed stack in a user-mode minidump: thread 1 stopped in leaf, thread
    7 with a context two frames further out on the same stack."""
    stopped = run("clang-O2", "entry", 5, stop_at="leaf")
    scenario = stopped.scenario(mode="user")
    expected = stopped.expected_frames()
    first = scenario.threads[0]
    scenario.threads.append(Thread(7, stack_base=first.stack_base, stack_size=first.stack_size,
                                   registers={"rip": expected[2][0], "rsp": expected[2][1]}))
    path = str(tmp_path / "user.mdmp")
    write_minidump(scenario, path)
    return path, expected


def test_k_walks_the_current_thread_of_a_minidump_and_any_other_thread_by_id_or_index(tmp_path):
    path, expected = minidump_with_two_threads(tmp_path)
    code, text, _ = k("--dump", path)
    assert code == 0
    lines = text.splitlines()
    assert lines[1].split() == ["#", "Child-SP", "RetAddr", "Call", "Site"]
    assert [line.split()[-1] for line in lines[3:]] == ["chain!leaf", "chain!middle+0x1f", "chain!outer+0xd",
                                                        "chain!entry+0xd"]
    for selector in ("7", "~1"):
        code, text, _ = k("--dump", path, "--thread", selector, "--json")
        document = json.loads(text)
        assert [(frame["ip"], frame["child_sp"]) for frame in document["frames"]] == expected[2:]
        assert document["thread"]["id"] == 7


def test_kf_and_kv_columns(tmp_path):
    path, expected = minidump_with_two_threads(tmp_path)
    code, text, _ = k("--dump", path, "--frame-sizes")
    rows = [line.split() for line in text.splitlines()[3:]]
    assert [row[1] for row in rows[1:]] == ["%x" % (b[1] - a[1]) for a, b in zip(expected, expected[1:])]
    code, text, _ = k("--dump", path, "-v")
    assert "Args to Child" in text and "Found by" in text
    assert [line.split()[-2] for line in text.splitlines()[3:]] == ["context", "unwind", "unwind", "unwind"]


def test_k_count_limits_the_frames(tmp_path):
    path, _ = minidump_with_two_threads(tmp_path)
    code, text, _ = k("2", "--dump", path, "--json")
    document = json.loads(text)
    assert len(document["frames"]) == 2 and document["truncated"] is True
    assert [problem["kind"] for problem in document["problems"]] == ["frames_truncated"]


def test_k_refuses_an_unknown_thread_in_one_line(tmp_path):
    path, _ = minidump_with_two_threads(tmp_path)
    code, text, err = k("--dump", path, "--thread", "99")
    assert code == 1 and text == ""
    assert err.count("\n") == 1 and "99" in err


def minidump_without_pdata(tmp_path):
    """An executed stack in a minidump that lost the page holding chain.dll's .pdata."""
    stopped = run("clang-O2", "entry", 5, stop_at="leaf")
    scenario = stopped.scenario(mode="user")
    base = stopped.address("leaf") - stopped.image.exports_by_name["leaf"]
    scenario.unmap(base + stopped.image.directory(3)[0], 1)
    path = str(tmp_path / "no-pdata.mdmp")
    write_minidump(scenario, path)
    return path, stopped.expected_frames()


@pytest.mark.parametrize("option", ["--image-path", "--symbols"])
def test_k_takes_unwind_data_the_dump_lacks_from_an_image_path_or_the_symbol_path(tmp_path, option):
    path, expected = minidump_without_pdata(tmp_path)
    code, text, _ = k("--dump", path, "--json")
    before = json.loads(text)
    assert "no_unwind_data" in [problem["kind"] for problem in before["problems"]]
    code, text, _ = k("--dump", path, "--json", option, os.path.dirname(build("clang-O2")))
    after = json.loads(text)
    assert [(frame["ip"], frame["child_sp"]) for frame in after["frames"]] == expected
    assert after["found_by"]["scan"] == 0


def test_k_inside_windbg_links_child_sp_to_dps_and_call_sites_to_u():
    scenario = Scenario("x64", "kernel")
    info = add_sample_driver(scenario)
    text, _ = run_windbg_script("k", [], scenario, mode="kernel")
    assert "Traceback" not in text
    assert '<link cmd="dps 0x%x">' % info["rsp"] in text
    assert '<link cmd="u 0x%x">sampledrv!CopyLeaf</link>' % info["functions"]["CopyLeaf"] in text
    text, _ = run_windbg_script("k", ["--json"], scenario, mode="kernel")
    document = json.loads(text)
    assert [frame["function"].split("+")[0] for frame in document["frames"]][:4] == [
        "sampledrv!CopyLeaf", "sampledrv!BuildRequest", "sampledrv!Dispatch", "sampledrv!DriverEntry"]


def test_k_walks_a_waiting_kernel_thread_from_its_switch_frame_and_the_running_one_from_its_context(tmp_path):
    scenario = Scenario("x64", "kernel")
    info = add_sample_driver(scenario)
    waiting = scenario.alloc(KTHREAD_SIZE)
    # Its switch frame's return address is the one the running thread's RSP points at.
    scenario.pack(waiting + KTHREAD_FIELDS["KernelStack"], "<Q", info["rsp"] - 0x38)
    scenario.pack(waiting + KTHREAD_FIELDS["InitialStack"], "<Q", info["initial_stack"])
    scenario.pack(waiting + KTHREAD_FIELDS["StackLimit"], "<Q", info["stack_limit"])
    dump = str(tmp_path / "sample.dmp")
    scenario.write_kernel_dump(dump)
    scenario.write_symbols(dump + ".symbols")
    code, text, _ = k("--dump", dump, "--thread", "0x%x" % waiting, "--json")
    document = json.loads(text)
    assert document["thread"]["kernel_thread"] == waiting
    assert document["frames"][0]["function"].startswith("sampledrv!BuildRequest+")
    assert document["thread"]["stack_base"] == info["initial_stack"]
    code, text, _ = k("--dump", dump, "--thread", "0x%x" % info["thread"], "--json")
    document = json.loads(text)
    assert document["thread"]["kernel_thread"] == info["thread"]
    assert document["frames"][0]["function"] == "sampledrv!CopyLeaf"


def test_k_finds_a_module_image_the_minidump_lacks_in_a_symbol_store_folder_by_timestamp_and_size(tmp_path):
    # A minidump as Windows writes them: the module list (name, base, size,
    # TimeDateStamp) but no byte of the image.  The image is found only in the
    # store's chain.dll/<TimeDateStamp><SizeOfImage>/ folder, not on an image path.
    stopped = run("clang-O2", "entry", 5, stop_at="leaf")
    scenario = stopped.scenario(mode="user")
    module = scenario.modules[0]
    module.timestamp = stopped.image.timestamp
    scenario.unmap(module.base, module.size)
    path = str(tmp_path / "no-image.mdmp")
    write_minidump(scenario, path)
    store = tmp_path / "store"
    folder = store / "chain.dll" / ("%08X%x" % (stopped.image.timestamp, stopped.image.size_of_image))
    folder.mkdir(parents=True)
    with open(build("clang-O2"), "rb") as source, open(str(folder / "chain.dll"), "wb") as copy:
        copy.write(source.read())
    code, text, err = k("--dump", path, "--json")
    without = json.loads(text)
    assert [problem["kind"] for problem in without["problems"]][-1] == "no_unwind_data"
    code, text, err = k("--dump", path, "--json", "--symbols", str(store), "--no-download")
    document = json.loads(text)
    assert [(frame["ip"], frame["child_sp"]) for frame in document["frames"]] == stopped.expected_frames()
    assert [frame["found_by"] for frame in document["frames"]] == ["context"] + ["unwind"] * 3
    assert not any(frame["unconfirmed"] for frame in document["frames"])
    assert document["problems"] == []
