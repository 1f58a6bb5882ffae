"""The tracer the ipt tests, the fuzzer and the benchmark generate traces with: a
writer of packets the way the processor writes them, a walk of assembled code that
chooses branch outcomes at random and writes the packets for the path it took (with
the options that reproduce the errata libipt works around), and random programs to
walk.

The tracer does not use the decoder under test: it works from the assembler's own
record of every instruction (address, size, branch kind, target), so its expected
instruction list is an independent answer; libipt is the other one.  The assembler
and the sample program live in the package (:mod:`dbgext.ipt.fixtures`), which the
bundled sample needs; the sample's trace is this tracer's output, checked by
test_ipt_command.py.
"""

import random
import struct

from dbgext.ipt.fixtures import (CONDITIONS, I_CALL, I_CALL_NEXT, I_COND, I_ICALL, I_IRET, I_JUMP, I_PLAIN,
                                 I_RET, I_SYSCALL, PLAIN, Assembler, Program)
from dbgext.ipt.flow import RETSTACK_DEPTH
from dbgext.ipt.packets import PSB


def random_program(base, functions=60, seed=1, syscalls=False):
    """Many small functions: if/else, loops, direct calls to later functions,
    occasional indirect calls; function 0 is a never-returning driver loop.
    ``syscalls`` adds ``syscall`` sites and a handler ending in ``sysretq``."""
    generator = random.Random(seed)
    asm = Assembler(base)
    names = ["f%d" % i for i in range(functions)]
    asm.label("Driver")
    for index in range(1, min(functions, 8)):
        asm.call(names[index])
        asm.plain("nop")
    asm.jmp("Driver")
    asm.label("InterruptHandler")
    asm.plain("push rbx", "pop rbx")
    asm.iretq()
    asm.label("SyscallHandler")
    asm.plain("push rbx", "pop rbx")
    asm.sysretq()
    plains = [name for name in PLAIN if name not in ("push rbx", "pop rbx", "pop rax")]
    for index, name in enumerate(names):
        asm.label(name)
        for part in range(generator.randint(2, 5)):
            label = "%s_%d" % (name, part)
            asm.plain(*generator.sample(plains, generator.randint(1, 4)))
            shape = generator.random()
            callee = names[generator.randint(index + 1, functions - 1)] if index < functions - 1 else None
            if shape < 0.35:
                asm.jcc(generator.choice(list(CONDITIONS)), label + "_else")
                asm.plain(*generator.sample(plains, generator.randint(1, 3)))
                asm.label(label + "_else")
            elif shape < 0.55:
                asm.label(label + "_loop")
                asm.plain(*generator.sample(plains, generator.randint(1, 3)))
                asm.jcc(generator.choice(list(CONDITIONS)), label + "_loop")
            elif shape < 0.8 and callee:
                asm.call(callee)
            elif shape < 0.88 and callee:
                asm.call_indirect(callee)
            elif shape < 0.92:
                asm.call_next()
                asm.plain("pop rax")
            elif shape < 0.96 and syscalls:
                asm.syscall()
        asm.ret()
    return Program(asm, "Driver", "InterruptHandler")


