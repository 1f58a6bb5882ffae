"""Benchmark: the stack unwinder (dbgext.stacks) against the return-address scan it
replaces (the anchor: what triage's faulting-thread signature and stackuse's
fallback did — every stack slot above SP that points just after a call in a
loaded module is a frame), side by side on the same threads.

Two things are measured:

* **frames per second** — every input thread walked repeatedly by the unwinder
  (warm: one Unwinder per target, unwind data loaded once; cold: a new Unwinder
  per walk, images read each time) and by the scan;
* **where frames came from** — per input, the unwinder's frames by ``found_by``
  (context / unwind / frame_chain / scan) next to the scan's frames, and how
  many of the scan's frames the unwinder did not find (stale return addresses).

Inputs: the ``dbgext sample`` kernel dump; the triage tests' kernel and user
dumps; and, when MinGW/clang and Unicorn are installed, the executed stacks of
the unwinder's tests (tests/data/stacks) plus a 250-frame recursion.

    python scripts/bench_unwind.py [--seconds S]
"""

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from dbgext.sample import write_sample  # noqa: E402
from dbgext.stacks import Unwinder  # noqa: E402
from dbgext.stacks.images import Images  # noqa: E402
from dbgext.stacks.scan import ReturnAddresses, scan_for_return  # noqa: E402
from dbgext.stackuse.fixtures import Function, alloc_slots, build_pe, push_slot  # noqa: E402
from dbgext.target import open_dump  # noqa: E402
from dbgext.sample.scenario import Scenario  # noqa: E402
from dbgext.problems import ProblemLog  # noqa: E402

SCAN_FRAMES = 64  # the scan's frame cap for the comparison (triage kept 8)
SCAN_SPAN = 0x2000  # bytes above SP the old triage scan read (1024 slots)


def scan_all(target, thread):
    """The anchor: the context's pc, then every plausible return address in the
    SCAN_SPAN bytes above its SP (at most SCAN_FRAMES)."""
    ip_name, sp_name = ("rip", "rsp") if target.arch == "x64" else ("eip", "esp")
    ip, sp = thread.registers.get(ip_name), thread.registers.get(sp_name)
    returns = ReturnAddresses(target, Images(target, ProblemLog()))
    frames = [ip]
    top = sp + SCAN_SPAN
    while len(frames) < SCAN_FRAMES:
        found = scan_for_return(target, returns, sp, top, target.pointer_size)
        if found is None:
            break
        frames.append(found[1])
        sp = found[0] + target.pointer_size
    return frames


def sample_dump(directory):
    return "dbgext sample", open_dump(write_sample(os.path.join(directory, "sample")))


def triage_dumps(directory):
    from triage_support import crash_scenario, user_crash_scenario, write_dump, write_user_dump
    kernel = os.path.join(directory, "triage-kernel.dmp")
    write_dump(crash_scenario(), kernel)
    user = os.path.join(directory, "triage-user.mdmp")
    write_user_dump(user_crash_scenario(), user)
    return [("triage kernel dump", open_dump(kernel)), ("triage user dump", open_dump(user))]


def executed_stacks():
    """The unwinder tests' executed stacks (skipped without compilers or Unicorn)."""
    try:
        import stacks_support
        import unicorn  # noqa: F401
    except ImportError:
        return []
    inputs = []
    for config in stacks_support.CONFIGS:
        for label, options in (("chain", {"stop_at": "leaf"}),
                               ("interrupt", {"stop_at": "leaf", "interrupt_at": ("touch", 0)})):
            try:
                stopped = stacks_support.run(config, "entry", 5, **options)
            except Exception as error:  # a compiler missing: pytest.skip raises its own exception type
                print("executed stacks skipped: %s" % error)
                return inputs
            inputs.append(("%s %s" % (config, label), stopped.scenario(bounds=False).target()))
        stopped = stacks_support.run(config, "stale", 5, stop_at="leaf", hit=2)
        inputs.append(("%s stale" % config, stopped.scenario(bounds=False).target()))
    return inputs


