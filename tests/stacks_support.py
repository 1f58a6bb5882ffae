"""Stacks made by running real compiled code.

``tests/data/stacks/chain.c`` (plus the interrupt handler ``isr.s``) is built with
MinGW-w64 gcc and with clang + lld-link, linked at a kernel address, and executed
in the Unicorn emulator from a chosen function until a chosen instruction.  While
it runs, every ``call``/``ret`` (and the interrupt we deliver) is tracked on a
shadow stack, so each live frame's return address and where it was pushed are
known from the execution itself — not from the unwind data the tested unwinder
reads.  The stopped machine (registers, stack, image) becomes a kernel-mode
:class:`~dbgext.sample.scenario.Scenario`.
"""

import glob
import hashlib
import os
import subprocess
import tempfile

from dbgext.pe import PEImage
from dbgext.sample.scenario import Scenario, Thread
from dbgext.stacks.images import runtime_functions
from build_cache import build_into
from requirements import need_module, need_tool

SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "stacks")
IMAGE_BASE = 0x140000000  # Unicorn fetches no code from canonical high addresses
STACK_LIMIT = 0x7F000000
STACK_SIZE = 0x6000
STACK_BASE = STACK_LIMIT + STACK_SIZE
THREAD_START = 0   # the return address below the first frame: where Windows threads end their stacks
MODULE = "chain"

CONFIGS = ("mingw-O0", "mingw-O2", "clang-O2", "clang-fp")
MINGW = "x86_64-w64-mingw32-gcc"
REGISTERS = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12", "r13",
             "r14", "r15", "rip")


def _commands(config, source, asm, out):
    if config.startswith("mingw"):
        level = config.split("-")[1]
        return [[MINGW, "-" + level, "-shared", "-o", out, source, asm, "-Wl,--export-all-symbols",
                 "-Wl,--image-base=0x%x" % IMAGE_BASE]]
    flags = ["-O2"] if config == "clang-O2" else ["-O1", "-fno-omit-frame-pointer"]
    target = "--target=x86_64-pc-windows-msvc"
    return [["clang", target] + flags + ["-c", source, "-o", "chain.obj"],
            ["clang", target, "-c", asm, "-o", "isr.obj"],
            ["lld-link", "/dll", "/noentry", "/nodefaultlib", "/out:" + out, "chain.obj", "isr.obj",
             "/export:isr_stub", "/base:0x%x" % IMAGE_BASE]]


def _cache_directory():
    digest = hashlib.sha256()
    for path in sorted(path for path in glob.glob(os.path.join(SOURCES, "*")) if os.path.isfile(path)):
        with open(path, "rb") as handle:
            digest.update(handle.read())
    for tool in (MINGW, "clang"):
        digest.update(subprocess.run([tool, "--version"], stdout=subprocess.PIPE).stdout)
    return os.path.join(tempfile.gettempdir(), "dbgext-stacks-" + digest.hexdigest()[:16])


def build(config):
    """The path of chain.dll built with ``config`` (cached by source and compiler)."""
    need_tool(MINGW, "clang", "lld-link")
    root = _cache_directory()
    final = os.path.join(root, config)
    path = os.path.join(final, "chain.dll")
    if os.path.isfile(path):
        return path
    build_into(root, final, _commands(config, os.path.join(SOURCES, "chain.c"), os.path.join(SOURCES, "isr.s"),
                                      "chain.dll"))
    return path


