"""Scenarios and third-party oracles for the dump writer/backend tests.

The oracles are kdmp-parser (kernel dumps) and the ``minidump`` package
(minidumps): independent parsers, so a mistake shared by our writer and our
reader cannot pass unnoticed.
"""

import os
import random
import struct

from dbgext.layouts.dump_formats import DUMP_HEADER64, PAGE_SIZE
from dbgext.sample.scenario import Scenario, Thread
from requirements import need_module

KERNEL_POOL = 0xFFFFC08000000000
NT_BASE = 0xFFFFF80000000000          # 2 MiB-aligned and fully mapped: one large page
DRIVER_BASE = 0xFFFFF80012340000
USER_BLOB = 0x00007FF712340FF0        # crosses a page boundary
UNMAPPED_KERNEL = 0xFFFFF80020000000
NON_CANONICAL = 0x0000900000000000


def random_bytes(rng, size):
    """``size`` reproducible random bytes from ``rng`` (random.Random)."""
    return rng.getrandbits(8 * size).to_bytes(size, "little") if size else b""


def kernel_scenario(seed=1, blobs=24):
    """A kernel-mode scenario: nt (large-page sized), a driver, random blobs of
    1 B .. 12 KiB in pool and user space (some crossing pages), a hole."""
    rng = random.Random(seed)
    s = Scenario("x64", "kernel", build=19045)
    s.add_module("nt", NT_BASE, 0x200000, image="ntoskrnl.exe", content=random_bytes(rng, 2 * PAGE_SIZE))
    s.add_module("mydrv", DRIVER_BASE, 0x6000, image="mydrv.sys", content=b"MZ" + bytes(0x3E))
    s.add_symbol("nt", "KeBugCheckEx", 0x1230)
    for index in range(blobs):
        size = rng.choice([1, 8, 100, 0xFFF, 0x1001, 0x3000])
        address = s.alloc(size, align=rng.choice([1, 8, 16]))
        s.write(address, random_bytes(rng, size))
        if index % 6 == 5:
            s.alloc_pages(PAGE_SIZE)  # leave unmapped guard gaps between blobs
    s.write(USER_BLOB, random_bytes(rng, 0x40))
    hole = s.alloc_pages(3 * PAGE_SIZE)
    s.write(hole, b"\x11" * 3 * PAGE_SIZE)
    s.unmap(hole + PAGE_SIZE, PAGE_SIZE)
    s.registers = {"rip": NT_BASE + 0x1230, "rsp": KERNEL_POOL + 0x800, "rbp": KERNEL_POOL + 0x900,
                   "rax": 0x1122334455667788, "r15": 0xF, "efl": 0x40246}
    s.bugcheck = (0xE2, 0x1, 0x2, 0x3, 0x4)
    return s


def user_scenario(arch="x64", seed=2, blobs=16):
    """A user-mode scenario with two modules, random blobs and two threads."""
    rng = random.Random(seed)
    s = Scenario(arch, "user", build=22621)
    exe_base, dll_base = (0x7FF612340000, 0x7FFB00000000) if arch == "x64" else (0x400000, 0x77000000)
    s.add_module("app", exe_base, 0x5000, image="app.exe", content=b"MZ\x90\x00")
    s.add_module("ntdll", dll_base, 0x3000, image="ntdll.dll", content=b"MZ\x90\x00")
    for _ in range(blobs):
        size = rng.choice([1, 8, 100, 0xFFF, 0x1001, 0x2800])
        address = s.alloc(size, align=rng.choice([1, 8, 16]))
        s.write(address, random_bytes(rng, size))
    pc, sp = ("rip", "rsp") if arch == "x64" else ("eip", "esp")
    for thread_id in (0x1A0, 0x1A4):
        stack = s.alloc_pages(0x2000)
        s.write(stack + 0x1F00, random_bytes(rng, 0x100))
        s.threads.append(Thread(thread_id, 0, stack, 0x2000,
                                {pc: exe_base + 0x1000 + thread_id, sp: stack + 0x1F00}))
    return s


def header_u64(path, field):
    with open(path, "rb") as handle:
        handle.seek(DUMP_HEADER64[field])
        return struct.unpack("<Q", handle.read(8))[0]


def open_kdmp(path):
    """kdmp-parser on a dump whose size matches its header.  kdmp-parser maps the
    file and dies with SIGBUS on a truncated one, so check before opening.  The
    calling test is skipped when kdmp-parser is not installed."""
    kdmp_parser = need_module("kdmp_parser", "kdmp-parser")
    assert os.path.getsize(path) == header_u64(path, "RequiredDumpSpace"), "truncated dump"
    return kdmp_parser.KernelDumpParser(path)


