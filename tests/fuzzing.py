"""The fuzz harness: seed inputs of every kind dbgext reads, mutations a hostile or
broken input makes, and the commands that must survive them.

A *case* is one kind of input (a kernel dump, a minidump, an IPT trace, a PE, an
.etl file, an ISF file...): how to build its seed, and the command lines that read
it.  :func:`run_input` writes a mutated input to a file and runs each command line
in-process the way the ``dbgext`` console does, with ``--debug`` so that an
internal error comes back as a traceback.  Anything but a clean exit code (0, 1,
2 or ``EXIT_PROBLEMS``) and anything over the time budget is a *failure*, named by
a signature: the exception type and the innermost dbgext frame, so a campaign
counts distinct bugs, not inputs.

Used by ``tests/test_fuzz.py`` (Hypothesis, a bounded example count) and by
``scripts/fuzz.py`` (long campaigns across processes).

Mutation finds what flipped and truncated bytes do; the hostile families
(claims, cycles, bombs, links) are built on purpose instead, in
``tests/hostile.py`` (run by ``tests/test_fuzz_hostile.py`` and
``scripts/fuzz.py --hostile``).
"""

import io
import os
import random
import re
import signal
import struct
import time

from dbgext.cli import main
from dbgext.errors import EXIT_ERROR, EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, DbgextError
from minidump_writer import write_minidump
from requirements import missing_tools

CLEAN_EXIT_CODES = (EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_PROBLEMS)

# No input may make dbgext use more than this beyond the input file's own size.
MEMORY_BUDGET = 300 << 20

# -- mutations -----------------------------------------------------------------

INTERESTING_U32 = (0, 1, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF)


def _bit_flip(data, position, value):
    data[position % len(data)] ^= 1 << (value % 8)


def _byte_run(data, position, value):
    start = position % len(data)
    length = 1 + value % 64
    data[start:start + length] = bytes([value >> 8 & 0xFF]) * len(data[start:start + length])


def _truncate(data, position, value):
    del data[max(1, position % len(data)):]


def _page_fill(data, position, value):
    """A whole 4 KiB page of 0x00 or 0xFF: a zeroed or garbage page-table page."""
    start = (position % len(data)) & ~0xFFF
    fill = b"\xff" if value & 1 else b"\x00"
    data[start:start + 0x1000] = fill * len(data[start:start + 0x1000])


def _interesting_u32(data, position, value):
    start = (position % max(1, len(data) - 3)) & ~3
    data[start:start + 4] = struct.pack("<I", INTERESTING_U32[value % len(INTERESTING_U32)])


def _interesting_u64(data, position, value):
    """A pointer- or size-looking field made huge, tiny or self-referencing."""
    start = (position % max(1, len(data) - 7)) & ~7
    choices = (0, 0xFFFFFFFFFFFFFFFF, 0x7FFFFFFFFFFFFFFF, 0xFFFFF80000000000 + (value & 0xFFFFF),
               struct.unpack_from("<Q", bytes(data[start:start + 8]).ljust(8, b"\0"))[0] ^ (1 << (value % 64)))
    data[start:start + 8] = struct.pack("<Q", choices[value % len(choices)])


def _header_field(data, position, value):
    """The first 8 KiB hold every format's headers: hit them more often."""
    _interesting_u32(data, position % min(len(data), 0x2000), value)


def _duplicate_chunk(data, position, value):
    start = position % len(data)
    chunk = data[start:start + 1 + value % 256]
    insert_at = (value >> 8) % len(data)
    data[insert_at:insert_at] = chunk


MUTATIONS = {
    "bit_flip": _bit_flip, "byte_run": _byte_run, "truncate": _truncate, "page_fill": _page_fill,
    "u32": _interesting_u32, "u64": _interesting_u64, "header": _header_field, "duplicate": _duplicate_chunk,
}


def mutate(seed, operations):
    """``seed`` with ``operations`` ([(mutation name, position, value)]) applied."""
    data = bytearray(seed)
    for name, position, value in operations:
        if not data:
            break
        MUTATIONS[name](data, position, value)
    return bytes(data)


def random_operations(rng, most=4):
    return [(rng.choice(sorted(MUTATIONS)), rng.getrandbits(31), rng.getrandbits(32))
            for _ in range(rng.randint(1, most))]


