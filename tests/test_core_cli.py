"""The dbgext console entry: one-line errors, exit codes, never a traceback."""

import io

from dbgext.cli import main


def run(*argv):
    stream = io.StringIO()
    code = main(list(argv), stream=stream)
    return code, stream.getvalue()


def test_no_command_prints_help_and_fails():
    code, text = run()
    assert code == 2 and "COMMAND" in text


def test_an_unknown_command_is_a_usage_error_not_a_crash():
    code, text = run("no-such-command")
    assert code == 2 and "invalid choice" in text and "Traceback" not in text


def test_a_missing_dump_file_is_a_one_line_error(tmp_path):
    code, text = run("lm", "--dump", str(tmp_path / "missing.dmp"))
    assert code == 1
    assert text.startswith("error: cannot open") and len(text.strip().split("\n")) == 1


def test_a_file_that_is_not_a_dump_is_rejected_by_signature(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"hello world, not a dump")
    code, text = run("lm", "--dump", str(path))
    assert code == 1 and "is not a Windows dump" in text


def test_help_is_available_for_every_command():
    from dbgext.cli import load_commands
    for command in load_commands():
        code, text = run(command.name, "-h")
        assert code == 0, command.name
        assert "usage:" in text.lower() or "usage" in text


def test_numbers_without_a_target_are_hex_by_default_with_0n_for_decimal_and_windbgs_backtick():
    import pytest
    from dbgext.address import parse_number
    from dbgext.errors import BadInput
    assert parse_number("fffff800`00001000") == parse_number("0xfffff80000001000") == 0xFFFFF80000001000
    assert parse_number(" 10 ") == 0x10
    assert parse_number("0n80") == 80
    assert parse_number("L20") == 0x20
    for bad in ("", "0x", "zz", "nt!KeBugCheckEx", "-1"):
        with pytest.raises(BadInput) as raised:
            parse_number(bad)
        assert repr(bad)[1:-1] in str(raised.value)
