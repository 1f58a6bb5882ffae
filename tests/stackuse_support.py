"""Helpers for the stackuse tests: MinGW-built PE files with gcc's own stack-usage
numbers, and small hand-assembled images."""

import glob
import hashlib
import os
import shutil
import subprocess
import tempfile

from dbgext.stackuse.callgraph import CallGraph, Program
from dbgext.pe import PEImage
from requirements import need_tool

SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "stackuse")
COMPILERS = {"x64": "x86_64-w64-mingw32-gcc", "x86": "i686-w64-mingw32-gcc"}
CONFIGS = [(arch, level) for arch in ("x64", "x86") for level in ("O0", "O2")]


class MingwBuild(object):
    """One compiled DLL: its path, the analysed module and gcc's .su numbers
    ({function name: (bytes, "static"|"dynamic"|"dynamic,bounded")})."""

    def __init__(self, arch, level, path, stack_usage):
        self.arch = arch
        self.level = level
        self.path = path
        self.stack_usage = stack_usage
        self.pointer_size = 8 if arch == "x64" else 4
        self.program = Program()
        self.module = self.program.add_image(PEImage.from_file(path))
        self.graph = CallGraph(self.program)
        self.graph.analyse_all(self.module)

    def function(self, name):
        """Exports carry stdcall decorations (``name@12``): match either form."""
        for function in self.module.functions.values():
            if function.name and function.name.split("@")[0] == name:
                return function
        raise KeyError(name)

    def bound(self, name):
        return self.graph.bound(self.function(name))


def _cache_directory():
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(SOURCES, "*.c"))):
        with open(path, "rb") as handle:
            digest.update(handle.read())
    for compiler in COMPILERS.values():
        digest.update(subprocess.run([compiler, "--version"], stdout=subprocess.PIPE).stdout)
    return os.path.join(tempfile.gettempdir(), "dbgext-stackuse-mingw-" + digest.hexdigest()[:16])


def build_all():
    """Compile frames.c for every (arch, level) into a cache directory keyed by the
    sources and compiler versions; returns {(arch, level): MingwBuild}."""
    need_tool(*COMPILERS.values())
    root = _cache_directory()
    os.makedirs(root, exist_ok=True)
    jobs = []
    for arch, level in CONFIGS:
        final = os.path.join(root, "%s-%s" % (arch, level))
        if os.path.isdir(final):
            continue
        # Build in a private directory and rename it into place when complete, so a
        # concurrent test run never reads a half-written DLL.
        scratch = tempfile.mkdtemp(prefix="build-", dir=root)
        command = [COMPILERS[arch], "-" + level, "-fstack-usage", "-shared", "-Wl,--export-all-symbols",
                   "-o", "frames.dll", os.path.join(SOURCES, "frames.c")]
        jobs.append((scratch, final, subprocess.Popen(command, cwd=scratch, stdout=subprocess.PIPE,
                                                      stderr=subprocess.STDOUT)))
    for scratch, final, job in jobs:
        output = job.communicate()[0]
        if job.returncode != 0:
            shutil.rmtree(scratch, ignore_errors=True)
            raise RuntimeError("MinGW build failed:\n%s" % output.decode(errors="replace"))
        try:
            os.rename(scratch, final)
        except OSError:  # another run finished the same build first
            shutil.rmtree(scratch, ignore_errors=True)
    builds = {}
    for arch, level in CONFIGS:
        directory = os.path.join(root, "%s-%s" % (arch, level))
        builds[(arch, level)] = MingwBuild(arch, level, os.path.join(directory, "frames.dll"),
                                           read_stack_usage(directory))
    return builds


def read_stack_usage(directory):
    """gcc's .su lines: ``file:line:column:function<TAB>bytes<TAB>qualifier``."""
    usage = {}
    for path in glob.glob(os.path.join(directory, "*.su")):
        with open(path) as handle:
            for line in handle:
                location, size, qualifier = line.rstrip("\n").split("\t")
                usage[location.rsplit(":", 1)[1]] = (int(size), qualifier)
    return usage


def analyse_built(built, arch, symbols=None):
    """Program, module and call graph over a :func:`build_pe` result."""
    program = Program()
    image = PEImage.from_bytes(built.data, "test.sys")
    module = program.add_image(image, symbols)
    graph = CallGraph(program)
    graph.analyse_all(module)
    return program, module, graph


def function_named(module, name):
    for function in module.functions.values():
        if function.name == name:
            return function
    raise KeyError(name)