# -- JSON mutations (symbol files are structured input) ----------------------------

def mutate_json_text(text, rng):
    """An ISF document with values swapped for ones of the wrong type."""
    import json
    document = json.loads(text)
    wrong = [None, 1.5, [], {}, "x", -1, 1 << 70, True]
    nodes = []

    def collect(node, depth):
        if depth > 6:
            return
        if isinstance(node, dict):
            for key in list(node):
                nodes.append((node, key))
                collect(node[key], depth + 1)
        elif isinstance(node, list):
            for index in range(len(node)):
                nodes.append((node, index))
                collect(node[index], depth + 1)
    collect(document, 0)
    for _ in range(rng.randint(1, 3)):
        if not nodes:
            break
        container, key = rng.choice(nodes)
        container[key] = rng.choice(wrong)
    return json.dumps(document)


# -- running one input -----------------------------------------------------------

class _OverBudget(BaseException):  # not an Exception: main() must not catch it as a bug
    pass


def _on_alarm(signum, frame):
    raise _OverBudget()


_FRAME = re.compile(r'File "([^"]*dbgext[/\\][^"]+)", line (\d+), in (\S+)')


def signature_of(case_name, argv, output, code):
    """``case: ExceptionType at dbgext/file.py:function`` from a --debug traceback."""
    frames = _FRAME.findall(output)
    last_line = output.strip().splitlines()[-1] if output.strip() else ""
    exception = last_line.split(":", 1)[0].strip() or "exit %s" % code
    where = ""
    if frames:
        path, _, function = frames[-1]
        where = " at %s:%s" % (path[path.rfind("dbgext"):].replace("\\", "/"), function)
    return "%s %s: %s%s" % (case_name, argv[0], exception, where)


def _within_budget(budget_seconds, run):
    """``run()``'s result, or raise _OverBudget once ``budget_seconds`` pass."""
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, budget_seconds)
    try:
        return run()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_input(case, data, directory, budget_seconds=10.0, levels="parsers,commands"):
    """Run ``case``'s parsers and/or command lines (``levels``) over ``data``; a
    list of failure signatures (empty when dbgext handled the input)."""
    path = os.path.join(directory, "input" + case.suffix)
    with open(path, "wb") as handle:
        handle.write(data)
    failures = []
    over = "%s %s: over the %.0f s budget"
    peak_before = _peak_rss()
    if "parsers" in levels:
        for parser in case.parsers:
            try:
                _within_budget(budget_seconds, lambda: parser(path, case.seed_directory))
            except _OverBudget:
                failures.append(over % (case.name, parser.__name__, budget_seconds))
            except DbgextError:
                pass
            except Exception as error:  # anything else is a bug in dbgext
                failures.append(_exception_signature(case.name, parser.__name__, error))
    if "commands" in levels:
        failures += _run_commands(case, path, budget_seconds, over)
    if _peak_rss() - peak_before > MEMORY_BUDGET + len(data):
        failures.append("%s: memory grew by more than %d MB beyond the input's size"
                        % (case.name, MEMORY_BUDGET >> 20))
    return failures


def _peak_rss():
    """This process's peak resident set in bytes (it never goes down, so a rise
    during one input is that input's doing)."""
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _run_commands(case, path, budget_seconds, over):
    failures = []
    for argv in case.command_lines(path):
        stream = io.StringIO()
        started = time.monotonic()
        try:
            code = _within_budget(budget_seconds, lambda: main(list(argv) + ["--debug"], stream=stream))
        except _OverBudget:
            failures.append(over % (case.name, argv[0], budget_seconds))
            continue
        except BaseException as error:  # anything escaping main() is a failure
            failures.append("%s %s: %s escaped main()" % (case.name, argv[0], type(error).__name__))
            continue
        if code not in CLEAN_EXIT_CODES:
            failures.append(signature_of(case.name, argv, stream.getvalue(), code))
        elif time.monotonic() - started > budget_seconds:
            failures.append(over % (case.name, argv[0], budget_seconds))
    return failures


def _exception_signature(case_name, parser_name, error):
    import traceback
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if "dbgext" in frame.filename
              and "tests" not in frame.filename]
    where = ""
    if frames:
        path = frames[-1].filename.replace("\\", "/")
        where = " at %s:%s" % (path[path.rfind("dbgext/"):], frames[-1].name)
    return "%s %s: %s%s" % (case_name, parser_name, type(error).__name__, where)


