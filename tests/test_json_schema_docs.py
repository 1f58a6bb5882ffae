"""docs/json-schema/ describes every key the commands' --json documents have: each
command runs on the bundled sample (and dumpinfo on a small dump and a minidump
too), and every top-level key of its document, and every key of the objects in its
top-level lists, must be named (as `key`) in the command's schema file."""

import io
import json
import os
import re

import pytest

from dbgext.cli import main
from dbgext.sample.command import demo_steps
from dumps_support import small_dump, user_scenario
from minidump_writer import write_minidump

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "json-schema")
SCHEMA_FILE = {"db": "basic", "dd": "basic", "dq": "basic", "dps": "basic", "lm": "basic"}


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """[(argv, document)] of every command on the sample and of dumpinfo on other dump kinds."""
    directory = tmp_path_factory.mktemp("sample")
    assert main(["sample", "--out", str(directory)], stream=io.StringIO()) == 0
    dump = str(directory / "sample.dmp")
    with open(str(directory / "sample.json")) as handle:
        manifest = json.load(handle)
    ipt = manifest["contents"]["ipt"]
    on_dump = ["--dump", dump]
    commands = [argv for _, argv in demo_steps(dump, manifest)] + [
        ["rtltrace"] + on_dump + ["--find"],
        ["ipt", "packets"] + on_dump + ["--address", "0x%x" % ipt["trace_address"], "--size", "0x%x" % ipt["trace_size"]],
        ["ln"] + on_dump + ["nt"], ["x"] + on_dump + ["nt!Ke*"], ["dt"] + on_dump + ["nt!_KTHREAD"],
        ["db"] + on_dump + ["nt", "L10"], ["dps"] + on_dump + ["nt", "L4"], ["lm"] + on_dump,
        ["stackuse", "functions"] + on_dump + ["--module", "sampledrv", "--depth"],
        ["stackuse", "chain", "sampledrv!DriverEntry"] + on_dump,
        ["stackuse", "hogs"] + on_dump + ["--module", "sampledrv"],
        ["etwstacks", "--key", "0x%x" % manifest["contents"]["etwstacks"]["keys"][0]] + on_dump,
        ["ipt", "scan"] + on_dump,
        ["triage", "report", "--db", str(directory / "triage.duckdb")]]
    assert main(["triage", dump, "--db", str(directory / "triage.duckdb")], stream=io.StringIO()) == 0
    small = str(directory / "small.dmp")
    small_dump().write(small)
    minidump = str(directory / "user.mdmp")
    write_minidump(user_scenario("x64"), minidump)
    commands += [["dumpinfo", "--dump", small], ["dumpinfo", "--dump", minidump]]
    found = []
    for argv in commands:
        stream = io.StringIO()
        assert main(argv + ["--json"], stream=stream) in (0, 4), argv
        found.append((argv, json.loads(stream.getvalue())))
    return found


def documented_names(command):
    """Every name inside `...` in the command's schema file and in json-schema.md
    (the rules every document follows: the problem objects): `key`,
    `{"name", "start"}`, `loggers[].logger_id`, `.name`."""
    names = set()
    for path in (os.path.join(DOCS, SCHEMA_FILE.get(command, command) + ".md"), DOCS + ".md"):
        with open(path, encoding="utf-8") as handle:
            for span in re.findall(r"`([^`]+)`", handle.read()):
                names.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", span))
    return names


def keys_of(document):
    """The document's keys and the keys of the objects in its top-level lists (the
    rows a reader iterates; objects keyed by data, such as a header's fields by
    name, are described as a whole)."""
    keys = set(document)
    for value in document.values():
        if isinstance(value, list):
            keys.update(key for item in value if isinstance(item, dict) for key in item)
    return keys


def test_every_key_of_every_commands_json_document_is_described_in_its_schema_file(documents):
    undocumented = {}
    for argv, document in documents:
        command = argv[0]
        missing = sorted(keys_of(document) - documented_names(command))
        if missing:
            undocumented.setdefault(" ".join(argv[:2] if command in ("ipt", "stackuse") else argv[:1]),
                                    set()).update(missing)
    assert {name: sorted(keys) for name, keys in sorted(undocumented.items())} == {}, repr(sorted((k, sorted(v)) for k, v in undocumented.items()))


def test_every_command_has_a_schema_file(documents):
    assert sorted({argv[0] for argv, _ in documents if not os.path.exists(
        os.path.join(DOCS, SCHEMA_FILE.get(argv[0], argv[0]) + ".md"))}) == []
