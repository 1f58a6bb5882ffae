"""Scenarios with ETW loggers and stack caches, and stack streams for the tests."""

import io
import json
import random

from dbgext.cli import main
from dbgext.etwcache import fixtures
from dbgext.sample.scenario import Scenario

NT_BASE = 0xFFFFF80000000000
DRIVER_BASE = 0xFFFFF80012340000
USER_BASE = 0x00007FF700000000


def kernel_scenario(build=19041):
    scenario = Scenario("x64", "kernel", build=build)
    scenario.add_module("nt", NT_BASE, 0x100000, image="ntoskrnl.exe")
    scenario.add_module("mydrv", DRIVER_BASE, 0x8000, image="mydrv.sys")
    scenario.add_symbol("nt", "KiSystemCall64", 0x9000)
    scenario.add_symbol("mydrv", "DispatchIoctl", 0x1400)
    return scenario


def random_stacks(count, distinct, seed=1, max_depth=70, user=False):
    """``count`` references to ``distinct`` kernel stacks (skewed: low ids hot)."""
    rng = random.Random(seed)
    pool = []
    for _ in range(distinct):
        depth = rng.randint(1, max_depth)
        base = USER_BASE if user else NT_BASE
        pool.append([base + rng.randrange(0x1000, 0x100000, 4) for _ in range(depth)])
    return [pool[min(int(rng.expovariate(4.0 / distinct)), distinct - 1)] for _ in range(count)]


def scenario_with_cache(stacks, variant="B", bucket_count=7, total_pieces=40, with_types=True,
                        logger_id=3, build=19041):
    """(scenario, context, builder) with one logger whose cache was fed ``stacks``."""
    scenario = kernel_scenario(build)
    context, builder = fixtures.add_logger_with_cache(
        scenario, stacks, logger_id=logger_id, name="Test Logger", bucket_count=bucket_count,
        total_pieces=total_pieces, variant=variant, with_types=with_types)
    return scenario, context, builder


def run(argv, target=None):
    """(exit code, text) of ``dbgext argv``."""
    stream = io.StringIO()
    code = main(argv, stream=stream, target=target)
    return code, stream.getvalue()


def run_json(argv, target=None):
    code, text = run(argv + ["--json"], target)
    return code, json.loads(text)


def walked_state(state):
    """{bucket: [frames tuples, MRU first]} of a walked cache (non-empty buckets)."""
    return {index: [tuple(entry.frames) for entry in bucket] for index, bucket in enumerate(state.buckets)
            if bucket}