class PacketWriter(object):
    """Writes packets the way the processor does: TNT bits gathered into TNT-8 (or
    TNT-64) packets and flushed before any IP packet, IPs compressed against the last IP.

    ``tip(ip, deferred=True)`` holds a TIP back until the TNT bits of the branches
    after it have filled one TNT packet: the TNT-then-TIP order libipt calls a
    deferred TIP."""

    def __init__(self, use_tnt64=False):
        self.out = bytearray()
        self.bits = []
        self.last_ip = 0
        self.use_tnt64 = use_tnt64
        self.long_bits = 47 if use_tnt64 else 6
        self.deferred = None
        self.corrupted_tma = False  # PSB+ holds TSC and a TMA with reserved bits set, then a bogus byte (SKZ84)

    def psb_plus(self, ip, mode_64=True, intx=None):
        """PSB+: MODE.Exec, MODE.TSX when ``intx`` is given (parts with TSX restate the
        transaction state), FUP when tracing is on (``ip``), PSBEND."""
        self.flush()
        self.out += PSB
        self.last_ip = 0
        if self.corrupted_tma:
            self.out += b"\x19" + bytes(7) + b"\x02\x73\x34\x12\x00\x56\xfe" + b"\x59"
        self.out += b"\x99" + bytes([1 if mode_64 else 2])
        if intx is not None:
            self.out += b"\x99" + bytes([0x20 | intx])
        if ip is not None:
            self.ip_packet(0x1D, ip)
        self.out += b"\x02\x23"

    def tnt(self, taken):
        self.bits.append(taken)
        if len(self.bits) == self.long_bits:
            self.flush()

    def flush(self):
        if self.bits:
            value = 1
            for bit in self.bits:
                value = value << 1 | bit
            if len(self.bits) <= 6:
                self.out.append(value << 1)
            else:
                self.out += b"\x02\xa3" + value.to_bytes(6, "little")
            self.bits = []
        if self.deferred is not None:
            ip, self.deferred = self.deferred, None
            self._ip_bytes(0x0D, ip)

    def ip_packet(self, opcode_low, ip):
        self.flush()
        self._ip_bytes(opcode_low, ip)

    def _ip_bytes(self, opcode_low, ip):
        if ip is None:
            self.out.append(opcode_low)
            return
        last = self.last_ip
        if ip >> 16 == last >> 16:
            self.out += bytes([opcode_low | 1 << 5]) + struct.pack("<H", ip & 0xFFFF)
        elif ip >> 32 == last >> 32:
            self.out += bytes([opcode_low | 2 << 5]) + struct.pack("<I", ip & 0xFFFFFFFF)
        elif ip >> 47 in (0, 0x1FFFF):
            self.out += bytes([opcode_low | 3 << 5]) + (ip & 0xFFFFFFFFFFFF).to_bytes(6, "little")
        else:
            self.out += bytes([opcode_low | 6 << 5]) + struct.pack("<Q", ip)
        self.last_ip = ip

    def tip(self, ip, deferred=False):
        if deferred:
            self.flush()
            self.deferred = ip
        else:
            self.ip_packet(0x0D, ip)

    def fup(self, ip):
        self.ip_packet(0x1D, ip)

    def pge(self, ip, uncompressed=False):
        """``uncompressed``: the IP in full (IPBytes 011), as libipt's own erratum tests
        write the TIP.PGE after a FUP its workarounds skip."""
        if uncompressed:
            self.flush()
            self.out += bytes([0x11 | 3 << 5]) + (ip & 0xFFFFFFFFFFFF).to_bytes(6, "little")
            self.last_ip = ip
        else:
            self.ip_packet(0x11, ip)

    def pgd(self, ip=None):
        self.ip_packet(0x01, ip)

    def ovf(self):
        self.flush()
        self.out += b"\x02\xf3"
        self.last_ip = 0

    def tsx(self, intx, abort=False):
        self.raw(b"\x99" + bytes([0x20 | intx | abort << 1]))

    def raw(self, data):
        self.flush()
        self.out += data

    def bytes(self):
        self.flush()
        return bytes(self.out)


