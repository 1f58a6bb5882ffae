"""Benchmark: dbgext's Intel PT decoders next to libipt's, side by side in one run.

    python scripts/bench_ipt.py [--mb 8.5] [--repeat 3] [--only mixed,tnt,tip] [--ctypes]

Three traces of about 8.5 MB each, written by the fixture tracer over a synthetic
code image (hundreds of small functions: loops, if/else, direct, indirect and
compressed-return calls, syscalls, interrupts):

* mixed: TNT, TIPs of indirect calls and some returns, interrupts, MTC timing;
* TNT-heavy: conditional branches and compressed returns, few TIPs;
* TIP-heavy: every return uncompressed and an interrupt every ~20 instructions;

and seven other mixes (long TNT-8 runs, TNT-64, TIP-dense, timing packets everywhere,
PSB-dense, mostly PAD, TNT-64 among MTCs and interrupts), so that the speed is not
tuned on three traces: the last line gives the worst ratio of all.

A trace is one traced stretch repeated: each stretch ends with FUP + TIP.PGD, so
the copies concatenate into one valid trace.

The same work on both sides, no instruction cap, nothing printed per packet or
instruction:

* packets: libipt's packet decoder over the whole buffer, counting packets, against
  ``dbgext.ipt.packets.packet_stats`` (what ``ipt packets --stats`` runs);
* flow: libipt's instruction decoder (``pt_insn_next`` to the end, counting) against
  dbgext's flow decoder over a cold block cache, counting through a sink.

The "ipt.libipt" column is dbgext's libipt back end (``ipt flow --decoder libipt``,
dbgext.ipt.libipt): libipt's instruction decoder called through ctypes, one call per
instruction, its figure taken as the flow is (in this process, CPU time, the
decoder's set-up included).

libipt runs in a small C harness compiled here (cc -lipt), timed inside the
harness, so its figures carry no ctypes call overhead (through ctypes every
``pt_insn_next`` costs a Python call, which makes libipt look 5-10x slower than it
is).  Without a compiler, or with --ctypes, it times libipt through ctypes and says so.  dbgext runs in this
process; its start-up is not timed.  Both sides are timed in CPU time of their
process (the machine may be shared), over --repeat rounds in which the two sides take
turns: the speeds are each side's median, the ratio the median of the rounds' ratios.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import ipt_tracer  # noqa: E402
from dbgext.errors import BadInput  # noqa: E402
from dbgext.ipt.flow import CodeImage, FlowDecoder  # noqa: E402
from dbgext.ipt.libipt import LibiptFlowDecoder  # noqa: E402
from dbgext.ipt.packets import compile_counters, packet_stats  # noqa: E402

BASE = 0xFFFFF80012341000

TRACES = [
    ("mixed", {"interrupt_every": 400, "uncompressed_ret_every": 50, "timing": True}),
    ("tnt", {}),
    ("tip", {"uncompressed_ret_every": 1, "interrupt_every": 20}),
    # Other mixes, so that no speed is tuned on three traces:
    ("loops", {"taken_probability": 0.9}),                            # long TNT-8 runs
    ("tnt64", {"use_tnt64": True}),                                   # long TNT-64 packets
    ("tipdense", {"uncompressed_ret_every": 1, "interrupt_every": 3}),  # a TIP or FUP + TIP every few instructions
    ("timing", {"timing": True, "extras": ("timing",), "extras_where": ("branch",)}),  # MTC, TSC, CYC everywhere
    ("psb", {"psb_every": 48}),                                       # a PSB+ every 48 bytes
    ("pad", {"pad_every": 64}),                                       # mostly PAD
    # TNT-64 between MTCs, FUP + TIPs and TNT-8:
    ("tnt64mix", {"use_tnt64": True, "timing": True, "interrupt_every": 40, "taken_probability": 0.9}),
]
STRETCH_INSNS = 400000

HARNESS = r"""
#include <intel-pt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint8_t *image;
static size_t image_size;
static uint64_t image_base;

