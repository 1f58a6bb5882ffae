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