class Tracer(object):
    """The processor's side of a trace: executes ``program`` choosing branch outcomes
    at random and writes the packets for what it did (see :func:`trace_program`)."""

    def __init__(self, program, generator, writer, options):
        self.program = program
        self.random = generator
        self.writer = writer
        self.options = options
        self.executed = []
        self.committed = 0
        self.stack = []
        self.compression = []  # the return stack RET compression works from
        self.interrupted_at = None
        self.in_transaction = False
        self.ended = False

    def chance(self, every):
        return every and self.random.randrange(every) == 0

    def commit(self):
        self.committed = len(self.executed)

    def untraced(self, ip, count):
        """Execute ``count`` instructions from ``ip`` with no packets (lost to an
        overflow, or outside the traced range); returns where execution got to."""
        by_address = self.program.by_address
        for _ in range(count):
            instruction = by_address[ip]
            following = ip + instruction.size
            kind = instruction.kind
            if kind == I_COND:
                ip = instruction.target if self.random.random() < 0.5 else following
            elif kind in (I_JUMP, I_CALL_NEXT):
                ip = instruction.target
            elif kind in (I_CALL, I_ICALL):
                self.stack.append(following)
                ip = instruction.target
            elif kind == I_RET and self.stack:
                ip = self.stack.pop()
            elif kind == I_IRET and self.interrupted_at is not None:
                ip, self.interrupted_at = self.interrupted_at, None
            elif kind in (I_PLAIN, I_SYSCALL):
                ip = following
            else:
                break
        # Whatever the hardware's return stack held no longer matches.
        self.compression = []
        return ip

    def disable_at_direct_branch(self, target):
        """TIP.PGD after a direct call/jmp: the branch left the traced range (without
        the target IP: erratum SKL014).  A PSB+ with FUP while tracing is off, before
        the TIP.PGE: erratum BDM70."""
        self.writer.pgd(None if self.options["disable_ip_suppressed"] else target)
        self.commit()
        if self.options["end_disabled"]:
            self.ended = True
            return target
        ip = self.untraced(target, self.random.randint(0, 20))
        if self.options["psb_while_disabled"]:
            self.writer.psb_plus(ip)
            self.writer.pge(ip, uncompressed=True)
        else:
            self.writer.pge(ip)
        return ip

    def disable_at_near_branch(self, ip):
        """TIP.PGD without an IP for an indirect call or uncompressed RET (it binds only to
        far transfers): tracing is back on at ``ip``."""
        self.writer.pgd(None)
        self.writer.pge(ip)
        self.compression = []
        return ip

    def extra(self, ip, where):
        """With ``extras_where`` holding ``where`` (branch, overflow, end), one packet group
        of ``extras`` at ``ip``, the next instruction (between a branch and its TIP, only
        the groups that name no IP); returns the next instruction after it."""
        options = self.options
        if where not in options["extras_where"] or not options["extras"]:
            return ip
        groups = [group for group in options["extras"] if where != "branch" or group in NO_IP_EXTRAS]
        if not groups:
            return ip
        group = self.random.choice(groups)
        writer = self.writer
        if group == "timing":  # MTC, TSC, a one-byte CYC
            writer.raw(b"\x59" + bytes([self.random.getrandbits(8)]) + b"\x19" + bytes(7)
                       + bytes([self.random.getrandbits(5) << 3 | 3]))
        elif group == "exstop":
            writer.raw(b"\x02\x62")
        elif group == "power":  # MWAIT, PWRE, EXSTOP with IP + its FUP, PWRX: at ip, which has not run
            writer.raw(b"\x02\xc2" + bytes(8) + b"\x02\x22\x00\x20\x02\xe2")
            writer.fup(ip)
            writer.raw(b"\x02\xa2\x12\x01\x00\x00\x00")
            self.commit()
        elif group == "ptw_ip":  # PTW with IP + its FUP: the PTWRITE at ip ran
            instruction = self.program.by_address[ip]
            if instruction.kind == I_PLAIN:
                self.executed.append(ip)
                writer.raw(b"\x02\x92" + bytes(4))
                writer.fup(ip)
                self.commit()
                return ip + instruction.size
        else:  # psb: PSB+ with the FUP of ip (status)
            writer.psb_plus(ip)
        return ip

    def tip(self, ip):
        """The TIP of the branch that just ran, maybe after packets of no IP."""
        self.extra(None, "branch")
        self.writer.tip(ip)

    def overflow(self, ip):
        """Packets lost: OVF, then FUP where tracing resumes (after untraced code)."""
        ip = self.extra(ip, "overflow")
        del self.executed[self.committed:]
        ip = self.untraced(ip, self.random.randint(0, 20))
        if self.options["cyc_cut_by_overflow"]:
            # erratum SKD007: the OVF comes in place of a CYC's second byte
            self.writer.raw(bytes([0x07 | self.random.getrandbits(5) << 3]))
        self.writer.ovf()
        resume = self.options["overflow_resume"]
        if resume == "fup":
            self.writer.fup(ip)
            return ip
        if resume == "psb":
            # erratum SKD010: the FUP was dropped; the next PSB+ says where tracing is
            self.writer.psb_plus(ip)
            return ip
        if resume == "pgd+pge":
            # erratum APL11: the OVF comes with a TIP.PGD
            self.writer.pgd(None)
        if resume == "fup+pge":
            # erratum APL12: a FUP although tracing was off when the overflow resolved
            self.writer.fup(ip)
            self.writer.pge(ip, uncompressed=True)
            return ip
        self.writer.pge(ip)  # tracing was off when the overflow resolved; TIP.PGE turns it on
        return ip

    def transaction(self, ip):
        """MODE.TSX + FUP: begin, commit, or abort (with a TIP to the abort handler)."""
        writer = self.writer
        if not self.in_transaction:
            writer.tsx(1)
            writer.fup(ip)
            self.in_transaction = True
        elif self.random.random() < 0.5:
            writer.tsx(0)
            writer.fup(ip)
            self.in_transaction = False
        else:
            if self.options["tsx_abort_corrupts_branch"] and writer.bits and \
                    self.program.by_address[self.executed[-1]].kind == I_COND:
                # erratum BDM64: the conditional branch right before the abort traced wrong
                writer.bits[-1] = not writer.bits[-1]
            writer.tsx(0, abort=True)
            writer.fup(ip)
            # The abort handler: the driver loop, which never returns (the stack is abandoned).
            ip = self.program.entry
            writer.tip(ip)
            self.stack = []
            self.compression = []
            self.in_transaction = False
        self.commit()
        return ip

    def run(self, max_insns):
        options = self.options
        program = self.program
        writer = self.writer
        by_address = program.by_address
        ip = program.entry
        next_psb = options["psb_every"]
        while len(self.executed) < max_insns and not self.ended:
            if self.chance(options["interrupt_every"]) and self.interrupted_at is None and \
                    program.interrupt_handler:
                writer.fup(ip)
                writer.tip(program.interrupt_handler)
                self.interrupted_at = ip
                self.commit()
                ip = program.interrupt_handler
            if self.chance(options["overflow_every"]):
                ip = self.overflow(ip)
            if self.chance(options["tsx_every"]):
                ip = self.transaction(ip)
            if next_psb and len(writer.out) >= next_psb:
                writer.psb_plus(ip, intx=int(self.in_transaction) if options["tsx_every"] else None)
                next_psb = len(writer.out) + options["psb_every"]
            if options["timing"] and self.random.randrange(16) == 0:
                writer.raw(b"\x59" + bytes([self.random.getrandbits(8)]))
            ip = self.step(ip, by_address[ip])
        if not self.ended:
            self.extra(ip, "end")
        if options["stretch"] and not self.ended:
            # FUP + TIP.PGD: tracing stops before ``ip``
            writer.fup(ip)
            writer.pgd(None)
            self.commit()
        return writer.bytes(), self.executed[:self.committed]

    def step(self, ip, instruction):
        """Execute one instruction, write its packets; returns the next IP."""
        options = self.options
        writer = self.writer
        self.executed.append(ip)
        kind = instruction.kind
        following = ip + instruction.size
        if kind == I_PLAIN:
            return following
        if kind == I_COND:
            taken = self.random.random() < options["taken_probability"]
            writer.tnt(taken)
            self.commit()
            return instruction.target if taken else following
        if kind in (I_JUMP, I_CALL_NEXT, I_CALL):
            if kind == I_CALL:
                self.stack.append(following)
                self.compression.append(following)
                if len(self.compression) > RETSTACK_DEPTH:
                    del self.compression[0]
            if kind != I_CALL_NEXT and self.chance(options["disable_every"]):
                return self.disable_at_direct_branch(instruction.target)
            return instruction.target
        deferred = bool(self.chance(options["deferred_tip_every"]))
        if kind == I_ICALL:
            self.stack.append(following)
            self.compression.append(following)
            if len(self.compression) > RETSTACK_DEPTH:
                del self.compression[0]
            if self.chance(options["pgd_without_ip_every"]):
                self.commit()
                return self.disable_at_near_branch(instruction.target)
            if deferred:
                writer.tip(instruction.target, deferred)
            else:
                self.tip(instruction.target)
            self.commit()
            return instruction.target
        if kind == I_RET:
            ip = self.stack.pop()
            # Compressed only when the decoder's return stack predicts the target.
            if self.compression and self.compression[-1] == ip and not self.chance(
                    options["uncompressed_ret_every"]):
                self.compression.pop()
                writer.tnt(True)
            else:
                # Never deferred: a TNT where its TIP should be reads as a compressed RET.
                self.tip(ip)
            self.commit()
            return ip
        if kind == I_IRET:
            ip, self.interrupted_at = self.interrupted_at, None
            self.tip(ip)
            self.commit()
            return ip
        if kind == I_SYSCALL:
            self.commit()
            if options["kernel_traced"]:
                self.interrupted_at = following  # sysret returns here
                writer.tip(self.program.syscall_handler)
                return self.program.syscall_handler
            writer.pgd(None)  # into the kernel, which is not traced: IP suppressed
            writer.pge(following)
            return following
        # I_SYSRET
        ip, self.interrupted_at = self.interrupted_at, None
        self.tip(ip)
        self.commit()
        return ip