class Stopped(object):
    """The machine where the emulation stopped, and the truth about its frames:
    ``calls`` holds, innermost first, (return address, slot it was pushed to,
    "call" | "interrupt") for every frame still live."""

    def __init__(self, image, data, registers, stack, calls):
        self.image = image
        self.data = data
        self.registers = registers
        self.stack = stack
        self.calls = calls

    def address(self, name):
        return IMAGE_BASE + self.image.exports_by_name[name]

    def expected_frames(self):
        """[(ip, child-SP)] innermost first, from the shadow stack."""
        frames = [(self.registers["rip"], self.registers["rsp"])]
        for return_address, slot, kind in self.calls:
            child_sp = slot + 8 if kind == "call" else self.stack_pointer_after_interrupt(slot)
            frames.append((return_address, child_sp))
        return frames

    def stack_pointer_after_interrupt(self, machine_frame):
        return int.from_bytes(self.read_stack(machine_frame + 24, 8), "little")

    def read_stack(self, address, size):
        offset = address - STACK_LIMIT
        return self.stack[offset:offset + size]

    def scenario(self, bounds=True, mode="kernel"):
        """A scenario (kernel or user ``mode``) holding the image, the stack and
        the context (as a thread with its stack bounds when ``bounds``)."""
        scenario = Scenario("x64", mode)
        scenario.add_module(MODULE, IMAGE_BASE, len(self.data), image="chain.dll", content=self.data)
        for name, rva in self.image.exports_by_name.items():
            scenario.add_symbol(MODULE, name, rva)
        scenario.write(STACK_LIMIT, self.stack)
        if bounds:
            scenario.threads.append(Thread(1, stack_base=STACK_LIMIT, stack_size=STACK_SIZE,
                                           registers=self.registers))
        else:
            scenario.registers.update(self.registers)
        return scenario


def _load(path):
    image = PEImage.from_file(path)
    image.exports_by_name = dict((name, rva) for rva, name in image.exports.items())
    data = bytearray(image.size_of_image)
    for rva, size in [(0, 0x1000)] + [(section.rva, section.size) for section in image.sections]:
        piece = image.read_partial(rva, size)
        data[rva:rva + len(piece)] = piece
    return image, bytes(data)


def run(config, function, argument, stop_at, hit=1, interrupt_at=None):
    """Execute ``function(argument)`` of the ``config`` build until the ``hit``-th
    time ``stop_at`` (a name, or (name, offset)) is about to execute.
    ``interrupt_at``: (name, offset) where an interrupt is delivered: the machine
    frame is pushed and ``isr_stub`` runs, as the processor would."""
    unicorn = need_module("unicorn")
    x86 = need_module("unicorn.x86_const", "unicorn")
    from dbgext.disasm import Disassembler, base_mnemonic

    image, data = _load(build(config))
    size = (len(data) + 0xFFF) & ~0xFFF
    machine = unicorn.Uc(unicorn.UC_ARCH_X86, unicorn.UC_MODE_64)
    machine.mem_map(IMAGE_BASE, size)
    machine.mem_write(IMAGE_BASE, data)
    machine.mem_map(STACK_LIMIT, STACK_SIZE)
    rsp = STACK_BASE - 0x100
    machine.mem_write(rsp, THREAD_START.to_bytes(8, "little"))
    registers = dict((name, getattr(x86, "UC_X86_REG_" + name.upper())) for name in REGISTERS)
    for name in ("rbx", "rsi", "rdi", "rbp", "r12", "r13", "r14", "r15"):
        machine.reg_write(registers[name], 0x1111 * (REGISTERS.index(name) + 1))
    machine.reg_write(registers["rsp"], rsp)
    machine.reg_write(registers["rcx"], argument)

    def where(spec):
        name, offset = spec if isinstance(spec, tuple) else (spec, 0)
        return IMAGE_BASE + image.exports_by_name[name] + offset

    stop, interrupt = where(stop_at), where(interrupt_at) if interrupt_at else None
    decoder = Disassembler(64)
    calls = []
    hits = [0]
    delivered = []

    def on_code(uc, address, size, _):
        if address == stop:
            hits[0] += 1
            if hits[0] == hit:
                uc.emu_stop()
                return
        if address == interrupt and not delivered:
            delivered.append(address)
            # What the processor does: push SS, RSP, RFLAGS, CS, RIP; enter the handler.
            current = uc.reg_read(registers["rsp"])
            frame = (current & ~0xF) - 40
            for index, value in enumerate((address, 0x10, 0x202, current, 0x18)):
                uc.mem_write(frame + 8 * index, value.to_bytes(8, "little"))
            uc.reg_write(registers["rsp"], frame)
            uc.reg_write(registers["rip"], where("isr_stub"))
            calls.insert(0, (address, frame, "interrupt"))
            return
        instruction = decoder.one(bytes(uc.mem_read(address, size)), address)
        mnemonic = base_mnemonic(instruction[2]) if instruction else ""
        if mnemonic == "call":
            calls.insert(0, (address + size, uc.reg_read(registers["rsp"]) - 8, "call"))
        elif mnemonic in ("ret", "iretq") and calls:
            calls.pop(0)

    machine.hook_add(unicorn.UC_HOOK_CODE, on_code)
    machine.emu_start(where(function), THREAD_START, count=100000)
    if hits[0] != hit:
        raise RuntimeError("the emulation never reached %r (hit %d)" % (stop_at, hit))
    state = dict((name, machine.reg_read(number)) for name, number in registers.items())
    return Stopped(image, data, state, bytes(machine.mem_read(STACK_LIMIT, STACK_SIZE)), calls)