def kdmp_read(dump, address, size):
    """Bytes at a virtual address through kdmp-parser (page by page), or None if
    any page is unreadable."""
    out = bytearray()
    while size > 0:
        page = dump.read_virtual_page(address)
        if page is None:
            return None
        within = address & (PAGE_SIZE - 1)
        span = min(PAGE_SIZE - within, size)
        out += page[within:within + span]
        address += span
        size -= span
    return bytes(out)


def minidump_reader(path):
    """The ``minidump`` package's parse of ``path``; the calling test is skipped
    when the package is not installed."""
    return need_module("minidump.minidumpfile", "minidump").MinidumpFile.parse(path)


def minidump_read(reader, address, size):
    """Bytes through the ``minidump`` package's reader, or None.  It raises a bare
    Exception for unmapped addresses and reads that cross a range boundary."""
    try:
        return reader.read(address, size)
    except Exception:  # the package's only error type
        return None


def probe_addresses(scenario, rng, count=200):
    """Addresses worth reading: inside mapped pages (often near page ends), in the
    unmapped gaps next to them, and far away."""
    pages = sorted(scenario.pages)
    addresses = []
    for _ in range(count):
        page = rng.choice(pages)
        kind = rng.random()
        if kind < 0.6:
            addresses.append(page + rng.randrange(PAGE_SIZE))
        elif kind < 0.8:
            addresses.append(page + PAGE_SIZE - rng.randrange(1, 16))
        else:
            addresses.append(page + rng.choice([-PAGE_SIZE, PAGE_SIZE, 0x10 * PAGE_SIZE]) + rng.randrange(64))
    return [a for a in addresses if 0 <= a < 1 << 64]


def scenario_bytes(scenario, address, size):
    """What the scenario holds at [address, address+size), or None if any page is absent."""
    page = address & ~(PAGE_SIZE - 1)
    while page < address + size:
        if page not in scenario.pages or page in scenario.excluded_pages:
            return None
        page += PAGE_SIZE
    return scenario.read(address, size)


def kdmp_loaded_modules(dump):
    """(base, size, file name) of each PsLoadedModuleList entry, read through
    kdmp-parser: the oracle for dbgext's own module walk."""
    head = dump.header.PsLoadedModuleList
    modules = []
    entry = struct.unpack("<Q", kdmp_read(dump, head, 8))[0]
    while entry != head and len(modules) < 100:
        base, = struct.unpack("<Q", kdmp_read(dump, entry + 0x30, 8))
        size, = struct.unpack("<I", kdmp_read(dump, entry + 0x40, 4))
        length, _, buffer = struct.unpack("<HHxxxxQ", kdmp_read(dump, entry + 0x58, 16))
        modules.append((base, size, kdmp_read(dump, buffer, length).decode("utf-16-le")))
        entry = struct.unpack("<Q", kdmp_read(dump, entry, 8))[0]
    return modules


# -- small memory dumps (DumpType 4) ----------------------------------------------------------

KDBG_ADDRESS = 0xFFFFF80000C00000
KI_PROCESSOR_BLOCK = 0xFFFFF80000D00000
PRCB_ADDRESS = 0xFFFFF80000F00180
THREAD_ADDRESS = 0xFFFFC08000100080
PROCESS_ADDRESS = 0xFFFFC08000200040
STACK_POINTER = 0xFFFFD00000007D28     # mid-page, as a real stack pointer is
STACK_BYTES = 0x22D8                   # up to the thread's InitialStack
DATA_PAGE = 0xFFFFC08000300000
FAULT_BLOCK = 0xFFFFC08000400FF0       # a data block crossing a page boundary
# Windows 10 19041 x64 offsets, as KDDEBUGGER_DATA64 publishes them.
SMALL_DUMP_OFFSETS = {
    "KernBase": NT_BASE, "PsLoadedModuleList": NT_BASE + 0x2A0, "PsActiveProcessHead": NT_BASE + 0x2B0,
    "KiProcessorBlock": KI_PROCESSOR_BLOCK, "MmUnloadedDrivers": NT_BASE + 0x2C0,
    "OffsetKThreadNextProcessor": 0x218, "OffsetKThreadTeb": 0xF0, "OffsetKThreadKernelStack": 0x58,
    "OffsetKThreadInitialStack": 0x28, "OffsetKThreadApcProcess": 0xB8, "OffsetKThreadState": 0x184,
    "SizeEProcess": 0x880, "OffsetEprocessPeb": 0x550, "OffsetEprocessParentCID": 0x540,
    "OffsetEprocessDirectoryTableBase": 0x28, "SizePrcb": 0x700, "OffsetPrcbCurrentThread": 0x8,
    "OffsetPrcbNumber": 0x24, "SizeEThread": 0x500, "OffsetPrcbContext": 0x1C0, "OffsetKThreadStackLimit": 0x30,
    "OffsetKThreadStackBase": 0x38, "OffsetPrcbIdleThread": 0x18, "OffsetKThreadWaitReason": 0x283,
}


