"""ARM64 test support: a minimal PE reader, ``llvm-readobj --unwind`` as a
referee, ARM64 DLLs built with clang + lld-link, and their code executed in
unicorn's ARM64 mode with the live calls recorded.

The PE reader is deliberately tiny (headers, sections, exports, the exception
directory): the project's :class:`dbgext.pe.PEImage` does not accept machine
0xAA64 yet, and the unwinder only needs ``unpack``/``describe``/``size_of_image``.
"""

import glob
import hashlib
import os
import re
import shutil
import struct
import subprocess
import tempfile

import pytest

from dbgext.stacks.arm64_unwind import parse_pdata

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REALWORLD = os.path.join(os.path.dirname(REPOSITORY), "shared", "realworld")
XCPT4 = os.path.join(REALWORLD, "pdb", "msvc2022-arm64-xcpt4", "xcpt4.exe")
ARM64_TRIAGE_DUMP = os.path.join(REALWORLD, "kernel", "rizin__triage_arm64.dmp")
SOURCES = os.path.join(REPOSITORY, "tests", "data", "arm64")
MACHINE_ARM64 = 0xAA64
DIRECTORY_EXPORT = 0
DIRECTORY_EXCEPTION = 3


class MiniPE(object):
    """An ARM64 PE file mapped by sections."""

    def __init__(self, path):
        with open(path, "rb") as handle:
            self.raw = handle.read()
        self.name = os.path.basename(path)
        pe = struct.unpack_from("<I", self.raw, 0x3C)[0]
        machine, sections, _, _, _, optional_size = struct.unpack_from("<HHIIIH", self.raw, pe + 4)
        assert machine == MACHINE_ARM64, hex(machine)
        optional = pe + 24
        self.image_base = struct.unpack_from("<Q", self.raw, optional + 24)[0]
        self.size_of_image = struct.unpack_from("<I", self.raw, optional + 56)[0]
        count = struct.unpack_from("<I", self.raw, optional + 108)[0]
        self.directories = [struct.unpack_from("<II", self.raw, optional + 112 + 8 * index)
                            for index in range(count)]
        self.image = bytearray(self.size_of_image)
        self.sections = []
        table = optional + optional_size
        for index in range(sections):
            name, virtual_size, rva, raw_size, raw_offset = struct.unpack_from("<8sIIII", self.raw, table + 40 * index)
            characteristics = struct.unpack_from("<I", self.raw, table + 40 * index + 36)[0]
            data = self.raw[raw_offset:raw_offset + min(raw_size, virtual_size)]
            self.image[rva:rva + len(data)] = data
            self.sections.append((name.rstrip(b"\0").decode(), rva, virtual_size, characteristics))
        self.image = bytes(self.image)

    def unpack(self, fmt, rva):
        size = struct.calcsize(fmt)
        if rva < 0 or rva + size > len(self.image):
            return None
        return struct.unpack_from(fmt, self.image, rva)

    def read(self, rva, size):
        return self.image[rva:rva + size]

    def describe(self, rva):
        return "%s+0x%x" % (self.name, rva)

    @property
    def pdata(self):
        rva, size = self.directories[DIRECTORY_EXCEPTION]
        return parse_pdata(self.image[rva:rva + size])

    @property
    def exports(self):
        """{name: rva}"""
        rva, _ = self.directories[DIRECTORY_EXPORT]
        if not rva:
            return {}
        fields = struct.unpack_from("<IIHHIIIIIII", self.image, rva)
        functions, names, ordinals = fields[8], fields[9], fields[10]
        result = {}
        for index in range(fields[7]):
            name_rva = struct.unpack_from("<I", self.image, names + 4 * index)[0]
            ordinal = struct.unpack_from("<H", self.image, ordinals + 2 * index)[0]
            name = self.image[name_rva:self.image.index(b"\0", name_rva)].decode()
            result[name] = struct.unpack_from("<I", self.image, functions + 4 * ordinal)[0]
        return result


# -- llvm-readobj as the referee ---------------------------------------------------------------

