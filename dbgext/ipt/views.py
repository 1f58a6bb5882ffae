"""Layer 4: views of a flow decode, built while the decode runs, as plain data
(rendering is in render.py).

Each view is fed the committed instructions chunk by chunk (``feed``), so a trace
of any size is viewed without holding its instructions; ``finish`` returns the
view's data.  Events (enabled, disabled, sync, overflow, interrupt, gap, resync...)
reach the call tree as the decode reports them (``on_event``), by instruction index.

* :class:`FunctionPath`: one entry per stretch of instructions in one function;
* :class:`CallTree`: who called whom, with call and instruction counts; an
  asynchronous transfer (interrupt, exception) opens a node of its own under the
  interrupted function, closed by the handler's iret;
* :class:`FunctionCounts`: instructions per function.

``namer`` turns an address into text; :class:`Namer` caches the target's symbolizer
and derives the function (``module!symbol``) from it.
"""

import bisect
from collections import Counter, OrderedDict, deque

from .flow import B_CALL, B_FAR_CALL, B_FAR_RET, B_INDIRECT_CALL, B_RET

MAX_ROWS = 100000
MAX_TREE_DEPTH = 64
MAX_TREE_NODES = 10000
MAX_NODE_EVENTS = 100
# Events after which the call stack the trace built up is no longer known.
STACK_LOST = frozenset(("sync", "overflow", "resumed", "gap", "resync", "enabled"))


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


def event_row(event):
    index, kind, offset, ip = event
    return {"index": index, "kind": kind, "offset": offset, "ip": ip}


class FunctionPath(object):
    """Consecutive instructions in one function folded into one entry
    {"function", "first", "index", "instructions"}; at most ``limit`` entries
    are kept (``truncated`` says so), the counts go on."""

    def __init__(self, namer, limit=MAX_ROWS):
        self.namer = namer
        self.limit = limit
        self.entries = []
        self.total_entries = 0
        self.index = 0
        self._current = None
        self._function = None

    def feed(self, chunk):
        function_of = self.namer.function
        current, current_function = self._current, self._function
        entries = self.entries
        index = self.index
        for ip in chunk:
            function = function_of(ip)
            if function != current_function:
                current_function = function
                current = {"function": function, "first": ip, "index": index, "instructions": 0}
                self.total_entries += 1
                if len(entries) < self.limit:
                    entries.append(current)
            current["instructions"] += 1
            index += 1
        self.index = index
        self._current, self._function = current, current_function

    def finish(self):
        return {"entries": self.entries, "total_entries": self.total_entries,
                "truncated": self.total_entries > len(self.entries)}


class CallTree(object):
    """Who called whom.  ``ends``: {address of a block's last instruction: block kind}
    (BlockCache.ends).  Events arrive through ``on_event`` before the instructions
    they precede are fed.

    The root is the function the trace starts in.  Depth and node count are
    bounded: past them, instructions are counted in the deepest node allowed."""

    def __init__(self, namer, ends):
        self.namer = namer
        self.ends = ends
        self.events = deque()  # reported, not yet reached by the instructions fed
        self.index = 0
        self.root = None
        self.stack = []
        self.nodes = 0
        self.pending = None  # what the last instruction started: "call" or "interrupt"

    def on_event(self, event):
        self.events.append(event)

    def _enter(self, ip, how):
        parent = self.stack[-1]
        name = self.namer.function(ip)
        key = (name, how)
        child = parent["_children"].get(key)
        if child is None:
            if self.nodes >= MAX_TREE_NODES or len(self.stack) >= MAX_TREE_DEPTH:
                child = parent  # keep counting in the parent rather than grow without bound
            else:
                child = parent["_children"][key] = _node(name, how)
                self.nodes += 1
        if child is not parent:
            child["calls"] += 1
        self.stack.append(child)

    def _apply_events(self, index):
        events = self.events
        while events and events[0][0] <= index:
            event = events.popleft()
            kind = event[1]
            if self.stack and len(self.stack[-1]["events"]) < MAX_NODE_EVENTS:
                self.stack[-1]["events"].append(event_row(event))
            if kind == "interrupt":
                self.pending = "interrupt"
            elif kind in STACK_LOST and self.root is not None:
                del self.stack[1:]
                self.pending = "resume"

    def feed(self, chunk):
        ends = self.ends
        events = self.events
        index = self.index
        for ip in chunk:
            if events and events[0][0] <= index:
                self._apply_events(index)
            if self.root is None:
                self.root = _node(self.namer.function(ip), "root")
                self.root["calls"] = 1
                self.stack = [self.root]
                self.nodes = 1
                self.pending = None
            elif self.pending is not None:
                how, self.pending = self.pending, None
                if how == "resume":
                    if self.namer.function(ip) != self.root["function"]:
                        self._enter(ip, "resume")
                else:
                    self._enter(ip, how)
            self.stack[-1]["instructions"] += 1
            kind = ends.get(ip)
            if kind is not None:
                if kind == B_CALL or kind == B_INDIRECT_CALL or kind == B_FAR_CALL:
                    self.pending = "call"
                elif (kind == B_RET or kind == B_FAR_RET) and len(self.stack) > 1:
                    self.stack.pop()
            index += 1
        self.index = index

    def finish(self):
        self._apply_events(self.index)
        return _finish(self.root) if self.root is not None else None


def _node(name, how):
    return {"function": name, "via": how, "calls": 0, "instructions": 0, "events": [], "_children": OrderedDict()}


def _finish(node):
    # Depth is bounded by MAX_TREE_DEPTH, well under WinDbg's recursion limit of 500.
    children = node.pop("_children")
    node["children"] = [_finish(child) for child in children.values()]
    return node


class FunctionCounts(object):
    """Instructions per function, most executed first."""

    def __init__(self, namer):
        self.namer = namer
        self.by_address = Counter()

    def feed(self, chunk):
        self.by_address.update(chunk)

    def finish(self):
        counts = Counter()
        function_of = self.namer.function
        for ip, count in self.by_address.items():
            counts[function_of(ip)] += count
        return [{"function": name, "instructions": count} for name, count in counts.most_common()]


VIEWS = {"path": FunctionPath, "functions": FunctionCounts}


def make_view(view, namer, cache, result):
    """The consumer for ``view`` over the decode filling ``result`` (a flow.FlowResult);
    None for "instructions", whose listing is the decode's own."""
    if view == "calltree":
        tree = CallTree(namer, cache.ends)
        result.listeners.append(tree.on_event)
        return tree
    if view in VIEWS:
        return VIEWS[view](namer)
    return None
