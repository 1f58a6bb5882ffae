"""Text (with DML links inside WinDbg) views of a walked database, and the
display choices: which traces, in which order (``SORTS``), how many.

Views get ``fmt`` (addresses as WinDbg prints them), never the Target: the names
of the frames they show are in the result (``db.frame_names``, filled by
:func:`dbgext.rtltrace.name_frames` for the traces shown).  ``links`` is a
:class:`Links` telling how to build debugger commands: a trace links to ``dps``
over its frames, a bucket to this command's ``--bucket N`` view.
"""

from operator import attrgetter

from ..render.output import dml_escape
from .layouts import DATABASE_MAGIC, HASH_COUNTER_SLOTS, MAX_FRAMES

TOP_TRACES = 10   # the summary's most hit traces


def _by_count(blocks):
    """Most hit first, ties by address (two stable C-keyed sorts: a 100,000-block
    database sorts in a tenth of the time a Python key function takes)."""
    return sorted(sorted(blocks, key=attrgetter("address")), key=attrgetter("count"), reverse=True)


def _by_depth(blocks):
    return sorted(sorted(blocks, key=attrgetter("address")), key=attrgetter("size"), reverse=True)


def _by_address(blocks):
    return sorted(blocks, key=attrgetter("address"))


SORTS = {"count": _by_count, "depth": _by_depth, "address": _by_address}


def ordered(blocks, sort):
    """``blocks`` in the order ``sort`` names (``count``, ``depth``, ``address``)."""
    return SORTS[sort](blocks)


def shown_traces(db, sort="count", limit=None):
    """The selected traces a view lists: ordered by ``sort``, at most ``limit``; a
    bucket's chain (and one trace) as walked, newest first."""
    if db.selection.kind in ("bucket", "trace"):
        return list(db.selection.blocks)
    blocks = ordered(db.selection.blocks, sort)
    return blocks if limit is None else blocks[:max(0, limit)]


def top_traces(db, count=TOP_TRACES):
    """The ``count`` most hit traces, most hit first."""
    return _by_count(db.blocks)[:max(0, count)]


def _name(db, frame):
    return db.frame_names.get(frame, "?")   # "?": a view showing a trace nobody named


class Links(object):
    """Debugger commands for DML links; ``script`` is the ``!py`` path of
    commands/rtltrace.py (None offline: no bucket links)."""

    def __init__(self, script=None):
        self.script = script

    def frames(self, db, block):
        """``dps`` over the frames, which follow the block header (whatever a
        corrupt Trace pointer says)."""
        depth = block.size if 0 < block.size <= MAX_FRAMES else 1
        return "dps 0x%x L0x%x" % (block.address + db.layout.block.size, depth)

    def bucket(self, db, bucket):
        if not self.script:
            return None
        return "!py %s 0x%x --bucket 0x%x%s" % (self.script, db.address, bucket, self.layout_option(db))

    @staticmethod
    def layout_option(db):
        return " --layout %s" % db.layout.name


# -- text ------------------------------------------------------------------------------

def _hex(value):
    return "0x%x" % value


def render_header(out, fmt, db):
    layout = db.layout
    out.line("RTL_TRACE_DATABASE at %s (%s layout: %s)" % (fmt(db.address),
                                                        layout.name, layout.reason))
    if not db.header_read:
        return
    magic = db.field("Magic")
    flags = db.field("Flags")
    tag = db.field("Tag")
    tag_text = "".join(chr(b) if 32 <= b < 127 else "." for b in tag.to_bytes(4, "little"))
    hash_info = db.hash_function
    rows = [
        ["Magic", _hex(magic), "ok" if magic == DATABASE_MAGIC else "BAD (expected 0x%x)" % DATABASE_MAGIC],
        ["Flags", _hex(flags), ", ".join(db.flag_names)],
        ["Tag", _hex(tag), "'%s'" % tag_text if tag else ""],
        ["SegmentList", fmt(db.field("SegmentList")), "%d segments" % len(db.segments)],
        ["MaximumSize", _hex(db.field("MaximumSize")), "unlimited" if not db.field("MaximumSize") else ""],
        ["CurrentSize", _hex(db.field("CurrentSize")), "%d bytes" % db.field("CurrentSize")],
        ["Owner", _hex(db.field("Owner")), ""],
        ["NoOfBuckets", str(db.field("NoOfBuckets")), ""],
        ["Buckets", fmt(db.field("Buckets")), ""],
        ["HashFunction", fmt(db.field("HashFunction")),
         "%s: %s" % (hash_info.get("symbol") or "NULL", hash_info.get("description", ""))],
        ["NoOfTraces", str(db.field("NoOfTraces")), "%d blocks reached through the buckets" % len(db.blocks)],
        ["NoOfHits", str(db.field("NoOfHits")), ""],
    ]
    out.table(rows, ["field", "value", "meaning"])


