"""A problem an analysis found in target memory: a stable snake_case ``kind`` (for
scripts and triage), the address it concerns, and a sentence for people."""


class Problem(object):
    __slots__ = ("kind", "address", "detail")

    def __init__(self, kind, address, detail):
        self.kind = kind
        self.address = address
        self.detail = detail

    def as_dict(self):
        return {"kind": self.kind, "address": self.address, "detail": self.detail}

    def __repr__(self):
        return "Problem(%r, 0x%x, %r)" % (self.kind, self.address or 0, self.detail)



class CollectsProblems(object):
    """Base for an analysis result that lists problems in ``self.problems``:
    corrupt memory can produce the same problem millions of times, so past
    ``MAX_PER_KIND`` of one kind they are only counted, and :meth:`finish_problems`
    adds one ``problems_truncated`` line per kind cut short."""

    MAX_PER_KIND = 200

    def __init__(self):
        self.problems = []
        self._problem_counts = {}

    def problem(self, kind, address, detail):
        count = self._problem_counts.get(kind, 0) + 1
        self._problem_counts[kind] = count
        if count <= self.MAX_PER_KIND:
            self.problems.append(Problem(kind, address, detail))

    def finish_problems(self):
        for kind, count in sorted(self._problem_counts.items()):
            if count > self.MAX_PER_KIND:
                self.problems.append(Problem("problems_truncated", self.address, "%d more %s problems not listed"
                                             % (count - self.MAX_PER_KIND, kind)))
