#!/usr/bin/env python3
"""Long fuzz campaigns over every kind of input dbgext reads.

    python scripts/fuzz.py --inputs 1000000 --jobs 2 --out /tmp/fuzz

Each kind of input (``tests/fuzzing.py``: its seed, its mutations, the command
lines or parsers that read it) runs in worker processes, so a death by signal (a
SIGBUS through an mmap, a crash in a C extension) is caught and counted like any
other failure.  Prints inputs per second per kind and every distinct failure
signature with its count; the first input that hit each signature is saved in
``--out`` for reproduction.  Exit code 1 when anything failed.

    python scripts/fuzz.py --hostile claims,cycles --checkout ../main

runs the built hostile cases instead (``tests/hostile.py``: sizes and counts
near 2**32, cycles, decompression bombs, planted links), each command in a fresh
interpreter under a 4 GiB address-space limit, and prints every family's worst
time and memory growth, for any checkout's dbgext.
"""

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
# This checkout's dbgext, not an installed one (workers inherit it through sys.path).
sys.path.insert(0, os.path.dirname(HERE))


def worker(case_name, levels, first, count, out, budget):
    """Run inputs ``first .. first+count`` of one case; one JSON line per failure
    and a final ``done`` line.  Before each input its number is written to
    ``out/<case>.current`` so the parent can name the input that killed us."""
    sys.path.insert(0, TESTS)
    import fuzzing
    case = fuzzing.case_named(case_name)
    directory = tempfile.mkdtemp(prefix="dbgext-fuzz-%s-" % case_name)
    seed = fuzzing.prepare(case, directory)
    if seed is None:
        print(json.dumps({"skipped": case_name}), flush=True)
        return
    current = os.path.join(out, case_name + ".current")
    for number in range(first, first + count):
        with open(current, "w") as handle:
            handle.write(str(number))
        data = fuzzing.mutated_input(case, seed, random.Random("%s:%d" % (case_name, number)))
        for signature in fuzzing.run_input(case, data, directory, budget, levels):
            print(json.dumps({"signature": signature, "input": number}), flush=True)
    print(json.dumps({"done": count}), flush=True)


def save_input(case_name, number, out):
    """Rebuild input ``number`` of a case (mutations are reproducible) into ``out``."""
    sys.path.insert(0, TESTS)
    import fuzzing
    case = fuzzing.case_named(case_name)
    directory = tempfile.mkdtemp(prefix="dbgext-fuzz-save-")
    seed = fuzzing.prepare(case, directory)
    data = fuzzing.mutated_input(case, seed, random.Random("%s:%d" % (case_name, number)))
    path = os.path.join(out, "%s-%d%s" % (case_name, number, case.suffix))
    with open(path, "wb") as handle:
        handle.write(data)
    return path


def run_case(case_name, levels, inputs, out, budget, chunk):
    """Drive workers over ``inputs`` inputs of one case, restarting after a death."""
    signatures = collections.Counter()
    first_input = {}
    done = 0
    started = time.monotonic()
    while done < inputs:
        count = min(chunk, inputs - done)
        command = [sys.executable, os.path.abspath(__file__), "--worker", case_name, "--levels", levels,
                   "--first", str(done), "--count", str(count), "--out", out, "--budget", str(budget)]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        finished = False
        for line in process.stdout:
            record = json.loads(line)
            if "skipped" in record:
                return {"case": case_name, "skipped": True}
            if "signature" in record:
                signatures[record["signature"]] += 1
                first_input.setdefault(record["signature"], record["input"])
            if "done" in record:
                finished = True
        process.wait()
        if finished:
            done += count
            continue
        # The worker died: the input it was on is the culprit; go on after it.
        with open(os.path.join(out, case_name + ".current")) as handle:
            culprit = int(handle.read())
        died = "%s: killed by %s" % (case_name, _signal_name(process.returncode))
        signatures[died] += 1
        first_input.setdefault(died, culprit)
        done = culprit + 1
    elapsed = time.monotonic() - started
    saved = {signature: save_input(case_name, number, out) for signature, number in first_input.items()}
    return {"case": case_name, "inputs": inputs, "seconds": elapsed, "signatures": dict(signatures),
            "examples": saved}


def _signal_name(returncode):
    if returncode is not None and returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return "signal %d" % -returncode
    return "exit %s" % returncode


# -- hostile families (issue 27): claims, cycles, bombs, links ---------------------------

