"""Hostile inputs of four families (issue 27), built on purpose rather than by
mutation: what an attacker or a corrupt file does that flipping bytes rarely does.

* **claims** — sizes and counts near 2**32 that the file does not hold: PE
  directories reaching into a section's zero-fill, export/CFG counts, minidump
  stream counts and sizes, kernel-dump run and bitmap sizes, trace-database bucket
  counts and block sizes, stack-file hit counts;
* **cycles** — structures that point at themselves or nest without end: module
  lists looping past their head, trace-database bucket chains, self-containing
  types, stack files nested 100,000 deep;
* **bombs** — compressed data that decodes to far more than it is: .etl buffers
  of one literal and one 64 MiB match (LZ77+Huffman), ISF ``.json.xz`` files of
  gigabytes of blanks;
* **links** — a planted symbolic link (or an existing file) in every place a
  command writes: ``sample``, ``demo``, ``triage --out/--db/--parquet``.

Every case is one or more command lines run in a *fresh interpreter* under a
4 GiB address-space limit (RLIMIT_AS), so a claim that allocates fails there
rather than in the test process.  The limits are the first round's: the command
ends with exit code 0, 1 or 4, within 1 s + 2 s per MB of input, and its peak
resident memory grows by less than 300 MB beyond the input's size.  A links case
also checks that the file the link points at (or the file already there) is
unchanged.

``tests/test_fuzz_hostile.py`` runs :data:`CI_CASES` (a few of each family);
``scripts/fuzz.py --hostile`` runs every case, against any checkout (``--checkout``),
and prints each family's worst time and memory.
"""

import json
import lzma
import os
import struct
import subprocess
import sys

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADDRESS_SPACE_LIMIT = 4 << 30
MEMORY_BUDGET = 300 << 20
ALLOWED_EXIT_CODES = (0, 1, 4)
# A run is killed here (reported over budget): some unbounded cases take minutes.
HARD_TIMEOUT = 120.0


def time_budget(input_bytes):
    """The first round's limit: 1 s plus 2 s per MB of input."""
    return 1.0 + 2.0 * input_bytes / 1e6


class HostileCase(object):
    """``build(directory) -> (command lines, input paths)``; ``check(directory)``
    returns what went wrong beyond the exit code (a links case: the file the
    link points at was written), or None."""

    def __init__(self, family, name, build, check=None):
        self.family = family
        self.name = name
        self.build = build
        self.check = check

    def __repr__(self):
        return "%s/%s" % (self.family, self.name)


# -- running one command line in a fresh, address-space-limited interpreter --------

_RUNNER = r"""
import json, os, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
from dbgext.cli import main
import capstone  # imported by most commands: counted as the interpreter's, not the input's
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.monotonic()
with open(os.devnull, "w") as sink:
    code = main(json.loads(sys.argv[2]), stream=sink, error_stream=sys.stderr)
seconds = time.monotonic() - started
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
sys.stdout.write("\n" + json.dumps({"code": code, "seconds": seconds, "grew": grew}) + "\n")
"""


def run_command(argv, checkout=REPOSITORY, python=sys.executable, timeout=HARD_TIMEOUT):
    """{"code", "seconds", "grew" (peak RSS growth, bytes), "stderr"} of one
    ``dbgext`` command line run by ``checkout``'s package; code None when it was
    killed at ``timeout``."""
    environment = dict(os.environ, PYTHONPATH=checkout)
    try:
        finished = subprocess.run([python, "-c", _RUNNER, str(ADDRESS_SPACE_LIMIT), json.dumps(argv)],
                                  cwd=checkout, env=environment, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=timeout, universal_newlines=True)
    except subprocess.TimeoutExpired:
        return {"code": None, "seconds": timeout, "grew": None, "stderr": "killed after %.0f s" % timeout}
    lines = finished.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, ValueError):  # died before reporting (a signal, an escaping exception)
        report = {"code": finished.returncode, "seconds": None, "grew": None}
    report["stderr"] = finished.stderr.strip()
    return report


