"""Benchmark of compressed .etl reading (figures printed, nothing asserted).

Plain LZ77 XPRESS first: every compressed buffer of PerfView's real traces
(../shared/realworld/etl/perfview__net.4.5.2.{x64,x86}.etl, what Windows' ETW
compression writes) decompressed with ``dbgext.etl.xpress.decompress_plain``
side by side with dissect.util's ``lzxpress.decompress`` (pure Python, the
reference the tests compare with) on the same buffers: MB/s of output, and how
many times faster dbgext is.

Then XPRESS Huffman: builds a ~20 MB trace of 64 KiB buffers (StackWalk walks, key references and
definitions with realistic kernel/user frames, plus classic events with text-like
payloads), stores every buffer but the header compressed with the tests'
LZ77+Huffman compressor (tests/xpress_support.py; cached under the temp
directory, it takes a while in pure Python), then measures in one run:

1. ``dbgext.etl.xpress.decompress`` over every compressed buffer: MB/s of output;
2. reading every event of the compressed trace with ``EtlReader`` side by side
   with the anchor, the same buffers stored uncompressed (same events, same work
   but the decompression).

Times are CPU seconds of this process (the machine may be shared).

    python scripts/bench_xpress.py [--megabytes N] [--repeat N] [--plain-only]
"""

import argparse
import os
import random
import statistics
import struct
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.dirname(HERE))   # this checkout's dbgext, not an installed one

from dbgext.etl import EtlReader  # noqa: E402
from dbgext.etl import format as fmt  # noqa: E402
from etl_writer import EtlWriter  # noqa: E402
from dbgext.etl.xpress import decompress, decompress_plain  # noqa: E402
from xpress_support import compress_etl  # noqa: E402

BUFFER_SIZE = 0x10000
REAL_ETL = os.path.join(os.path.dirname(os.path.dirname(HERE)), "shared", "realworld", "etl")
REAL_TRACES = ("perfview__net.4.5.2.x64.etl", "perfview__net.4.5.2.x86.etl")
NT_BASE = 0xFFFFF80000000000
USER_BASE = 0x00007FF700000000


def build_trace(megabytes, seed=1):
    """An uncompressed trace of about ``megabytes`` MB."""
    rng = random.Random(seed)
    writer = EtlWriter(buffer_size=BUFFER_SIZE)
    kernel_functions = [NT_BASE + rng.randrange(0x1000, 0x800000, 2) for _ in range(3000)]
    user_functions = [USER_BASE + rng.randrange(0x1000, 0x4000000, 2) for _ in range(3000)]
    hot = [[rng.choice(kernel_functions) for _ in range(rng.randint(4, 40))] for _ in range(400)]
    words = [b"Microsoft-Windows-Kernel-Process", b"svchost.exe", b"C:\\Windows\\System32\\", b"ntdll.dll",
             b"explorer.exe", b"0x80070005", b"ImageLoad", b"ThreadStart"]
    target = megabytes * 1000 * 1000
    timestamp = 0x01DB000000000000
    key = 0xFFFFC08000000000
    while len(writer._buffers) * BUFFER_SIZE < target:
        timestamp += rng.randint(100, 5000)
        kind = rng.random()
        if kind < 0.5:
            frames = list(rng.choice(hot)) + [rng.choice(user_functions) for _ in range(rng.randint(0, 12))]
            writer.add_stack_walk(frames, process_id=rng.choice((4, 1234, 5678)), thread_id=rng.randint(8, 9000),
                                  timestamp=timestamp)
        elif kind < 0.75:
            key += 0x40 * rng.randint(1, 4)
            writer.add_stack_definition(key, rng.choice(hot))
            writer.add_stack_key(key, process_id=4, thread_id=rng.randint(8, 9000), timestamp=timestamp)
        else:
            text = b" ".join(rng.choice(words) for _ in range(rng.randint(3, 20)))
            writer.add_classic_event("3d6fa8d0-fe05-11d0-9dda-00c04fd7ba7c", rng.randint(1, 4),
                                     struct.pack("<QI", timestamp, rng.randint(0, 1 << 30)) + text,
                                     process_id=1234, thread_id=rng.randint(8, 9000), timestamp=timestamp)
    return writer.to_bytes()