TRACE_DEFAULTS = {"taken_probability": 0.5, "interrupt_every": 0, "psb_every": 4096, "uncompressed_ret_every": 0,
                  "timing": False, "use_tnt64": False, "disable_every": 0, "end_disabled": False,
                  "overflow_every": 0, "overflow_resume": "fup", "deferred_tip_every": 0, "tsx_every": 0,
                  "kernel_traced": True, "stretch": False, "disable_ip_suppressed": False,
                  "psb_while_disabled": False, "cyc_cut_by_overflow": False, "tsx_abort_corrupts_branch": False,
                  "pgd_without_ip_every": 0, "corrupted_tma": False, "extras": (), "extras_where": ()}
# Packet groups the tracer can add (``extras``), and those that name no IP.
# (No PTW without IP: it binds to the next PTWRITE instruction, which random programs lack.)
EXTRAS = ("timing", "power", "exstop", "ptw_ip", "psb")
NO_IP_EXTRAS = ("timing", "exstop")


def trace_program(program, max_insns, seed=0, **options):
    """Walk ``program`` from its entry choosing branch outcomes at random; returns
    (trace bytes, expected instruction addresses).

    Options (all off by default, see TRACE_DEFAULTS): ``taken_probability``;
    ``interrupt_every`` N (an interrupt, FUP + TIP, about every N instructions);
    ``psb_every`` bytes; ``uncompressed_ret_every``; ``timing`` (MTC packets);
    ``use_tnt64``; ``disable_every`` (TIP.PGD after a direct call/jmp, then TIP.PGE
    further on, or the end of the trace with ``end_disabled``; ``disable_ip_suppressed``:
    that TIP.PGD without the target, as erratum SKL014; ``psb_while_disabled``: a PSB+
    with FUP before the TIP.PGE, as erratum BDM70); ``pgd_without_ip_every`` (an
    indirect call ends in TIP.PGD without an IP, then TIP.PGE at its target);
    ``overflow_every`` (OVF after some untraced code, then ``overflow_resume``: ``fup``
    (tracing was on), ``pge`` (tracing comes back on with TIP.PGE), ``pgd+pge``
    (erratum APL11: a TIP.PGD first), ``fup+pge`` (erratum APL12: a FUP although
    tracing was off) or ``psb`` (erratum SKD010: the FUP is dropped, a PSB+ follows);
    ``cyc_cut_by_overflow``: the OVF comes after a CYC's first byte, as erratum
    SKD007); ``deferred_tip_every`` (TNT before the TIP of an indirect branch);
    ``tsx_every`` (MODE.TSX begin/commit/abort; ``tsx_abort_corrupts_branch``: a
    conditional branch right before an abort is traced the wrong way, as erratum BDM64);
    ``corrupted_tma`` (each PSB+ holds a TMA with reserved bits set and a bogus byte
    after it, as erratum SKZ84); ``extras`` (packet groups of EXTRAS: timing packets,
    power events with EXSTOP's IP, EXSTOP, PTW with IP, PSB+) written
    ``extras_where``: ``branch`` (between each indirect branch and its TIP, the groups
    of NO_IP_EXTRAS), ``overflow`` (right before each OVF), ``end`` (at the end);
    ``kernel_traced`` (False: a syscall disables tracing, sysret's return enables it);
    ``stretch`` (one stretch of tracing: TIP.PGE at the entry, FUP + TIP.PGD at the
    end, so copies of the trace concatenate into a valid trace).

    The expected list ends at the last instruction that consumed trace data, the
    decoders' stopping convention."""
    unknown = set(options) - set(TRACE_DEFAULTS)
    if unknown:
        raise TypeError("unknown trace options: %s" % ", ".join(sorted(unknown)))
    settings = dict(TRACE_DEFAULTS, **options)
    writer = PacketWriter(settings["use_tnt64"])
    writer.corrupted_tma = settings["corrupted_tma"]
    if settings["stretch"]:
        writer.psb_plus(None)
        writer.pge(program.entry)
    else:
        writer.psb_plus(program.entry)
    return Tracer(program, random.Random(seed), writer, settings).run(max_insns)
