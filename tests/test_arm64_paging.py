"""ARM64 translation (4 KiB granule, 48-bit VA, 4 levels) over synthetic tables
built here from the architecture's descriptor format: every mapping made is the
truth its translation is checked against."""

import random

import pytest

from dbgext.target.arm64_paging import DESCRIPTOR_ACCESS_FLAG, DESCRIPTOR_PXN, DESCRIPTOR_UXN, LEVEL_SHIFTS

from arm64_translation import Translation, TranslationFault, table_base, translate

VALID, TABLE = 1, 2
KERNEL = 0xFFFF_0000_0000_0000


class Tables(object):
    """Physical memory holding page tables, and the mappings put in them."""

    def __init__(self, seed=0):
        self.memory = {}              # physical address of a descriptor -> value
        self.next_frame = 0x4000_0000
        self.ttbr0 = self.new_table()
        self.ttbr1 = self.new_table() | (0x12 << 48) | 1   # an ASID and CnP: not part of the base
        self.missing = set()          # table pages "not in the dump"

    def new_table(self):
        frame = self.next_frame
        self.next_frame += 0x1000
        return frame

    def read(self, address):
        if address & ~0xFFF in self.missing:
            return None
        return self.memory.get(address, 0)

    def map(self, virtual, physical, level=3, access_flag=True, attributes=0):
        """Map ``virtual`` to ``physical`` with a descriptor at ``level`` (3: a
        page, 1 or 2: a block); missing tables on the way are created."""
        table = (self.ttbr1 if virtual >> 48 else self.ttbr0) & 0xFFFF_FFFF_F000
        for depth in range(level):
            entry = table + 8 * ((virtual >> LEVEL_SHIFTS[depth]) & 0x1FF)
            if entry not in self.memory:
                self.memory[entry] = self.new_table() | VALID | TABLE
            table = self.memory[entry] & 0xFFFF_FFFF_F000
        entry = table + 8 * ((virtual >> LEVEL_SHIFTS[level]) & 0x1FF)
        descriptor = physical | VALID | (TABLE if level == 3 else 0) | attributes
        if access_flag:
            descriptor |= DESCRIPTOR_ACCESS_FLAG
        self.memory[entry] = descriptor
        return entry

    def translate(self, virtual):
        return translate(virtual, self.ttbr0, self.ttbr1, self.read)


def test_a_kernel_page_is_walked_from_ttbr1_through_four_levels():
    tables = Tables()
    tables.map(0xFFFF_F803_F32D_E000, 0x8_1234_5000)
    found = tables.translate(0xFFFF_F803_F32D_E014)
    assert isinstance(found, Translation)
    assert (found.physical, found.size, found.level, found.access_flag) == (0x8_1234_5014, 0x1000, 3, True)
    assert [level for level, _, _ in found.path] == [0, 1, 2, 3]
    assert found.path[0][1] == (tables.ttbr1 & 0xFFFF_FFFF_F000) + 8 * 0x1F0


def test_a_user_address_is_walked_from_ttbr0():
    tables = Tables()
    tables.map(0x7FF6_1234_0000, 0x5000)
    assert tables.translate(0x7FF6_1234_0ABC).physical == 0x5ABC
    assert not tables.translate(0xFFFF_7FF6_1234_0ABC)       # the kernel half has no such mapping


@pytest.mark.parametrize("level,size", [(1, 1 << 30), (2, 1 << 21)])
def test_blocks_map_their_whole_size_and_ignore_the_low_output_address_bits(level, size):
    tables = Tables()
    virtual = KERNEL | 0x8000_0000 + 3 * (1 << 30)
    # Bits below the block size in the descriptor's output address are not part of it.
    tables.map(virtual, 0x40_0000_0000 | (size >> 1), level=level)
    found = tables.translate(virtual + size - 8)
    assert (found.physical, found.size, found.level) == (0x40_0000_0000 + size - 8, size, level)


def test_attribute_bits_above_and_below_the_output_address_stay_out_of_it():
    tables = Tables()
    attributes = DESCRIPTOR_PXN | DESCRIPTOR_UXN | (0xF << 55) | (1 << 11) | (3 << 8) | (7 << 2) | (1 << 6)
    tables.map(KERNEL | 0x1000, 0x7_0000_0000, attributes=attributes)
    found = tables.translate(KERNEL | 0x1008)
    assert found.physical == 0x7_0000_0008
    assert found.user and not found.kernel_executable and found.writable


def test_a_mapping_whose_access_flag_is_clear_translates_and_says_so():
    tables = Tables()
    tables.map(KERNEL | 0x2000, 0x9000, access_flag=False)
    found = tables.translate(KERNEL | 0x2000)
    assert found.physical == 0x9000 and not found.access_flag


def test_an_invalid_descriptor_ends_the_walk_at_its_level_with_its_address():
    tables = Tables()
    entry = tables.map(KERNEL | 0x3000, 0x9000)
    tables.memory[entry] &= ~VALID
    fault = tables.translate(KERNEL | 0x3000)
    assert isinstance(fault, TranslationFault) and not fault
    assert (fault.reason, fault.level, fault.entry_address) == ("invalid", 3, entry)
    untouched = tables.translate(KERNEL | 0x8000_0000_0000)      # another level-0 entry
    assert (untouched.reason, untouched.level) == ("invalid", 0)


def test_a_level_3_descriptor_without_the_page_bit_is_reserved_and_faults():
    tables = Tables()
    entry = tables.map(KERNEL | 0x5000, 0x9000)
    tables.memory[entry] &= ~TABLE
    assert tables.translate(KERNEL | 0x5000).reason == "reserved_descriptor"


def test_a_block_descriptor_at_level_0_faults():
    tables = Tables()
    base = tables.ttbr1 & 0xFFFF_FFFF_F000
    tables.memory[base] = 0x8000_0000 | VALID | DESCRIPTOR_ACCESS_FLAG
    fault = tables.translate(KERNEL)
    assert (fault.reason, fault.level) == ("block_at_level_0", 0)


def test_non_canonical_addresses_and_tables_missing_from_the_dump_are_faults_not_exceptions():
    tables = Tables()
    assert tables.translate(0x0001_0000_0000_0000).reason == "non_canonical"
    assert table_base(0x8000_0000_0000_0000, tables.ttbr0, tables.ttbr1) is None
    tables.map(KERNEL | 0x6000, 0x9000)
    leaf_table = tables.translate(KERNEL | 0x6000).path[3][1] & ~0xFFF
    tables.missing.add(leaf_table)
    fault = tables.translate(KERNEL | 0x6000)
    assert (fault.reason, fault.level, fault.descriptor) == ("table_not_in_dump", 3, None)


def test_random_mappings_of_every_kind_translate_to_what_was_mapped():
    generator = random.Random(25)
    tables = Tables()
    expected = {}
    for _ in range(300):
        level = generator.choice((1, 2, 3, 3, 3))
        size = 1 << LEVEL_SHIFTS[level]
        half = generator.choice((0, KERNEL))
        virtual = half | (generator.randrange(1 << 48) & ~(size - 1))
        if any(virtual < other + other_size and other < virtual + size for other, (_, other_size) in expected.items()):
            continue        # keep mappings disjoint: a block never replaces a table in use
        physical = generator.randrange(1 << 48) & ~(size - 1)
        tables.map(virtual, physical, level=level)
        expected[virtual] = (physical, size)
    checked = 0
    for virtual, (physical, size) in expected.items():
        offset = generator.randrange(size)
        found = tables.translate(virtual + offset)
        assert (found.physical, found.size) == (physical + offset, size)
        checked += 1
    assert checked > 250