# -- the cases -------------------------------------------------------------------

class Case(object):
    """One kind of input: ``build_seed(directory) -> bytes``; ``parsers`` are
    functions ``(input path, seed directory)`` calling dbgext's parsers directly
    (fast: a campaign's bulk); ``commands`` are argv lists with ``{input}`` (the
    mutated file) and ``{dir}`` (the seed directory, for companion files such as a
    clean dump) placeholders."""

    def __init__(self, name, suffix, build_seed, commands, parsers=(), structured=False, tools=()):
        self.name = name
        self.tools = tools  # the programs build_seed runs
        self.suffix = suffix
        self.build_seed = build_seed
        self.commands = commands
        self.parsers = list(parsers)
        self.structured = structured
        self.seed_directory = None

    def command_lines(self, path):
        return [[word.format(input=path, dir=self.seed_directory) for word in argv] for argv in self.commands]


def _kernel_dump_seed(bitmap=False, dump_type=None):
    def build(directory):
        from dbgext.sample import build_sample_scenario
        scenario, _ = build_sample_scenario()
        path = os.path.join(directory, "seed.dmp")
        scenario.write_kernel_dump(path, bitmap=bitmap, dump_type=dump_type)
        # The mutated dump is written as input.dmp: its symbols sit beside it.
        scenario.write_symbols(os.path.join(directory, "input.dmp.symbols"))
        return _read(path)
    return build


def _small_dump_seed(directory):
    from dumps_support import small_dump
    path = os.path.join(directory, "seed.dmp")
    small_dump().write(path)
    return _read(path)


def _x86_kernel_dump_seed(directory):
    from test_dumps_kernel_x86 import write_x86, x86_memory
    path = os.path.join(directory, "seed.dmp")
    write_x86(path, x86_memory(), dump_type=5)
    return _read(path)


def _compressed_etl_seed(directory):
    from xpress_support import compress_etl
    return compress_etl(_etl_seed(directory))


def _minidump_seed(arch):
    def build(directory):
        from dumps_support import user_scenario
        path = os.path.join(directory, "seed-%s.mdmp" % arch)
        write_minidump(user_scenario(arch), path)
        return _read(path)
    return build


def _ipt_seed(directory):
    from ipt_tracer import random_program, trace_program
    program = random_program(0x401000, functions=20, seed=3)
    trace, _ = trace_program(program, 3000, seed=5, interrupt_every=400)
    code_path = os.path.join(directory, "code.bin")
    with open(code_path, "wb") as handle:
        handle.write(program.code)
    return trace


def _pe_seed(directory):
    from dbgext.stackuse.fixtures import build_pe, sample_driver_functions
    return build_pe("x64", sample_driver_functions(), imports=["ntoskrnl.exe!KeQueryTimeIncrement"]).data


MINGW_SOURCE = r"""
#include <string.h>
struct node { struct node *next; int value[6]; };
__declspec(dllexport) int __stdcall walk(struct node *n, int limit)
{ char scratch[200]; int total = 0;
  for (; n && limit--; n = n->next) { memcpy(scratch, n->value, sizeof n->value); total += scratch[3]; }
  return total; }
static int leaf(int x) { return x * 3 + 1; }
__declspec(dllexport) int __fastcall spin(int x, int y) { int buf[64]; buf[x & 63] = y; return leaf(buf[y & 63]); }
"""


def _mingw_pe_seed(directory):
    """A real compiler's 32-bit DLL (no .pdata: discovery from symbols and calls)."""
    import subprocess
    source = os.path.join(directory, "seed.c")
    output = os.path.join(directory, "seed.dll")
    with open(source, "w") as handle:
        handle.write(MINGW_SOURCE)
    subprocess.run(["i686-w64-mingw32-gcc", "-O2", "-shared", "-o", output, source], check=True)
    return _read(output)


def _etl_seed(directory):
    from etl_writer import EtlWriter
    writer = EtlWriter()
    rng = random.Random(7)
    for key in range(1, 40):
        frames = [0xFFFFF80000001000 + rng.randrange(0x10000) for _ in range(rng.randint(1, 30))]
        writer.add_stack_definition(0xFFFF000000000000 + key * 0x10, frames)
        writer.add_stack_key(0xFFFF000000000000 + key * 0x10)
    return writer.to_bytes()


