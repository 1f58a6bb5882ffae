"""Every command on every real file in ../shared/realworld/ (minidumps, kernel
small dumps, .etl traces), as a new user would run them: no traceback, no
internal error (exit code 3), and no silent empty output.  A command that gives
nothing on stdout, or fails, says why on stderr in one line; a file dbgext cannot
handle (a malformed minidump) is refused in one line."""

import io
from pathlib import Path

import pytest

import dbgext
from dbgext.cli import main
from dbgext.errors import DbgextError

REALWORLD = Path(__file__).resolve().parents[1].parent / "shared" / "realworld"
DUMPS = sorted(REALWORLD.glob("minidumps/*.dmp")) + sorted(REALWORLD.glob("kernel/*.dmp"))
TRACES = sorted(REALWORLD.glob("etl/*.etl"))
INTERNAL_ERROR = 3


def dump_commands(path):
    """Every command that takes a dump, with arguments that fit the dump (its
    registers, a module it has)."""
    arch, module = "x64", "nt"
    try:
        with dbgext.open(str(path)) as target:
            arch = target.arch
            module = target.modules()[0].name if target.modules() else module
    except DbgextError:
        pass   # every command must then refuse the file in one line
    sp, ip = {"x64": ("@rsp", "@rip"), "x86": ("@esp", "@eip"), "arm64": ("@sp", "@pc")}[arch]
    commands = [["dumpinfo"], ["lm"], ["k"], ["triage"], ["db", sp], ["dd", sp], ["dq", sp], ["dps", sp],
                ["ln", ip], ["x", module + "!*"], ["dt", "nt!_KTHREAD"], ["rtltrace", "--find"], ["etwstacks"],
                ["ipt", "scan"], ["stackuse", "thread"]]
    return [command + ["--dump", str(path)] for command in commands]


def trace_commands(path):
    return [["etwstacks", "--simulate", "--etl", str(path)], ["ipt", "scan", "--etl", str(path)],
            ["dumpinfo", "--dump", str(path)]]


def complaint(argv):
    """What is wrong with running ``argv`` (None when nothing is)."""
    out, err = io.StringIO(), io.StringIO()
    code = main(argv, stream=out, error_stream=err)
    text, errors = out.getvalue(), err.getvalue()
    if code == INTERNAL_ERROR or "Traceback" in text + errors:
        return "internal error (exit %d): %s" % (code, errors.strip()[-300:])
    if code == 0 and not text.strip() and len(errors.strip().splitlines()) != 1:
        return "empty output with no one-line reason (stderr %r)" % errors
    if code not in (0, 4) and len(errors.strip().splitlines()) != 1:
        return "exit %d without a one-line reason (stderr %r)" % (code, errors)
    return None


def check(commands):
    found = []
    for argv in commands:
        why = complaint(argv)
        if why:
            found.append("%s: %s" % (" ".join(argv), why))
    assert found == []


@pytest.mark.parametrize("path", DUMPS, ids=[path.name for path in DUMPS])
def test_every_command_on_a_real_dump_answers_or_says_why_in_one_line(path):
    check(dump_commands(path))


@pytest.mark.parametrize("path", TRACES, ids=[path.name for path in TRACES])
def test_every_etl_command_on_a_real_trace_answers_or_says_why_in_one_line(path):
    check(trace_commands(path))


def test_the_real_world_folder_is_there():
    assert len(DUMPS) == 31 and len(TRACES) == 11, "../shared/realworld is incomplete"
