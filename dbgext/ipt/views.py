"""Layer 4: views of a decode as plain data (rendering is in render.py).

* packet listing;
* instruction listing with ``module!symbol+off``;
* condensed path: one entry per stretch of instructions in one function;
* call tree with call counts;
* per-function instruction counts.

``namer`` turns an address into text; :class:`Namer` caches the target's symbolizer
and derives the function (``module!symbol``) from it.
"""

import bisect
from collections import Counter, OrderedDict

from .flow import B_CALL, B_INDIRECT_CALL, B_RET

MAX_TREE_DEPTH = 64
MAX_TREE_NODES = 10000


class Namer(object):
    """Address -> "module!symbol+0xoff" (cached) and -> function "module!symbol".

    ``images``: [(base, size, name, {rva: exported name})] for code image files."""

    def __init__(self, target=None, images=()):
        self.target = target
        self.images = []
        for base, size, name, exports in sorted(images, key=lambda image: image[0]):
            rvas = sorted(exports)
            self.images.append((base, size, name, rvas, [exports[rva] for rva in rvas]))
        self._names = {}
        self._functions = {}

    def name(self, address):
        text = self._names.get(address)
        if text is None:
            text = self._describe(address)
            self._names[address] = text
        return text

    def _describe(self, address):
        for base, size, name, rvas, names in self.images:
            if base <= address < base + size:
                rva = address - base
                index = bisect.bisect_right(rvas, rva) - 1
                if index < 0:
                    return "%s+0x%x" % (name, rva)
                offset = rva - rvas[index]
                return "%s!%s+0x%x" % (name, names[index], offset) if offset else "%s!%s" % (name, names[index])
        if self.target is not None:
            return self.target.symbolize(address)
        return "0x%x" % address

    def function(self, address):
        function = self._functions.get(address)
        if function is None:
            text = self.name(address)
            function = text.rsplit("+", 1)[0] if "!" in text else text.split("+", 1)[0]
            self._functions[address] = function
        return function


def packet_rows(decode, buffer):
    """Packets as dicts with offsets in the stored buffer (ring positions mapped back)."""
    rows = []
    for packet in decode.packets:
        row = packet.as_dict()
        row["offset"] = buffer.original_offset(packet.offset)
        rows.append(row)
    return rows


def error_rows(errors, buffer):
    return [{"offset": buffer.original_offset(offset), "message": message} for offset, message in errors]


def instruction_rows(instructions, namer):
    return [{"ip": ip, "symbol": namer.name(ip)} for ip in instructions]


def function_path(instructions, namer):
    """Consecutive instructions in one function folded into one entry."""
    path = []
    current = None
    for ip in instructions:
        function = namer.function(ip)
        if current is None or current["function"] != function:
            current = {"function": function, "first": ip, "instructions": 0}
            path.append(current)
        current["instructions"] += 1
    return path


def branch_kinds(cache):
    """Address of each block-ending call/ret -> its kind, from the flow's block cache."""
    kinds = {}
    for table in cache.by_mode.values():
        for block in table.values():
            if block.kind in (B_CALL, B_INDIRECT_CALL, B_RET) and block.insns:
                kinds[block.insns[-1]] = block.kind
    return kinds


def call_tree(instructions, kinds, namer):
    """Who called whom, with call and instruction counts.

    Returns the root node {"function", "calls", "instructions", "children": [...]};
    the root is the function the trace starts in.  Depth and node count are bounded."""
    if not instructions:
        return None
    root = _node(namer.function(instructions[0]))
    root["calls"] = 1
    stack = [root]
    nodes = 1
    call_pending = False
    for ip in instructions:
        if call_pending:
            call_pending = False
            parent = stack[-1]
            name = namer.function(ip)
            child = parent["_children"].get(name)
            if child is None:
                if nodes >= MAX_TREE_NODES or len(stack) >= MAX_TREE_DEPTH:
                    child = parent  # keep counting in the parent rather than grow without bound
                else:
                    child = parent["_children"][name] = _node(name)
                    nodes += 1
            if child is not parent:
                child["calls"] += 1
            stack.append(child)
        stack[-1]["instructions"] += 1
        kind = kinds.get(ip)
        if kind == B_CALL or kind == B_INDIRECT_CALL:
            call_pending = True
        elif kind == B_RET and len(stack) > 1:
            stack.pop()
    return _finish(root)


def _node(name):
    return {"function": name, "calls": 0, "instructions": 0, "_children": OrderedDict()}


def _finish(node):
    children = node.pop("_children")
    node["children"] = [_finish(child) for child in children.values()]
    return node


def function_counts(instructions, namer):
    """[{"function", "instructions"}] most executed first."""
    counts = Counter(namer.function(ip) for ip in instructions)
    return [{"function": name, "instructions": count} for name, count in counts.most_common()]