def _isf_seed(directory):
    from dbgext.sample import build_sample_scenario
    scenario, _ = build_sample_scenario()
    clean = os.path.join(directory, "clean.dmp")
    scenario.write_kernel_dump(clean)
    files = scenario.write_symbols(os.path.join(directory, "isf"))
    nt = [f for f in files if os.path.basename(f).startswith("nt.")][0]
    return _read(nt)


def _pdb_seed(directory):
    """A real PDB from clang and lld-link, with a kernel dump to load it against."""
    import symbols_support
    built = symbols_support.build_dll(directory, "x64")
    from dbgext.sample import build_sample_scenario
    scenario, _ = build_sample_scenario()
    scenario.write_kernel_dump(os.path.join(directory, "clean.dmp"))
    return _read(built.pdb)


def _read(path):
    with open(path, "rb") as handle:
        return handle.read()


# -- parser-level targets: dbgext's parsers called directly ---------------------

def open_and_read_dump(path, directory):
    """Open a dump and touch what every analysis starts from: header facts,
    modules, threads, the first page of each module, the readable ranges."""
    from dbgext.target import open_dump
    target = open_dump(path, symbols=[])
    try:
        target.info()
        target.threads()
        for module in target.modules()[:16]:
            target.try_read(module.base, 0x1000)
            target.symbolize(module.base + 0x10)
        for start, end in (target.backend.mapped_ranges() or [])[:64]:
            target.try_read(start, min(end - start, 0x2000))
    finally:
        target.close()


def decode_ipt_packets(path, directory):
    from dbgext.ipt.packets import decode_packets
    decode_packets(_read(path))


def decode_ipt_flow(path, directory):
    from dbgext.ipt.flow import CodeImage, decode_flow
    code = CodeImage(images=[(0x401000, _read(os.path.join(directory, "code.bin")))])
    decode_flow(_read(path), code, max_insns=200000)


def parse_pe(path, directory):
    from dbgext.pe import PEImage
    from dbgext.stacks.images import runtime_functions
    image = PEImage.from_file(path)
    for part in ("exports", "imports", "coff_functions", "relocations", "codeview", "load_config", "seh_handlers",
                 "guard_functions"):
        value = getattr(image, part)
        if callable(value):
            value()
    runtime_functions(image)


def stackuse_listing_is_depths_listing(path, directory):
    """``stackuse functions`` decodes only the bodies it must: it still lists exactly what
    ``--depth`` lists, depth fields aside."""
    from dbgext.stackuse import analyze
    listed = analyze(pe=path).records()
    deep = [dict((key, value) for key, value in record.items() if not key.startswith("depth"))
            for record in analyze(pe=path, depth=True).records()]
    if listed != deep:
        raise AssertionError("stackuse functions and functions --depth list different functions")


def read_etl(path, directory):
    from dbgext.etl.reader import EtlReader
    with EtlReader(path) as reader:
        for _ in reader.events():
            pass


def read_pdb(path, directory):
    from symbols_support import read_everything
    read_everything(path)


def load_isf(path, directory):
    from dbgext.symbols.module import load_isf_file
    load_isf_file(path)


KERNEL_COMMANDS = [["lm", "--dump", "{input}", "--json"], ["dps", "--dump", "{input}", "nt", "L10"],
                   ["rtltrace", "--dump", "{input}", "--find", "--json"],
                   ["etwstacks", "--dump", "{input}", "--validate", "--json"],
                   ["stackuse", "thread", "--dump", "{input}", "--json"],
                   ["triage", "--dump", "{input}", "--json"], ["k", "--dump", "{input}", "--json"],
                   ["dumpinfo", "--dump", "{input}", "--json"]]
SMALL_DUMP_COMMANDS = [["lm", "--dump", "{input}", "--json"], ["dps", "--dump", "{input}", "@rsp", "L10"],
                       ["k", "--dump", "{input}", "--json"], ["stackuse", "thread", "--dump", "{input}", "--json"],
                       ["dumpinfo", "--dump", "{input}", "--json"], ["triage", "--dump", "{input}", "--json"]]