def run_case(case, directory, checkout=REPOSITORY, python=sys.executable, timeout=HARD_TIMEOUT):
    """Build ``case`` in ``directory`` and run its command lines: a dict with the
    worst time and memory growth over them, the input size and ``failures`` (the
    limits each command broke, empty when the case passed)."""
    os.makedirs(directory, exist_ok=True)
    command_lines, inputs = case.build(directory)
    input_bytes = sum(_size(path) for path in inputs)
    budget = time_budget(input_bytes)
    result = {"case": repr(case), "family": case.family, "input_bytes": input_bytes, "seconds": 0.0,
              "grew": 0, "failures": [], "codes": []}
    for argv in command_lines:
        report = run_command(argv, checkout, python, timeout)
        result["codes"].append(report["code"])
        result["seconds"] = max(result["seconds"], report["seconds"] or timeout)
        result["grew"] = max(result["grew"], report["grew"] or 0)
        words = " ".join(word if len(word) < 60 else "..." + word[-40:] for word in argv[:3])
        last_line = report["stderr"].splitlines()[-1] if report["stderr"] else ""
        if report["code"] not in ALLOWED_EXIT_CODES:
            result["failures"].append("%s: exit code %s (%s)" % (words, report["code"], last_line[:200]))
        if report["seconds"] is not None and report["seconds"] > budget:
            result["failures"].append("%s: %.1f s, over the %.1f s budget" % (words, report["seconds"], budget))
        if report["grew"] is not None and report["grew"] > MEMORY_BUDGET + input_bytes:
            result["failures"].append("%s: memory grew by %d MB" % (words, report["grew"] >> 20))
    if case.check is not None:
        problem = case.check(directory)
        if problem:
            result["failures"].append(problem)
    return result


def _size(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)
    return os.path.getsize(path) if os.path.exists(path) else 0


def _write(path, data):
    with open(path, "wb") as handle:
        handle.write(data)
    return path


# -- claims: PE images -------------------------------------------------------------------

PE_IMAGE_BASE = 0x140000000
TEXT_RVA, RDATA_RVA, BSS_RVA = 0x1000, 0x2000, 0x3000
IMAGE_SIZE_CLAIM = 0xFFFFF000   # SizeOfImage; .bss, with no raw data, claims almost 4 GiB of zero-fill
FUNCTION_CODE = b"\x48\x83\xec\x28\x48\x83\xc4\x28\xc3"   # sub rsp,28h; add rsp,28h; ret


