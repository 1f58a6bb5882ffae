"""Benchmark: commands on kernel dumps whose page tables are garbage, side by side
with the same commands on the clean dump (the anchor), plus what reading the
file with positioned reads costs next to an mmap.

Builds one kernel bitmap dump with ``--mib`` MiB of pool (4 KiB pages, so there
are page tables to break), then variants of it with broken page-table pages:
0xFF-filled PDPT, PD and PT pages, four 0xFF pages at once, a PD of random
bytes, a PDPT whose 512 entries each map a 1 GiB page over all of physical
memory, and a PDPT/PD hanging one table under every entry.  Each command runs
in-process through ``dbgext.cli.main`` on a freshly opened dump; the table
shows CPU seconds per command and the ratio to the clean dump.  Issue 16's goal:
every ratio <= 2.

    python scripts/bench_pagetables.py [--mib 64] [--repeat 3] [--keep DIR]
"""

import argparse
import io
import mmap
import os
import random
import shutil
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dbgext.cli import load_commands, main  # noqa: E402
from dbgext.sample.kdump_writer import (  # noqa: E402
    KernelDumpHeader, build_physical_memory, write_physical_dump)
from dbgext.sample.scenario import Scenario  # noqa: E402

PAGE = 0x1000
POOL = 0xFFFFC08000000000
NT_BASE = 0xFFFFF80000000000
COMMANDS = [
    ("lm", ["lm"]),
    ("db", ["db", "%x" % (POOL + 0x1230), "L80"]),
    ("dps @rsp", ["dps", "@rsp", "L20"]),
    ("dumpinfo", ["dumpinfo"]),
    ("rtltrace --find", ["rtltrace", "--find"]),
    ("ipt scan", ["ipt", "scan"]),
    ("triage", ["triage", "--json"]),
]
clock = time.process_time  # CPU time: the machine is shared


def build_memory(mib):
    scenario = Scenario("x64", "kernel", build=19045)
    scenario.add_module("nt", NT_BASE, 0x200000, image="ntoskrnl.exe", content=b"MZ" + bytes(0x3E))
    region = scenario.alloc_pages(mib << 20)
    rng = random.Random(16)
    for offset in range(0, mib << 20, 1 << 20):
        scenario.write(region + offset, rng.getrandbits(8 << 20).to_bytes(1 << 20, "little"))
    scenario.build_loaded_module_list()
    scenario.registers = {"rip": NT_BASE + 0x1000, "rsp": region + 0x800}
    pages = dict((va, bytes(data)) for va, data in scenario.pages.items())
    physical, dtb = build_physical_memory(pages, large_pages=False)
    return scenario, physical, dtb, region


def tables_toward(physical, dtb, va):
    path = [dtb]
    for shift in (39, 30, 21):
        entry = struct.unpack_from("<Q", physical[path[-1]], ((va >> shift) & 0x1FF) * 8)[0]
        if not entry & 1 or entry & 0x80:
            break
        path.append(entry & 0x000FFFFFFFFFF000)
    return path


def variants(physical, dtb, region):
    pml4, pdpt, pd, pt = tables_toward(physical, dtb, region)
    rng = random.Random(7)
    tables = sorted(pa for pa in physical if pa < 0x1000000 and pa != dtb)
    ff = b"\xff" * PAGE
    return [
        ("clean", {}),
        ("0xFF PDPT", {pdpt: ff}),
        ("0xFF PD", {pd: ff}),
        ("0xFF PT", {pt: ff}),
        ("four 0xFF pages", dict((pa, ff) for pa in tables[:4])),
        ("random PD", {pd: rng.getrandbits(8 * PAGE).to_bytes(PAGE, "little")}),
        ("PDPT of 1 GiB aliases", {pdpt: struct.pack("<Q", 0x83) * 512}),
        ("one table under every entry", {pdpt: struct.pack("<Q", pd | 0x63) * 512,
                                         pd: struct.pack("<Q", pt | 0x63) * 512}),
    ]


