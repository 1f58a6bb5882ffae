"""A whole ARM64 translation built on the library's one-level :func:`step`: the
tests' independent check of what the kernel dump reader's walk finds, and the
place where a failed walk says at which level and entry it stopped.

``read_entry(physical address)`` returns the u64 there or None when the dump does
not hold that page.  Nothing raises; a failed walk returns a (falsy)
:class:`TranslationFault`.
"""

from dbgext.target.arm64_paging import (DESCRIPTOR_ACCESS_FLAG, DESCRIPTOR_AP_EL0, DESCRIPTOR_AP_READ_ONLY,
                                        DESCRIPTOR_PXN, DESCRIPTOR_SIZE, INDEX_MASK, LEVEL_SHIFTS, PAGE_SIZE,
                                        TTBR_BASE_MASK, VIRTUAL_ADDRESS_BITS, step)


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
