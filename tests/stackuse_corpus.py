"""One C corpus for measuring stackuse against the compilers' own ``-fstack-usage``
numbers, and the builds of it (MinGW-w64 gcc and clang targeting
``i686-pc-windows-msvc`` with lld-link, several optimisation levels).

The corpus is generated from a fixed seed, so it is the same on every machine: a
few hundred functions mixing what frame analysis has to get right — small and large
locals (beyond a page: ``__chkstk``), cdecl/stdcall/fastcall callees (``ret N``),
arguments passed on the stack (pushes right before calls), structs by value and as
return values, doubles, switch jump tables, indirect calls through a table of
callbacks (functions only reachable through relocated pointers), varargs, self
recursion, and ``alloca``/VLAs (dynamic frames).  Each function calls only earlier
ones, so the call graph is a DAG apart from the deliberate recursion.

``scripts/stackuse_exact.py`` prints the exact-match table from these builds;
``scripts/bench_stackuse.py`` uses the same generator for its 45,000-function DLL.
"""

import hashlib
import os
import random
import re
import shutil
import subprocess
import tempfile

from dbgext.pe import undecorate

import requirements

SEED = 15
FUNCTIONS = 400
CALLBACKS = 8

PRELUDE = r"""
typedef __SIZE_TYPE__ size_t;
typedef struct { int a, b, c; double d; } S;
#define NOINLINE __attribute__((noinline))
#define EXPORT __declspec(dllexport)
#if defined(_MSC_VER)
/* No C runtime is linked into the clang-msvc build: what the compiler calls. */
int _fltused;
void *memset(void *to, int value, size_t size)
{ volatile char *p = to; while (size--) *p++ = (char)value; return to; }
void *memcpy(void *to, const void *from, size_t size)
{ volatile char *p = to; const volatile char *q = from; while (size--) *p++ = *q++; return to; }
#endif
static volatile int g_sink;
static NOINLINE void touch(volatile char *buffer, int size) { buffer[0] = (char)size; g_sink += buffer[size / 2]; }
static NOINLINE int va_sum(int count, ...)
{
    __builtin_va_list args; int total = 0;
    __builtin_va_start(args, count);
    while (count-- > 0) total += __builtin_va_arg(args, int);
    __builtin_va_end(args);
    return total;
}
"""

# x86 calling conventions (the x64 compilers ignore the keywords).
CONVENTIONS = [("", 6), ("__stdcall ", 3), ("__fastcall ", 2)]
LOCAL_SIZES = [(0, 10), (8, 4), (16, 4), (24, 3), (64, 4), (100, 3), (256, 3), (600, 2), (1500, 2),
               (4000, 1), (5000, 1), (9000, 1), (70000, 1)]
PARAMETER_TYPES = [("int", 8), ("double", 1), ("S", 1)]


def _pick(rng, weighted):
    total = sum(weight for _, weight in weighted)
    roll = rng.uniform(0, total)
    for value, weight in weighted:
        roll -= weight
        if roll <= 0:
            return value
    return weighted[-1][0]


class _Signature(object):
    def __init__(self, name, returns, convention, parameters):
        self.name = name
        self.returns = returns
        self.convention = convention
        self.parameters = parameters

    def declaration(self, storage):
        params = ", ".join("%s p%d" % (kind, index) for index, kind in enumerate(self.parameters)) or "void"
        return "%s%s %s%s(%s)" % (storage, self.returns, self.convention, self.name, params)

    def call(self, rng):
        args = []
        for kind in self.parameters:
            if kind == "int":
                args.append(rng.choice(["x", "acc", "%d" % rng.randint(0, 99), "x + acc"]))
            elif kind == "double":
                args.append(rng.choice(["(double)x", "0.5 * acc"]))
            else:
                args.append("s")
        text = "%s(%s)" % (self.name, ", ".join(args))
        if self.returns == "S":
            return "%s.a" % text
        if self.returns == "double":
            return "(int)%s" % text
        return text