def run_hostile(families, names, checkout, python, out, timeout, as_json):
    """Run every hostile case of ``families`` (tests/hostile.py) with ``checkout``'s
    dbgext; print each case and each family's worst time and memory growth.
    Exit code 1 when a case broke a limit."""
    # The cases are built with this repository's dbgext and test support, whichever
    # checkout's dbgext then runs them.
    sys.path[:0] = [os.path.dirname(HERE), TESTS]
    import hostile
    cases = [case for case in hostile.CASES if case.family in families and (not names or case.name in names)]
    results = []
    for case in cases:
        result = hostile.run_case(case, os.path.join(out, case.family, case.name), checkout, python, timeout)
        results.append(result)
        if not as_json:
            print("%-7s %-48s %9d B in  %7.2f s  %6d MB  codes %s%s" % (
                case.family, case.name, result["input_bytes"], result["seconds"], result["grew"] >> 20,
                ",".join(str(code) for code in result["codes"]),
                "".join("\n          FAIL " + failure for failure in result["failures"])), flush=True)
    worst = {}
    for result in results:
        family = worst.setdefault(result["family"], {"cases": 0, "failed": 0, "seconds": 0.0, "grew_mb": 0})
        family["cases"] += 1
        family["failed"] += bool(result["failures"])
        family["seconds"] = max(family["seconds"], round(result["seconds"], 2))
        family["grew_mb"] = max(family["grew_mb"], result["grew"] >> 20)
    if as_json:
        print(json.dumps({"checkout": checkout, "families": worst, "cases": results}, indent=1))
    else:
        for name, family in sorted(worst.items()):
            print("%-7s %d cases, %d failed; worst %.2f s, worst memory growth %d MB"
                  % (name, family["cases"], family["failed"], family["seconds"], family["grew_mb"]))
    return 1 if any(result["failures"] for result in results) else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=10000, help="inputs in all (split across the kinds)")
    parser.add_argument("--cases", help="comma-separated kinds (default: all)")
    parser.add_argument("--levels", default="parsers,commands",
                        help="parsers (fast, in-process parser calls), commands (whole command lines), or both")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds one input may take")
    parser.add_argument("--chunk", type=int, default=5000, help="inputs per worker process")
    parser.add_argument("--out", default=tempfile.mkdtemp(prefix="dbgext-fuzz-"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--hostile", metavar="FAMILIES", nargs="?", const="claims,cycles,bombs,links",
                        help="run the built hostile cases (tests/hostile.py) of these families instead of "
                        "mutations, each in a fresh interpreter under a 4 GiB address-space limit")
    parser.add_argument("--case", action="append", help="with --hostile: only this case (repeatable)")
    parser.add_argument("--checkout", default=os.path.dirname(HERE),
                        help="with --hostile: the repository whose dbgext runs (default: this one)")
    parser.add_argument("--python", default=sys.executable, help="with --hostile: the interpreter to run")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="with --hostile: seconds after which a command is killed")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.hostile:
        return run_hostile(args.hostile.split(","), args.case, os.path.abspath(args.checkout), args.python,
                           args.out, args.timeout, args.json)
    if args.worker:
        worker(args.worker, args.levels, args.first, args.count, args.out, args.budget)
        return 0

    sys.path.insert(0, TESTS)
    import fuzzing
    names = args.cases.split(",") if args.cases else fuzzing.case_names(args.levels)
    per_case = max(1, args.inputs // len(names))
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        reports = list(pool.map(lambda name: run_case(name, args.levels, per_case, args.out, args.budget,
                                                      args.chunk), names))
    total_inputs = sum(report.get("inputs", 0) for report in reports)
    total = collections.Counter()
    for report in reports:
        total.update(report.get("signatures", {}))
    if args.json:
        print(json.dumps({"inputs": total_inputs, "cases": reports, "distinct_signatures": len(total)}, indent=1))
    else:
        for report in reports:
            if report.get("skipped"):
                print("%-16s skipped (seed tool not installed)" % report["case"])
                continue
            print("%-16s %9d inputs  %8.0f inputs/s  %d distinct failures" % (
                report["case"], report["inputs"], report["inputs"] / max(report["seconds"], 1e-9),
                len(report["signatures"])))
        print("total: %d inputs, %d distinct failure signatures (examples in %s)" % (
            total_inputs, len(total), args.out))
        for signature, count in total.most_common():
            print("  %6d  %s" % (count, signature))
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
