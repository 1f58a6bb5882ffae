"""Fixture dumps for the triage tests (and scripts/bench_triage.py).

Every dump is built through a Scenario: an ``nt`` and one or two drivers with
symbols, a kernel stack holding return addresses (each preceded by a ``call
rel32`` in the module's code, as real return addresses are), and the bug check.
The crash stack reads, top first::

    nt!KeBugCheckEx  <- nt!KiBugCheckDispatch  <- nt!KiPageFault  <- <driver>!<function>  <- nt!IofCallDriver

so the expected signature is ``<driver>!<function>``.

Test-only analysis plug-ins live here too: ``register_test_analyses`` (used as
``--plugin triage_support:register_test_analyses``) adds ``test-hang`` (sleeps for
an hour on dumps whose bug check is HANG_BUGCHECK), ``test-explode`` (raises on
EXPLODE_BUGCHECK) and ``test-slow`` (sleeps SLOW_SECONDS and leaves a marker file
in $TRIAGE_TEST_MARKERS, so a test can kill a run midway).
"""

import os
import struct
import time

from dbgext.sample.kdump_writer import write_kernel_dump
from minidump_writer import write_minidump
from dbgext.sample.scenario import Scenario, Thread
from dbgext.problems import Problem
from dbgext.triage.record import register_analysis

NT_BASE = 0xFFFFF80000000000
DRIVER_BASE = 0xFFFFF80001000000
DRIVER_SIZE = 0x10000
NT_SYMBOLS = {"KeBugCheckEx": 0x1000, "KiBugCheckDispatch": 0x2000, "KiPageFault": 0x3000,
              "IofCallDriver": 0x4000, "KiSystemCall64": 0x5000}
DRIVER_FUNCTIONS = {"DriverEntry": 0x1000, "DispatchIoctl": 0x2000, "ProcessPacket": 0x3000,
                    "CompleteRequest": 0x4000}

DRIVER_TIMESTAMP = 0x5F3C2A10
ACCESS_VIOLATION = 0xC0000005
HANG_BUGCHECK = 0xDEAD0001
EXPLODE_BUGCHECK = 0xDEAD0002
SLOW_SECONDS = 0.25
DUMP_TYPE_LIVE = 6


def _return_address(scenario, module_name, symbol, offset):
    """An address inside ``module!symbol`` preceded by a ``call rel32``."""
    address = scenario.module(module_name).base + scenario.module_symbols[module_name].symbols[symbol] + offset
    scenario.write(address - 5, b"\xe8\x00\x00\x00\x00")
    return address


def pe_headers(timestamp, size_of_image):
    """The headers an x64 image has in memory: MZ, PE signature, file header with
    its TimeDateStamp and a PE32+ optional header with SizeOfImage (no sections)."""
    nt = 0x80
    headers = bytearray(0x200)
    headers[0:2] = b"MZ"
    struct.pack_into("<I", headers, 0x3C, nt)
    headers[nt:nt + 4] = b"PE\0\0"
    struct.pack_into("<HHIIIHH", headers, nt + 4, 0x8664, 0, timestamp, 0, 0, 0xF0, 0x22)
    optional = nt + 24
    struct.pack_into("<H", headers, optional, 0x20B)
    struct.pack_into("<II", headers, optional + 56, size_of_image, 0x200)
    struct.pack_into("<I", headers, optional + 108, 16)
    return bytes(headers)


def bugcheck_arguments(code, salt, faulting_ip):
    """Arguments shaped as ``code``'s documentation says: the faulting instruction
    where the code puts it (0xD1: Arg4; 0x7E: Arg2, after the exception code)."""
    if code == 0x7E:
        return (ACCESS_VIOLATION, faulting_ip, 0xFFFFC08000002000 + salt, 0xFFFFC08000003000)
    return (0x10 + salt, 2, 0, faulting_ip)