def recursion(depth=250):
    """A thread 250 frames deep in a function with pushes and an allocation."""
    body = [b"\x53", b"\x56", b"\x48\x83\xec\x28", ("call", "Recurse"), b"\x48\x83\xc4\x28", b"\x5e", b"\x5b",
            b"\xc3"]
    built = build_pe("x64", [Function("Recurse", body, {"prolog_size": 6, "slots": alloc_slots(6, 0x28)
                                                        + push_slot(2, 6) + push_slot(1, 3)})],
                     image_base=0xFFFFF80123400000, name="recurse.sys")
    scenario = Scenario("x64", "kernel")
    scenario.add_module("recurse", 0xFFFFF80123400000, built.size, image="recurse.sys", content=built.data)
    scenario.add_symbol("recurse", "Recurse", built.rvas["Recurse"])
    stack = scenario.alloc_pages(0x10000)
    return_address = 0xFFFFF80123400000 + built.rvas["Recurse"] + 11
    sp = stack + 0x100
    for _ in range(depth):
        scenario.write_pointer(sp + 0x38, return_address)
        sp += 0x40
    scenario.registers.update({"rip": return_address, "rsp": stack + 0x100})
    return "recursion x%d" % depth, scenario.target()


def rate(walk, seconds):
    """(frames per second, frames per walk) of calling ``walk`` for ``seconds``."""
    frames = walk()
    count, started = 0, time.perf_counter()
    while True:
        walk()
        count += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            return frames * count / elapsed, frames


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="time per measurement (default 0.5)")
    args = parser.parse_args(argv)
    directory = tempfile.mkdtemp(prefix="bench-unwind-")
    inputs = [sample_dump(directory)] + triage_dumps(directory) + executed_stacks() + [recursion()]

    print("%-24s %6s %6s %6s %6s | %6s %6s %6s | %10s %10s %10s" % (
        "input", "ctx", "unwind", "chain", "scan", "scan*", "stale", "missed", "warm f/s", "cold f/s", "scan f/s"))
    totals = {"after": {}, "before_frames": 0, "stale": 0, "missed": 0}
    for label, target in inputs:
        unwinder = Unwinder(target)
        result = unwinder.walk()
        counts = result.found_by_counts
        thread = target.thread
        scanned = scan_all(target, thread) if thread is not None else []
        real = set(frame.ip for frame in result.frames)
        stale = sum(1 for address in scanned if address not in real)
        missed = len(real - set(scanned))
        warm, _ = rate(lambda: len(unwinder.walk().frames), args.seconds)
        cold, _ = rate(lambda: len(Unwinder(target).walk().frames), args.seconds)
        scan_rate, _ = rate(lambda: len(scan_all(target, thread)), args.seconds) if thread is not None else (0.0, 0)
        print("%-24s %6d %6d %6d %6d | %6d %6d %6d | %10.0f %10.0f %10.0f" % (
            label, counts["context"], counts["unwind"], counts["frame_chain"], counts["scan"], len(scanned),
            stale, missed, warm, cold, scan_rate))
        for how, number in counts.items():
            totals["after"][how] = totals["after"].get(how, 0) + number
        totals["before_frames"] += len(scanned)
        totals["stale"] += stale
        totals["missed"] += missed
        target.close()
    print("")
    print("after (unwinder): %s" % ", ".join("%s %d" % item for item in sorted(totals["after"].items())))
    print("before (scan): %d frames, all by scanning; %d of them not real frames (stale or data), %d real "
          "frames missed" % (totals["before_frames"], totals["stale"], totals["missed"]))
    print("scan* = the scan's frames (context pc included); stale = scan frames the unwinder did not find; "
          "missed = unwinder frames the scan did not find (capped at %d frames)" % SCAN_FRAMES)


if __name__ == "__main__":
    main()