def cached_traces(megabytes):
    directory = os.path.join(tempfile.gettempdir(), "dbgext_bench_xpress")
    if not os.path.isdir(directory):
        os.makedirs(directory)
    plain_path = os.path.join(directory, "plain-%d.etl" % megabytes)
    packed_path = os.path.join(directory, "packed-%d.etl" % megabytes)
    if not (os.path.exists(plain_path) and os.path.exists(packed_path)):
        started = time.process_time()
        plain = build_trace(megabytes)
        buffers = len(plain) // BUFFER_SIZE
        # The anchor keeps the compressed trace's header buffer (LogFileMode says compressed).
        stored_plain = compress_etl(plain, skip=range(buffers))
        packed = compress_etl(plain)
        with open(plain_path, "wb") as handle:
            handle.write(stored_plain)
        with open(packed_path, "wb") as handle:
            handle.write(packed)
        print("built and compressed the trace in %.1f CPU s (cached in %s)" % (time.process_time() - started, directory))
    return plain_path, packed_path


def compressed_buffers(path):
    """(payload, decompressed size) of every compressed buffer."""
    found = []
    with EtlReader(path) as reader:
        for buffer in reader.buffers():
            if buffer.compressed:
                found.append((buffer.data[fmt.BUFFER_HEADER_SIZE:], buffer.saved_offset - fmt.BUFFER_HEADER_SIZE))
    return found


def median_time(function, buffers, repeat):
    """The median of ``repeat`` CPU times of ``function(payload, size)`` over ``buffers``."""
    times = []
    for _ in range(repeat):
        started = time.process_time()
        for payload, size in buffers:
            function(payload, size)
        times.append(time.process_time() - started)
    return statistics.median(times)


def bench_plain(repeat):
    """Plain XPRESS on the real traces' buffers, dbgext beside dissect.util."""
    try:
        from dissect.util.compression import lzxpress
    except ImportError:
        lzxpress = None
    for name in REAL_TRACES:
        path = os.path.join(REAL_ETL, name)
        if not os.path.exists(path):
            print("plain XPRESS: %s is missing" % path)
            continue
        buffers = compressed_buffers(path)
        output = sum(size for _, size in buffers)
        ours = median_time(decompress_plain, buffers, repeat)
        line = ("plain XPRESS, %s: %d buffers, %.1f MB out: dbgext %.1f MB/s"
                % (name, len(buffers), output / 1e6, output / 1e6 / ours))
        if lzxpress is not None:
            theirs = median_time(lambda payload, size: lzxpress.decompress(payload), buffers, repeat)
            line += ", dissect.util %.1f MB/s (%.1fx)" % (output / 1e6 / theirs, theirs / ours)
        print(line + " (CPU time, median of %d)" % repeat)


def read_all(path):
    events = 0
    payload = 0
    with EtlReader(path) as reader:
        for event in reader.events():
            events += 1
            payload += len(event.payload)
    return events, payload, reader.summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--plain-only", action="store_true", help="only plain XPRESS on the real traces")
    args = parser.parse_args(argv)
    bench_plain(args.repeat)
    if args.plain_only:
        return 0
    plain_path, packed_path = cached_traces(args.megabytes)
    plain_size, packed_size = os.path.getsize(plain_path), os.path.getsize(packed_path)
    print("trace: %.1f MB uncompressed, %.1f MB compressed (%.1fx), %d-byte buffers"
          % (plain_size / 1e6, packed_size / 1e6, float(plain_size) / packed_size, BUFFER_SIZE))

    buffers = compressed_buffers(packed_path)
    output = sum(size for _, size in buffers)
    median = median_time(decompress, buffers, args.repeat)
    print("XPRESS Huffman decompress: %d buffers, %.1f MB out in %.2f CPU s = %.1f MB/s of output "
          "(%.1f MB/s of input), median of %d"
          % (len(buffers), output / 1e6, median, output / 1e6 / median,
             sum(len(p) for p, _ in buffers) / 1e6 / median, args.repeat))

    timings = {}
    for name, path in (("uncompressed (anchor)", plain_path), ("compressed", packed_path)):
        started = time.process_time()
        events, payload, summary = read_all(path)
        timings[name] = time.process_time() - started
        print("read all events, %-21s: %d events, %.1f MB of payload in %.2f CPU s = %.1f MB/s of trace data; "
              "%d buffers, %d decompressed, %d undecodable"
              % (name, events, payload / 1e6, timings[name], plain_size / 1e6 / timings[name], summary.buffers,
                 summary.compressed, summary.undecodable))
    print("compressed reading costs %.1fx the uncompressed anchor"
          % (timings["compressed"] / timings["uncompressed (anchor)"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