def generate(count=FUNCTIONS, seed=SEED, x86=True, prefix=""):
    """The corpus as C source: ``count`` functions (plus callbacks and helpers);
    ``prefix`` keeps names apart when several sources are linked together."""
    rng = random.Random(seed)
    lines = [PRELUDE]
    callbacks = []
    for index in range(CALLBACKS):
        name = "%scallback_%d" % (prefix, index)
        size = rng.choice([0, 16, 200])
        body = ("volatile char b[%d]; touch(b, %d); return x + b[1];" % (size, size)) if size else "return x * %d;" % (
            index + 2)
        lines.append("static NOINLINE int %s(int x) { %s }" % (name, body))
        callbacks.append(name)
    lines.append("static int (*g_callbacks[%d])(int) = { %s };" % (CALLBACKS, ", ".join(callbacks)))
    signatures = []
    for index in range(count):
        convention = _pick(rng, CONVENTIONS) if x86 else ""
        returns = _pick(rng, [("int", 12), ("S", 1), ("double", 1)])
        parameters = ["int"] + [_pick(rng, PARAMETER_TYPES) for _ in range(rng.randint(0, 4))]
        signature = _Signature("%sf_%d" % (prefix, index), returns, convention, parameters)
        storage = _pick(rng, [("", 4), ("static NOINLINE ", 4), ("EXPORT ", 3), ("static ", 1)])
        lines.append(signature.declaration(storage))
        lines.append("{")
        lines.append("    int acc = p0; int x = p0; S s = { p0, 1, 2, 0.5 };")
        size = _pick(rng, LOCAL_SIZES)
        if size:
            lines.append("    volatile char buf[%d]; touch(buf, %d);" % (size, size))
        for position, kind in enumerate(signature.parameters[1:], 1):
            lines.append("    acc += (int)%s;" % ("p%d" % position if kind != "S" else "p%d.b" % position))
        callees = rng.sample(signatures, min(len(signatures), rng.randint(0, 3)))
        for callee in callees:
            lines.append("    acc += %s;" % callee.call(rng))
        feature = rng.random()
        if feature < 0.12:
            lines.append("    switch (x & 7) {")
            for case in range(8):
                lines.append("    case %d: acc += %s; break;" % (
                    case, signatures[rng.randrange(len(signatures))].call(rng) if signatures and case % 3 == 0
                    else "%d * x" % (case + 3)))
            lines.append("    }")
        elif feature < 0.22:
            lines.append("    acc += g_callbacks[x & %d](acc);" % (CALLBACKS - 1))
        elif feature < 0.27:
            lines.append("    acc += va_sum(%d, %s);" % (3, ", ".join(["x", "acc", "7"])))
        elif feature < 0.30:
            lines.append("    { volatile char *p = __builtin_alloca((size_t)(x & 255) + 1); touch(p, 1); acc += p[0]; }")
        elif feature < 0.32:
            lines.append("    { volatile char vla[(x & 127) + 1]; touch(vla, 1); acc += vla[0]; }")
        elif feature < 0.35 and signature.returns == "int":
            lines.append("    if (x > 0) acc += %s;" % signature.call(rng).replace("(x", "(x - 1", 1))
        elif feature < 0.45:
            lines.append("    for (int i = 0; i < (x & 15); i++) acc += i * %d;" % rng.randint(2, 9))
        elif feature < 0.50:
            lines.append("    { double d = acc; for (int i = 0; i < 4; i++) d = d * 1.5 + x; acc += (int)d; }")
        if size:
            lines.append("    acc += buf[x & %d];" % (min(size, 256) - 1))
        if signature.returns == "S":
            lines.append("    s.a = acc; return s;")
        elif signature.returns == "double":
            lines.append("    return acc * 0.25;")
        else:
            lines.append("    return acc;")
        lines.append("}")
        signatures.append(signature)
    return "\n".join(lines) + "\n"


# -- builds ------------------------------------------------------------------------------

TOOLCHAINS = {
    "mingw-x86": {"tools": ["i686-w64-mingw32-gcc"], "x86": True},
    "clang-x86": {"tools": ["clang", "lld-link", "llvm-pdbutil"], "x86": True},
    "mingw-x64": {"tools": ["x86_64-w64-mingw32-gcc"], "x86": False},
}
LEVELS = ["O0", "O1", "O2", "Os"]
BUILDS = [(toolchain, level) for toolchain in ("mingw-x86", "clang-x86") for level in LEVELS]

# clang's i686-msvc code calls these helpers for frames beyond a page and for alloca;
# with no C runtime linked they come from here (they move ESP by EAX like MSVC's).
CHKSTK_ASM = """
.text
.globl __chkstk
.globl __alloca_probe
__chkstk:
__alloca_probe:
    pushl %ecx
    leal 8(%esp), %ecx
    subl %eax, %ecx
    movl %esp, %eax
    movl %ecx, %esp
    movl (%eax), %ecx
    pushl 4(%eax)
    ret
"""


def missing_tools(toolchain):
    return requirements.missing_tools(*TOOLCHAINS[toolchain]["tools"])


# Where the tests keep their builds, reused across runs.
TEST_BUILD_DIRECTORY = os.path.join(tempfile.gettempdir(), "dbgext-stackuse-corpus")


