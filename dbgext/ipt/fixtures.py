"""The bundled sample's IPT part: hand-assembled x64 code (a tiny assembler that
records every instruction's address, size, branch kind and target) and
:func:`add_sample_trace`, which puts that code and a trace over it into a sample dump.

The sample's trace was written by the tests' tracer (tests/ipt_tracer.py), which walks
the assembled code the way the processor would; test_ipt_command.py checks that it
still writes exactly these bytes.
"""

import struct

from .sources import encode_event_header, ipt_option_value

I_PLAIN, I_COND, I_JUMP, I_CALL, I_RET, I_ICALL, I_IRET, I_CALL_NEXT, I_SYSCALL, I_SYSRET = range(10)

# Plain instructions by name: (bytes).  Enough for realistic-looking straight-line code.
PLAIN = {
    "nop": b"\x90", "test eax, eax": b"\x85\xc0", "inc eax": b"\xff\xc0", "dec ecx": b"\xff\xc9",
    "xor eax, eax": b"\x31\xc0", "push rbx": b"\x53", "pop rbx": b"\x5b", "pop rax": b"\x58",
    "mov ecx, 8": b"\xb9\x08\x00\x00\x00", "add rax, rcx": b"\x48\x01\xc8", "cmp ecx, 3": b"\x83\xf9\x03",
    "mov rdx, [rsp+8]": b"\x48\x8b\x54\x24\x08", "lea r8, [rip+0x10]": b"\x4c\x8d\x05\x10\x00\x00\x00",
    "mov r10, [rip+0x100]": b"\x4c\x8b\x15\x00\x01\x00\x00", "sub rsp, 0x28": b"\x48\x83\xec\x28",
    "add rsp, 0x28": b"\x48\x83\xc4\x28",
}
CONDITIONS = {"jo": 0x80, "jb": 0x82, "jz": 0x84, "jnz": 0x85, "jbe": 0x86, "js": 0x88, "jl": 0x8C, "jle": 0x8E}


class Instruction(object):
    __slots__ = ("address", "size", "kind", "target")

    def __init__(self, address, size, kind, target=None):
        self.address = address
        self.size = size
        self.kind = kind
        self.target = target


class Assembler(object):
    """A tiny x64 assembler with labels: plain instructions from PLAIN, rel32
    branches, ``mov rax, label; call rax`` indirect calls, ret and iretq."""

    def __init__(self, base):
        self.base = base
        self.code = bytearray()
        self.labels = {}
        self._fixups = []  # (position of rel32, label, kind index in self.instructions)
        self.instructions = []

    def here(self):
        return self.base + len(self.code)

    def label(self, name):
        self.labels[name] = self.here()

    def _emit(self, data, kind=I_PLAIN, target_label=None):
        index = len(self.instructions)
        self.instructions.append(Instruction(self.here(), len(data), kind))
        self.code += data
        if target_label is not None:
            self._fixups.append((len(self.code) - 4, target_label, index))

    def plain(self, *names):
        for name in names:
            self._emit(PLAIN[name])

    def jcc(self, condition, label):
        self._emit(bytes([0x0F, CONDITIONS[condition]]) + b"\0\0\0\0", I_COND, label)

    def jmp(self, label):
        self._emit(b"\xe9\0\0\0\0", I_JUMP, label)

    def call(self, label):
        self._emit(b"\xe8\0\0\0\0", I_CALL, label)

    def call_next(self):
        """``call $+5`` (position-independent code reading its IP): not a real call."""
        self._emit(b"\xe8\0\0\0\0", I_CALL_NEXT)
        self.instructions[-1].target = self.here()

    def call_indirect(self, label):
        """``mov rax, label; call rax``."""
        self._emit(b"\x48\xb8" + bytes(8))
        self._fixups.append((len(self.code) - 8, label, None))
        self._emit(b"\xff\xd0", I_ICALL)
        self.instructions[-1].target = label

    def ret(self):
        self._emit(b"\xc3", I_RET)

    def iretq(self):
        self._emit(b"\x48\xcf", I_IRET)

    def syscall(self):
        self._emit(b"\x0f\x05", I_SYSCALL)

    def sysretq(self):
        self._emit(b"\x48\x0f\x07", I_SYSRET)

    def assemble(self):
        for position, label, index in self._fixups:
            target = self.labels[label]
            if index is None:
                struct.pack_into("<Q", self.code, position, target)
                continue
            struct.pack_into("<i", self.code, position, target - (self.base + position + 4))
            self.instructions[index].target = target
        for instruction in self.instructions:
            if instruction.kind == I_ICALL and isinstance(instruction.target, str):
                instruction.target = self.labels[instruction.target]
        return bytes(self.code)


