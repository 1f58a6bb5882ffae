"""Benchmark: dbgext's Intel PT decoders next to libipt's on the same traces.

    python scripts/bench_ipt.py [--insns N] [--packet-mb M] [--repeat R]

Builds a synthetic code image (hundreds of small functions: loops, if/else, direct
and indirect calls), traces a random walk through it with the fixture tracer, then
times, best of R runs:

* packet decoding: dbgext ``packet_stats`` (what ``ipt packets --stats`` runs) and
  the full packet listing, against libipt's packet decoder;
* flow: dbgext's block-level flow decoder (cold and warm block cache) against
  libipt's instruction and block decoders.

libipt runs in a small C harness compiled here with cc (-lipt) so its figures are
not ctypes call overhead; without a compiler it falls back to ctypes and says so.
Prints MB/s, instructions/s and the ratios.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

from dbgext.ipt import fixtures  # noqa: E402
from dbgext.ipt.flow import BlockCache, CodeImage, FlowDecoder  # noqa: E402
from dbgext.ipt.packets import decode_packets, packet_stats  # noqa: E402

BASE = 0xFFFFF80012341000

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
    clock_gettime(CLOCK_MONOTONIC, &t);
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
    size_t packet_size, flow_size;
    uint8_t *packets, *flow;
    struct pt_config config;
    struct pt_packet_decoder *packet_decoder;
    struct pt_insn_decoder *insn_decoder;
    struct pt_block_decoder *block_decoder;
    struct pt_packet packet;
    struct pt_insn insn;
    struct pt_block block;
    struct pt_event event;
    long packet_count = 0, insn_count = 0, block_insns = 0;
    double start, packet_time, insn_time, block_time;
    int status;

    if (argc != 5) { fprintf(stderr, "usage: harness PACKETS FLOW IMAGE BASE\n"); return 2; }
    packets = load(argv[1], &packet_size);
    flow = load(argv[2], &flow_size);
    image = load(argv[3], &image_size);
    image_base = strtoull(argv[4], NULL, 0);

    pt_config_init(&config);
    config.begin = packets;
    config.end = packets + packet_size;
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

    config.begin = flow;
    config.end = flow + flow_size;
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
        if (status & pts_eos)
            break;
    }
    insn_time = now() - start;
    pt_insn_free_decoder(insn_decoder);

    start = now();
    block_decoder = pt_blk_alloc_decoder(&config);
    pt_image_set_callback(pt_blk_get_image(block_decoder), read_memory, NULL);
    status = pt_blk_sync_forward(block_decoder);
    while (status >= 0) {
        while (status & pts_event_pending) {
            status = pt_blk_event(block_decoder, &event, sizeof(event));
            if (status < 0)
                break;
        }
        if (status < 0)
            break;
        status = pt_blk_next(block_decoder, &block, sizeof(block));
        if (status < 0) {
            if (status != -pte_eos)
                status = pt_blk_sync_forward(block_decoder);
            continue;
        }
        block_insns += block.ninsn;
    }
    block_time = now() - start;
    pt_blk_free_decoder(block_decoder);

    printf("%ld %.9f %ld %.9f %ld %.9f\n", packet_count, packet_time, insn_count, insn_time, block_insns,
           block_time);
    return 0;
}
"""


def best_of(repeat, function):
    best = None
    result = None
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    return best, result