CASES = [
    Case("kernel-full", ".dmp", _kernel_dump_seed(), KERNEL_COMMANDS, [open_and_read_dump]),
    Case("kernel-bitmap", ".dmp", _kernel_dump_seed(bitmap=True), KERNEL_COMMANDS, [open_and_read_dump]),
    Case("kernel-summary", ".dmp", _kernel_dump_seed(dump_type=2), KERNEL_COMMANDS, [open_and_read_dump]),
    Case("kernel-rdmp", ".dmp", _kernel_dump_seed(dump_type=8), KERNEL_COMMANDS, [open_and_read_dump]),
    Case("kernel-small", ".dmp", _small_dump_seed, SMALL_DUMP_COMMANDS, [open_and_read_dump]),
    Case("kernel-x86", ".dmp", _x86_kernel_dump_seed, [["lm", "--dump", "{input}", "--json"],
                                                       ["dumpinfo", "--dump", "{input}", "--json"]],
         [open_and_read_dump]),
    Case("minidump-x64", ".mdmp", _minidump_seed("x64"),
         [["lm", "--dump", "{input}", "--json"], ["rtltrace", "--dump", "{input}", "--find", "--json"],
          ["triage", "--dump", "{input}", "--json"]], [open_and_read_dump]),
    Case("minidump-x86", ".mdmp", _minidump_seed("x86"),
         [["lm", "--dump", "{input}", "--json"], ["rtltrace", "--dump", "{input}", "--find", "--json"]],
         [open_and_read_dump]),
    Case("ipt-trace", ".bin", _ipt_seed,
         [["ipt", "packets", "--trace", "{input}", "--json"],
          ["ipt", "flow", "--trace", "{input}", "--image", "{dir}/code.bin@401000", "--json"]],
         [decode_ipt_packets, decode_ipt_flow]),
    Case("pe-x64", ".sys", _pe_seed, [["stackuse", "functions", "--pe", "{input}", "--json"],
                                      ["stackuse", "functions", "--pe", "{input}", "--depth", "--json"]],
         [parse_pe, stackuse_listing_is_depths_listing]),
    Case("pe-mingw-x86", ".dll", _mingw_pe_seed,
         [["stackuse", "functions", "--pe", "{input}", "--json"],
          ["stackuse", "functions", "--pe", "{input}", "--depth", "--json"]],
         [parse_pe, stackuse_listing_is_depths_listing], tools=("i686-w64-mingw32-gcc",)),
    Case("etl", ".etl", _etl_seed,
         [["etwstacks", "--simulate", "--etl", "{input}", "--json"], ["ipt", "scan", "--etl", "{input}", "--json"]],
         [read_etl]),
    Case("etl-compressed", ".etl", _compressed_etl_seed,
         [["etwstacks", "--simulate", "--etl", "{input}", "--json"], ["ipt", "scan", "--etl", "{input}", "--json"]],
         [read_etl]),
    Case("isf", ".json", _isf_seed,
         [["lm", "--dump", "{dir}/clean.dmp", "--symbols", "{input}", "--json"],
          ["dps", "--dump", "{dir}/clean.dmp", "--symbols", "{input}", "nt", "L4"]], [load_isf], structured=True),
    Case("pdb", ".pdb", _pdb_seed, [["lm", "--dump", "{dir}/clean.dmp", "--symbols", "{input}", "--json"]],
         [read_pdb], tools=("clang", "lld-link")),
]


def case_names(levels):
    return [case.name for case in CASES if ("commands" in levels and case.commands)
            or ("parsers" in levels and case.parsers)]


def case_named(name):
    for case in CASES:
        if case.name == name:
            return case
    raise KeyError(name)


def prepare(case, directory):
    """Build the case's seed (and companion files) in ``directory``; the seed bytes,
    or None when a tool the seed needs (a cross compiler) is not installed."""
    if missing_tools(*case.tools):
        return None
    os.makedirs(directory, exist_ok=True)
    case.seed_directory = directory
    return case.build_seed(directory)


def mutated_input(case, seed, rng):
    """One mutated input for ``case`` from ``seed`` (bytes), reproducible from ``rng``."""
    if hasattr(case, "generate"):  # a family that builds its inputs (IPT adversarial)
        return case.generate(seed, rng)
    if case.structured and rng.random() < 0.7:
        try:
            return mutate_json_text(seed.decode("utf-8"), rng).encode("utf-8")
        except ValueError:
            pass
    return mutate(seed, random_operations(rng))


