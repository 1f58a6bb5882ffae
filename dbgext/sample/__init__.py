"""The bundled sample: a Windows x64 kernel crash dump (with ISF symbol files) that
carries one of everything dbgext analyses — a trace database, an ETW logger with a
stack cache, an IPT event with the code it traced, and a driver image with a thread
running through it.  ``dbgext sample --out DIR`` writes it; ``dbgext demo`` builds it
(once, in a cache directory) and runs the analyses on it.

Each capability contributes its part through its fixtures module (a failed import
is an error: the sample always has every part).
"""

import io
import json
import os

from .. import outputs
from ..etwcache.fixtures import add_sample_logger
from ..ipt.fixtures import add_sample_trace
from ..rtltrace.fixtures import add_sample_database
from ..stackuse.fixtures import Function, add_sample_driver, alloc_slots, build_pe
from .scenario import Scenario

# Format 2: every capability's part always present, the process, nt's image.
MANIFEST_FORMAT = 2
NT_BASE = 0xFFFFF80000000000
HAL_BASE = 0xFFFFF80000400000

# (function, manifest key): each adds its structures to the scenario.
CONTRIBUTIONS = [
    (add_sample_database, "rtltrace"),
    (add_sample_logger, "etwstacks"),
    (add_sample_trace, "ipt"),
    (add_sample_driver, "stackuse"),
]

NT_SYMBOLS = {
    "KiSystemStartup": 0x1000, "KeBugCheckEx": 0x2000, "KiPageFault": 0x3000,
    "ExAllocatePool2": 0x4000, "ExFreePoolWithTag": 0x4400, "IofCallDriver": 0x5000,
    "IopfCompleteRequest": 0x5400, "KeWaitForSingleObject": 0x6000, "KiSwapContext": 0x6400,
    "ObReferenceObjectByHandle": 0x7000, "NtDeviceIoControlFile": 0x8000, "KiSystemCall64": 0x9000,
    "RtlStackTraceHashFunction": 0xA000, "EtwpTraceStackKey": 0xB000,
}


# The process the sample's threads run in: _KTHREAD.ApcState.Process as in
# Windows 10 x64 (ApcState at 0x98, _KAPC_STATE.Process at 0x20).
KTHREAD_APC_STATE = 0x98
KAPC_STATE = {"size": 0x30, "Process": 0x20}
EPROCESS_SIZE = 0xA40


def nt_image():
    """nt's PE image, with a function at each of NT_SYMBOLS' RVAs (each running up to
    the next): KeBugCheckEx has unwind data, the others are leaves, so a stack walk
    reads real .pdata and ends at KiSystemStartup, the first frame of a system thread."""
    starts = sorted(NT_SYMBOLS.items(), key=lambda item: item[1])
    functions = []
    for (name, rva), end in zip(starts, [rva for _, rva in starts[1:]] + [starts[-1][1] + 0x100]):
        if name == "KeBugCheckEx":
            body = [b"\x48\x83\xec\x28", b"\xcc" * (end - rva - 4)]   # sub rsp, 28h
            functions.append(Function(name, body, {"prolog_size": 4, "slots": alloc_slots(4, 0x28)}))
        else:
            functions.append(Function(name, [b"\xc3" + b"\xcc" * (end - rva - 1)]))
    image = build_pe("x64", functions, image_base=NT_BASE, name="ntoskrnl.exe")
    assert all(image.rvas[name] == rva for name, rva in NT_SYMBOLS.items()), "nt's functions must sit at NT_SYMBOLS"
    return image


def _add_process(scenario, kthread):
    """An EPROCESS for the thread at ``kthread`` (KTHREAD.ApcState.Process); its address."""
    scenario.add_type("nt", "_KAPC_STATE", KAPC_STATE["size"], {"Process": KAPC_STATE["Process"]})
    scenario.module_symbols["nt"].types["_KTHREAD"]["fields"]["ApcState"] = {
        "offset": KTHREAD_APC_STATE, "type": {"kind": "struct", "name": "_KAPC_STATE"}}
    process = scenario.alloc(EPROCESS_SIZE)
    scenario.write_pointer(kthread + KTHREAD_APC_STATE + KAPC_STATE["Process"], process)
    return process


def build_sample_scenario():
    """The sample's Scenario and a manifest of what each capability placed where."""
    scenario = Scenario(arch="x64", mode="kernel", build=19041)
    nt = nt_image()
    scenario.add_module("nt", NT_BASE, nt.size, image="ntoskrnl.exe", content=nt.data)
    scenario.add_module("hal", HAL_BASE, 0x10000, image="hal.dll")
    for name, rva in NT_SYMBOLS.items():
        scenario.add_symbol("nt", name, rva)
    scenario.add_symbol("hal", "HalRequestSoftwareInterrupt", 0x1200)
    manifest = {"format": MANIFEST_FORMAT, "contents": {}}
    for contribute, key in CONTRIBUTIONS:
        manifest["contents"][key] = contribute(scenario)
    manifest["contents"]["process"] = _add_process(scenario, manifest["contents"]["stackuse"]["thread"])
    # DRIVER_IRQL_NOT_LESS_OR_EQUAL: Arg4 is the instruction that touched the
    # memory, where the crashing thread is (sampledrv!CopyLeaf, frame 0 of its stack).
    scenario.bugcheck = (0xD1, 0x10, 2, 0, scenario.registers["rip"])
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
