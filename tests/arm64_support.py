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
import struct
import subprocess
import tempfile


from dbgext.errors import UnreadableMemory
from dbgext.layouts.arm64 import KTRAP_FRAME_ARM64, KTRAP_FRAME_ARM64_VOLATILE_X
from dbgext.stacks.arm64_unwind import (find_entry, follows_call, function_table, parse_pdata, unwind_frame_chain,
                                        unwind_function, unwind_leaf)
from dbgext.stacks.x64 import UnwindStep
from build_cache import build_into
from requirements import need_module, need_tool

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


class BytesImage(object):
    """An image that is just ``data`` at rva 0 (for synthetic unwind data)."""

    size_of_image = 0x10000

    def __init__(self, data):
        self.data = data

    def unpack(self, fmt, rva):
        size = struct.calcsize(fmt)
        return struct.unpack_from(fmt, self.data, rva) if 0 <= rva and rva + size <= len(self.data) else None

    def describe(self, rva):
        return "image+0x%x" % rva


# -- llvm-readobj as the referee ---------------------------------------------------------------

_OPCODE = re.compile(r"^\s*0x([0-9a-f]+)\s+;\s(.*)$")
_FIELD = re.compile(r"^\s*(\w+): (.*)$")


def require(*tools):
    need_tool(*tools)


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
TARGET = "--target=aarch64-pc-windows-msvc"
FLAGS = {"O0": ["-O0"], "O1": ["-O1"], "O2": ["-O2"], "Os": ["-Os"], "O1-fp": ["-O1", "-fno-omit-frame-pointer"]}


def _cache_directory():
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(SOURCES, "*"))):
        with open(path, "rb") as handle:
            digest.update(handle.read())
    digest.update(subprocess.run(["clang", "--version"], stdout=subprocess.PIPE).stdout)
    return os.path.join(tempfile.gettempdir(), "dbgext-arm64-" + digest.hexdigest()[:16])


def build(config, source="chain.c", exports=("run",), assembly=()):
    """The path of the DLL built from ``source`` (+ chkstk.s and the ``assembly``
    sources) with ``FLAGS[config]``, cached by sources and compiler."""
    require("clang", "lld-link")
    root = _cache_directory()
    stem = os.path.splitext(source)[0]
    final = os.path.join(root, "%s-%s%s" % (stem, config, "".join("+" + os.path.splitext(extra)[0]
                                                                   for extra in assembly)))
    path = os.path.join(final, stem + ".dll")
    if os.path.isfile(path):
        return path
    source_path = os.path.join(SOURCES, source)
    compile_source = (["clang", TARGET] + FLAGS[config] + ["-c", source_path, "-o", "code.obj"]
                      if source.endswith(".c") else ["clang", TARGET, "-c", source_path, "-o", "code.obj"])
    commands = [compile_source,
                ["clang", TARGET, "-c", os.path.join(SOURCES, "chkstk.s"), "-o", "chkstk.obj"]]
    commands += [["clang", TARGET, "-c", os.path.join(SOURCES, extra), "-o", extra + ".obj"] for extra in assembly]
    commands.append(["lld-link", "/dll", "/noentry", "/nodefaultlib", "/out:" + stem + ".dll", "code.obj",
                     "chkstk.obj"] + [extra + ".obj" for extra in assembly] + ["/base:0x%x" % IMAGE_BASE]
                    + ["/export:" + name for name in exports])
    build_into(root, final, commands)
    return path


# -- execution in unicorn: the live calls are the truth ----------------------------------------

STACK_LIMIT = 0x7F000000
STACK_SIZE = 0x10000
STACK_TOP = STACK_LIMIT + STACK_SIZE - 0x100
RETURN_TO = 0x10000      # the lr `run` is entered with: the walk's end, like a thread's start
_REGISTER_NAMES = tuple("x%d" % number for number in range(29)) + ("fp", "lr", "sp", "pc")


def _is_call(word):
    return word & 0xFC000000 == 0x94000000 or word & 0xFFFFFC1F == 0xD63F0000      # bl, blr


def _branch_target(word, address):
    """The target of an unconditional ``b``, or None."""
    if word & 0xFC000000 != 0x14000000:
        return None
    offset = word & 0x3FFFFFF
    return address + 4 * (offset - (1 << 26) if offset & (1 << 25) else offset)


def _is_return(word):
    return word & 0xFFFFFC1F == 0xD65F0000                                            # ret


class Stopped(object):
    """The machine where the emulation stopped: ``registers`` (dbgext's names),
    the stack bytes, and ``calls``: the live calls innermost first, each
    (return address, sp when the call executed) — what a correct unwind yields."""

    def __init__(self, image, registers, stack, calls, executed):
        self.image = image
        self.registers = registers
        self.stack = stack
        self.calls = calls
        self.executed = executed        # instructions executed before the stop

    def read_pointer(self, address):
        offset = address - STACK_LIMIT
        if not 0 <= offset <= len(self.stack) - 8:
            raise UnreadableMemory(address, 8)
        return int.from_bytes(self.stack[offset:offset + 8], "little")

    def expected_frames(self):
        """[(pc, sp)] innermost first, ending with the return to RETURN_TO."""
        return [(self.registers["pc"], self.registers["sp"])] + list(self.calls)