def build_harness(folder):
    source = os.path.join(folder, "harness.c")
    binary = os.path.join(folder, "harness")
    with open(source, "w") as handle:
        handle.write(HARNESS)
    try:
        subprocess.run(["cc", "-O2", "-o", binary, source, "-lipt"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as error:
        print("note: cannot build the libipt C harness (%s); using ctypes" % (
            getattr(error, "stderr", b"") or error))
        return None
    return binary


def libipt_figures(folder, packet_data, trace, program, repeat):
    """{packets, packet_seconds, insns, insn_seconds, block_insns, block_seconds} or None."""
    paths = {}
    for name, data in (("packets.bin", packet_data), ("flow.bin", trace), ("image.bin", program.code)):
        paths[name] = os.path.join(folder, name)
        with open(paths[name], "wb") as handle:
            handle.write(data)
    binary = build_harness(folder)
    if binary is not None:
        best = None
        for _ in range(repeat):
            output = subprocess.run([binary, paths["packets.bin"], paths["flow.bin"], paths["image.bin"],
                                     "0x%x" % program.base], check=True, capture_output=True).stdout.split()
            figures = dict(zip(("packets", "packet_seconds", "insns", "insn_seconds", "block_insns",
                                "block_seconds"), [float(value) for value in output]))
            if best is None:
                best = figures
            else:
                for key in ("packet_seconds", "insn_seconds", "block_seconds"):
                    best[key] = min(best[key], figures[key])
        best["how"] = "C harness"
        return best
    try:
        import ipt_support
    except ImportError:
        return None
    if ipt_support.LIB is None:
        return None
    packet_seconds, packets = best_of(repeat, lambda: ipt_support.packet_decode_count(packet_data))
    insn_seconds, flow = best_of(repeat, lambda: ipt_support.instruction_flow(trace, {program.base: program.code}))
    block_seconds, block_insns = best_of(repeat, lambda: ipt_support.block_flow_count(
        trace, {program.base: program.code}))
    return {"packets": packets, "packet_seconds": packet_seconds, "insns": len(flow[0]),
            "insn_seconds": insn_seconds, "block_insns": block_insns, "block_seconds": block_seconds,
            "how": "ctypes (per-call overhead included)"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--insns", type=int, default=1000000, help="instructions in the flow trace")
    parser.add_argument("--packet-mb", type=float, default=4.0, help="size of the packet benchmark buffer")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--functions", type=int, default=300)
    options = parser.parse_args()

    program = fixtures.random_program(BASE, functions=options.functions, seed=2)
    start = time.perf_counter()
    trace, expected = fixtures.trace_program(program, options.insns, seed=3)
    timed_trace, _ = fixtures.trace_program(program, options.insns // 4, seed=4, timing=True, interrupt_every=400,
                                            uncompressed_ret_every=50)
    print("code image: %d functions, %d bytes; flow trace: %d instructions in %d bytes (built in %.1f s)"
          % (options.functions, len(program.code), len(expected), len(trace), time.perf_counter() - start))
    copies = max(1, int(options.packet_mb * 1e6 / len(trace)))
    packet_data = trace * copies
    timed_copies = max(1, int(options.packet_mb * 1e6 / len(timed_trace)))
    timed_data = timed_trace * timed_copies

    stats_seconds, stats = best_of(options.repeat, lambda: packet_stats(packet_data))
    timed_seconds, timed_stats = best_of(options.repeat, lambda: packet_stats(timed_data))
    listing_seconds, listing = best_of(1, lambda: decode_packets(packet_data))
    code = CodeImage(images=[(program.base, program.code)])
    cold_seconds, cold = best_of(options.repeat, lambda: FlowDecoder(code).decode(trace))  # new cache each run
    cache = BlockCache(code)
    FlowDecoder(code, cache=cache).decode(trace)
    warm_seconds, warm = best_of(options.repeat, lambda: FlowDecoder(code, cache=cache).decode(trace))
    assert cold.instructions == expected and not cold.errors, "dbgext flow disagrees with the tracer"
    timed_flow_seconds, timed_flow = best_of(options.repeat, lambda: FlowDecoder(code, cache=cache).decode(timed_trace))

    with tempfile.TemporaryDirectory() as folder:
        libipt = libipt_figures(folder, packet_data, trace, program, options.repeat)

    megabytes = len(packet_data) / 1e6
    print("")
    print("packets (%.1f MB, %d packets, %.2f bytes/packet):" % (megabytes, stats.packets,
                                                                 len(packet_data) / stats.packets))
    print("  dbgext packet_stats      %8.1f MB/s" % (megabytes / stats_seconds))
    print("  dbgext packet listing    %8.1f MB/s" % (megabytes / listing_seconds))
    print("  dbgext stats, MTC+FUP mix%8.1f MB/s (%.1f MB, %d packets)" % (
        len(timed_data) / 1e6 / timed_seconds, len(timed_data) / 1e6, timed_stats.packets))
    if libipt:
        libipt_mbs = megabytes / libipt["packet_seconds"]
        print("  libipt packet decoder    %8.1f MB/s  [%s; %d packets]" % (libipt_mbs, libipt["how"],
                                                                           libipt["packets"]))
        print("  ratio libipt / dbgext    %8.1fx" % (libipt_mbs / (megabytes / stats_seconds)))
    print("")
    print("flow (%d instructions, %d blocks):" % (len(expected), cold.blocks_built))
    cold_rate = len(cold.instructions) / cold_seconds
    warm_rate = len(warm.instructions) / warm_seconds
    print("  dbgext flow, cold cache  %8.2f M insns/s" % (cold_rate / 1e6))
    print("  dbgext flow, warm cache  %8.2f M insns/s" % (warm_rate / 1e6))
    print("  dbgext flow, MTC+FUP mix %8.2f M insns/s (%d instructions, %d bytes)" % (
        len(timed_flow.instructions) / timed_flow_seconds / 1e6, len(timed_flow.instructions), len(timed_trace)))
    if libipt:
        insn_rate = libipt["insns"] / libipt["insn_seconds"]
        block_rate = libipt["block_insns"] / libipt["block_seconds"]
        print("  libipt insn decoder      %8.2f M insns/s  [%d instructions]" % (insn_rate / 1e6, libipt["insns"]))
        print("  libipt block decoder     %8.2f M insns/s" % (block_rate / 1e6))
        print("  ratio libipt insn / dbgext cold  %6.1fx" % (insn_rate / cold_rate))
        print("  ratio libipt block / dbgext cold %6.1fx" % (block_rate / cold_rate))
    else:
        print("  (libipt not installed: apt-get install libipt2 libipt-dev)")
    print("")
    print("machine load average: %s" % " ".join("%.2f" % value for value in os.getloadavg()))


if __name__ == "__main__":
    main()