def _exported_function(path, function):
    """(start RVA, its instructions) of the exported x64 ``function``, to the end
    its ``.pdata`` entry gives."""
    from dbgext.disasm import Disassembler

    image, data = _load(path)
    start = image.exports_by_name[function]
    end = next(e for b, e, _ in runtime_functions(image) if b == start)
    return start, Disassembler(64).decode(data[start:end], start)


def epilogue_offset(path, function):
    """Offset in ``function`` of the first instruction after its last ``add rsp``
    (inside the epilogue: the frame is gone, the pops and ret remain)."""
    start, instructions = _exported_function(path, function)
    after = None
    for address, size, mnemonic, operands in instructions:
        if mnemonic == "add" and operands.startswith("rsp,"):
            after = address + size - start
    if after is None:
        raise AssertionError("%s has no add rsp in %s" % (function, path))
    return after


def tail_call_epilogue_offsets(path, function):
    """Offsets in ``function`` of each instruction after its last ``add rsp`` up
    to and including the indirect ``jmp`` that ends it (a tail call)."""
    start, instructions = _exported_function(path, function)
    offsets = None
    for address, size, mnemonic, operands in instructions:
        if mnemonic == "add" and operands.startswith("rsp,"):
            offsets = []
        elif offsets is not None:
            offsets.append(address - start)
            if mnemonic.endswith("jmp"):
                return offsets
    raise AssertionError("%s ends in no tail jmp after add rsp in %s" % (function, path))


# -- real MSVC x86 images executed in the emulator ----------------------------------------------

# Real files written by Windows and Microsoft's tools (never copied into the repository).
REALWORLD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.pardir, "shared",
                         "realworld")
X86_STACK_LIMIT = 0x00200000
X86_STACK_SIZE = 0x10000
X86_REGISTERS = ("eax", "ecx", "edx", "ebx", "esp", "ebp", "esi", "edi", "eip")
LOW_MEMORY = 0x10000       # mapped zero page(s): null pointers read zeros instead of faulting


class X86Stop(object):
    """One point of an execution: registers, the stack, and the live calls
    (innermost first: (return address, slot))."""

    def __init__(self, registers, stack, calls):
        self.registers = registers
        self.stack = stack
        self.calls = calls

    def expected_frames(self):
        """[(ip, child-SP)] innermost first, from the shadow stack."""
        return [(self.registers["eip"], self.registers["esp"])] + [
            (return_address, slot + 4) for return_address, slot in self.calls]


def load_x86_image(path):
    """(PEImage, its bytes laid out as in memory) for an image at its preferred base."""
    image = PEImage.from_file(path)
    data = bytearray(image.size_of_image)
    for rva, size in [(0, 0x1000)] + [(section.rva, section.size) for section in image.sections]:
        piece = image.read_partial(rva, size)
        data[rva:rva + len(piece)] = piece
    return image, bytes(data)


