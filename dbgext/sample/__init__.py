"""The bundled sample: a Windows x64 kernel crash dump (with ISF symbol files) that
carries one of everything dbgext analyses — a trace database, an ETW logger with a
stack cache, an IPT event with the code it traced, and a driver image with a thread
running through it.  ``dbgext sample --out DIR`` writes it; ``dbgext demo`` builds it
(once, in a cache directory) and runs the analyses on it.

Each capability contributes its part through its fixtures module; a capability
that is not installed is left out of the sample (and the manifest says so).
"""

import importlib
import io
import json
import os

from .. import outputs
from .scenario import Scenario

NT_BASE = 0xFFFFF80000000000
NT_SIZE = 0x100000
HAL_BASE = 0xFFFFF80000400000

# (fixtures module, function, manifest key): each adds its structures to the scenario.
CONTRIBUTIONS = [
    ("dbgext.rtltrace.fixtures", "add_sample_database", "rtltrace"),
    ("dbgext.etwcache.fixtures", "add_sample_logger", "etwstacks"),
    ("dbgext.ipt.fixtures", "add_sample_trace", "ipt"),
    ("dbgext.stackuse.fixtures", "add_sample_driver", "stackuse"),
]

NT_SYMBOLS = {
    "KiSystemStartup": 0x1000, "KeBugCheckEx": 0x2000, "KiPageFault": 0x3000,
    "ExAllocatePool2": 0x4000, "ExFreePoolWithTag": 0x4400, "IofCallDriver": 0x5000,
    "IopfCompleteRequest": 0x5400, "KeWaitForSingleObject": 0x6000, "KiSwapContext": 0x6400,
    "ObReferenceObjectByHandle": 0x7000, "NtDeviceIoControlFile": 0x8000, "KiSystemCall64": 0x9000,
    "RtlStackTraceHashFunction": 0xA000, "EtwpTraceStackKey": 0xB000,
}


def build_sample_scenario():
    """The sample's Scenario and a manifest of what each capability placed where."""
    scenario = Scenario(arch="x64", mode="kernel", build=19041)
    scenario.add_module("nt", NT_BASE, NT_SIZE, image="ntoskrnl.exe")
    scenario.add_module("hal", HAL_BASE, 0x10000, image="hal.dll")
    for name, rva in NT_SYMBOLS.items():
        scenario.add_symbol("nt", name, rva)
    scenario.add_symbol("hal", "HalRequestSoftwareInterrupt", 0x1200)
    manifest = {"format": 1, "contents": {}, "missing": []}
    for module_name, function_name, key in CONTRIBUTIONS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            manifest["missing"].append(key)
            continue
        manifest["contents"][key] = getattr(module, function_name)(scenario)
    if scenario.bugcheck == (0, 0, 0, 0, 0):
        scenario.bugcheck = (0xD1, 0x10, 2, 0, NT_BASE + NT_SYMBOLS["IofCallDriver"] + 0x40)
    return scenario, manifest


def write_sample(directory, force=False, force_option="--force"):
    """Write ``sample.dmp``, its ISF symbols (``sample.dmp.symbols/``) and
    ``sample.json`` (the manifest) into ``directory``; returns the dump path.

    Every file goes through :mod:`dbgext.outputs`: a link where a file (or the
    symbols folder) goes is refused, and so is an existing file unless ``force``;
    all of them are checked before anything is written."""
    dump_path = os.path.join(directory, "sample.dmp")
    symbols = dump_path + ".symbols"
    manifest_path = os.path.join(directory, "sample.json")
    outputs.output_directory(directory)
    outputs.refuse_link(symbols)
    scenario, manifest = build_sample_scenario()
    for path in [dump_path, manifest_path] + scenario.symbol_file_paths(symbols):
        outputs.check_output(path, force, force_option)
    with outputs.replacing(dump_path, force, force_option) as partial:
        scenario.write_kernel_dump(partial)
    scenario.write_symbols(outputs.output_directory(symbols), force, force_option)
    outputs.write_text(manifest_path, json.dumps(manifest, indent=1, default=_jsonable), force, force_option)
    return dump_path


def _jsonable(value):
    if hasattr(value, "name") and hasattr(value, "base"):
        return {"name": value.name, "base": value.base, "size": value.size}
    raise TypeError("not JSON serialisable: %r" % (value,))


def load_manifest(directory):
    with io.open(os.path.join(directory, "sample.json"), "r", encoding="utf-8") as handle:
        return json.load(handle)