def small_dump(seed=41):
    """A small dump with every part of §1.3a: stack, data page, two data blocks
    (one holding KiProcessorBlock), KDDEBUGGER_DATA64, the KPRCB/ETHREAD/EPROCESS
    copies pointing at each other, three drivers, two unloaded drivers and the Mm
    information."""
    from dbgext.sample.kdump_writer import KernelDumpHeader, pack_debugger_data
    from triage_writer import SmallDump
    rng = random.Random(seed)
    registers = {"rip": DRIVER_BASE + 0x1234, "rsp": STACK_POINTER, "rbp": STACK_POINTER + 0x80,
                 "rax": 0xC0FFEE, "efl": 0x40286}
    header = KernelDumpHeader(build=19041, bugcheck=(0xD1, 0xFFFFC08000400FF8, 2, 0, DRIVER_BASE + 0x1234),
                              registers=registers, system_time=0x01DB3A1B2C3D4E5F,
                              kd_debugger_data_block=KDBG_ADDRESS, processors=4)
    dump = SmallDump(header)
    dump.service_pack_build = 0x100
    offsets = SMALL_DUMP_OFFSETS
    dump.debugger_data = pack_debugger_data(offsets)
    prcb = bytearray(random_bytes(rng, offsets["SizePrcb"]))
    struct.pack_into("<Q", prcb, offsets["OffsetPrcbCurrentThread"], THREAD_ADDRESS)
    struct.pack_into("<H", prcb, offsets["OffsetPrcbNumber"], 2)
    thread = bytearray(random_bytes(rng, offsets["SizeEThread"]))
    struct.pack_into("<Q", thread, offsets["OffsetKThreadApcProcess"], PROCESS_ADDRESS)
    struct.pack_into("<Q", thread, offsets["OffsetKThreadInitialStack"], STACK_POINTER + STACK_BYTES)
    struct.pack_into("<Q", thread, offsets["OffsetKThreadStackLimit"], STACK_POINTER + STACK_BYTES - 0x6000)
    dump.prcb, dump.thread = bytes(prcb), bytes(thread)
    dump.process = random_bytes(rng, offsets["SizeEProcess"])
    dump.stack = (STACK_POINTER, random_bytes(rng, STACK_BYTES))
    dump.data_page = (DATA_PAGE, random_bytes(rng, PAGE_SIZE))
    processor_block = struct.pack("<4Q", 0xFFFFF80000E00180, 0xFFFFF80001E00180, PRCB_ADDRESS, 0)
    dump.data_blocks = [(KI_PROCESSOR_BLOCK, processor_block), (FAULT_BLOCK, random_bytes(rng, 0x40))]
    dump.drivers = [("ntoskrnl.exe", NT_BASE, 0x200000, 0x5E2B8A3C, 0xA1B2C3),
                    ("mydrv.sys", DRIVER_BASE, 0x6000, 0x61000001, 0x1234),
                    ("ACPI.sys", 0xFFFFF80012400000, 0x8A000, 0x5F00AA00, 0x8C3D1)]
    dump.broken_driver = 1
    dump.unloaded_drivers = [("oldfilter.sys", 0xFFFFF80013000000, 0xFFFFF80013010000),
                             ("averyveryverylongname.sys", 0xFFFFF80014000000, 0xFFFFF80014002000)]
    dump.mm = {"Version": 1, "Size": 0x50, "MmSpecialPoolTag": 0x6C6F6F50, "MiTriageActionTaken": 0,
               "MmVerifyDriverLevel": 0, "KernelVerifier": 0, "MmMaximumNonPagedPool": 0x80000000,
               "MmAllocatedNonPagedPool": 0x1234, "PagedPoolMaximum": 0x40000000, "PagedPoolAllocated": 0x5678,
               "CommittedPages": 0x9ABC, "CommittedPagesPeak": 0xDEF0, "CommitLimitMaximum": 0x100000}
    return dump
