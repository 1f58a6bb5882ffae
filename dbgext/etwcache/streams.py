"""Stack streams for the simulator: a JSON/text file, an .etl file's StackWalk
events, or the traces of an RTL_TRACE_DATABASE in the target."""

import io
import json

from ..errors import BadInput
from ..hexaddr import hexaddr
from ..etl.format import SIGNATURE_SIZE as ETL_SIGNATURE_SIZE, looks_like_etl
from ..rtltrace import walk as walk_trace_database
from .layouts import KERNEL_SPACE_START
from .replay import StackStream

# Bound on events produced by expanding hit counts (RTL trace databases) and the
# counts of a stack file: each event is one list slot, so a count is never
# expanded past it.
MAX_EXPANDED_EVENTS = 5000000


class _EventBudget(object):
    """The events a stack file's counts add up to, refused in one line past
    MAX_EXPANDED_EVENTS (before a count is expanded, not after)."""

    def __init__(self, path):
        self.path = path
        self.total = 0

    def take(self, count, where):
        self.total += count
        if self.total > MAX_EXPANDED_EVENTS:
            raise BadInput("%s: the counts add up to more than %d stack-walk events (at %s, count %d); "
                           "scale them down" % (self.path, MAX_EXPANDED_EVENTS, where, count))
        return count


def _frame(value, where):
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.replace("`", ""), 16)
        except ValueError:
            pass
    raise BadInput("%s: %r is not a frame address" % (where, value))


def load_stack_file(path):
    """Stacks from a file.

    JSON: a list whose items are a list of frames or {"frames": [...], "count": n}
    (or an object with such a list under "stacks"); frames are ints or hex strings.
    Text: one stack per line, hex frames separated by blanks or commas, optionally
    preceded by ``COUNT:``; blank lines and ``#`` comments are ignored.  Every stack
    is split into its kernel and user parts, which the kernel caches separately.
    The counts may add up to MAX_EXPANDED_EVENTS events; JSON nested deeper than
    the interpreter's recursion limit is refused in one line.
    An .etl file is recognised by its signature and read as :func:`load_etl_stream`."""
    try:
        with io.open(path, "rb") as handle:
            head = handle.read(ETL_SIGNATURE_SIZE)
            if looks_like_etl(head):
                return load_etl_stream(path)
            text = (head + handle.read()).decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise BadInput("cannot read stack file %s: %s" % (path, error))
    stream = StackStream(source="stack file %s" % path)
    budget = _EventBudget(path)
    stripped = text.lstrip()
    if stripped.startswith("[") or stripped.startswith("{"):
        try:
            document = json.loads(text)
        except ValueError as error:
            raise BadInput("%s: invalid JSON: %s" % (path, error))
        except RecursionError:
            raise BadInput("%s: invalid JSON: nested too deeply" % path)
        items = document.get("stacks") if isinstance(document, dict) else document
        if not isinstance(items, list):
            raise BadInput("%s: expected a list of stacks" % path)
        for number, item in enumerate(items):
            where = "%s: stack %d" % (path, number)
            count = 1
            if isinstance(item, dict):
                count = item.get("count", 1)
                item = item.get("frames")
                if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                    raise BadInput("%s: bad count %r" % (where, count))
            if not isinstance(item, list):
                raise BadInput("%s: not a list of frames" % where)
            stream.add_split([_frame(value, where) for value in item], budget.take(count, where))
        return stream
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        where = "%s line %d" % (path, number)
        count = 1
        if ":" in line:
            head, line = line.split(":", 1)
            try:
                count = int(head.strip(), 0)
            except ValueError:
                raise BadInput("%s: bad count %r" % (where, head))
            if count < 0:
                raise BadInput("%s: bad count %r" % (where, head))
        stream.add_split([_frame(value, where) for value in line.replace(",", " ").split()],
                         budget.take(count, where))
    return stream