def build_for_test(toolchain, level, source):
    """The build a test needs; the test is skipped with the reason when the toolchain is missing."""
    requirements.need_tool(*TOOLCHAINS[toolchain]["tools"])
    return build(toolchain, level, source, TEST_BUILD_DIRECTORY)


class Build(object):
    """One compiled DLL of the corpus: its path, the compiler's frame sizes
    ({name: (frame bytes below the return address, dynamic?)}) and where each
    function is ({name: rva}, from the COFF symbols or the linker map)."""

    def __init__(self, toolchain, level, path, expected, locations):
        self.toolchain = toolchain
        self.level = level
        self.path = path
        self.expected = expected
        self.locations = locations

    @property
    def label(self):
        return "%s -%s" % (self.toolchain, self.level)


def build(toolchain, level, source, directory):
    """Compile ``source`` with ``toolchain`` at ``level`` into ``directory`` (reused
    when it already holds a finished build of the same source and compiler)."""
    final = os.path.join(directory, "%s-%s-%s" % (toolchain, level, _digest(toolchain, source)))
    if not os.path.isdir(final):
        os.makedirs(directory, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix="build-", dir=directory)
        with open(os.path.join(scratch, "corpus.c"), "w") as handle:
            handle.write(source)
        _compile(toolchain, level, scratch)
        try:
            os.rename(scratch, final)
        except OSError:  # a concurrent run finished the same build first
            shutil.rmtree(scratch, ignore_errors=True)
    path = os.path.join(final, "corpus.dll")
    pointer = 4 if TOOLCHAINS[toolchain]["x86"] else 8
    # gcc's .su figure includes the return address, clang's does not.
    return_address = pointer if toolchain.startswith("mingw") else 0
    expected = {}
    with open(os.path.join(final, "corpus.su")) as handle:
        for line in handle:
            location, size, qualifier = line.rstrip("\n").split("\t")
            # clang marks names it spelled out itself (static stdcall/fastcall) with \x01.
            name = location.rsplit(":", 1)[1].lstrip("\x01")
            name = undecorate(name) if pointer == 4 else name
            expected[name] = (int(size) - return_address, qualifier.startswith("dynamic"))
    return Build(toolchain, level, path, expected, _locations(toolchain, final, path))


def _digest(toolchain, source):
    digest = hashlib.sha256(source.encode())
    for tool in TOOLCHAINS[toolchain]["tools"]:
        digest.update(subprocess.run([tool, "--version"], stdout=subprocess.PIPE).stdout)
    digest.update(CHKSTK_ASM.encode())
    return digest.hexdigest()[:12]