def execute(path, entry="run", argument=0, stops=(), frame_sizes=None, call_depths=None, trap_at=None):
    """Run ``entry(argument)`` of the DLL at ``path`` in unicorn to its return,
    and return the machine as it was just before executing instruction number
    ``n`` (counted from 0) for each ``n`` in ``stops``: a list of
    :class:`Stopped`.  ``call_depths``, a dict, receives for every function
    entered the deepest sp went below its entry sp while it was live, its
    callees' frames included (what a worst-case bound covers).  ``trap_at`` (an
    exported function's name): the first time its first instruction is about to
    run, a trap is delivered as the kernel's exception entry does it — a
    KTRAP_FRAME of the interrupted x0-x18, sp, lr, fp and pc below sp, sp
    pointing at it, ``trap_stub`` entered — and the live calls gain (interrupted
    pc, interrupted sp) until the stub resumes there.  ``frame_sizes``, a dict,
    receives for every function entered
    (by address) the deepest its sp went below its entry sp (its frame: on ARM64
    nothing but the function itself moves sp)."""
    unicorn = need_module("unicorn")
    from unicorn import arm64_const
    image = MiniPE(path)
    engine = unicorn.Uc(unicorn.UC_ARCH_ARM64, unicorn.UC_MODE_ARM)
    size = (image.size_of_image + 0xFFF) & ~0xFFF
    engine.mem_map(IMAGE_BASE, size)
    engine.mem_write(IMAGE_BASE, image.image)
    engine.mem_map(STACK_LIMIT, STACK_SIZE)
    engine.mem_map(RETURN_TO, 0x1000)
    engine.reg_write(arm64_const.UC_ARM64_REG_CPACR_EL1, 0x300000)     # let the code use FP/SIMD
    engine.reg_write(arm64_const.UC_ARM64_REG_SP, STACK_TOP)
    engine.reg_write(arm64_const.UC_ARM64_REG_LR, RETURN_TO)
    engine.reg_write(arm64_const.UC_ARM64_REG_X0, argument)
    constants = [getattr(arm64_const, "UC_ARM64_REG_" + {"fp": "X29", "lr": "X30"}.get(name, name.upper()))
                 for name in _REGISTER_NAMES]
    calls = [(RETURN_TO, STACK_TOP)]       # innermost last while running
    entered = [(IMAGE_BASE + image.exports[entry], STACK_TOP)]
    wanted = set(stops)
    # A `b` to a function's first instruction is a tail call: the callee takes over the frame.
    starts = set(IMAGE_BASE + begin for begin, _ in image.pdata) | set(IMAGE_BASE + rva for rva in
                                                                       image.exports.values())
    stopped = []
    state = {"count": 0, "pending": None, "resume": None}
    trap_address = IMAGE_BASE + image.exports[trap_at] if trap_at else None

    def deliver(uc, address, sp):
        frame = ((sp & ~0xF) - KTRAP_FRAME_ARM64["size"]) & ~0xF
        values = [(KTRAP_FRAME_ARM64["X"] + 8 * number, uc.reg_read(constants[number])) for number in
                  range(KTRAP_FRAME_ARM64_VOLATILE_X)]
        values += [(KTRAP_FRAME_ARM64["Sp"], sp), (KTRAP_FRAME_ARM64["Pc"], address),
                   (KTRAP_FRAME_ARM64["Lr"], uc.reg_read(arm64_const.UC_ARM64_REG_LR)),
                   (KTRAP_FRAME_ARM64["Fp"], uc.reg_read(arm64_const.UC_ARM64_REG_FP))]
        for offset, value in values:
            uc.mem_write(frame + offset, value.to_bytes(8, "little"))
        uc.reg_write(arm64_const.UC_ARM64_REG_SP, frame)
        uc.reg_write(arm64_const.UC_ARM64_REG_PC, IMAGE_BASE + image.exports["trap_stub"])
        calls.append((address, sp))
        entered.append((IMAGE_BASE + image.exports["trap_stub"], frame))
        state["resume"] = (address, sp)

    def hook(uc, address, size_, user_data):
        pending = state["pending"]      # the previous instruction executed: its effect holds
        if pending == "return":
            calls.pop()
            entered.pop()
        elif pending == "tail call":
            entered[-1] = (address, entered[-1][1])
        elif pending is not None:
            calls.append(pending)
            entered.append((address, pending[1]))
        state["pending"] = None
        sp = uc.reg_read(arm64_const.UC_ARM64_REG_SP)
        if address == trap_address and state["resume"] is None:
            deliver(uc, address, sp)
            return                      # the interrupted instruction did not run: the stub's first does
        if state["resume"] == (address, sp):
            calls.pop()
            entered.pop()
            state["resume"] = False
        if frame_sizes is not None:
            function, entry_sp = entered[-1]
            frame_sizes[function] = max(frame_sizes.get(function, 0), entry_sp - sp)
        if call_depths is not None:
            for function, entry_sp in entered:
                call_depths[function] = max(call_depths.get(function, 0), entry_sp - sp)
        if state["count"] in wanted:
            registers = dict(zip(_REGISTER_NAMES, [uc.reg_read(constant) for constant in constants]))
            stopped.append(Stopped(image, registers, bytes(uc.mem_read(STACK_LIMIT, STACK_SIZE)),
                                   list(reversed(calls)), state["count"]))
        state["count"] += 1
        word = int.from_bytes(uc.mem_read(address, 4), "little")
        if _is_call(word):
            state["pending"] = (address + 4, sp)
        elif _is_return(word):
            state["pending"] = "return"
        elif _branch_target(word, address) in starts:
            state["pending"] = "tail call"

    engine.hook_add(unicorn.UC_HOOK_CODE, hook, begin=IMAGE_BASE, end=IMAGE_BASE + size - 1)
    engine.emu_start(IMAGE_BASE + image.exports[entry], RETURN_TO)
    execute.last_count = state["count"]
    return stopped