def render_magic_checks(out, db):
    stats = db.statistics
    out.line("")
    out.line("Magic checks: database %s, segments %d/%d ok, blocks %d/%d ok"
             % ("ok" if db.magic_ok else "BAD", stats["segments_magic_ok"], len(db.segments),
                stats["blocks_magic_ok"], len(db.blocks)))


def render_segments(out, fmt, db):
    rows = []
    for index, segment in enumerate(db.segments):
        total = segment.total_size
        rows.append([str(index), fmt(segment.address), fmt(segment.start),
                     fmt(segment.end), fmt(segment.free),
                     "0x%x / 0x%x" % (segment.used, total), db.segment_magic[segment.address]])
    out.line("")
    out.table(rows, ["#", "segment", "start", "end", "free", "used/total", "magic"],
              title="Segments (newest first):")


def render_buckets(out, db):
    stats = db.statistics
    out.line("")
    out.line("Buckets: %d walked, %d occupied, %d empty, average chain %.2f, longest chain %d (bucket %s)"
             % (stats["buckets_walked"], stats["occupied_buckets"], stats["empty_buckets"],
                stats["average_chain"], stats["longest_chain"]["length"], _bucket(stats["longest_chain"]["bucket"])))
    histogram = stats["chain_histogram"]
    if histogram:
        top = max(count for _, count in histogram)
        rows = [[str(length), str(count), "#" * max(1, 40 * count // top)] for length, count in histogram]
        out.table(rows, ["chain length", "buckets", ""])
    stored = db.field("HashCounter", [])
    expected = db.hash_counter_expected
    if stored:
        out.line("")
        rows = []
        for slot in range(HASH_COUNTER_SLOTS):
            rows.append([str(slot), str(stored[slot]),
                         str(expected[slot]) if expected else "-",
                         str(stored[slot] - expected[slot]) if expected else "-"])
        out.table(rows, ["slot", "HashCounter", "from blocks", "external finds"],
                  title="HashCounter (stored vs the lookups the stored blocks account for):")
        out.line("overflow into the first segment's Magic: %d; external Find calls implied: %s"
                 % (db.overflow_traces, "?" if db.external_finds is None else db.external_finds))


def render_totals(out, db):
    stats = db.statistics
    out.line("")
    out.line("Totals: %d traces (%d stored), %d hits (%d stored), %d bytes in blocks, %d bytes in segments"
             % (stats["blocks_found"], db.field("NoOfTraces"), stats["hits_found"], db.field("NoOfHits"),
                stats["block_bytes"], stats["segment_bytes"]))


def trace_rows(fmt, db, blocks, links):
    rows = []
    cell_links = {}
    for index, block in enumerate(blocks):
        first = _name(db, block.frames[0]) if block.frames else "(frames unreadable)"
        rows.append([fmt(block.address), str(block.bucket), str(block.count),
                     str(block.size), first])
        cell_links[(index, 0)] = links.frames(db, block)
        bucket_command = links.bucket(db, block.bucket)
        if bucket_command:
            cell_links[(index, 1)] = bucket_command
    return rows, cell_links


def render_traces(out, fmt, db, blocks, links, title):
    rows, cell_links = trace_rows(fmt, db, blocks, links)
    out.line("")
    out.table(rows, ["block", "bucket", "count", "depth", "top frame"], links=cell_links, title=title)


def render_top_traces(out, fmt, db, links, top):
    out.line("")
    out.line("Top %d traces by hit count:" % len(top))
    for block in top:
        render_frames(out, fmt, db, block, links, indent="    ")


def _bucket(index):
    """A bucket index as --bucket takes it (hex, like every number dbgext reads)."""
    return "-" if index is None else "0x%x" % index


def render_frames(out, fmt, db, block, links, indent=""):
    label = fmt(block.address)
    out.markup_line(indent + out.link(label, links.frames(db, block))
                    + _escape(out, "  count %d, depth %d, bucket %s" % (block.count, block.size, _bucket(block.bucket))))
    for number, frame in enumerate(block.frames or ()):
        out.line("%s  %02d %s %s" % (indent, number, fmt(frame), _name(db, frame)))


def _escape(out, text):
    return dml_escape(text) if out.dml else text


def render_block(out, fmt, db, block, links):
    out.line("RTL_TRACE_BLOCK at %s%s" % (fmt(block.address),
                                          "" if block.bucket is not None else " (not reached through the buckets)"))
    rows = [["Magic", _hex(block.magic)], ["Count", str(block.count)], ["Size", str(block.size)],
            ["UserCount", _hex(block.user_count)], ["UserSize", _hex(block.user_size)],
            ["UserContext", _hex(block.user_context)], ["Next", fmt(block.next)],
            ["Trace", fmt(block.trace)],
            ["bucket", "-" if block.bucket is None else str(block.bucket)],
            ["hash", "-" if block.hash is None else _hex(block.hash)]]
    out.table(rows, ["field", "value"])
    out.line("")
    render_frames(out, fmt, db, block, links)


def render_bucket(out, fmt, db, bucket, blocks, links):
    out.line("Bucket %s (of %d) at %s: %d blocks (newest first)"
             % (_bucket(bucket), db.field("NoOfBuckets"),
                fmt(db.field("Buckets") + bucket * db.layout.pointer_size), len(blocks)))
    for block in blocks:
        render_frames(out, fmt, db, block, links, indent="  ")


def render_problems(out, fmt, db, title="Problems"):
    out.line("")
    if db.problems:
        rows = [[problem.severity, problem.kind, _where(fmt, problem), problem.message]
                for problem in db.problems]
        out.table(rows, ["severity", "kind", "address", "message"], title="%s (%d):" % (title, len(db.problems)))
    else:
        out.line("%s: none%s" % (title, "" if db.complete else " found in what could be read"))


def render_notes(err, db):
    """The database's notes (facts worth knowing that are not problems), on the
    diagnostics stream (stderr)."""
    for note in db.notes:
        err.line("note: %s" % note)


def _where(fmt, problem):
    return "-" if problem.address is None else fmt(problem.address)


def render_summary(out, fmt, db, links, top):
    render_header(out, fmt, db)
    if db.header_read:
        render_magic_checks(out, db)
        render_segments(out, fmt, db)
        render_buckets(out, db)
        render_totals(out, db)
        render_top_traces(out, fmt, db, links, top)
    render_problems(out, fmt, db)


def render_candidates(out, fmt, search):
    rows = [[fmt(c.address), c.layout, str(c.buckets), str(c.traces), str(c.hits),
             str(c.segments) + ("" if not c.segment_problem else " (%s)" % c.segment_problem),
             _hex(c.current_size)] for c in search.candidates]
    out.table(rows, ["database", "layout", "buckets", "traces", "hits", "segments", "size"],
              title="Trace databases found: %d" % len(search.candidates))


def render(out, fmt, db, links, view, shown, top, sort):
    """The text view ``view`` (``summary``, ``traces``, ``validate``) of a walked
    database; a trace, bucket or module selection shows that selection.  ``shown``:
    the selected traces to list (see :func:`shown_traces`), ordered by ``sort``;
    ``top``: the summary's most hit traces (:func:`top_traces`)."""
    selection = db.selection
    if selection.kind == "trace":
        render_block(out, fmt, db, selection.blocks[0], links)
    elif selection.kind == "bucket":
        render_bucket(out, fmt, db, selection.bucket, shown, links)
    elif selection.kind == "module":
        render_traces(out, fmt, db, shown, links,
                      "Traces with a frame in %s: %d" % (selection.module.name, len(shown)))
    elif view == "traces":
        render_traces(out, fmt, db, shown, links, "Traces (%d, by %s):" % (len(shown), sort))
    elif view == "validate":
        render_header(out, fmt, db)
        if db.header_read:
            render_magic_checks(out, db)
        render_problems(out, fmt, db)
    else:
        render_summary(out, fmt, db, links, top)