def crash_scenario(driver="mydrv", function="DispatchIoctl", bugcheck=0xD1, salt=0, stack_readable=True,
                   driver_timestamp=DRIVER_TIMESTAMP):
    """A kernel-mode scenario crashing in ``driver!function`` with bug check ``bugcheck``.
    ``salt`` varies parameters and time so dumps with one signature differ in content."""
    scenario = Scenario(arch="x64", mode="kernel", build=19041 + (salt % 3))
    scenario.add_module("nt", NT_BASE, 0x8000, image="ntoskrnl.exe")
    for name, rva in NT_SYMBOLS.items():
        scenario.add_symbol("nt", name, rva)
    scenario.add_module(driver, DRIVER_BASE, DRIVER_SIZE, image=driver + ".sys",
                        content=pe_headers(driver_timestamp, DRIVER_SIZE))
    for name, rva in DRIVER_FUNCTIONS.items():
        scenario.add_symbol(driver, name, rva)
    stack = scenario.alloc_pages(0x2000)
    rsp = stack + 0x1000
    chain = [_return_address(scenario, "nt", "KiBugCheckDispatch", 0x69),
             _return_address(scenario, "nt", "KiPageFault", 0x43e),
             _return_address(scenario, driver, function, 0x40 + salt % 16),
             _return_address(scenario, "nt", "IofCallDriver", 0x55)]
    slot = rsp + 0x28
    for index, address in enumerate(chain):
        scenario.pack(slot, "<Q", 0xFFFFC08000001000 + index)   # a local that is not code
        scenario.pack(slot + 8, "<Q", address)
        slot += 0x40
    if not stack_readable:
        scenario.unmap(stack, 0x2000)
    scenario.registers = {"rip": scenario.module("nt").base + NT_SYMBOLS["KeBugCheckEx"], "rsp": rsp}
    scenario.bugcheck = (bugcheck,) + bugcheck_arguments(bugcheck, salt, chain[2])
    scenario.system_time = 0x01DB000000000000 + salt * 10000000 * 3600  # one hour apart
    return scenario


APP_BASE = 0x00007FF700000000
NTDLL_BASE = 0x00007FFA00000000


def user_crash_scenario(function="ParseRequest", salt=0):
    """A user-mode process (app.exe, ntdll) whose thread 0x1234 faults in
    ``app!function``; returns (scenario, exception) for write_user_dump."""
    scenario = Scenario(arch="x64", mode="user", build=22621)
    scenario.add_module("app", APP_BASE, 0x8000, image="app.exe")
    for name, rva in {"main": 0x1000, "ParseRequest": 0x2000, "HandleClient": 0x3000}.items():
        scenario.add_symbol("app", name, rva)
    scenario.add_module("ntdll", NTDLL_BASE, 0x8000, image="ntdll.dll")
    scenario.add_symbol("ntdll", "RtlUserThreadStart", 0x1000)
    stack = scenario.alloc_pages(0x2000)
    rsp = stack + 0x1800
    chain = [_return_address(scenario, "app", "HandleClient", 0x30 + salt % 8),
             _return_address(scenario, "app", "main", 0x80),
             _return_address(scenario, "ntdll", "RtlUserThreadStart", 0x21)]
    for index, address in enumerate(chain):
        scenario.pack(rsp + 0x38 + 0x30 * index, "<Q", address)
    rip = scenario.module("app").base + scenario.module_symbols["app"].symbols[function] + 0x11
    registers = {"rip": rip, "rsp": rsp}
    scenario.threads.append(Thread(0x1234, teb=0, stack_base=stack, stack_size=0x2000, registers=registers))
    scenario.system_time = 0x01DB000000000000 + salt * 10000000 * 3600
    exception = {"thread_id": 0x1234, "code": ACCESS_VIOLATION, "address": rip, "parameters": [0, 0x10 + salt]}
    return scenario, exception


def write_user_dump(scenario_and_exception, path):
    scenario, exception = scenario_and_exception
    write_minidump(scenario, str(path), exception=exception)
    scenario.write_symbols(str(path) + ".symbols")
    return str(path)


def write_dump(scenario, path, dump_type=None, symbols=True):
    """The dump and (unless not ``symbols``) its ISF symbols in ``<dump>.symbols/``
    (where dbgext.open looks)."""
    write_kernel_dump(scenario, str(path), dump_type=dump_type)
    if symbols:
        scenario.write_symbols(str(path) + ".symbols")
    return str(path)


