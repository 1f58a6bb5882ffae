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

Pure functions: ``read_entry(physical address)`` returns the u64 there or None
when the dump does not hold that page.  Nothing raises; a failed walk returns a
:class:`TranslationFault` saying at which level and entry.
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


class Translation(object):
    """A successful walk: the ``physical`` address, the mapping's ``size`` (page
    or block) and ``level``, the ``descriptor`` that mapped it, its access flag,
    and the ``path`` of (level, entry address, descriptor) from the top."""

    __slots__ = ("virtual", "physical", "size", "level", "descriptor", "path")

    def __init__(self, virtual, physical, size, level, descriptor, path):
        self.virtual = virtual
        self.physical = physical
        self.size = size
        self.level = level
        self.descriptor = descriptor
        self.path = path

    @property
    def access_flag(self):
        return bool(self.descriptor & DESCRIPTOR_ACCESS_FLAG)

    @property
    def writable(self):
        return not self.descriptor & DESCRIPTOR_AP_READ_ONLY

    @property
    def user(self):
        return bool(self.descriptor & DESCRIPTOR_AP_EL0)

    @property
    def kernel_executable(self):
        return not self.descriptor & DESCRIPTOR_PXN

    def __repr__(self):
        return "Translation(0x%x -> 0x%x, %s at level %d)" % (self.virtual, self.physical, _size_name(self.size),
                                                              self.level)


class TranslationFault(object):
    """A failed walk: ``reason`` ("non_canonical", "table_not_in_dump",
    "invalid", "reserved_descriptor", "block_at_level_0"), the ``level`` and
    entry address where it happened (None for non-canonical) and the descriptor
    read there (None when unreadable), plus the path up to it."""

    __slots__ = ("virtual", "reason", "level", "entry_address", "descriptor", "path")

    def __init__(self, virtual, reason, level=None, entry_address=None, descriptor=None, path=()):
        self.virtual = virtual
        self.reason = reason
        self.level = level
        self.entry_address = entry_address
        self.descriptor = descriptor
        self.path = list(path)

    def __bool__(self):
        return False

    __nonzero__ = __bool__

    def __repr__(self):
        return "TranslationFault(0x%x: %s at level %s)" % (self.virtual, self.reason, self.level)


def table_base(virtual, ttbr0, ttbr1):
    """The level-0 table of ``virtual``'s half (from TTBR1 for the kernel half,
    TTBR0 for the user half), or None for a non-canonical address."""
    top = virtual >> VIRTUAL_ADDRESS_BITS
    if top == 0xFFFF:
        return ttbr1 & TTBR_BASE_MASK
    if top == 0:
        return ttbr0 & TTBR_BASE_MASK
    return None


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


def translate(virtual, ttbr0, ttbr1, read_entry):
    """Walk the tables for ``virtual``: a :class:`Translation`, or a (falsy)
    :class:`TranslationFault`."""
    table = table_base(virtual, ttbr0, ttbr1)
    if table is None:
        return TranslationFault(virtual, "non_canonical")
    path = []
    for level, shift in enumerate(LEVEL_SHIFTS):
        entry_address = table + DESCRIPTOR_SIZE * ((virtual >> shift) & INDEX_MASK)
        descriptor = read_entry(entry_address)
        if descriptor is None:
            return TranslationFault(virtual, "table_not_in_dump", level, entry_address, None, path)
        path.append((level, entry_address, descriptor))
        found = step(descriptor, level)
        if found.__class__ is int:
            table = found
            continue
        if found.__class__ is str:
            return TranslationFault(virtual, found, level, entry_address, descriptor, path)
        base, size = found
        return Translation(virtual, base | (virtual & (size - 1)), size, level, descriptor, path)


def _size_name(size):
    return {PAGE_SIZE: "4 KiB page", 1 << 21: "2 MiB block", 1 << 30: "1 GiB block"}.get(size, "0x%x" % size)