# -- IPT adversarial inputs ------------------------------------------------------
#
# A family of its own: not mutations of a seed but inputs built to make a decoder
# backtrack or loop (runs of one byte value, incomplete PSBs, packets cut short and
# repeated, TNT-8 runs, PAD between every byte), each after a real trace so the flow
# is inside code when they start.  Every decoder (packet listing, packet counter,
# flow, event scan) must finish within a budget linear in the input's size.
# tests/test_ipt_adversarial.py runs a fixed set of them; the fuzz campaign draws
# shapes and sizes at random.

IPT_ADVERSARIAL_BASE = 0x401000
# One encoding of every packet, to cut short (the PSB is cut too: an incomplete PSB).
IPT_PACKET_SAMPLES = {
    "tnt8": b"\x4a", "pad": b"\x00", "tip.ip2": b"\x2d\x34\x12", "tip.ip4": b"\x4d\x78\x56\x34\x12",
    "tip.ip6": b"\x6d\x00\x10\x40\x00\x00\x00", "tip.ip8": b"\xcd\x00\x10\x40\x00\x00\x00\x00\x00",
    "tip.pge": b"\x71\x00\x10\x40\x00\x00\x00", "tip.pgd": b"\x01", "fup": b"\x3d\x00\x10",
    "psb": b"\x02\x82" * 8, "psbend": b"\x02\x23", "tnt64": b"\x02\xa3\xaa\xaa\xaa\xaa\x01\x00",
    "pip": b"\x02\x43\x00\x10\x00\x00\x00\x00", "cbr": b"\x02\x03\x20\x00", "tma": b"\x02\x73\x10\x00\x00\x08\x00",
    "ovf": b"\x02\xf3", "vmcs": b"\x02\xc8\x01\x02\x03\x04\x05", "stop": b"\x02\x83",
    "mnt": b"\x02\xc3\x88" + bytes(range(8)), "exstop.ip": b"\x02\xe2", "mwait": b"\x02\xc2" + bytes(8),
    "pwre": b"\x02\x22\x00\x20", "pwrx": b"\x02\xa2\x12\x01\x00\x00\x00", "ptw4": b"\x02\x92\x01\x02\x03\x04",
    "ptw8": b"\x02\xb2" + bytes(range(8)), "cfe": b"\x02\x13\x81\x0e", "evd": b"\x02\x53\x01" + bytes(8),
    "tsc": b"\x19" + bytes(range(7)), "mtc": b"\x59\x10", "cyc": b"\x07\x01\x03\x02", "mode.exec": b"\x99\x01",
    "mode.tsx": b"\x99\x21", "trig": b"\xd9\x00\x01",
}


def ipt_adversarial_program():
    """(code, trace): a real trace over a program at IPT_ADVERSARIAL_BASE."""
    from ipt_tracer import random_program, trace_program
    program = random_program(IPT_ADVERSARIAL_BASE, functions=12, seed=9)
    trace, _ = trace_program(program, 300, seed=2, interrupt_every=90)
    return program.code, trace


