"""Hash functions a trace database may use besides the default
(RtlStackTraceHashFunction, in ``dbgext.stackhash``)."""


def pointer_sum_hash(frames):
    """The hash the RtlTraceDatabaseCreate documentation describes ("sums the
    pointer values"), truncated to a ULONG; some custom databases use it."""
    return sum(frames) & 0xFFFFFFFF
