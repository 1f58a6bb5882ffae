"""ARM64 (Windows on ARM) layouts: the CONTEXT, register names, and the
KTRAP_FRAME and machine-frame fields the unwinder reads (the page-table
descriptor bits are in :mod:`dbgext.target.arm64_paging`).

``CONTEXT_ARM64`` has the shape of :data:`dbgext.layouts.dump_formats.CONTEXT_AMD64`
(``size``, ``flags``, ``ContextFlags``, ``registers``: name -> (offset, bytes)), so
the dump readers' ``unpack_context``/``pack_context`` take it unchanged.  It is
``winnt.h``'s ``ARM64_NT_CONTEXT``: ContextFlags, Cpsr, X0-X28, Fp (x29), Lr (x30),
Sp, Pc, V0-V31 (16 bytes each), Fpcr, Fpsr, 8 Bcr/Bvr and 2 Wcr/Wvr debug
registers; 0x390 bytes.  A kernel dump holds it at 0x348 of the header
(``MachineImageType`` 0xAA64; see ``../shared/reference/dump-formats.md``).  The
offsets were checked on the real ARM64 small memory dump
(``rizin__triage_arm64.dmp``): ContextFlags 0x400007, Cpsr 0x80000144 (EL1t), Sp = Fp on the
kernel stack, Pc in ntoskrnl, x18 the KPCR (Windows keeps it there in kernel mode).
"""

CONTEXT_ARM64_FLAG = 0x400000     # CONTEXT_ARM64: the architecture bit of ContextFlags
CONTEXT_UNWOUND_TO_CALL = 0x20000000

# The general registers by number, as the unwind codes and the CONTEXT's X[] array
# number them, with WinDbg's names (x29 is fp, x30 is lr).
GENERAL_REGISTERS = tuple("x%d" % number for number in range(29)) + ("fp", "lr")
REGISTER_NAMES = GENERAL_REGISTERS + ("sp", "pc")
FRAME_POINTER = "fp"
LINK_REGISTER = "lr"
STACK_POINTER = "sp"
INSTRUCTION_POINTER = "pc"

# Other spellings WinDbg and disassemblers use for the same registers.
REGISTER_ALIASES = {"x29": "fp", "x30": "lr"}

_X0 = 0x08
CONTEXT_ARM64 = {
    "size": 0x390,
    "flags": CONTEXT_ARM64_FLAG | 0x7,   # CONTROL | INTEGER | FLOATING_POINT
    "ContextFlags": 0x00,
    "registers": dict(
        [(name, (_X0 + 8 * number, 8)) for number, name in enumerate(GENERAL_REGISTERS)]
        + [("cpsr", (0x04, 4)), ("sp", (0x100, 8)), ("pc", (0x108, 8)),
           ("fpcr", (0x310, 4)), ("fpsr", (0x314, 4))]),
    "V": 0x110,          # V0-V31, 16 bytes each (d8-d15 are the low halves of V8-V15)
    "Bcr": 0x318, "Bvr": 0x338, "Wcr": 0x378, "Wvr": 0x380,
    # EL1t (kernel mode on SP_EL0, as the real dump's Cpsr 0x80000144 shows): what a
    # kernel thread's Cpsr holds when nothing is given.
    "defaults": {"cpsr": 0x4},
}

# ARM64_KTRAP_FRAME (0x150 bytes): what the unwind code MSFT_OP_TRAP_FRAME (0xE8)
# restores from.  From the ARM64 unwinder of the .NET runtime, a port of Windows'.
KTRAP_FRAME_ARM64 = {
    "size": 0x150,
    "VfpState": 0x10,
    "Spsr": 0x90,
    "Sp": 0x98,
    "X": 0xA0,          # X0-X18
    "Lr": 0x138,
    "Fp": 0x140,
    "Pc": 0x148,
}
KTRAP_FRAME_ARM64_VOLATILE_X = 19   # X0..X18 are in the trap frame

# MSFT_OP_MACHINE_FRAME (0xE9): the saved SP then PC, 16 bytes.
MACHINE_FRAME_ARM64 = {"size": 0x10, "Sp": 0x0, "Pc": 0x8}
