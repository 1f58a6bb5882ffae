"""The one problem type every analysis reports, and the one capped collector.

A :class:`Problem` is something an analysis found wrong in target memory or in an
input file: a stable snake_case ``kind`` (for scripts and triage), the target
``address`` or file/trace ``offset`` it concerns, a sentence for people, and a
``severity`` (``error``, ``warning`` or ``note``).
"""

from .hexaddr import hexaddr

SEVERITIES = ("error", "warning", "note")


class Problem(object):
    __slots__ = ("kind", "address", "message", "severity", "offset")

    def __init__(self, kind, address=None, message="", severity="error", offset=None):
        if severity not in SEVERITIES:
            raise ValueError("severity must be one of %s, not %r" % (", ".join(SEVERITIES), severity))
        self.kind = kind
        self.address = address
        self.message = message
        self.severity = severity
        self.offset = offset

    def as_dict(self):
        return {"kind": self.kind, "severity": self.severity, "address": self.address,
                "offset": self.offset, "message": self.message}

    @classmethod
    def from_dict(cls, item):
        """A Problem from its :meth:`as_dict` form (a backend's info() carries them so)."""
        return cls(item["kind"], item.get("address"), item.get("message", ""), item.get("severity", "error"),
                   item.get("offset"))

    def where(self):
        """``at fffff800`00001000`` / ``at offset 0x40`` / empty."""
        if self.address is not None:
            return "at %s" % hexaddr(self.address)
        if self.offset is not None:
            return "at offset 0x%x" % self.offset
        return ""

    def __str__(self):
        where = self.where()
        return "%s %s%s: %s" % (self.severity, self.kind, " " + where if where else "", self.message)

    def __repr__(self):
        return "Problem(%r, %r, %r, %r, offset=%r)" % (self.kind, self.address, self.message, self.severity,
                                                      self.offset)

    def __eq__(self, other):
        return isinstance(other, Problem) and self.as_dict() == other.as_dict()

    def __hash__(self):
        return hash((self.kind, self.address, self.offset, self.message))


class ProblemLog(object):
    """The problems of one result, capped per kind: corrupt memory can produce the
    same problem millions of times, so past ``MAX_PER_KIND`` of one kind they are
    only counted, and :meth:`finish` adds one ``problems_truncated`` note per kind
    cut short.  It is a read-only sequence of the listed problems (iteration,
    ``len``, indexing, comparison with a list); :meth:`count` counts every problem
    reported, listed or not."""

    MAX_PER_KIND = 200

    def __init__(self, problems=()):
        self._listed = []
        self._counts = {}
        self._finished = False
        self.extend(problems)

    def add(self, kind, address=None, message="", severity="error", offset=None):
        self.append(Problem(kind, address, message, severity, offset))

    def append(self, problem):
        count = self._counts.get(problem.kind, 0) + 1
        self._counts[problem.kind] = count
        if count <= self.MAX_PER_KIND:
            self._listed.append(problem)

    def __iter__(self):
        return iter(self._listed)

    def __len__(self):
        return len(self._listed)

    def __getitem__(self, index):
        return self._listed[index]

    def __eq__(self, other):
        if isinstance(other, ProblemLog):
            return self._listed == other._listed
        if isinstance(other, (list, tuple)):
            return self._listed == list(other)
        return NotImplemented

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None

    def __repr__(self):
        return "ProblemLog(%r)" % (self._listed,)

    def extend(self, problems):
        for problem in problems:
            self.append(problem)

    def finish(self):
        """Add the truncation notes (once); returns self."""
        if not self._finished:
            self._finished = True
            for kind, count in sorted(self._counts.items()):
                if count > self.MAX_PER_KIND:
                    self._listed.append(Problem("problems_truncated", None, "%d more %s problems not listed"
                                           % (count - self.MAX_PER_KIND, kind), "note"))
        return self

    def count(self, kind=None):
        """How many problems were reported (listed or not), of one kind or in all."""
        if kind is None:
            return sum(self._counts.values())
        return self._counts.get(kind, 0)

    @property
    def errors(self):
        """How many listed problems have severity ``error``."""
        return sum(1 for problem in self if problem.severity == "error")

    def as_list(self):
        return [problem.as_dict() for problem in self]
