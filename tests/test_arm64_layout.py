"""The ARM64 CONTEXT layout and register names, checked on the real ARM64 small
memory dump (Windows 11 22000, bug check 0x1C8) and by round trips."""

import struct

from arm64_support import ARM64_TRIAGE_DUMP
from dbgext.layouts.arm64 import (CONTEXT_ARM64, CONTEXT_ARM64_FLAG, GENERAL_REGISTERS, REGISTER_NAMES,
                                  KTRAP_FRAME_ARM64)
from dbgext.sample.kdump_writer import pack_context
from dbgext.target.kdump import unpack_context

HEADER_CONTEXT = 0x348
# Read by hand from the dump's driver list: ntoskrnl's base and size.
NTOSKRNL = (0xFFFFF803F2E00000, 0x103E000)


def test_the_real_arm64_dumps_context_decodes_into_a_kernel_thread_stopped_in_ntoskrnl():
    with open(ARM64_TRIAGE_DUMP, "rb") as handle:
        header = handle.read(HEADER_CONTEXT + CONTEXT_ARM64["size"])
    assert header[:8] == b"PAGEDU64" and struct.unpack_from("<I", header, 0x30)[0] == 0xAA64
    flags = struct.unpack_from("<I", header, HEADER_CONTEXT + CONTEXT_ARM64["ContextFlags"])[0]
    assert flags & CONTEXT_ARM64_FLAG and flags & 0x3 == 0x3          # control and integer registers
    registers = unpack_context(CONTEXT_ARM64, header, HEADER_CONTEXT)
    assert registers["cpsr"] >> 2 & 3 == 1                            # EL1: kernel mode (EL1t, on SP_EL0)
    assert NTOSKRNL[0] <= registers["pc"] < NTOSKRNL[0] + NTOSKRNL[1] and registers["pc"] % 4 == 0
    assert registers["sp"] >> 48 == 0xFFFF and registers["sp"] % 16 == 0
    assert registers["fp"] == registers["sp"]     # the frame record the function just set up
    assert registers["x18"] >> 48 == 0xFFFF and registers["x18"] % 0x1000 == 0   # x18 holds the KPCR in kernel mode


def test_register_names_are_windbgs_and_number_like_the_unwind_codes():
    assert GENERAL_REGISTERS[19] == "x19" and GENERAL_REGISTERS[29] == "fp" and GENERAL_REGISTERS[30] == "lr"
    assert REGISTER_NAMES[-2:] == ("sp", "pc") and len(set(REGISTER_NAMES)) == 33


def test_the_context_fields_are_disjoint_inside_its_0x390_bytes_and_round_trip():
    spans = sorted(CONTEXT_ARM64["registers"].values())
    for (offset, size), (following, _) in zip(spans, spans[1:]):
        assert offset + size <= following
    vectors = (CONTEXT_ARM64["V"], CONTEXT_ARM64["V"] + 32 * 16)
    assert all(offset + size <= vectors[0] or offset >= vectors[1] for offset, size in spans)
    assert spans[-1][0] + spans[-1][1] <= CONTEXT_ARM64["Bcr"] < CONTEXT_ARM64["size"]
    registers = dict((name, 0x1111 * (index + 1)) for index, name in enumerate(REGISTER_NAMES))
    registers["cpsr"] = 0x80000144
    packed = pack_context(CONTEXT_ARM64, registers)
    assert len(packed) == 0x390
    decoded = unpack_context(CONTEXT_ARM64, packed, 0)
    assert all(decoded[name] == value for name, value in registers.items())


def test_the_trap_frame_fields_the_unwinder_reads_lie_inside_it():
    assert KTRAP_FRAME_ARM64["X"] + 19 * 8 == KTRAP_FRAME_ARM64["Lr"]
    assert KTRAP_FRAME_ARM64["Pc"] + 8 == KTRAP_FRAME_ARM64["size"]
