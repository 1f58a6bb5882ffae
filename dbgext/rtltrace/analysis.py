"""The public entry points: ``walk`` one database (walk, validate, select the
traces asked for), ``find`` databases in memory, and ``name_frames`` for the
traces a caller shows."""

from ..errors import BadInput, UnreadableMemory, WrongSignature
from .find import find_databases
from .layouts import BLOCK_MAGIC, DATABASE_MAGIC, MAX_FRAMES, choose_layouts, describe_magic
from .result import DatabaseSearch, Selection
from .validate import validate_database
from .walk import read_block, walk_database

MAX_WALKED = 16   # databases find(walk=True) walks


def walk(target, address, layout=None, force=False, trace=None, bucket=None, module=None):
    """Walk and validate the RTL_TRACE_DATABASE at ``address``: a TraceDatabase
    holding what was read, its problems and notes, statistics, and the traces
    selected by ``trace`` (a block address), ``bucket`` (an index) or ``module``
    (a module name) — all traces otherwise — in walk order.

    ``layout``: a built-in layout name (``user-x64``, ``kernel-x64``,
    ``user-x86``) instead of type information or recognition.  A wrong magic at
    ``address`` raises WrongSignature unless ``force``; when ``address`` holds a
    pointer to a database (``driver!g_TraceDatabase``) it is followed."""
    address, followed = _database_address(target, address)
    db = _walk_and_validate(target, address, layout, force)
    if followed:
        db.note(followed)
    db.selection = _select(target, db, trace, bucket, module, force)
    return db


def name_frames(target, db, blocks):
    """Name the frames of ``blocks`` (the traces a caller is about to show) in
    ``db.frame_names``, so the result carries every name its views show."""
    for block in blocks:
        target.name_addresses(db.frame_names, block.frames or ())
    return db


def find(target, start=0, end=None, walk=False):
    """Databases in readable memory [start, end): a DatabaseSearch of candidates
    (the magic followed by a first segment header pointing back); with ``walk``,
    the first MAX_WALKED are analyzed too."""
    if end is not None and end <= start:
        raise BadInput("the search range must end above its start (0x%x..0x%x)" % (start, end))
    target.require_full_memory("finding trace databases")
    candidates = find_databases(target, start, end)
    search = DatabaseSearch(candidates)
    if walk:
        search.databases.extend(_walk_and_validate(target, candidate.address) for candidate in candidates[:MAX_WALKED])
        if len(candidates) > MAX_WALKED:
            search.problems.add("walk_limit", None, "%d trace databases found, only the first %d walked"
                                % (len(candidates), MAX_WALKED), severity="note")
    return search


def _walk_and_validate(target, address, layout=None, force=False):
    return validate_database(target, walk_database(target, address, choose_layouts(target, address, layout), force))


def _database_address(target, address):
    """``address``, or the database a pointer there points to, and a note saying so."""
    try:
        if target.u32(address) == DATABASE_MAGIC:
            return address, None
        pointed = target.pointer(address)
        if target.u32(pointed) == DATABASE_MAGIC:
            return pointed, "%s holds a pointer to the database at %s" % (
                target.format_address(address), target.format_address(pointed))
    except UnreadableMemory:
        pass
    return address, None


def _select(target, db, trace, bucket, module, force):
    if trace is not None:
        return Selection("trace", [_trace_block(target, db, trace, force)])
    if bucket is not None:
        if not 0 <= bucket < db.buckets_walked:
            raise BadInput("bucket %d is outside 0..%d" % (bucket, max(db.buckets_walked - 1, 0)))
        return Selection("bucket", [block for block in db.blocks if block.bucket == bucket], bucket=bucket)
    blocks = db.blocks
    kind = "all"
    found = None
    if module is not None:
        found = target.module_named(module)
        if found is None:
            raise BadInput("no module named %r (known: %s)" % (
                module, ", ".join(m.name for m in target.modules()) or "none"))
        blocks = [block for block in blocks if any(found.contains(frame) for frame in block.frames or ())]
        kind = "module"
    return Selection(kind, blocks, module=found)


def _trace_block(target, db, address, force):
    """The block at ``address`` (or whose frames start there), read on its own when
    the walk did not reach it."""
    for block in db.blocks:
        if address in (block.address, block.trace):
            return block
    try:
        block = read_block(target, db.layout, address)
    except UnreadableMemory as error:
        raise BadInput("no trace block at %s: memory at %s is unreadable"
                       % (target.format_address(address), target.format_address(error.address)))
    if block.magic != BLOCK_MAGIC and not force:
        raise WrongSignature("RTL_TRACE_BLOCK", address, describe_magic(block.magic))
    if not 0 < block.size <= MAX_FRAMES:
        db.problems.add("bad_block_size", address, "block Size %d (1..%d frames expected); frames not read"
                        % (block.size, MAX_FRAMES))
    return block