def hostile_pe(directories, rdata=(), rdata_size=0x200):
    """A small x64 PE: .text (one function), .rdata of ``rdata_size`` bytes
    (``rdata``: (offset, bytes) patches) and an uninitialised .bss from BSS_RVA
    (or after .rdata) up to IMAGE_SIZE_CLAIM; ``directories`` {data directory
    index: (rva, size)}."""
    headers = bytearray(0x400)
    headers[:2] = b"MZ"
    struct.pack_into("<I", headers, 0x3C, 0x40)
    headers[0x40:0x44] = b"PE\0\0"
    struct.pack_into("<HHIIIHH", headers, 0x44, 0x8664, 3, 0, 0, 0, 0xF0, 0x22)
    optional = 0x58
    struct.pack_into("<HBBIIIII", headers, optional, 0x20B, 14, 0, 0x200, 0x400, 0, TEXT_RVA, TEXT_RVA)
    struct.pack_into("<QII", headers, optional + 24, PE_IMAGE_BASE, 0x1000, 0x200)
    struct.pack_into("<HHHHHH", headers, optional + 40, 10, 0, 0, 0, 10, 0)
    struct.pack_into("<III", headers, optional + 56, IMAGE_SIZE_CLAIM, 0x400, 0)
    struct.pack_into("<HH", headers, optional + 68, 1, 0x160)
    struct.pack_into("<I", headers, optional + 108, 16)
    for index, (rva, size) in directories.items():
        struct.pack_into("<II", headers, optional + 112 + 8 * index, rva, size)
    table = optional + 0xF0
    bss_rva = max(BSS_RVA, RDATA_RVA + (rdata_size + 0xFFF) // 0x1000 * 0x1000)
    sections = [(b".text", 0x200, TEXT_RVA, 0x200, 0x400, 0x60000020),
                (b".rdata", rdata_size, RDATA_RVA, rdata_size, 0x600, 0x40000040),
                (b".bss", IMAGE_SIZE_CLAIM - bss_rva, bss_rva, 0, 0, 0xC0000080)]
    for index, (name, vsize, rva, raw_size, raw_offset, characteristics) in enumerate(sections):
        struct.pack_into("<8sIIII12xI", headers, table + 40 * index, name, vsize, rva, raw_size, raw_offset,
                         characteristics)
    text = bytearray(b"\xcc" * 0x200)
    text[:len(FUNCTION_CODE)] = FUNCTION_CODE
    data = bytearray(rdata_size)
    # One function's unwind info (UWOP_ALLOC_SMALL 0x28 after 4 prologue bytes) at .rdata+0x80.
    data[0x80:0x86] = struct.pack("<BBBBBB", 1, 4, 1, 0, 4, 0x42)
    for offset, patch in rdata:
        data[offset:offset + len(patch)] = patch
    return bytes(headers + text + data)


def _pe_case(name, directories, rdata=(), extra_commands=(), rdata_size=0x200):
    def build(directory):
        path = _write(os.path.join(directory, "input.sys"), hostile_pe(directories, rdata, rdata_size))
        commands = [["stackuse", "functions", "--pe", path, "--json"],
                    ["stackuse", "functions", "--pe", path, "--depth", "--json"]]
        return commands + [[word.format(input=path) for word in argv] for argv in extra_commands], [path]
    return HostileCase("claims", name, build)


def _load_config(table_field_offset, count_field_offset, count, flags=0):
    """An x64 load config at .rdata+0x100 whose table lies in the zero-fill."""
    config = bytearray(0x94)
    struct.pack_into("<I", config, 0, len(config))
    struct.pack_into("<Q", config, table_field_offset, PE_IMAGE_BASE + BSS_RVA)
    struct.pack_into("<Q", config, count_field_offset, count)
    struct.pack_into("<I", config, 0x90, flags)
    return [(0x100, bytes(config))]


def _export_directory(count):
    directory = bytearray(40)
    struct.pack_into("<IIIII", directory, 20, count, count, BSS_RVA, BSS_RVA, BSS_RVA)
    return [(0x100, bytes(directory))]


def _imports_sharing_one_thunk_table(descriptors=4096, thunks=65535):
    """``descriptors`` import descriptors (at .rdata+0x100) all naming one table of
    ``thunks`` ordinal imports: a few hundred KB that list 2**28 imports."""
    table = 0x100 + 20 * (descriptors + 1)
    name = table + 8 * (thunks + 1)
    descriptor = struct.pack("<IIIII", RDATA_RVA + table, 0, 0, RDATA_RVA + name, RDATA_RVA + table)
    thunk_table = struct.pack("<%dQ" % thunks, *((1 << 63) | (index & 0xFFFF) for index in range(thunks)))
    patches = [(0x100, descriptor * descriptors), (table, thunk_table), (name, b"hostile.dll\0")]
    return patches, (name + 16 + 0x1FF) // 0x200 * 0x200


PE_CLAIMS = [
    _pe_case("pe-exception-directory-into-zero-fill", {3: (BSS_RVA, 0xFFFFFF00)}),
    _pe_case("pe-relocation-directory-into-zero-fill", {5: (BSS_RVA, 0xFFFFFF00)}),
    _pe_case("pe-exception-directory-size-near-4g", {3: (RDATA_RVA + 0x100, 0xFFFFFFF0)},
             [(0x100, struct.pack("<III", TEXT_RVA, TEXT_RVA + len(FUNCTION_CODE), RDATA_RVA + 0x80))]),
    _pe_case("pe-function-claims-4g-of-code", {3: (RDATA_RVA + 0x100, 12)},
             [(0x100, struct.pack("<III", TEXT_RVA, 0xFFFFF000, RDATA_RVA + 0x80))]),
    _pe_case("pe-cfg-table-count-near-4g", {10: (RDATA_RVA + 0x100, 0x94)},
             _load_config(0x80, 0x88, 0xFFFFFFFF, flags=0xF0000000)),
    _pe_case("pe-export-counts-into-zero-fill", {0: (RDATA_RVA + 0x100, 40)}, _export_directory(0xFFFFF)),
    _pe_case("pe-import-descriptors-sharing-one-thunk-table", {1: (RDATA_RVA + 0x100, 20 * 4097)},
             _imports_sharing_one_thunk_table()[0], rdata_size=_imports_sharing_one_thunk_table()[1]),
]


# -- claims and cycles: stack files ------------------------------------------------------

def _stack_file_case(family, name, text):
    def build(directory):
        path = _write(os.path.join(directory, "input.txt"), text.encode("ascii"))
        return [["etwstacks", "--simulate", "--stacks", path, "--json"]], [path]
    return HostileCase(family, name, build)


FRAMES = "fffff80000001000 fffff80000002000 7ff000001000"
STACK_FILE_CLAIMS = [
    _stack_file_case("claims", "stack-file-count-0x4000000", "0x4000000: %s\n" % FRAMES),
    _stack_file_case("claims", "stack-file-count-near-4g", "0xFFFFFFFF: %s\n" % FRAMES),
    _stack_file_case("claims", "stack-file-json-count-near-4g",
                     json.dumps([{"frames": FRAMES.split(), "count": 0xFFFFFFFF}])),
    _stack_file_case("claims", "stack-file-counts-adding-up", "".join(
        "0x100000: fffff8000000%04x\n" % index for index in range(64))),
]
STACK_FILE_CYCLES = [
    _stack_file_case("cycles", "stack-file-nested-100000-lists", "[" * 100000),
    _stack_file_case("cycles", "stack-file-nested-100000-objects", '{"stacks": ' * 100000),
]


# -- claims: dumps ----------------------------------------------------------------------

def _sample_scenario():
    from dbgext.sample import build_sample_scenario
    return build_sample_scenario()


def _kernel_dump(directory, name="input.dmp", patch=None, bitmap=False):
    """The sample kernel dump (``patch(scenario, manifest)`` first changes its
    memory), with its ISF symbols beside it; its path and the manifest."""
    scenario, manifest = _sample_scenario()
    if patch is not None:
        scenario.build_loaded_module_list()
        patch(scenario, manifest)
    path = os.path.join(directory, name)
    scenario.write_kernel_dump(path, bitmap=bitmap)
    scenario.write_symbols(path + ".symbols")
    return path, manifest


def _patched_file(path, patches):
    with open(path, "r+b") as handle:
        for offset, fmt, value in patches:
            handle.seek(offset)
            handle.write(struct.pack(fmt, value))
    return path


def _kernel_header_case(name, patches, bitmap=False):
    def build(directory):
        path, _ = _kernel_dump(directory, bitmap=bitmap)
        _patched_file(path, patches)
        return [["lm", "--dump", path, "--json"], ["dumpinfo", "--dump", path, "--json"]], [path]
    return HostileCase("claims", name, build)


def _minidump(directory):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from dumps_support import user_scenario
    from minidump_writer import write_minidump
    path = os.path.join(directory, "input.mdmp")
    write_minidump(user_scenario("x64"), path)
    return path


def _minidump_streams(path):
    with open(path, "rb") as handle:
        data = handle.read()
    count, directory = struct.unpack_from("<II", data, 8)
    return [(directory + 12 * index,) + struct.unpack_from("<III", data, directory + 12 * index)
            for index in range(count)]


def _minidump_case(name, patches_of):
    """``patches_of(streams)``: [(offset, fmt, value)] from the stream directory
    [(entry offset, type, size, rva)]."""
    def build(directory):
        path = _minidump(directory)
        _patched_file(path, patches_of(_minidump_streams(path)))
        return [["lm", "--dump", path, "--json"], ["k", "--dump", path, "--json"],
                ["triage", "--dump", path, "--json"]], [path]
    return HostileCase("claims", name, build)


THREAD_LIST, MODULE_LIST, MEMORY_LIST, MEMORY64_LIST = 3, 4, 5, 9

DUMP_CLAIMS = [
    _kernel_header_case("kernel-dump-run-count-near-4g", [(0x88, "<I", 0xFFFFFFFF)]),
    _kernel_header_case("kernel-dump-run-pages-near-4g", [(0x90, "<Q", 0xFFFFFFFF), (0xA0, "<Q", 0xFFFFFFFF)]),
    _kernel_header_case("bitmap-dump-bit-count-near-2-40", [(0x2030, "<Q", 0xFFFFFFFF << 8)], bitmap=True),
    _kernel_header_case("bitmap-dump-first-page-beyond-file", [(0x2020, "<Q", 0xFFFFFFFF000)], bitmap=True),
    _minidump_case("minidump-stream-count-near-4g", lambda streams: [(8, "<I", 0xFFFFFFFF)]),
    _minidump_case("minidump-stream-sizes-near-4g",
                   lambda streams: [(entry + 4, "<I", 0xFFFFFFFF) for entry, _, _, _ in streams]),
    _minidump_case("minidump-list-counts-near-4g", lambda streams: [
        (rva, "<I" if kind != MEMORY64_LIST else "<Q", 0xFFFFFFFF)
        for _, kind, _, rva in streams if kind in (THREAD_LIST, MODULE_LIST, MEMORY_LIST, MEMORY64_LIST)]),
]


# -- claims and cycles: trace databases and module lists in a kernel dump --------------

RTL_KERNEL = {"NoOfBuckets": 0x70, "Buckets": 0x78, "block.Size": 0x08, "block.Next": 0x28}


def _first_block(scenario, database):
    buckets = struct.unpack("<Q", scenario.read(database + RTL_KERNEL["Buckets"], 8))[0]
    count = struct.unpack("<I", scenario.read(database + RTL_KERNEL["NoOfBuckets"], 4))[0]
    for index in range(count):
        block = struct.unpack("<Q", scenario.read(buckets + 8 * index, 8))[0]
        if block:
            return block
    raise ValueError("the sample trace database has no blocks")


def _trace_database_case(family, name, patch):
    def build(directory):
        holder = {}

        def apply(scenario, manifest):
            holder["database"] = manifest["contents"]["rtltrace"]
            patch(scenario, holder["database"])
        path, _ = _kernel_dump(directory, patch=apply)
        address = "0x%x" % holder["database"]
        return [["rtltrace", "--dump", path, address, "--validate", "--json"],
                ["rtltrace", "--dump", path, address, "--traces", "--json"]], [path]
    return HostileCase(family, name, build)


def _module_list_case(name, patch):
    def build(directory):
        def apply(scenario, manifest):
            head = scenario.ps_loaded_module_list
            first = struct.unpack("<Q", scenario.read(head, 8))[0]
            second = struct.unpack("<Q", scenario.read(first, 8))[0]
            patch(scenario, head, first, second)
        path, _ = _kernel_dump(directory, patch=apply)
        return [["lm", "--dump", path, "--json"], ["k", "--dump", path, "--json"],
                ["triage", "--dump", path, "--json"]], [path]
    return HostileCase("cycles", name, build)


def _ipt_event_case(name, trace_size):
    """The sample's IntelProcessorTrace event claiming ``trace_size`` bytes of
    trace where the dump holds 80."""
    def build(directory):
        holder = {}

        def apply(scenario, manifest):
            holder["event"] = manifest["contents"]["ipt"]["event_address"]
            scenario.pack(holder["event"] + IPT_EVENT_TRACE_SIZE, "<I", trace_size)
        path, _ = _kernel_dump(directory, patch=apply)
        return [["ipt", "event", "--dump", path, "--address", "0x%x" % holder["event"], "--json"]], [path]
    return HostileCase("claims", name, build)


def _module_pdata_case(name, size):
    """The sample driver's image in the dump with its exception directory
    claiming ``size`` bytes: the unwinder reads .pdata from target memory."""
    def build(directory):
        def apply(scenario, manifest):
            base = manifest["contents"]["stackuse"]["base"]
            nt_headers = struct.unpack("<I", scenario.read(base + 0x3C, 4))[0]
            scenario.pack(base + nt_headers + 24 + 112 + 8 * 3 + 4, "<I", size)
        path, _ = _kernel_dump(directory, patch=apply)
        return [["k", "--dump", path, "--json"], ["stackuse", "thread", "--dump", path, "--json"]], [path]
    return HostileCase("claims", name, build)


MODULE_CLAIMS = [
    _module_pdata_case("module-in-dump-exception-directory-120-mib", 120 << 20),
    _module_pdata_case("module-in-dump-exception-directory-near-4g", 0xFFFFFF00),
]

IPT_EVENT_TRACE_SIZE = 24   # EventTimeStamp, Process, Thread, IptOption, then TraceSize (u32)

IPT_CLAIMS = [
    _ipt_event_case("ipt-event-trace-size-128-mib", 128 << 20),
    _ipt_event_case("ipt-event-trace-size-near-4g", 0xFFFFFFFF),
]

DATABASE_CLAIMS = [
    _trace_database_case("claims", "trace-database-bucket-count-near-4g",
                         lambda scenario, db: scenario.pack(db + RTL_KERNEL["NoOfBuckets"], "<I", 0xFFFFFFFF)),
    _trace_database_case("claims", "trace-database-block-size-near-4g", lambda scenario, db: scenario.pack(
        _first_block(scenario, db) + RTL_KERNEL["block.Size"], "<I", 0xFFFFFFFF)),
]

DUMP_CYCLES = [
    _trace_database_case("cycles", "trace-database-block-names-itself-next", lambda scenario, db: scenario.pack(
        _first_block(scenario, db) + RTL_KERNEL["block.Next"], "<Q", _first_block(scenario, db))),
    _module_list_case("module-list-entry-names-itself",
                      lambda scenario, head, first, second: scenario.pack(first, "<Q", first)),
    _module_list_case("module-list-loops-past-its-head",
                      lambda scenario, head, first, second: scenario.pack(second, "<Q", first)),
]


# -- cycles: self-containing types in a symbol file -----------------------------------

def _self_containing_types_case():
    def build(directory):
        path, _ = _kernel_dump(directory, name="clean.dmp")
        with open(os.path.join(path + ".symbols", "nt.json")) as handle:
            document = json.load(handle)
        itself = {"kind": "struct", "name": "_SELF"}
        document["user_types"]["_SELF"] = {"kind": "struct", "size": 16, "fields": {
            "Inline": {"offset": 0, "type": itself},
            "Pointer": {"offset": 8, "type": {"kind": "pointer", "subtype": itself}},
            "Many": {"offset": 8, "type": {"kind": "array", "count": 0xFFFFFFFF, "subtype": itself}}}}
        isf = os.path.join(directory, "input.json")
        with open(isf, "w") as handle:
            json.dump(document, handle)
        dump = ["--dump", path, "--symbols", isf]
        return [["dt"] + dump + ["nt!_SELF", "-r"], ["dt"] + dump + ["nt!_SELF", "nt", "-r"]], [isf]
    return HostileCase("cycles", "isf-type-contains-itself", build)


# -- bombs -------------------------------------------------------------------------------

def xpress_literals_then_match(literals, size):
    """LZ77+Huffman bytes decoding to ``size`` bytes: ``literals``, then one match
    repeating them (offset ``len(literals)``) up to ``size`` — a few hundred bytes
    whatever ``size`` is."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from xpress_support import EOF_SYMBOL, MIN_MATCH, _BitWriter, canonical_codes, code_lengths, match_symbol
    length, offset = size - len(literals), len(literals)
    symbol = match_symbol(length, offset)
    frequencies = [0] * 512
    for byte in literals:
        frequencies[byte] += 1
    frequencies[symbol] += 1
    frequencies[EOF_SYMBOL] += 1
    lengths = code_lengths(frequencies)
    out = bytearray(lengths[2 * i] | lengths[2 * i + 1] << 4 for i in range(256))
    codes = canonical_codes(lengths)
    writer = _BitWriter(out)
    for byte in literals:
        writer.bits(*codes[byte])
    writer.bits(*codes[symbol])
    writer.byte_stream(b"\xff\x00\x00" + struct.pack("<I", length - MIN_MATCH))
    offset_bits = offset.bit_length() - 1
    writer.bits(offset - (1 << offset_bits), offset_bits)
    writer.bits(*codes[EOF_SYMBOL])
    writer.finish()
    return bytes(out)


def etl_bomb(buffers, decoded_size=64 << 20, event=False):
    """An .etl file: the first (uncompressed) buffer of a real one, then
    ``buffers`` compressed buffers of a few hundred bytes, each decoding to
    ``decoded_size`` bytes: zeros, or with ``event`` one stack-walk event repeated
    (every copy a valid event, so skipping payloads of one repeated byte does not
    catch it)."""
    from dbgext.etl import format as fmt
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from etl_writer import EtlWriter
    from xpress_support import FORMAT_XPRESS_HUFF, COMPRESSED_MODE
    writer = EtlWriter()
    header_event_end = len(writer._current)
    writer.add_stack_walk([0xFFFFF80000001000 + 0x10 * index for index in range(8)])
    literals = bytes(writer._current[header_event_end:]) if event else b"\0"
    data = bytearray(writer.to_bytes())
    first = data[:struct.unpack_from("<I", data, 0)[0]]
    struct.pack_into("<I", first, 0x2C, FORMAT_XPRESS_HUFF)
    mode_offset = fmt.BUFFER_HEADER_SIZE + 0x40
    struct.pack_into("<I", first, mode_offset, struct.unpack_from("<I", first, mode_offset)[0] | COMPRESSED_MODE)
    payload_size = (decoded_size - fmt.BUFFER_HEADER_SIZE) // len(literals) * len(literals)
    packed = xpress_literals_then_match(literals, payload_size)
    header = bytearray(first[:fmt.BUFFER_HEADER_SIZE])
    disk_size = (fmt.BUFFER_HEADER_SIZE + len(packed) + 7) & ~7
    struct.pack_into("<II", header, 0, disk_size, fmt.BUFFER_HEADER_SIZE + payload_size)
    struct.pack_into("<H", header, 0x34, struct.unpack_from("<H", header, 0x34)[0] | fmt.BUFFER_FLAG_COMPRESSED)
    bomb = bytes(header + packed + bytes(disk_size - fmt.BUFFER_HEADER_SIZE - len(packed)))
    return bytes(first) + bomb * buffers


def _etl_bomb_case(name, buffers, event=False):
    def build(directory):
        path = _write(os.path.join(directory, "input.etl"), etl_bomb(buffers, event=event))
        return [["etwstacks", "--simulate", "--etl", path, "--json"]], [path]
    return HostileCase("bombs", name, build)


def isf_bomb(path, blank_bytes, document):
    """An ISF file (``.json.xz`` or ``.json.gz``) of ``blank_bytes`` blanks, then
    ``document``: a few hundred KB that decompress to gigabytes."""
    chunk = b" " * (1 << 20)
    if path.endswith(".xz"):
        compressor = lzma.LZMACompressor(preset=1)
        with open(path, "wb") as handle:
            for _ in range(blank_bytes >> 20):
                handle.write(compressor.compress(chunk))
            handle.write(compressor.compress(json.dumps(document).encode("utf-8")) + compressor.flush())
    else:
        import gzip
        with gzip.open(path, "wb", compresslevel=9) as handle:
            for _ in range(blank_bytes >> 20):
                handle.write(chunk)
            handle.write(json.dumps(document).encode("utf-8"))
    return path


def _isf_bomb_case(suffix, blank_bytes):
    def build(directory):
        path, _ = _kernel_dump(directory, name="clean.dmp")
        with open(os.path.join(path + ".symbols", "hal.json")) as handle:
            document = json.load(handle)
        bomb = isf_bomb(os.path.join(directory, "hal" + suffix), blank_bytes, document)
        return [["lm", "--dump", path, "--symbols", bomb, "--json"]], [bomb]
    return HostileCase("bombs", "isf-%s-%d-mib-of-blanks" % (suffix.lstrip(".").replace(".", "-"),
                                                             blank_bytes >> 20), build)


BOMBS = [
    _etl_bomb_case("etl-one-buffer-decoding-to-64-mib", 1),
    _etl_bomb_case("etl-100-buffers-decoding-to-64-mib-each", 100),
    _etl_bomb_case("etl-1-mb-of-buffers-decoding-to-64-mib-each", 2700),
    _etl_bomb_case("etl-one-buffer-repeating-one-stack-walk-event-for-64-mib", 1, event=True),
    _etl_bomb_case("etl-8-buffers-repeating-one-stack-walk-event-for-64-mib", 8, event=True),
    _isf_bomb_case(".json.xz", 2 << 30),
    _isf_bomb_case(".json.gz", 1 << 30),
]


# -- links: every place a command writes ------------------------------------------------

VICTIM_TEXT = b"the file a planted link points at: it must stay as it is\n"


def _plant(directory, relative, kind):
    """At ``directory/relative``: a link to a victim file outside (``link``), a
    link to a victim directory (``directory-link``) or a regular file already
    there (``existing``).  The victim's path."""
    victims = os.path.join(directory, "victims")
    os.makedirs(victims, exist_ok=True)
    place = os.path.join(directory, relative)
    os.makedirs(os.path.dirname(place), exist_ok=True)
    if kind == "directory-link":
        victim = os.path.join(victims, "folder")
        os.makedirs(victim, exist_ok=True)
        _write(os.path.join(victim, "keep.txt"), VICTIM_TEXT)
        os.symlink(victim, place)
        return victim
    victim = _write(os.path.join(victims, os.path.basename(relative)), VICTIM_TEXT)
    if kind == "link":
        os.symlink(victim, place)
    else:
        _write(place, VICTIM_TEXT)
    return victim


def _untouched(directory, relative, kind):
    """What was written through (or over) what ``_plant`` left, or None."""
    place = os.path.join(directory, relative)
    victim = os.path.join(directory, "victims", "folder" if kind == "directory-link" else os.path.basename(relative))
    if kind == "directory-link":
        written = sorted(os.listdir(victim))
        return None if written == ["keep.txt"] else "files were written through the link %s: %s" % (relative, written)
    with open(victim, "rb") as handle:
        if handle.read() != VICTIM_TEXT:
            return "%s was overwritten through %s" % (victim, relative)
    if kind == "link" and not os.path.islink(place):
        return "%s: the planted link was replaced" % relative
    if kind == "existing":
        with open(place, "rb") as handle:
            if handle.read() != VICTIM_TEXT:
                return "%s was replaced without --force" % relative
    return None


def _link_case(name, relative, kind, command):
    """``command(directory)``: the command lines writing into ``directory/out``."""
    def build(directory):
        _plant(directory, relative, kind)
        return command(directory)
    return HostileCase("links", name, build, lambda directory: _untouched(directory, relative, kind))


def _sample_command(subcommand):
    def command(directory):
        return [[subcommand, "--out", os.path.join(directory, "out")]], []
    return command


def _triage_record_command(directory):
    dump, _ = _kernel_dump(directory, name="clean.dmp")
    return [["triage", "--dump", dump, "--out", os.path.join(directory, "out", "record.json")]], [dump]


def _triage_batch_command(directory):
    dumps = os.path.join(directory, "dumps")
    os.makedirs(dumps, exist_ok=True)
    _kernel_dump(dumps, name="clean.dmp")
    return [["triage", "run", dumps, "--db", os.path.join(directory, "out", "triage.duckdb"), "--workers", "1",
             "--no-progress", "--parquet", os.path.join(directory, "out", "export")]], []


LINKS = [
    _link_case("sample-dump-is-a-link", "out/sample.dmp", "link", _sample_command("sample")),
    _link_case("sample-manifest-is-a-link", "out/sample.json", "link", _sample_command("sample")),
    _link_case("sample-symbols-folder-is-a-link", "out/sample.dmp.symbols", "directory-link",
               _sample_command("sample")),
    _link_case("sample-symbol-file-is-a-link", "out/sample.dmp.symbols/nt.json", "link", _sample_command("sample")),
    _link_case("sample-dump-exists", "out/sample.dmp", "existing", _sample_command("sample")),
    _link_case("demo-dump-is-a-link", "out/sample.dmp", "link", _sample_command("demo")),
    _link_case("triage-out-is-a-link", "out/record.json", "link", _triage_record_command),
    _link_case("triage-out-exists", "out/record.json", "existing", _triage_record_command),
    _link_case("triage-db-is-a-link", "out/triage.duckdb", "link", _triage_batch_command),
    _link_case("triage-db-wal-is-a-link", "out/triage.duckdb.wal", "link", _triage_batch_command),
    _link_case("triage-parquet-file-is-a-link", "out/export/dumps.parquet", "link", _triage_batch_command),
    _link_case("triage-parquet-folder-is-a-link", "out/export", "directory-link", _triage_batch_command),
]


CASES = (PE_CLAIMS + STACK_FILE_CLAIMS + DUMP_CLAIMS + MODULE_CLAIMS + IPT_CLAIMS + DATABASE_CLAIMS
         + STACK_FILE_CYCLES + DUMP_CYCLES + [_self_containing_types_case()] + BOMBS + LINKS)
FAMILIES = ("claims", "cycles", "bombs", "links")


def case_named(name):
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(name)


# What CI runs (tests/test_fuzz_hostile.py): a few cases of each family, each a
# command or three in a fresh interpreter.  The others (the 1 MB .etl bomb, the
# gigabyte ISF bombs) run under scripts/fuzz.py --hostile.
CI_CASES = [
    "pe-exception-directory-into-zero-fill", "pe-relocation-directory-into-zero-fill",
    "pe-export-counts-into-zero-fill", "pe-import-descriptors-sharing-one-thunk-table",
    "stack-file-count-near-4g", "stack-file-json-count-near-4g", "minidump-list-counts-near-4g",
    "kernel-dump-run-pages-near-4g", "trace-database-bucket-count-near-4g",
    "module-in-dump-exception-directory-120-mib",
    "stack-file-nested-100000-lists", "module-list-loops-past-its-head", "trace-database-block-names-itself-next",
    "isf-type-contains-itself",
    "etl-one-buffer-decoding-to-64-mib", "etl-100-buffers-decoding-to-64-mib-each",
    "etl-8-buffers-repeating-one-stack-walk-event-for-64-mib", "isf-json-xz-2048-mib-of-blanks",
    "isf-json-gz-1024-mib-of-blanks", "ipt-event-trace-size-128-mib",
] + [case.name for case in LINKS]
