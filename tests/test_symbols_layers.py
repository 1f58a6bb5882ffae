"""The symbol layer points one way: ``dbgext.pe`` and ``dbgext.symbols.*`` never
import ``dbgext.target`` (the target imports the symbol table, not the other way),
and the imports among them, function-level ones included, have no cycle."""

import ast
import os

import dbgext

PACKAGE = os.path.dirname(os.path.abspath(dbgext.__file__))
LOWER_LAYERS = ("dbgext.pe", "dbgext.symbols")


def module_name(path):
    relative = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
    return relative[:-len(".__init__")] if relative.endswith(".__init__") else relative


def imports_of(path):
    """Every dbgext module ``path`` imports, wherever the import statement is."""
    name = module_name(path)
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("dbgext"))
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            if not target.startswith("dbgext"):
                continue
            for alias in node.names:
                candidate = target + "." + alias.name
                found.add(candidate if os.path.exists(_path(candidate)) else target)
    return found


def _path(name):
    parts = name.split(".")[1:]
    base = os.path.join(PACKAGE, *parts)
    return base + ".py" if os.path.exists(base + ".py") else os.path.join(base, "__init__.py")


def lower_layer_graph():
    graph = {}
    for root, _, files in os.walk(PACKAGE):
        for file_name in files:
            path = os.path.join(root, file_name)
            if file_name.endswith(".py") and module_name(path).startswith(LOWER_LAYERS):
                graph[module_name(path)] = imports_of(path)
    return graph


def test_pe_and_symbols_never_import_the_target_layer():
    offenders = dict((module, sorted(name for name in imported if name.startswith("dbgext.target")))
                     for module, imported in lower_layer_graph().items())
    assert dict((module, names) for module, names in offenders.items() if names) == {}


def test_the_symbol_layer_has_no_import_cycle():
    graph = lower_layer_graph()
    state = {}

    def visit(module, trail):
        if state.get(module) == "done":
            return
        assert state.get(module) != "open", "import cycle: " + " -> ".join(trail + [module])
        state[module] = "open"
        for imported in graph.get(module, ()):
            visit(imported, trail + [module])
        state[module] = "done"

    for module in sorted(graph):
        visit(module, [])
    assert "dbgext.symbols.table" in graph and "dbgext.pe" in graph