def instruction_count(path, entry="run", argument=0):
    """How many instructions ``entry(argument)`` executes."""
    execute(path, entry, argument)
    return execute.last_count


class Walker(object):
    """The ARM64 walk order dbgext's walker gets on wiring (``stacks/walk.py``
    ``_step``): the module's unwind data (a function without an entry is a leaf),
    else the x29 frame chain, else a scan for a slot after a ``bl``/``blr`` —
    each frame marked with how it was found."""

    def __init__(self, image, use_unwind_data=True):
        self.image = image
        self.table, self.dropped = function_table(image, image.pdata) if use_unwind_data else ([], [])
        self.begins = [entry[0] for entry in self.table]
        self.cache = {}

    def walk(self, stopped, max_frames=64):
        registers = dict(stopped.registers)
        frames = [(registers["pc"], registers["sp"], "context")]
        unwound_to_call = False
        while registers["pc"] != RETURN_TO and len(frames) < max_frames:
            pc = registers["pc"]
            in_image = IMAGE_BASE <= pc < IMAGE_BASE + self.image.size_of_image
            if in_image and self.table:
                entry = find_entry(self.table, self.begins, pc - IMAGE_BASE - (4 if unwound_to_call else 0))
                if entry is None:
                    step = unwind_leaf(registers)
                else:
                    step = unwind_function(self.image, IMAGE_BASE, entry, registers, stopped.read_pointer,
                                           unwound_to_call, self.cache)
                how = "unwind"
            else:
                step = unwind_frame_chain(registers, stopped.read_pointer)
                how = "frame_chain"
                if step is None:
                    step = self._scan(stopped, registers)
                    how = "scan"
            if step is None:
                break
            registers = step.registers
            unwound_to_call = step.machine_frame is None
            frames.append((registers["pc"], registers["sp"], how))
        return frames

    def _scan(self, stopped, registers):
        for slot in range(registers["sp"], STACK_LIMIT + STACK_SIZE - 8, 8):
            value = stopped.read_pointer(slot)
            rva = value - IMAGE_BASE
            if 4 <= rva < self.image.size_of_image and follows_call(self.image.read(rva - 4, 4)):
                caller = dict(registers)
                caller["pc"], caller["sp"] = value, slot + 8
                return UnwindStep(caller, slot)
        return None


# -- the stopped machine as a target dbgext reads ------------------------------------------------

MODULE = "chain"


def image_bytes(path):
    """The DLL at ``path`` laid out as the loader maps it (headers and sections)."""
    from dbgext.pe import PEImage
    image = PEImage.from_file(path)
    data = bytearray(image.size_of_image)
    for rva, size in [(0, 0x1000)] + [(section.rva, section.size) for section in image.sections]:
        piece = image.read_partial(rva, size)
        data[rva:rva + len(piece)] = piece
    return bytes(data)


def scenario(stopped, path, bounds=True):
    """An ARM64 user-mode :class:`~dbgext.sample.scenario.Scenario` of ``stopped``
    (the run of the DLL at ``path``): the module mapped with its exports as
    symbols, the emulator's stack, and the context as a thread with the stack's
    bounds (or as the target's only context without them)."""
    from dbgext.sample.scenario import Scenario, Thread
    data = image_bytes(path)
    machine = Scenario("arm64", "user")
    machine.add_module(MODULE, IMAGE_BASE, len(data), image=MODULE + ".dll", content=data)
    for name, rva in stopped.image.exports.items():
        machine.add_symbol(MODULE, name, rva)
    machine.write(STACK_LIMIT, stopped.stack)
    if bounds:
        machine.threads.append(Thread(1, stack_base=STACK_LIMIT, stack_size=STACK_SIZE,
                                      registers=stopped.registers))
    else:
        machine.registers.update(stopped.registers)
    return machine
