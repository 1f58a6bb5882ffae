"""Virtual memory made of address ranges backed by bytes of a dump file: a
minidump's captured ranges, a small kernel dump's saved parts.

Ranges need not be page-aligned (Windows captures 256-byte windows around
instruction pointers and partial stacks).  A page that ranges cover only in part
is assembled zero-filled, and :meth:`FileMappedRanges.partial_pages` names the
bytes it really holds, so the Target can report the rest as unreadable.
"""

from bisect import bisect_right

from .base import PAGE_SIZE, merge_ranges

PAGE_OFFSET_MASK = PAGE_SIZE - 1


class FileMappedRanges(object):
    """``ranges``: (start, end, file offset) triples.  Where two overlap, the one
    starting lower keeps its bytes.  ``dump_file`` reads with ``read(offset, size)``."""

    def __init__(self, dump_file, ranges):
        self._file = dump_file
        self._ranges = _without_overlaps(ranges)
        self._starts = [start for start, _, _ in self._ranges]
        self._merged = merge_ranges((start, end) for start, end, _ in self._ranges)
        self._partial = _partial_pages(self._merged)

    def read(self, address, size):
        """Bytes [address, address+size) when one range holds them all, else None."""
        index = bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        start, end, offset = self._ranges[index]
        if address + size > end:
            return None
        return self._file.read(offset + address - start, size)

    def read_pages(self, page_address, count):
        """Pages [page_address, +count pages): bytes or None each.  A stretch one
        range covers is fetched with one file read."""
        pages = []
        starts, ranges = self._starts, self._ranges
        address = page_address
        end_address = page_address + count * PAGE_SIZE
        while address < end_address:
            index = bisect_right(starts, address) - 1
            if index >= 0 and ranges[index][1] >= address + PAGE_SIZE:
                start, end, offset = ranges[index]
                stop = min(end_address, address + (end - address) // PAGE_SIZE * PAGE_SIZE)
                data = self._file.read(offset + address - start, stop - address)
                pages.extend(data[i:i + PAGE_SIZE] for i in range(0, len(data), PAGE_SIZE))
                address = stop
            else:
                pages.append(self._assemble_page(address, max(index, 0)))
                address += PAGE_SIZE
        return pages

    def _assemble_page(self, page_address, index):
        """A page put together from the ranges that touch it, zero-filled where
        they do not; None when none does."""
        page = None
        page_end = page_address + PAGE_SIZE
        ranges = self._ranges
        while index < len(ranges) and ranges[index][0] < page_end:
            start, end, offset = ranges[index]
            lo, hi = max(start, page_address), min(end, page_end)
            if lo < hi:
                if page is None:
                    page = bytearray(PAGE_SIZE)
                page[lo - page_address:hi - page_address] = self._file.read(offset + lo - start, hi - lo)
            index += 1
        return bytes(page) if page is not None else None

    def mapped_ranges(self):
        return list(self._merged)

    def partial_pages(self):
        """{page address: ((start, end), ...)}: pages held only in part, each with
        the address ranges of the bytes that are held."""
        return dict(self._partial)


class ReadsFileMappedRanges(object):
    """For a backend whose memory is a :class:`FileMappedRanges` in ``self._memory``."""

    def read_page(self, page_address):
        return self._memory.read_pages(page_address, 1)[0]

    def read_pages(self, page_address, count):
        return self._memory.read_pages(page_address, count)

    def mapped_ranges(self):
        return self._memory.mapped_ranges()

    def partial_pages(self):
        """The pages the dump holds only part of (a minidump's 256-byte windows, a
        small dump's stack copy from the stack pointer up), with the ranges held."""
        return self._memory.partial_pages()


def _without_overlaps(ranges):
    """The ranges sorted, each cut to what lower-starting ranges leave uncovered
    (empty ones dropped)."""
    kept = []
    covered_to = 0
    for start, end, offset in sorted(ranges):
        lo = max(start, covered_to)
        if lo < end:
            kept.append((lo, end, offset + lo - start))
            covered_to = end
    return kept


def _partial_pages(merged):
    """{page: ((start, end), ...)} of the pages that merged ranges cover only in part."""
    partial = {}
    for start, end in merged:
        first, last = start & ~PAGE_OFFSET_MASK, (end - 1) & ~PAGE_OFFSET_MASK
        for page in {first, last}:
            lo, hi = max(start, page), min(end, page + PAGE_SIZE)
            if hi - lo < PAGE_SIZE:
                partial.setdefault(page, []).append((lo, hi))
    return {page: tuple(sorted(pieces)) for page, pieces in partial.items()}
