"""ARM64 address translation as Windows on ARM configures the MMU: 4 KiB
granule, 48-bit virtual addresses, four levels of 512 eight-byte descriptors.

The top 16 bits of a virtual address choose the table: all ones (the kernel
half) walk from TTBR1, all zeros (the user half) from TTBR0; anything else is
not a canonical address.  Each level indexes 9 bits (47:39, 38:30, 29:21, 20:12).

A descriptor (Arm ARM D8, VMSAv8-64 stage 1):

* bit 0 — valid; an invalid one ends the walk (Windows keeps its software
  bits there: paged out, transition, prototype);
* bit 1 — at levels 0-2, 1 = the next table, 0 = a *block*: 1 GiB at level 1,
  2 MiB at level 2 (no blocks at level 0 with this granule); at level 3 it must be
  1 (a page), 0 is reserved and faults;
* bit 10 — the access flag: clear, an access faults so the OS can track use.
  The memory is still there, so the translation succeeds and says so;
* bits 47:12 — the output address (47:30 for a 1 GiB block, 47:21 for 2 MiB):
  the attribute bits above (PXN 53, UXN 54, software 55-58) and below are not
  part of it.

The kernel dump reader walks the tables with :func:`step` (one level), the same
walk it does for x64's page tables; what this module holds is the descriptor format.
"""

PAGE_SIZE = 0x1000
LEVEL_SHIFTS = (39, 30, 21, 12)
INDEX_MASK = 0x1FF
DESCRIPTOR_SIZE = 8
VIRTUAL_ADDRESS_BITS = 48

DESCRIPTOR_VALID = 1 << 0
DESCRIPTOR_TABLE_OR_PAGE = 1 << 1
DESCRIPTOR_ACCESS_FLAG = 1 << 10
DESCRIPTOR_AP_EL0 = 1 << 6           # AP[1]: EL0 may access
DESCRIPTOR_AP_READ_ONLY = 1 << 7     # AP[2]
DESCRIPTOR_PXN = 1 << 53
DESCRIPTOR_UXN = 1 << 54
OUTPUT_ADDRESS_MASK = 0x0000_FFFF_FFFF_F000            # bits 47:12
TTBR_BASE_MASK = 0x0000_FFFF_FFFF_F000                 # BADDR; ASID above, CnP in bit 0


def step(descriptor, level):
    """One level of the walk: what a *valid* ``descriptor`` at ``level`` (0-3)
    leads to — the next table's address (an int, levels 0-2), the mapping as
    ``(output address, size)`` (a page at level 3, a block at 1 or 2), or the
    fault's reason (a str: "invalid", "reserved_descriptor", "block_at_level_0").
    The kernel dump reader walks with it too."""
    if not descriptor & DESCRIPTOR_VALID:
        return "invalid"
    if level < 3:
        if descriptor & DESCRIPTOR_TABLE_OR_PAGE:
            return descriptor & OUTPUT_ADDRESS_MASK
        if level == 0:
            return "block_at_level_0"
    elif not descriptor & DESCRIPTOR_TABLE_OR_PAGE:
        return "reserved_descriptor"
    size = 1 << LEVEL_SHIFTS[level]
    return (descriptor & OUTPUT_ADDRESS_MASK & ~(size - 1), size)