def execute_x86(image, data, entry_rva, planted_return, functions, max_instructions=3000):
    """Run the function at ``entry_rva`` (arguments all zero, ``planted_return`` as
    its return address) following every call to a function (an RVA in
    ``functions``, or a ``jmp rel32`` thunk) inside the image, and return an
    :class:`X86Stop` at each function entry, each ``call`` about to execute and
    each instruction just after a call returned — the points where a frame is
    whole.  The run ends at a call or jump out of the image (an import), a call
    into the middle of a function (an SEH funclet), at the outermost return, or
    after ``max_instructions``."""
    unicorn = need_module("unicorn")
    x86 = need_module("unicorn.x86_const", "unicorn")
    from dbgext.disasm import Disassembler, base_mnemonic

    base = image.image_base
    size = (len(data) + 0xFFF) & ~0xFFF
    machine = unicorn.Uc(unicorn.UC_ARCH_X86, unicorn.UC_MODE_32)
    machine.mem_map(0, LOW_MEMORY)
    machine.mem_map(base, size)
    machine.mem_write(base, data)
    machine.mem_map(X86_STACK_LIMIT, X86_STACK_SIZE)
    esp = X86_STACK_LIMIT + X86_STACK_SIZE - 0x100
    machine.mem_write(esp, planted_return.to_bytes(4, "little"))
    registers = dict((name, getattr(x86, "UC_X86_REG_" + name.upper())) for name in X86_REGISTERS)
    for index, name in enumerate(("ebx", "esi", "edi", "ebp")):
        machine.reg_write(registers[name], 0x1000 * (index + 1) + 0x11)
    machine.reg_write(registers["esp"], esp)
    decoder = Disassembler(32)
    calls = [(planted_return, esp)]
    stops = []
    returned_to = [None]
    entered = [True]

    def state():
        return dict((name, machine.reg_read(number)) for name, number in registers.items())

    def on_code(uc, address, length, _):
        instruction = decoder.one(bytes(uc.mem_read(address, length)), address)
        mnemonic = base_mnemonic(instruction[2]) if instruction else ""
        if entered[0] or returned_to[0] == address or mnemonic == "call":
            stops.append(X86Stop(state(), bytes(uc.mem_read(X86_STACK_LIMIT, X86_STACK_SIZE)), list(calls)))
        entered[0] = False
        returned_to[0] = None
        if mnemonic in ("call", "jmp"):
            target = _branch_target(uc, instruction[3], registers, address + length)
            if target is None or not base <= target < base + size or (
                    mnemonic == "call" and target - base not in functions and data[target - base] != 0xE9):
                uc.emu_stop()
                return
            if mnemonic == "call":
                calls.insert(0, (address + length, uc.reg_read(registers["esp"]) - 4))
                entered[0] = True
        elif mnemonic == "ret":
            returned_to[0] = calls.pop(0)[0]
            if not calls:
                uc.emu_stop()

    machine.hook_add(unicorn.UC_HOOK_CODE, on_code)
    try:
        machine.emu_start(base + entry_rva, planted_return, count=max_instructions)
    except unicorn.UcError:
        pass  # a fault ends the run; the points before it stand
    return stops


def _branch_target(uc, operands, registers, following):
    """Where a call/jmp goes: an immediate, or a dword in memory at a constant
    address (an import's IAT slot); None when it depends on registers."""
    text = operands.strip()
    try:
        return int(text, 0)
    except ValueError:
        pass
    if text.startswith("dword ptr [") and text.endswith("]"):
        try:
            slot = int(text[len("dword ptr ["):-1], 0)
        except ValueError:
            return None
        try:
            return int.from_bytes(uc.mem_read(slot, 4), "little")
        except Exception:
            return None
    return None