def _compile(toolchain, level, directory):
    def run(*argv):
        result = subprocess.run(argv, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            raise RuntimeError("%s failed:\n%s" % (" ".join(argv), result.stdout.decode(errors="replace")[-3000:]))

    if toolchain.startswith("mingw"):
        compiler = "i686-w64-mingw32-gcc" if toolchain == "mingw-x86" else "x86_64-w64-mingw32-gcc"
        run(compiler, "-" + level, "-w", "-fstack-usage", "-c", "corpus.c", "-o", "corpus.o")
        run(compiler, "-shared", "-o", "corpus.dll", "corpus.o")
        return
    with open(os.path.join(directory, "chkstk.s"), "w") as handle:
        handle.write(CHKSTK_ASM)
    # -g only so that the test can locate every function through the PDB: the
    # analysis itself gets no symbols.
    run("clang", "--target=i686-pc-windows-msvc", "-" + level, "-w", "-g", "-gcodeview", "-fstack-usage", "-c",
        "corpus.c", "-o", "corpus.obj")
    run("clang", "--target=i686-pc-windows-msvc", "-c", "chkstk.s", "-o", "chkstk.obj")
    run("lld-link", "/dll", "/noentry", "/nodefaultlib", "/safeseh:no", "/debug", "/out:corpus.dll", "corpus.obj",
        "chkstk.obj")


def _locations(toolchain, directory, path):
    """{name: rva} of the functions in the DLL, from gcc's COFF symbols or from the
    PDB through llvm-pdbutil (the clang build's analysis gets neither)."""
    from dbgext.pe import PEImage
    if toolchain.startswith("mingw"):
        return _by_name(PEImage.from_file(path).coff_functions)
    sections = PEImage.from_file(path).sections
    text = subprocess.run(["llvm-pdbutil", "dump", "--symbols", os.path.join(directory, "corpus.pdb")],
                          stdout=subprocess.PIPE, check=True, universal_newlines=True).stdout
    found = {}
    for name, section, offset in re.findall(r"S_[GL]PROC32 \[size = \d+\] `([^`]+)`\n.*?addr = (\d+):(\d+)", text):
        found[sections[int(section) - 1].rva + int(offset)] = undecorate(name)
    return _by_name(found)


def _by_name(functions):
    """{rva: symbol} -> {name as -fstack-usage spells it: rva}: gcc writes clones
    without their numbers (``f.constprop.0.isra.0`` -> ``f.constprop.isra``); a name
    two clones share is ambiguous and left out."""
    located, ambiguous = {}, set()
    for rva, symbol in functions.items():
        name = ".".join(part for part in symbol.split(".") if not part.isdigit())
        if name in located:
            ambiguous.add(name)
        located[name] = rva
    for name in ambiguous:
        del located[name]
    return located


# -- comparison ------------------------------------------------------------------------------

EXACT, UNKNOWN, WRONG, MISSED = "exact", "unknown", "wrong", "missed"
# clang's -fstack-usage figure for a frame that realigns the stack (`and esp, -8`)
# is 4 bytes below what the prologue's own instructions move ESP by, padding aside:
# `push ebp; mov ebp, esp; push esi; and esp, -8; sub esp, 80` moves it 88 bytes
# and more, the .su file says 84 (its CodeView S_FRAMEPROC record carries the same
# layout figure: clang rounds the allocation after the realignment up to the
# alignment, and its figure leaves the rounding out).  stackuse reports the 88 the
# instructions move; executing the code (the referee below) measures 88 under the
# most favourable incoming alignment and 92 under the worst.
COMPILER_LOW = "compiler_low"
CLANG_REALIGNED_SHORTFALL = 4


def compare(build_result, analysed):
    """{name: (verdict, ours, expected)} for every located function of a build.
    ``analysed``: the stackuse result over the DLL.  A function is *exact* when the
    frame size (or "dynamic") matches the compiler's, *compiler_low* when it is the
    clang realignment shortfall above, *unknown* when stackuse gives no number,
    *wrong* when it gives another number, *missed* when it was not discovered."""
    by_rva = {function.rva: function for function in analysed.functions}
    verdicts = {}
    for name, (size, dynamic) in sorted(build_result.expected.items()):
        rva = build_result.locations.get(name)
        if rva is None:
            continue
        function = by_rva.get(rva)
        if function is None:
            verdicts[name] = (MISSED, None, size)
            continue
        ours = "dynamic" if function.dynamic else function.frame_size
        wanted = "dynamic" if dynamic else size
        if ours == wanted:
            verdict = EXACT
        elif build_result.toolchain.startswith("clang") and function.padding and ours == (
                wanted + CLANG_REALIGNED_SHORTFALL if isinstance(wanted, int) else None):
            verdict = COMPILER_LOW
        elif ours is None or ours == "dynamic":
            verdict = UNKNOWN
        else:
            verdict = WRONG
        verdicts[name] = (verdict, ours, wanted)
    return verdicts


# -- the referee: frames measured by executing the code -------------------------------------

MEASURED_EXACT, MEASURED_DIFFERENT, UNMEASURED = "measured_exact", "measured_different", "unmeasured"


def referee_verdicts(build_result, analysed, names=None):
    """{name: (verdict, ours, measured)} for the located functions (``names``, or all)
    of a build, against the frame measured by executing it (tests/stackuse_referee.py):
    *measured_exact* when stackuse's frame is the measured minimum and its
    realignment padding the spread up to the measured maximum (or both say
    dynamic), *measured_different* otherwise, *unmeasured* when the execution did
    not give a frame.  ``measured`` is "dynamic", (minimum, maximum) or the problem."""
    from dbgext.pe import PEImage
    from stackuse_referee import Referee
    image = PEImage.from_file(build_result.path)
    referee = Referee(image, entries=[image.image_base + rva for rva in build_result.locations.values()])
    by_rva = {function.rva: function for function in analysed.functions}
    verdicts = {}
    for name in sorted(names if names is not None else build_result.expected):
        rva = build_result.locations.get(name)
        if rva is None or rva not in by_rva:
            continue
        function = by_rva[rva]
        ours = "dynamic" if function.dynamic else (function.frame_size, function.frame_size + function.padding
                                                   if function.frame_size is not None else None)
        measurement = referee.measure(image.image_base + rva)
        if measurement.problem:
            verdicts[name] = (UNMEASURED, ours, measurement.problem)
            continue
        measured = "dynamic" if measurement.dynamic else (measurement.minimum, measurement.maximum)
        verdicts[name] = (MEASURED_EXACT if ours == measured else MEASURED_DIFFERENT, ours, measured)
    return verdicts
