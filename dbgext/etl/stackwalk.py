"""Decode the kernel's StackWalk events (group 0x18).

* opcode 32, stack walk: {EventTimeStamp u64, StackProcess u32, StackThread u32, frames...}
* opcode 35 Delete Definition / 36 Rundown Definition: {StackKey, frames...}
* opcode 37 (kernel) / 38 (user) key reference: {EventTimeStamp u64, PID u32, TID u32, StackKey}

Frames and keys are pointer-sized (from the event's header type).
"""

import struct

from . import format as fmt
from .reader import EtlReader

KIND_NAMES = {fmt.STACK_WALK: "walk", fmt.STACK_DELETE_DEFINITION: "delete_definition",
              fmt.STACK_RUNDOWN_DEFINITION: "rundown_definition", fmt.STACK_KEY_KERNEL: "kernel_reference",
              fmt.STACK_KEY_USER: "user_reference"}


class StackWalkRecord(object):
    """One decoded StackWalk event: ``frames`` for walks and definitions, ``key`` for
    definitions and references."""

    __slots__ = ("opcode", "timestamp", "process_id", "thread_id", "key", "frames")

    def __init__(self, opcode, timestamp=0, process_id=0, thread_id=0, key=None, frames=()):
        self.opcode = opcode
        self.timestamp = timestamp
        self.process_id = process_id
        self.thread_id = thread_id
        self.key = key
        self.frames = frames

    @property
    def kind(self):
        return KIND_NAMES[self.opcode]


def decode(event):
    """A StackWalkRecord for a StackWalk event, or None (other events, short payloads)."""
    if event.group != fmt.STACKWALK_GROUP and event.provider != fmt.STACKWALK_GUID:
        return None
    payload = event.payload
    char = "Q" if event.pointer_size == 8 else "I"
    size = event.pointer_size
    if event.opcode == fmt.STACK_WALK:
        if len(payload) < 16:
            return None
        timestamp, pid, tid = struct.unpack_from("<QII", payload)
        count = (len(payload) - 16) // size
        return StackWalkRecord(event.opcode, timestamp, pid, tid,
                               frames=struct.unpack_from("<%d%s" % (count, char), payload, 16))
    if event.opcode in (fmt.STACK_DELETE_DEFINITION, fmt.STACK_RUNDOWN_DEFINITION):
        if len(payload) < size:
            return None
        count = len(payload) // size
        values = struct.unpack_from("<%d%s" % (count, char), payload)
        return StackWalkRecord(event.opcode, key=values[0], frames=values[1:])
    if event.opcode in (fmt.STACK_KEY_KERNEL, fmt.STACK_KEY_USER):
        if len(payload) < 16 + size:
            return None
        timestamp, pid, tid = struct.unpack_from("<QII", payload)
        key = struct.unpack_from("<" + char, payload, 16)[0]
        return StackWalkRecord(event.opcode, timestamp, pid, tid, key=key)
    return None


def stack_walk_records(source):
    """(records, the reader's ReadSummary) of every StackWalk event in an .etl file."""
    records = []
    with EtlReader(source) as reader:
        for event in reader.events():
            record = decode(event)
            if record is not None:
                records.append(record)
    return records, reader.summary