def write_variant(directory, name, scenario, physical, dtb, changes):
    changed = dict(physical)
    changed.update(changes)
    header = KernelDumpHeader(directory_table_base=dtb, build=19045, registers=scenario.registers,
                              ps_loaded_module_list=scenario.ps_loaded_module_list)
    path = os.path.join(directory, name.replace(" ", "_") + ".dmp")
    return write_physical_dump(path, changed, header, 5)


def available(command):
    """True when ``command`` is registered and imports (checkouts under work may lack one)."""
    try:
        return any(declared.name == command for declared in load_commands(only=command))
    except ImportError:
        return False


def time_command(argv, path, repeat):
    best = None
    code = None
    for _ in range(repeat):
        start = clock()
        code = main(argv + ["--dump", path], stream=io.StringIO(), error_stream=io.StringIO())
        elapsed = clock() - start
        best = elapsed if best is None else min(best, elapsed)
    return best, code


def pread_cost(path, seconds=1.0):
    """4 KiB reads/s at random page offsets of ``path``: pread, seek+read, mmap slice."""
    size = os.path.getsize(path)
    offsets = [random.Random(3).randrange(size // PAGE) * PAGE for _ in range(4096)]
    results = {}
    with open(path, "rb") as handle:
        fd = handle.fileno()
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)

        def with_pread(offset):
            return os.pread(fd, PAGE, offset)

        def with_seek(offset):
            handle.seek(offset)
            return handle.read(PAGE)

        def with_mmap(offset):
            return mapped[offset:offset + PAGE]

        for name, read in (("pread", with_pread), ("seek+read", with_seek), ("mmap slice", with_mmap)):
            done, start = 0, clock()
            while clock() - start < seconds:
                for offset in offsets:
                    read(offset)
                done += len(offsets)
            results[name] = done / (clock() - start)
        mapped.close()
    return results


def main_bench():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB of pool in the dump (default 64)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per command; the best is kept (default 3)")
    parser.add_argument("--keep", metavar="DIR", help="write the dumps here and keep them")
    args = parser.parse_args()
    directory = args.keep or tempfile.mkdtemp(prefix="bench_pagetables_")
    os.makedirs(directory, exist_ok=True)
    commands = [(name, argv) for name, argv in COMMANDS if available(argv[0])]
    try:
        scenario, physical, dtb, region = build_memory(args.mib)
        dumps = [(name, write_variant(directory, name, scenario, physical, dtb, changes))
                 for name, changes in variants(physical, dtb, region)]
        print("kernel bitmap dump, %d MiB of pool, %d pages; CPU seconds (best of %d), ratio to clean"
              % (args.mib, len(physical), args.repeat))
        clean = {}
        header = "%-30s" % "dump" + "".join("%24s" % name for name, _ in commands)
        print(header)
        worst = 0.0
        for dump_name, path in dumps:
            cells = []
            for name, argv in commands:
                seconds, code = time_command(argv, path, args.repeat)
                if dump_name == "clean":
                    clean[name] = seconds
                    cells.append("%10.3f s rc=%d      " % (seconds, code))
                else:
                    ratio = seconds / max(clean[name], 1e-3)
                    worst = max(worst, ratio)
                    cells.append("%10.3f s x%-5.2f rc=%d" % (seconds, ratio, code))
            print("%-30s" % dump_name + "".join("%24s" % cell for cell in cells))
        print("worst ratio to the clean dump: x%.2f (goal: <= 2)" % worst)
        rates = pread_cost(dumps[0][1])
        print("4 KiB reads/s at random offsets: " + ", ".join("%s %.0f k" % (name, value / 1000)
                                                           for name, value in rates.items()))
        print("pread costs %.2f us more per 4 KiB page than an mmap slice"
              % (1e6 / rates["pread"] - 1e6 / rates["mmap slice"]))
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main_bench()
