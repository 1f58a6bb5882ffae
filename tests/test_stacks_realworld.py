"""``k`` on crash files real Windows systems wrote (breakpad's test minidumps,
``../shared/realworld/minidumps``): they hold stacks but no code and no module
headers.  x86 frames come from the EBP chain, each step checked and marked
unconfirmed (no call site to read); the x64 crash has no unwind data, so its
frames are scanned; and each walk says once, on stderr, what would give a better
stack.  The expected frames are the EBP chains ``dps`` shows in these files, as
WinDbg follows them."""

import io
import json
import os

from dbgext.cli import main
from stacks_support import REALWORLD

MINIDUMPS = os.path.join(REALWORLD, "minidumps")


def k(name, *args):
    out, err = io.StringIO(), io.StringIO()
    code = main(["k", "--dump", os.path.join(MINIDUMPS, name)] + list(args), stream=out, error_stream=err)
    assert code == 0, "k on %s: %s" % (name, err.getvalue())
    return out.getvalue(), err.getvalue()


def frames(name):
    document = json.loads(k(name, "--json")[0])
    return document, [(frame["child_sp"] if document["arch"] == "x64" else frame["frame_pointer"],
                       frame["function"], frame["found_by"], frame["unconfirmed"])
                      for frame in document["frames"]]


def test_minidump2_follows_the_ebp_chain_windbg_follows_to_the_threads_first_frame():
    document, walked = frames("breakpad__minidump2.dmp")
    assert walked == [
        (0x12fe88, "test_app+0x429e", "context", False),
        (0x12ff70, "test_app+0x4200", "frame_chain", True),     # [0012fe8c]
        (0x12ffc0, "test_app+0x53ec", "frame_chain", True),     # [0012ff74]
        (0x12fff0, "kernel32+0x16fd7", "frame_chain", True),    # [0012ffc4]; [0012fff4] = 0 ends it
    ]
    assert document["frames"][-1]["return_address"] == 0
    assert [problem["kind"] for problem in document["problems"]] == ["no_unwind_data"]


def test_null_read_av_follows_the_ebp_chain_through_kernel32_and_ntdll():
    _, walked = frames("breakpad__null_read_av.dmp")
    assert [(base, function, how) for base, function, how, _ in walked] == [
        (0x37fac0, "crashme+0xa6cd", "context"),
        (0x37fb10, "crashme+0x83d8", "frame_chain"),
        (0x37fb18, "crashme+0x821f", "frame_chain"),
        (0x37fb24, "kernel32+0x13677", "frame_chain"),
        (0x37fb64, "ntdll+0x39d42", "frame_chain"),
        (0x37fb7c, "ntdll+0x39d15", "frame_chain"),
    ]


def test_the_x64_fastfail_without_images_is_scanned_unconfirmed_and_k_says_once_what_would_help():
    document, walked = frames("breakpad__tiny-exe-fastfail.dmp")
    assert walked[0] == (0xd2de4ff720, "tiny+0x1af42", "context", False)
    assert len(walked) > 1 and all(how == "scan" and unconfirmed for _, _, how, unconfirmed in walked[1:])
    text, err = k("breakpad__tiny-exe-fastfail.dmp")
    hint = [line for line in err.splitlines() if "no_unwind_data" in line]
    assert len(hint) == 1 and hint[0].startswith(
        "warning no_unwind_data: no unwind data for tiny.exe, ")
    assert hint[0].endswith(": give --image-path or a symbol path with the image store")
    assert "no_unwind_data" not in text     # results on stdout, warnings on stderr
    assert "frame(s) found by scanning the stack" in err


def test_kv_says_which_frames_are_unconfirmed():
    text, err = k("breakpad__minidump2.dmp", "-v")
    rows = [line for line in text.splitlines() if line[:2] in ("00", "01", "02", "03")]
    assert [row.split("  ")[0] for row in rows] == ["00", "01", "02", "03"]
    assert ["frame_chain (unconfirmed)" in row for row in rows] == [False, True, True, True]
    assert err.count("no_unwind_data") == 1
