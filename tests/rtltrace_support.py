"""Scenarios with trace databases for the rtltrace tests, and a CLI runner."""

import io
import json

from dbgext.cli import main
from dbgext.rtltrace.fixtures import build_database
from dbgext.sample.scenario import Scenario

USER_MODULES = {
    "x64": [("ntdll", 0x7FFA10000000, 0x1F0000, "ntdll.dll"),
            ("kernel32", 0x7FFA0F000000, 0xC0000, "kernel32.dll"),
            ("app", 0x7FF6A0000000, 0x80000, "app.exe"),
            ("netio", 0x7FFA0E000000, 0x40000, "netio.dll")],
    "x86": [("ntdll", 0x77A00000, 0x1A0000, "ntdll.dll"),
            ("kernel32", 0x76F00000, 0xF0000, "kernel32.dll"),
            ("app", 0x00400000, 0x60000, "app.exe"),
            ("netio", 0x74000000, 0x40000, "netio.dll")],
}
KERNEL_MODULES = [("nt", 0xFFFFF80000000000, 0x400000, "ntoskrnl.exe"),
                  ("mydrv", 0xFFFFF80012340000, 0x20000, "mydrv.sys")]

# ntdll!_RTL_TRACE_DATABASE as a PDB would give it (user x64 offsets).
DATABASE_TYPE_FIELDS = {"Magic": 0, "Flags": 4, "Tag": 8, "SegmentList": 0x10, "MaximumSize": 0x18,
                        "CurrentSize": 0x20, "Owner": 0x28, "NoOfBuckets": 0x58, "Buckets": 0x60,
                        "HashFunction": 0x68, "NoOfTraces": 0x70, "NoOfHits": 0x78, "HashCounter": 0x80}
_ULONG = {"kind": "base", "name": "unsigned long"}


def add_database_type(scenario, fields=DATABASE_TYPE_FIELDS):
    """ntdll!_RTL_TRACE_DATABASE in the scenario's types, ULONGs and the HashCounter
    array typed as such (the other fields are 8-byte values)."""
    scenario.add_type("ntdll", "_RTL_TRACE_DATABASE", 0xC0, fields)
    typed = scenario.module_symbols["ntdll"].types["_RTL_TRACE_DATABASE"]["fields"]
    for name in ("Magic", "Flags", "Tag", "NoOfBuckets"):
        if name in typed:
            typed[name]["type"] = dict(_ULONG)
    if "HashCounter" in typed:
        typed["HashCounter"]["type"] = {"kind": "array", "count": 16, "subtype": dict(_ULONG)}

LAYOUT_SCENARIO = {"user-x64": ("x64", "user"), "user-x86": ("x86", "user"),
                   "kernel-x64": ("x64", "kernel")}


def scenario_for(layout):
    arch, mode = LAYOUT_SCENARIO[layout]
    scenario = Scenario(arch, mode)
    modules = KERNEL_MODULES if mode == "kernel" else USER_MODULES[arch]
    for name, base, size, image in modules:
        scenario.add_module(name, base, size, image=image)
    return scenario


def allocator_modules(layout):
    if layout == "kernel-x64":
        return ["nt", "mydrv"]
    return ["ntdll", "app", "netio", "kernel32"]


def database(layout, distinct=300, adds=900, buckets=None, **options):
    """(scenario, builder) with a synced database of ``distinct`` traces."""
    scenario = scenario_for(layout)
    if buckets is None:
        buckets = 211 if layout == "kernel-x64" else 6263
    builder = build_database(scenario, layout, distinct, adds=adds, buckets=buckets,
                             modules=allocator_modules(layout), **options)
    return scenario, builder


class DmlStream(io.StringIO):
    """A WinDbg-like stdout: takes str through write and writedml."""

    def writedml(self, text):
        self.write(text)


def run(argv, target=None, windbg=False):
    """(exit code, output text) of ``dbgext rtltrace ...``."""
    stream = DmlStream() if windbg else io.StringIO()
    code = main(["rtltrace"] + list(argv), stream=stream, target=target, windbg=windbg)
    return code, stream.getvalue()


def run_json(argv, target=None):
    code, text = run(list(argv) + ["--json"], target=target)
    assert code == 0, text
    return json.loads(text)


def problem_kinds(document):
    return sorted(set(problem["kind"] for problem in document["problems"]))