def _repeated(pattern, size):
    return (pattern * (size // len(pattern) + 1))[:size]


def _ipt_shapes():
    """[(name, build(size, rng) -> bytes)] of every adversarial shape."""
    shapes = [("run-%02x" % value, lambda size, rng, value=value: bytes([value]) * size) for value in range(256)]
    for name, pattern in (("psb-without-its-last-pair", b"\x02\x82" * 7),
                          ("psb-cut-then-pad", b"\x02\x82" * 7 + b"\x00"),
                          ("psb-cut-then-02", b"\x02\x82" * 7 + b"\x02")):
        shapes.append((name, lambda size, rng, pattern=pattern: _repeated(pattern, size)))
    for name, packet in sorted(IPT_PACKET_SAMPLES.items()):
        for cut in range(1, len(packet)):
            shapes.append(("prefix-%s-%d" % (name, cut),
                           lambda size, rng, prefix=packet[:cut]: _repeated(prefix, size)))
    shapes.append(("tnt8-random", lambda size, rng: bytes(rng.randrange(4, 256, 2) for _ in range(size))))
    shapes.append(("pad-between-every-byte", _pad_between))
    return shapes


def _pad_between(size, rng):
    stream = b"".join(rng.choice(sorted(IPT_PACKET_SAMPLES.values())) for _ in range(size // 4 + 1))
    return bytes(byte for pair in zip(stream, bytes(len(stream))) for byte in pair)[:size]


IPT_ADVERSARIAL_SHAPES = _ipt_shapes()


def ipt_adversarial_tails(size, rng):
    """(name, bytes) of every adversarial shape at ``size`` bytes: a run of each byte
    value, incomplete PSBs, each packet's every prefix repeated, TNT-8 runs (random,
    from ``rng``), PAD after every byte of a packet stream."""
    return [(name, build(size, rng)) for name, build in IPT_ADVERSARIAL_SHAPES]


def ipt_linear_budget(size):
    """Seconds a decoder may take on ``size`` bytes: 2 s per MB and 1 s (generous:
    linear decoders take a small fraction; exponential ones take hours at 64 bytes)."""
    return 2.0 * size / 1e6 + 1.0


def _ipt_decode_listing(data, code):
    """The listing as ``ipt packets`` makes it (capped), and every token of the input."""
    from dbgext.ipt.analysis import DEFAULT_MAX_PACKETS
    from dbgext.ipt.packets import decode_packets, tokens
    decode_packets(data, max_packets=DEFAULT_MAX_PACKETS)
    for _ in tokens(data):
        pass


def _ipt_count(data, code):
    from dbgext.ipt.packets import packet_stats
    packet_stats(data)


def _ipt_flow(data, code):
    from dbgext.ipt.flow import CodeImage, decode_flow
    decode_flow(data, CodeImage(images=[(IPT_ADVERSARIAL_BASE, code)]), max_insns=0)


def _ipt_event_scan(data, code):
    """An IntelProcessorTrace event holding ``data``, and copies of its header every
    32 bytes through it (each a candidate the scan must check), scanned in memory."""
    from dbgext.ipt import sources
    from dbgext.sample.scenario import Scenario
    option = sources.ipt_option_value({"TraceMode": 1, "TimeMode": 0, "MTCFreq": 0, "CycThresh": 0,
                                       "BufferSize": 15, "TraceSessionMode": 0, "TraceChild": 0,
                                       "TraceCodeMode": 1})
    header = sources.encode_event_header(1, 4, 8, option, len(data), len(data))
    body = bytearray(data)
    for at in range(len(header), len(body) - len(header), 32):
        body[at:at + len(header)] = header
    scenario = Scenario("x64", "kernel")
    address = scenario.alloc(len(header) + len(body))
    scenario.write(address, header + bytes(body))
    sources.scan_target(scenario.target(), address, address + len(header) + len(body))


IPT_DECODERS = {"packets": _ipt_decode_listing, "counter": _ipt_count, "flow": _ipt_flow,
                "event-scan": _ipt_event_scan}


def ipt_decoder_times(data, code):
    """{decoder name: CPU seconds} on ``data`` (CPU time: the machine may be shared)."""
    times = {}
    for name, decode in IPT_DECODERS.items():
        started = time.process_time()
        decode(data, code)
        times[name] = time.process_time() - started
    return times


def _ipt_adversarial_seed(directory):
    code, trace = ipt_adversarial_program()
    with open(os.path.join(directory, "code.bin"), "wb") as handle:
        handle.write(code)
    return trace


def ipt_decoders_within_linear_budget(path, directory):
    """Every IPT decoder on the input, each within ipt_linear_budget of its size."""
    data = _read(path)
    code = _read(os.path.join(directory, "code.bin"))
    for name, seconds in ipt_decoder_times(data, code).items():
        if seconds > ipt_linear_budget(len(data)):
            raise AssertionError("ipt %s took %.1f s on %d bytes" % (name, seconds, len(data)))


class _IptAdversarialCase(Case):
    def generate(self, seed, rng):
        """The seed trace, then one adversarial shape of 64 bytes to 1 MiB."""
        name, build = rng.choice(IPT_ADVERSARIAL_SHAPES)
        return seed + build(int(64 * 2 ** rng.uniform(0, 14)), rng)


CASES.append(_IptAdversarialCase(
    "ipt-adversarial", ".bin", _ipt_adversarial_seed,
    [["ipt", "flow", "--trace", "{input}", "--image", "{dir}/code.bin@%x" % IPT_ADVERSARIAL_BASE, "--stats",
      "--json"]],
    [ipt_decoders_within_linear_budget]))