def load_etl_stream(path):
    """The stacks an .etl file's StackWalk events looked up, in event order:
    ordinary walks (opcode 32, split into kernel and user parts) and key references
    (37/38) resolved through the Delete/Rundown definitions (35/36) of their keys.

    A key can be redefined after a Delete Definition, so each reference resolves to
    the next definition of its key that follows it (or, for keys still cached at
    the end, the rundown).  A reference with no definition after it (events keep
    coming while the rundown is written) resolves to the last one before it: after
    a Rundown Definition the stack is still cached; after a Delete Definition the
    key may have been reused, so that stack is a best guess, and the note counts
    those.  References whose key is never defined in the file are left out."""
    from ..etl.stackwalk import stack_walk_records
    from ..etl import format as fmt
    records, summary = stack_walk_records(path)
    stream = StackStream(source="etl file %s" % path)
    stream.problems.extend(summary.problems)
    definitions = (fmt.STACK_DELETE_DEFINITION, fmt.STACK_RUNDOWN_DEFINITION)
    references = (fmt.STACK_KEY_KERNEL, fmt.STACK_KEY_USER)
    # Resolve from the end: the definition seen last (walking backwards) for a key is
    # the one that closes the reference's lifetime.
    resolved = [None] * len(records)
    current = {}
    for index in range(len(records) - 1, -1, -1):
        record = records[index]
        if record.opcode in definitions:
            current[record.key] = record.frames
        elif record.opcode in references:
            resolved[index] = current.get(record.key)
    unresolved = after_delete = 0
    earlier = {}   # key -> (opcode, frames) of its latest definition so far
    for index, record in enumerate(records):
        if record.opcode == fmt.STACK_WALK:
            stream.add_split(record.frames)
        elif record.opcode in definitions:
            earlier[record.key] = (record.opcode, record.frames)
        elif record.opcode in references:
            frames = resolved[index]
            if frames is None and record.key in earlier:
                opcode, frames = earlier[record.key]
                after_delete += opcode == fmt.STACK_DELETE_DEFINITION
            if frames is None:
                unresolved += 1
            else:
                stream.add(frames)
    if unresolved:
        stream.notes.append("%d key references had no definition in the file and were left out" % unresolved)
    if after_delete:
        stream.notes.append("%d key references came after their key's last Delete Definition; they were resolved "
                            "to that (deleted) stack" % after_delete)
    if not len(stream):
        stream.notes.append("no StackWalk events found")
    return stream


def load_rtltrace_stream(target, address):
    """The traces of the RTL_TRACE_DATABASE at ``address``, each referenced as often
    as its hit count, interleaved round-robin (every pass references each trace that
    still has hits left, in bucket-walk order) — a steady mix of the recorded stacks."""
    database = walk_trace_database(target, address)
    stream = StackStream(source="RTL trace database %s (hit counts, round-robin)" % hexaddr(address))
    stream.problems.extend(database.problems)
    blocks = [(block.frames, max(block.count, 1)) for block in database.blocks if block.frames]
    total = sum(count for _, count in blocks)
    if total > MAX_EXPANDED_EVENTS:
        scale = float(MAX_EXPANDED_EVENTS) / total
        blocks = [(frames, max(1, int(count * scale))) for frames, count in blocks]
        stream.notes.append("hit counts scaled by %.4f to stay within %d events" % (scale, MAX_EXPANDED_EVENTS))
    ids = []
    for frames, count in blocks:
        parts = [[f for f in frames if f >= KERNEL_SPACE_START], [f for f in frames if f < KERNEL_SPACE_START]]
        ids.append(([stream.intern(part) for part in parts if part], count))
    remaining = [count for _, count in ids]
    live = [i for i in range(len(ids)) if remaining[i] > 0]
    while live:
        for i in live:
            stream.sequence.extend(ids[i][0])
            remaining[i] -= 1
        live = [i for i in live if remaining[i] > 0]
    return stream