_OPCODE = re.compile(r"^\s*0x([0-9a-f]+)\s+;\s(.*)$")
_FIELD = re.compile(r"^\s*(\w+): (.*)$")


def require(*tools):
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        pytest.skip("not installed: %s (Debian packages llvm, clang, lld)" % ", ".join(missing))


def llvm_unwind(path):
    """``llvm-readobj --unwind`` of ``path`` as a list of RuntimeFunction dicts:
    their fields, and each ``[ ]`` block's lines — (bytes hex, text) for opcode
    lines, the text for packed prologues — under "Prologue", "Epilogue" and
    "EpilogueScopes" (a list of {fields..., "Opcodes": [...]})."""
    require("llvm-readobj")
    output = subprocess.run(["llvm-readobj", "--unwind", path], stdout=subprocess.PIPE, check=True).stdout.decode()
    functions = []
    stack = []        # open blocks: (name, container)
    current = None
    for line in output.splitlines():
        stripped = line.strip()
        if stripped == "RuntimeFunction {":
            current = {}
            functions.append(current)
            stack = [("RuntimeFunction", current)]
            continue
        if current is None or not stripped:
            continue
        if stripped.endswith("{") or stripped.endswith("["):
            name = stripped[:-1].strip()
            parent = stack[-1][1]
            if name == "EpilogueScope":
                block = {}
                parent.append(block)
            elif stripped.endswith("["):
                block = []
                parent[name] = block
            else:
                block = parent     # ExceptionData { ... }: its fields join the function's
            stack.append((name, block))
            continue
        if stripped in ("}", "]"):
            stack.pop()
            if not stack:
                current = None
            continue
        container = stack[-1][1]
        if isinstance(container, list):
            opcode = _OPCODE.match(line)
            container.append((opcode.group(1), opcode.group(2).strip()) if opcode else stripped)
        else:
            field = _FIELD.match(line)
            if field:
                container[field.group(1)] = field.group(2)
    return functions


# -- ARM64 DLLs built from tests/data/arm64 ----------------------------------------------------

IMAGE_BASE = 0x140000000
CONFIGS = ("O0", "O1", "O2", "Os")
TARGET = "--target=aarch64-pc-windows-msvc"


def _cache_directory():
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(SOURCES, "*"))):
        with open(path, "rb") as handle:
            digest.update(handle.read())
    digest.update(subprocess.run(["clang", "--version"], stdout=subprocess.PIPE).stdout)
    return os.path.join(tempfile.gettempdir(), "dbgext-arm64-" + digest.hexdigest()[:16])


def build(config, source="chain.c", exports=("run",)):
    """The path of the DLL built from ``source`` (+ chkstk.s) at ``-<config>``,
    cached by sources and compiler."""
    require("clang", "lld-link")
    root = _cache_directory()
    stem = os.path.splitext(source)[0]
    final = os.path.join(root, "%s-%s" % (stem, config))
    path = os.path.join(final, stem + ".dll")
    if os.path.isfile(path):
        return path
    os.makedirs(root, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="build-", dir=root)
    source_path = os.path.join(SOURCES, source)
    compile_source = (["clang", TARGET, "-" + config, "-c", source_path, "-o", "code.obj"]
                      if source.endswith(".c") else ["clang", TARGET, "-c", source_path, "-o", "code.obj"])
    commands = [compile_source,
                ["clang", TARGET, "-c", os.path.join(SOURCES, "chkstk.s"), "-o", "chkstk.obj"],
                ["lld-link", "/dll", "/noentry", "/nodefaultlib", "/out:" + stem + ".dll", "code.obj", "chkstk.obj",
                 "/base:0x%x" % IMAGE_BASE] + ["/export:" + name for name in exports]]
    for command in commands:
        done = subprocess.run(command, cwd=scratch, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            shutil.rmtree(scratch, ignore_errors=True)
            raise RuntimeError("%s failed:\n%s" % (" ".join(command), done.stdout.decode(errors="replace")))
    try:
        os.rename(scratch, final)
    except OSError:  # a concurrent run finished the same build first
        shutil.rmtree(scratch, ignore_errors=True)
    return path