static int read_memory(uint8_t *buffer, size_t size, const struct pt_asid *asid, uint64_t ip, void *context)
{
    size_t available;
    (void)asid; (void)context;
    if (ip < image_base || ip >= image_base + image_size)
        return -pte_nomap;
    available = image_base + image_size - ip;
    if (available > size)
        available = size;
    memcpy(buffer, image + (ip - image_base), available);
    return (int)available;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static uint8_t *load(const char *path, size_t *size)
{
    FILE *file = fopen(path, "rb");
    uint8_t *data;
    if (!file) { perror(path); exit(2); }
    fseek(file, 0, SEEK_END);
    *size = (size_t)ftell(file);
    fseek(file, 0, SEEK_SET);
    data = malloc(*size ? *size : 1);
    if (fread(data, 1, *size, file) != *size) { perror(path); exit(2); }
    fclose(file);
    return data;
}

int main(int argc, char **argv)
{
    size_t trace_size;
    uint8_t *trace;
    struct pt_config config;
    struct pt_packet_decoder *packet_decoder;
    struct pt_insn_decoder *insn_decoder;
    struct pt_packet packet;
    struct pt_insn insn;
    struct pt_event event;
    long packet_count = 0, insn_count = 0;
    double start, packet_time, insn_time;
    int status;

    if (argc != 4) { fprintf(stderr, "usage: harness TRACE IMAGE BASE\n"); return 2; }
    trace = load(argv[1], &trace_size);
    image = load(argv[2], &image_size);
    image_base = strtoull(argv[3], NULL, 0);

    pt_config_init(&config);
    config.begin = trace;
    config.end = trace + trace_size;
    start = now();
    packet_decoder = pt_pkt_alloc_decoder(&config);
    status = pt_pkt_sync_forward(packet_decoder);
    while (status >= 0) {
        status = pt_pkt_next(packet_decoder, &packet, sizeof(packet));
        if (status >= 0)
            packet_count++;
        else if (status != -pte_eos)
            status = pt_pkt_sync_forward(packet_decoder);
    }
    packet_time = now() - start;
    pt_pkt_free_decoder(packet_decoder);

    start = now();
    insn_decoder = pt_insn_alloc_decoder(&config);
    pt_image_set_callback(pt_insn_get_image(insn_decoder), read_memory, NULL);
    status = pt_insn_sync_forward(insn_decoder);
    while (status >= 0) {
        while (status & pts_event_pending) {
            status = pt_insn_event(insn_decoder, &event, sizeof(event));
            if (status < 0)
                break;
        }
        if (status < 0)
            break;
        status = pt_insn_next(insn_decoder, &insn, sizeof(insn));
        if (status < 0) {
            if (status != -pte_eos)
                status = pt_insn_sync_forward(insn_decoder);
            continue;
        }
        insn_count++;
        while (status & pts_event_pending) {
            status = pt_insn_event(insn_decoder, &event, sizeof(event));
            if (status < 0)
                break;
        }
        if (status >= 0 && (status & pts_eos))
            break;  /* as ptxed: the end of the trace, its events drained */
    }
    insn_time = now() - start;
    pt_insn_free_decoder(insn_decoder);

    printf("%ld %.9f %ld %.9f\n", packet_count, packet_time, insn_count, insn_time);
    return 0;
}
"""


def timed(function):
    """(CPU seconds, result) of one call."""
    start = time.process_time()
    result = function()
    return time.process_time() - start, result


def build_harness(folder):
    source = os.path.join(folder, "harness.c")
    binary = os.path.join(folder, "harness")
    with open(source, "w") as handle:
        handle.write(HARNESS)
    try:
        subprocess.run(["cc", "-O2", "-o", binary, source, "-lipt"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        print("note: cannot build the libipt C harness (%s); timing libipt through ctypes" % (
            getattr(error, "stderr", b"") or error))
        return None
    return binary


def libipt_figures(binary, folder, trace, program):
    """{packets, packet_seconds, insns, insn_seconds, how} of one run, or None without libipt."""
    if binary is not None:
        paths = []
        for name, data in (("trace.bin", trace), ("image.bin", program.code)):
            paths.append(os.path.join(folder, name))
            with open(paths[-1], "wb") as handle:
                handle.write(data)
        output = subprocess.run([binary] + paths + ["0x%x" % program.base], check=True,
                                capture_output=True).stdout.split()
        figures = dict(zip(("packets", "packet_seconds", "insns", "insn_seconds"), [float(value) for value in output]))
        figures["how"] = "C harness"
        return figures
    import ipt_support
    if ipt_support.LIB is None:
        return None
    packet_seconds, packets = timed(lambda: ipt_support.packet_decode_count(trace))
    insn_seconds, flow = timed(lambda: ipt_support.instruction_flow(trace, {program.base: program.code}))
    return {"packets": packets, "packet_seconds": packet_seconds, "insns": len(flow[0]),
            "insn_seconds": insn_seconds, "how": "ctypes (per-call overhead included)"}


def dbgext_figures(trace, program):
    """The same figures for dbgext, one run."""
    code = CodeImage(images=[(program.base, program.code)])
    packet_seconds, stats = timed(lambda: packet_stats(trace))
    # a new decoder each run: a cold block cache, as a fresh command has
    flow_seconds, result = timed(lambda: FlowDecoder(code).decode(trace, max_insns=0, sink=lambda chunk: None))
    return {"packets": stats.packets, "packet_seconds": packet_seconds, "insns": result.instruction_count,
            "insn_seconds": flow_seconds, "problems": len(result.problems)}


def backend_figures(trace, program):
    """The flow through dbgext's libipt back end, one run: {insns, insn_seconds}, None
    where libipt cannot be loaded."""
    def decode():
        decoder = LibiptFlowDecoder(CodeImage(images=[(program.base, program.code)]))
        return decoder.decode(trace, max_insns=0, sink=lambda chunk: None)
    try:
        seconds, result = timed(decode)
    except BadInput:
        return None
    return {"insns": result.instruction_count, "insn_seconds": seconds}


def rounds(repeat, *measures):
    """Each measure's figures, one per round, over ``repeat`` rounds.  The measures
    take turns within a round, so a machine whose speed drifts slows both sides
    alike, and each round gives a ratio of its own."""
    runs = [[] for _ in measures]
    for _ in range(repeat):
        for index, measure in enumerate(measures):
            figures = measure()
            if figures is not None:
                runs[index].append(figures)
    return runs


def median_figures(runs):
    """The first round's figures with the median times of all rounds (None: no rounds)."""
    if not runs:
        return None
    median = dict(runs[0])
    for key in ("packet_seconds", "insn_seconds"):
        if key in median:
            median[key] = statistics.median(run[key] for run in runs)
    return median


def ratio_text(ours, theirs, seconds, work):
    """How many times slower dbgext is per unit of ``work`` (packets, insns): the
    median of the rounds' ratios, and their range."""
    ratios = sorted((our[seconds] / our[work]) / (their[seconds] / their[work]) for our, their in zip(ours, theirs))
    return "%.1fx (%.1f-%.1f)" % (statistics.median(ratios), ratios[0], ratios[-1])


def build_trace(options, megabytes, program):
    """One stretch of the tracer repeated to ``megabytes``; ``pad_every`` N (not a tracer
    option): after each N bytes of packets, 3 N bytes of PAD (between stretches, where
    the packets end)."""
    options = dict(options)
    pad_every = options.pop("pad_every", 0)
    stretch, expected = ipt_tracer.trace_program(program, STRETCH_INSNS // (4 if pad_every else 1), seed=3,
                                               stretch=True, **options)
    if pad_every:
        stretch += bytes(3 * len(stretch))
    copies = max(1, int(round(megabytes * 1e6 / len(stretch))))
    return stretch * copies, len(expected) * copies


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=8.5, help="size of each trace in MB")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each side's median time is shown")
    parser.add_argument("--only", default=",".join(name for name, _ in TRACES))
    parser.add_argument("--ctypes", action="store_true", help="time libipt through ctypes (tests/ipt_support.py), "
                        "not the C harness")
    options = parser.parse_args()
    program = ipt_tracer.random_program(BASE, functions=300, seed=2, syscalls=True)
    # dbgext's start-up is not timed: its regexes are compiled here (the packet
    # counter's variants too, which a fresh process compiles for long buffers only).
    compile_counters()
    dbgext_figures(build_trace(TRACES[0][1], 0.01, program)[0], program)
    wanted = options.only.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        binary = None if options.ctypes else build_harness(folder)
        for name, trace_options in TRACES:
            if name not in wanted:
                continue
            trace, expected_insns = build_trace(trace_options, options.mb, program)
            our_rounds, their_rounds, backend_rounds = rounds(
                options.repeat, lambda: dbgext_figures(trace, program),
                lambda: libipt_figures(binary, folder, trace, program), lambda: backend_figures(trace, program))
            rows.append((name, trace, expected_insns, our_rounds, their_rounds, backend_rounds))
    print("ratio: the median of the %d rounds' ratios (their range)" % options.repeat)
    print("%-8s %7s %10s %9s %9s %-15s | %11s %9s %9s %-15s %10s  %s" % (
        "trace", "MB", "packets", "libipt", "dbgext", "ratio", "insns", "libipt", "dbgext", "ratio", "ipt.libipt",
        "libipt via"))
    print("%-8s %7s %10s %9s %9s %-15s | %11s %9s %9s %-15s %10s" % ("", "", "", "MB/s", "MB/s", "", "", "M/s",
                                                                     "M/s", "", "M/s"))
    for name, trace, expected_insns, our_rounds, their_rounds, backend_rounds in rows:
        ours, theirs = median_figures(our_rounds), median_figures(their_rounds)
        backend = median_figures(backend_rounds)
        backend_ips = "%10.2f" % (backend["insns"] / backend["insn_seconds"] / 1e6) if backend else "%10s" % "-"
        megabytes = len(trace) / 1e6
        our_mbs = megabytes / ours["packet_seconds"]
        our_ips = ours["insns"] / ours["insn_seconds"] / 1e6
        if theirs is None:
            print("%-8s %7.2f %10d %9s %9.1f %-15s | %11d %9s %9.2f %-15s  (libipt not installed)" % (
                name, megabytes, ours["packets"], "-", our_mbs, "-", ours["insns"], "-", our_ips, "-"))
            continue
        their_mbs = megabytes / theirs["packet_seconds"]
        their_ips = theirs["insns"] / theirs["insn_seconds"] / 1e6
        print("%-8s %7.2f %10d %9.1f %9.1f %-15s | %11d %9.2f %9.2f %-15s %s  %s" % (
            name, megabytes, theirs["packets"], their_mbs, our_mbs,
            ratio_text(our_rounds, their_rounds, "packet_seconds", "packets"), ours["insns"], their_ips, our_ips,
            ratio_text(our_rounds, their_rounds, "insn_seconds", "insns"), backend_ips, theirs["how"]))
        if theirs["packets"] != ours["packets"] or theirs["insns"] != ours["insns"] or ours["insns"] != expected_insns \
                or (backend and backend["insns"] != ours["insns"]):
            print("  warning: counts differ: packets libipt %d dbgext %d; instructions libipt %d dbgext %d "
                  "tracer %d ipt.libipt %s; dbgext problems %d" % (
                      theirs["packets"], ours["packets"], theirs["insns"], ours["insns"], expected_insns,
                      backend["insns"] if backend else "-", ours["problems"]))
    worst = [(max(rows, key=lambda row: row_ratio(row, seconds, work)), seconds, work)
             for seconds, work in (("packet_seconds", "packets"), ("insn_seconds", "insns"))]
    if all(their is not None for row in rows for their in row[4]):
        print("worst ratio: packets %.1fx (%s), flow %.1fx (%s)" % tuple(
            value for row, seconds, work in worst for value in (row_ratio(row, seconds, work), row[0])))
    print("machine load average: %s" % " ".join("%.2f" % value for value in os.getloadavg()))


def row_ratio(row, seconds, work):
    """A trace's median ratio (ratio_text's figure)."""
    _, _, _, ours, theirs, _ = row
    if any(their is None for their in theirs):
        return 0.0
    return statistics.median((our[seconds] / our[work]) / (their[seconds] / their[work])
                             for our, their in zip(ours, theirs))


if __name__ == "__main__":
    main()