def write_triage_directory(directory, hang=True, explode=False):
    """A directory of dumps covering what triage must handle; returns
    {name: (path, expectation)} where expectation is ("ok", bugcheck, signature)
    or ("failed", reason fragment)."""
    directory = str(directory)
    os.makedirs(directory, exist_ok=True)
    made = {}

    def add(name, scenario, expectation, dump_type=None):
        made[name] = (write_dump(scenario, os.path.join(directory, name), dump_type), expectation)

    add("a1.dmp", crash_scenario("mydrv", "DispatchIoctl", 0xD1, salt=1), ("ok", 0xD1, "mydrv!DispatchIoctl"))
    add("a2.dmp", crash_scenario("mydrv", "DispatchIoctl", 0xD1, salt=2), ("ok", 0xD1, "mydrv!DispatchIoctl"))
    add("a3-bitmap.dmp", crash_scenario("mydrv", "DispatchIoctl", 0xD1, salt=3), ("ok", 0xD1, "mydrv!DispatchIoctl"),
        dump_type=5)
    add("b1.dmp", crash_scenario("netdrv", "ProcessPacket", 0x7E, salt=4), ("ok", 0x7E, "netdrv!ProcessPacket"))
    add("live.dmp", crash_scenario("netdrv", "CompleteRequest", 0x161, salt=5),
        ("ok", 0x161, "netdrv!CompleteRequest"), dump_type=DUMP_TYPE_LIVE)
    os.makedirs(os.path.join(directory, "nested"), exist_ok=True)
    add(os.path.join("nested", "b2.dmp"), crash_scenario("netdrv", "ProcessPacket", 0x7E, salt=6),
        ("ok", 0x7E, "netdrv!ProcessPacket"))

    for salt in (1, 2):
        name = "app-%d.mdmp" % salt
        path = write_user_dump(user_crash_scenario(salt=salt), os.path.join(directory, name))
        made[name] = (path, ("ok", ACCESS_VIOLATION, "app!ParseRequest"))

    corrupt = os.path.join(directory, "corrupt.dmp")
    with open(corrupt, "wb") as handle:
        handle.write(b"PAGEDU64" + b"\xff" * 0x3000)
    made["corrupt.dmp"] = (corrupt, ("failed", "cannot open dump"))

    truncated = os.path.join(directory, "truncated.dmp")
    whole = write_dump(crash_scenario("mydrv", "DispatchIoctl", 0xD1, salt=7), truncated)
    with open(whole, "r+b") as handle:
        handle.truncate(os.path.getsize(whole) // 2)
    made["truncated.dmp"] = (truncated, ("failed", "truncated"))

    if hang:
        add("hang.dmp", crash_scenario("mydrv", "ProcessPacket", HANG_BUGCHECK, salt=8), ("failed", "timed out"))
    if explode:
        add("explode.dmp", crash_scenario("mydrv", "ProcessPacket", EXPLODE_BUGCHECK, salt=9),
            ("failed", "test-explode: RuntimeError"))
    with open(os.path.join(directory, "notes.txt"), "w") as handle:
        handle.write("not a dump: triage skips it inside directories\n")
    return made


# -- test-only analyses ---------------------------------------------------------------

def _bugcheck_code(target):
    bugcheck = (target.info() or {}).get("bugcheck") or [0]
    return bugcheck[0]


def summarize_or_hang(target):
    if _bugcheck_code(target) == HANG_BUGCHECK:
        time.sleep(3600)
    return {"checked": True}


def summarize_or_explode(target):
    if _bugcheck_code(target) == EXPLODE_BUGCHECK:
        raise RuntimeError("analysis bug on purpose")
    return {"checked": True, "problems": [Problem("test_problem", 0x1000, "test problem", "warning")]}


def summarize_slowly(target):
    time.sleep(SLOW_SECONDS)
    markers = os.environ.get("TRIAGE_TEST_MARKERS")
    if markers:
        with open(os.path.join(markers, "%d-%d" % (os.getpid(), time.time() * 1e6)), "w"):
            pass
    return {"slept": SLOW_SECONDS}


TEST_ANALYSES = ("test-hang", "test-explode", "test-slow")


def register_test_analyses():
    register_analysis("test-hang", summarize_or_hang, description="hangs on HANG_BUGCHECK dumps")
    register_analysis("test-explode", summarize_or_explode, description="raises on EXPLODE_BUGCHECK dumps")
    register_analysis("test-slow", summarize_slowly, description="sleeps, leaves a marker file")
