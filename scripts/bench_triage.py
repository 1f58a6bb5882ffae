"""Benchmark: triage throughput (dumps per minute) with 1 and 2 local workers, and
the per-dump overhead beyond the analyses themselves.

    python scripts/bench_triage.py [--dumps 100] [--workers 1,2] [--keep DIR]

The dumps are the bundled sample kernel dump (one of everything every analysis
looks for, ~1.5 MB) written N times with a different bug-check parameter each, so
every file has its own content hash.  Figures printed:

* dumps/min per worker count, wall clock for the whole batch (planning, hashing,
  pool start, analyses, DuckDB commits);
* analysis seconds per dump: the sum of the analyses' own timings in the records;
* hash and signature seconds per dump: the worker's whole-file SHA-256 and the
  faulting frame (unwind, symbols, image identity), from the records' timings;
* overhead per dump = wall x workers / dumps - analysis - hash - signature seconds
  per dump: what a worker spends per dump outside them (open, identity, IPC, pool
  start-up amortised; the parent's commits overlap with it);
* in-process costs: hashing one file, opening it + identity + signature (no
  analyses), and one DuckDB commit;
* the re-run, where every file is known by path, size and times (not read again).
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dbgext  # noqa: E402
from dbgext.sample import build_sample_scenario  # noqa: E402
from dbgext.sample.kdump_writer import write_kernel_dump  # noqa: E402
from dbgext.triage.record import build_record, content_hash, load_plugins, select_analyses  # noqa: E402
from dbgext.triage.run import run_batch  # noqa: E402
from dbgext.triage.store import TriageStore  # noqa: E402


def write_dumps(directory, count):
    scenario, _manifest = build_sample_scenario()
    code, p1, p2, p3, p4 = scenario.bugcheck
    paths = []
    for index in range(count):
        scenario.bugcheck = (code, p1, p2 + index, p3, p4)
        path = os.path.join(directory, "dump%03d.dmp" % index)
        write_kernel_dump(scenario, path)
        if index == 0:
            scenario.write_symbols(os.path.join(directory, "symbols"))  # shared: symbols/ beside the dumps
        paths.append(path)
    return paths


def mean_time(action, repeat):
    started = time.perf_counter()
    for _ in range(repeat):
        action()
    return (time.perf_counter() - started) / repeat


def in_process_costs(paths):
    load_plugins()
    sample = paths[:10]
    hashing = mean_time(lambda: [content_hash(p) for p in sample], 3) / len(sample)

    def open_and_identify():
        for path in sample:
            target = dbgext.open(path)
            build_record(target, path, 0, "x", analyses=[])
            target.close()
    framework = mean_time(open_and_identify, 3) / len(sample)
    target = dbgext.open(sample[0])
    record = build_record(target, sample[0], os.path.getsize(sample[0]), "bench", analyses=select_analyses())
    target.close()
    with TriageStore(":memory:") as store:
        keys = iter(range(10 ** 6))

        def commit():
            record.hash = "bench-%d" % next(keys)
            store.add(record)
        commit_seconds = mean_time(commit, 50)
    return hashing, framework, commit_seconds, record


NOT_ANALYSES = ("hash", "signature")


def batch(directory, workers, db):
    with TriageStore(db) as store:
        started = time.perf_counter()
        result = run_batch([directory], store, workers=workers, timeout=600)
        wall = time.perf_counter() - started
        records = [json.loads(row["record"]) for row in store.query("SELECT record FROM dumps")]
    def mean_of(pick):
        return statistics.mean(pick(r["timings"]) for r in records) if records else 0.0

    analysis = mean_of(lambda timings: sum(v for k, v in timings.items() if k not in NOT_ANALYSES))
    hashing = mean_of(lambda timings: timings.get("hash", 0.0))
    signature = mean_of(lambda timings: timings.get("signature", 0.0))
    return result, wall, analysis, hashing, signature


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dumps", type=int, default=100)
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--keep", metavar="DIR", help="write the dumps here and keep them")
    args = parser.parse_args()
    directory = args.keep or tempfile.mkdtemp(prefix="bench_triage_")
    os.makedirs(directory, exist_ok=True)
    try:
        started = time.perf_counter()
        paths = write_dumps(directory, args.dumps)
        size = sum(os.path.getsize(p) for p in paths)
        print("wrote %d dumps (%.1f MB) in %.1f s" % (len(paths), size / 1e6, time.perf_counter() - started))
        hashing, framework, commit_seconds, record = in_process_costs(paths)
        print("steps per dump: %s" % ", ".join("%s %.1f ms" % (name, seconds * 1000)
                                               for name, seconds in record.timings.items()))
        print("in-process: hash %.2f ms/dump, open+identity+signature %.2f ms/dump, DuckDB commit %.2f ms/dump"
              % (hashing * 1000, framework * 1000, commit_seconds * 1000))
        for workers in [int(w) for w in args.workers.split(",")]:
            db = os.path.join(directory, "bench-%d.duckdb" % workers)
            if os.path.exists(db):
                os.remove(db)
            result, wall, analysis, hashing, signature = batch(directory, workers, db)
            per_dump = wall * workers / max(result.analysed, 1)
            print("workers=%d: %d dumps (%d failed) in %.2f s = %.0f dumps/min; analyses %.1f ms/dump, "
                  "hash %.1f ms/dump, signature %.1f ms/dump, overhead beyond them %.1f ms/dump"
                  % (workers, result.analysed, result.failed, wall, result.analysed / wall * 60.0,
                     analysis * 1000, hashing * 1000, signature * 1000,
                     (per_dump - analysis - hashing - signature) * 1000))
        with TriageStore(os.path.join(directory, "bench-1.duckdb")) as store:
            started = time.perf_counter()
            result = run_batch([directory], store, workers=1)
            print("re-run (all %d recorded, unchanged files not read): %.2f s"
                  % (result.skipped, time.perf_counter() - started))
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