class Program(object):
    """Assembled code with its instruction table and entry points."""

    def __init__(self, assembler, entry, interrupt_handler=None):
        self.code = assembler.assemble()
        self.base = assembler.base
        self.labels = dict(assembler.labels)
        self.by_address = {i.address: i for i in assembler.instructions}
        self.entry = self.labels[entry]
        self.interrupt_handler = self.labels.get(interrupt_handler) if interrupt_handler else None
        self.syscall_handler = self.labels.get("SyscallHandler")


def sample_program(base):
    """The sample: a driver-like dispatch loop with calls, rets, conditional branches,
    an indirect call through a function pointer, a ``call $+5`` and an interrupt handler."""
    asm = Assembler(base)
    asm.label("Dispatch")
    asm.plain("sub rsp, 0x28", "mov ecx, 8")
    asm.label("Dispatch_loop")
    asm.call("ValidateRequest")
    asm.plain("test eax, eax")
    asm.jcc("jz", "Dispatch_skip")
    asm.call_indirect("CompleteRequest")
    asm.label("Dispatch_skip")
    asm.plain("dec ecx")
    asm.jcc("jnz", "Dispatch_loop")
    asm.plain("add rsp, 0x28")
    asm.jmp("Dispatch")

    asm.label("ValidateRequest")
    asm.plain("push rbx", "xor eax, eax", "cmp ecx, 3")
    asm.jcc("jbe", "ValidateRequest_small")
    asm.plain("inc eax")
    asm.call("Checksum")
    asm.label("ValidateRequest_small")
    asm.plain("pop rbx")
    asm.ret()

    asm.label("Checksum")
    asm.call_next()
    asm.plain("pop rax", "mov rdx, [rsp+8]", "add rax, rcx")
    asm.jcc("js", "Checksum_done")
    asm.plain("nop", "nop")
    asm.label("Checksum_done")
    asm.ret()

    asm.label("CompleteRequest")
    asm.plain("mov r10, [rip+0x100]", "lea r8, [rip+0x10]", "nop")
    asm.ret()

    asm.label("InterruptHandler")
    asm.plain("push rbx", "pop rbx")
    asm.iretq()
    return Program(asm, "Dispatch", "InterruptHandler")


# -- the sample dump -----------------------------------------------------------------

SAMPLE_MODULE = ("iptdemo", 0xFFFFF80012340000, 0x4000, "iptdemo.sys")
SAMPLE_OPTION = {"TraceMode": 1, "TimeMode": 0, "MTCFreq": 0, "CycThresh": 0, "BufferSize": 0,
                 "TraceSessionMode": 0, "TraceChild": 0, "TraceCodeMode": 1}
SAMPLE_CODE_RVA = 0x1000
# The tests' tracer over sample_program at SAMPLE_MODULE's base + SAMPLE_CODE_RVA:
# trace_program(program, 300, seed=7, interrupt_every=150, psb_every=0): the PSB,
# MODE.Exec 64-bit, the FUP of Dispatch, PSBEND, then TNT packets, TIPs (indirect
# calls, uncompressed RETs, interrupts and their iretq) and an interrupt's FUP; it
# reconstructs SAMPLE_TRACE_INSTRUCTIONS instructions.
SAMPLE_TRACE = bytes.fromhex(
    "02820282028202820282028202820282" "9901" "7d0010341200f8" "0223"
    "faf0f6cee67c2d5f103e3d0e102d6f102d0e10042d5f10fe4c2d5f107e3d24102d6f102d2410b83c2d5f10"
    "6c2d5f10ee042d5f101c")
SAMPLE_TRACE_INSTRUCTIONS = 300


def add_sample_trace(scenario):
    """Put an IPT sample in a kernel-mode Scenario: a module ``iptdemo`` holding
    hand-assembled code (calls, rets, conditional branches, an indirect call, an
    interrupt) and, in pool memory, an ETW IntelProcessorTrace event (header + trace)
    whose trace decodes over that code.

    Returns {"event_address", "trace_address", "trace_size", "module", "entry",
    "instructions"} (instructions: how many the trace reconstructs)."""
    name, base, size, image = SAMPLE_MODULE
    program = sample_program(base + SAMPLE_CODE_RVA)
    module = scenario.add_module(name, base, size, image=image)
    scenario.write(program.base, program.code)
    for label, address in program.labels.items():
        if "_" not in label:
            scenario.add_symbol(name, label, address - base)
    trace = SAMPLE_TRACE
    header = encode_event_header(event_time_stamp=0x1D9E0A1B2C3D4E5, process=4, thread=0x1F4,
                                 ipt_option=ipt_option_value(SAMPLE_OPTION), trace_size=len(trace),
                                 trace_position=len(trace))
    event = scenario.alloc(len(header) + len(trace), align=16)
    scenario.write(event, header + trace)
    return {"event_address": event, "trace_address": event + len(header), "trace_size": len(trace),
            "module": module, "entry": program.entry, "instructions": SAMPLE_TRACE_INSTRUCTIONS}
