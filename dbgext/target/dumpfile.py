"""Reading a dump file by offset, safely when the file changes under the reader.

Dumps are read with positioned reads (``os.pread``; seek + read where the
platform has no pread), not through an mmap: a mapped file that shrinks while it
is read (a copy still in progress, a network share, a dump being rewritten)
kills the process with SIGBUS, which no Python code can catch.  A short read
instead becomes :class:`DumpFileChanged`, one line naming the file and the
offset.  The cost, measured by ``scripts/bench_pagetables.py``, is a system call
per backend read; the Target's page cache and the backends' run-sized reads keep
the number of calls low.
"""

import os

from ..errors import BadInput

_HAS_PREAD = hasattr(os, "pread")


class DumpFileChanged(BadInput):
    """The dump file no longer holds bytes it held when it was opened."""

    def __init__(self, path, offset, size, file_size):
        self.path = path
        self.offset = offset
        super().__init__("%s changed while being read: %d bytes at offset 0x%x are no longer in the file "
                         "(now %d bytes)" % (path, size, offset, file_size))


class DumpFile(object):
    """A read-only dump file: ``read(offset, size)`` returns exactly ``size`` bytes
    or raises BadInput naming the file and the offset."""

    def __init__(self, path):
        self.path = path
        try:
            self._handle = open(path, "rb")
        except OSError as error:
            raise BadInput("cannot open %s: %s" % (path, error.strerror or error))
        self._fd = self._handle.fileno()
        self.size = os.fstat(self._fd).st_size

    def read(self, offset, size):
        if size <= 0:
            return b""
        if offset + size > self.size:
            raise BadInput("%s: %d bytes at offset 0x%x lie past the end of the file (%d bytes)"
                           % (self.path, size, offset, self.size))
        try:
            if _HAS_PREAD:
                data = os.pread(self._fd, size, offset)
            else:
                self._handle.seek(offset)
                data = self._handle.read(size)
        except OSError as error:
            raise BadInput("%s: cannot read %d bytes at offset 0x%x: %s"
                           % (self.path, size, offset, error.strerror or error))
        if len(data) != size:
            raise DumpFileChanged(self.path, offset, size, self._current_size())
        return data

    def read_within(self, offset, size):
        """Like :meth:`read`, but a range past the end is cut at the end (and may be
        empty): for optional parts whose sizes come from the file itself."""
        if offset >= self.size or size <= 0:
            return b""
        return self.read(offset, min(size, self.size - offset))

    def _current_size(self):
        try:
            return os.fstat(self._fd).st_size
        except OSError:
            return 0

    @property
    def closed(self):
        return self._handle.closed

    def close(self):
        self._handle.close()
