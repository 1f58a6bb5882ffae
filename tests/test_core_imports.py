"""Layers point one way: every dbgext module imports on its own in a fresh
interpreter, and the package's import graph — module-level and function-level
imports alike (a function-level import hides a cycle, it does not remove one) —
has no cycles."""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "dbgext")
# Not importable on their own by design: the pykd backend imports pykd at module
# level (it runs inside WinDbg; tests/test_pykd_backend.py imports it under the fake
# pykd), and ``python -m dbgext`` runs the CLI.
NOT_IMPORTED_ALONE = {"dbgext.target.pykd_backend", "dbgext.__main__"}
# Cycles being removed elsewhere, each a sorted tuple of its modules.


def module_files():
    """{module name: file path} of every module in the package."""
    found = {}
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imports_of(module, path, modules):
    """The dbgext modules ``module`` imports anywhere in its file."""
    is_package = path.endswith("__init__.py")
    package = module if is_package else module.rsplit(".", 1)[0]
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = "%s.%s" % (source, alias.name)
                targets.add(submodule if submodule in modules else source)
    return {target for target in targets if target in modules and target != module}


def import_graph():
    modules = module_files()
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def cycles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                connect(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(tuple(sorted(component)))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10000))
    try:
        for node in sorted(graph):
            if node not in index:
                connect(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_the_package_import_graph_has_no_cycles():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [("a", "b", "c")]


def test_every_module_imports_on_its_own_in_a_fresh_interpreter():
    names = sorted(set(module_files()) - NOT_IMPORTED_ALONE)
    # One interpreter per module, a few at a time.
    failures, running = {}, []
    environment = dict(os.environ, PYTHONPATH=ROOT)

    def finish(name, process):
        _, error = process.communicate(timeout=120)
        if process.returncode != 0:
            failures[name] = error.strip().splitlines()[-1:]

    for name in names:
        running.append((name, subprocess.Popen([sys.executable, "-c", "import " + name], env=environment,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                               universal_newlines=True)))
        if len(running) >= 4:
            finish(*running.pop(0))
    for name, process in running:
        finish(name, process)
    assert failures == {}


def _is_presentation(module):
    """The render layer and what sits above it: renderers, commands, the CLI."""
    last = module.rsplit(".", 1)[-1]
    return module.startswith("dbgext.render") or last in ("render", "command", "cli", "__main__")


def test_nothing_below_the_renderers_imports_them():
    graph = import_graph()
    below = {module: sorted(target for target in imports if target.startswith("dbgext.render"))
             for module, imports in graph.items() if not _is_presentation(module)}
    assert {module: imports for module, imports in below.items() if imports} == {}


def _backend_calls(path):
    """Lines of ``path`` that reach through a Target to its backend (``x.backend.y``)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    return sorted(node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                  and isinstance(node.value, ast.Attribute) and node.value.attr == "backend")


def test_only_the_target_layer_calls_backends():
    calls = {module: _backend_calls(path) for module, path in module_files().items()
             if not module.startswith("dbgext.target")}
    assert {module: lines for module, lines in calls.items() if lines} == {}


def _target_uses(path):
    """Lines of ``path`` that use a name ``target`` (a parameter or variable)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    used = {node.lineno for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id == "target"}
    used.update(node.lineno for node in ast.walk(tree) if isinstance(node, ast.arg) and node.arg == "target")
    return sorted(used)


def test_renderers_never_touch_the_target():
    """They get formatters and results that carry every name they show."""
    touching = {module: _target_uses(path) for module, path in module_files().items()
                if module.rsplit(".", 1)[-1] == "render" or module.startswith("dbgext.render.")}
    assert {module: lines for module, lines in touching.items() if lines} == {}
