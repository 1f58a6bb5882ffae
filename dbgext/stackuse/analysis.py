"""The public stackuse API: :func:`analyze` (every function's frame, optionally its
worst-case depth), :func:`chain` (the deepest call chain from one function) and
:func:`hogs` (the largest frames and the chains over a stack budget).

Each takes the code to analyse as either a target and a module name, or a PE file
(``pe``: a path or a :class:`~dbgext.pe.PEImage`), and returns a result object
that holds every derived fact and its JSON document (``as_dict()``)::

    from dbgext.stackuse import analyze
    result = analyze(pe="driver.sys", depth=True)
    for function in result.functions:
        print(function.display_name, function.frame_size, result.bounds[function.va].depth)
"""

from ..errors import BadInput
from ..pe import PEImage
from ..problems import ProblemLog
from .callgraph import EXACT, SEVERITY, UNBOUNDED, UNKNOWN, CallGraph, Program
from .layouts import DEFAULT_BUDGET

SCHEMA_VERSION = 1


def open_module(target=None, pe=None, module=None, symbols=None, pdb=None):
    """(Program, ModuleFunctions or None) for a PE file or a target's module.

    ``symbols``: extra function names {rva: name} (an ISF file's); ``pdb``: a PDB
    file whose procedures name functions — both on top of what the image itself
    names (exports, COFF symbols)."""
    if pe is not None:
        program = Program()
        image = pe if isinstance(pe, PEImage) else PEImage.from_file(pe)
        if pdb is not None:
            symbols = _with(symbols, pdb_functions(pdb, image))
        return program, program.add_image(image, symbols)
    if target is None:
        raise BadInput("give a PE file, or a target with a module name")
    program = Program(target)
    if module is None:
        return program, None
    loaded = target.module_named(module)
    if loaded is None:
        raise BadInput("no module named %r in the target (loaded: %s)" % (module, _module_names(target)))
    if pdb is not None:
        image = PEImage.from_target(target, loaded)
        return program, program.add_image(image, _with(symbols, pdb_functions(pdb, image)))
    return program, program.add_target_module(loaded, symbols)


def pdb_functions(path, image):
    """{rva: name} of the procedures in the PDB at ``path`` (each at its own address:
    overloads and same-named statics too), then of its function publics where no
    procedure is (a stripped PDB's, or code of a module built without debug
    information: hand-written CRT helpers, another compiler's objects), refused
    (BadInput) when its GUID and age are not the ones ``image``'s CodeView
    record names."""
    from ..symbols.pdb import PdbFile
    pdb = PdbFile(path)
    try:
        codeview = image.codeview
        if codeview is not None and not pdb.matches(codeview.guid, codeview.age):
            raise BadInput("%s does not belong to %s (the image wants %s %s, age %d)"
                           % (path, image.name, codeview.pdb_name, codeview.guid_text, codeview.age))
        names = {}
        for procedure in pdb.procedures():
            names.setdefault(procedure.rva, procedure.name)
        for public in pdb.publics():
            if public.is_function:
                names.setdefault(public.rva, public.name)
        return names
    finally:
        pdb.close()


def _with(symbols, more):
    """{rva: name} of ``symbols`` with ``more``'s names added."""
    merged = dict(symbols or {})
    merged.update(more)
    return merged


def _module_names(target, limit=12):
    names = [loaded.name for loaded in target.modules()]
    if not names:
        return "none"
    more = " and %d more" % (len(names) - limit) if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _require_module(module):
    if module is None:
        raise BadInput("give a module name (or a PE file)")
    return module


def _problems(program, module):
    problems = ProblemLog()
    if module is not None:
        problems.extend(module.problems)
    problems.extend(program.problems)
    return problems.finish()


def function_record(function, bound=None):
    """One function as JSON (the ``functions --jsonl`` line); ``bound`` adds the
    worst-case depth fields."""
    record = {
        "module": function.module.name,
        "rva": function.rva,
        "name": function.name,
        "frame_size": function.frame_size,
        "dynamic": bool(function.dynamic),
        "realignment_padding": function.padding,
        "source": function.source,
        "found_by": function.origin,
        "disagreement": function.disagreement,
    }
    if function.fragment_of is not None:
        record["fragment_of"] = function.fragment_of - function.module.image.image_base
    if bound is not None:
        record["depth"] = bound.depth
        record["depth_bound"] = bound.status
        record["depth_unknown"] = "; ".join(bound.reasons) if bound.status != EXACT else None
    return record


class FunctionsResult(object):
    """Every function of one module: ``functions`` (FunctionInfo, by address),
    ``bounds`` ({va: Bound}, with ``depth``) and ``problems``."""

    def __init__(self, module, functions, bounds, problems):
        self.module = module
        self.functions = functions
        self.bounds = bounds
        self.problems = problems

    def records(self):
        bounds = self.bounds or {}
        return [function_record(function, bounds.get(function.va)) for function in self.functions]

    def as_dict(self):
        return {"schema_version": SCHEMA_VERSION, "module": self.module.name, "arch": self.module.arch,
                "image_base": self.module.image.image_base, "functions": self.records(),
                "problems": self.problems.as_list()}


def analyze(target=None, pe=None, module=None, symbols=None, pdb=None, depth=False):
    """Every function of ``module`` (or of the PE file ``pe``) with its frame size;
    ``depth=True`` adds each one's worst-case stack depth."""
    program, functions_of = open_module(target, pe, _require_module(module) if pe is None else None, symbols, pdb)
    graph = CallGraph(program, call_sites=depth)
    graph.analyse_all(functions_of)
    functions = [functions_of.functions[va] for va in sorted(functions_of.functions)]
    bounds = {function.va: graph.bound(function) for function in functions} if depth else None
    return FunctionsResult(functions_of, functions, bounds, _problems(program, functions_of))


class ChainResult(object):
    """The worst path from ``function``: ``steps`` = [(FunctionInfo, CallSite or
    None, Bound)], the first step being the function itself."""

    def __init__(self, function, steps, problems):
        self.function = function
        self.steps = steps
        self.problems = problems

    @property
    def bound(self):
        return self.steps[0][2]

    def as_dict(self):
        bound = self.bound
        return {
            "schema_version": SCHEMA_VERSION,
            "function": self.function.display_name,
            "depth": bound.depth,
            "depth_bound": bound.status,
            "reasons": list(bound.reasons),
            "frames": [{
                "function": function.display_name,
                "module": function.module.name,
                "rva": function.rva,
                "frame_size": function.frame_size,
                "sp_at_call": site.depth if site is not None else None,
                "call_site": site.address if site is not None else None,
                "call_kind": site.kind if site is not None else None,
                "depth": step_bound.depth,
            } for function, site, step_bound in self.steps],
            "problems": self.problems.as_list(),
        }


def chain(subject, target=None, pe=None, module=None, symbols=None, pdb=None):
    """The deepest call chain from ``subject``: an address (int), a name
    (``name`` or ``module!name``), searched in exports and symbols."""
    program, functions_of = open_module(target, pe, module if pe is None else None, symbols, pdb)
    function = _resolve(program, functions_of, subject)
    steps = CallGraph(program).chain(function)
    return ChainResult(function, steps, _problems(program, function.module))


def _resolve(program, module, subject):
    if isinstance(subject, int):
        found = program.module_for(subject)
        if found is None:
            raise BadInput("0x%x is not in any analysable module" % subject)
        function = found.functions.get(subject) or found.function_containing(subject) or found.add(
            subject, "request")
        if function is None:
            raise BadInput("0x%x is not in the code of %s" % (subject, found.name))
        return function
    name = subject
    candidates = [module] if module is not None else list(program.modules)
    if "!" in subject:
        module_name, name = subject.split("!", 1)
        if module is None and program.target is not None:
            loaded = program.target.module_named(module_name)
            if loaded is None:
                raise BadInput("no module named %r in the target" % module_name)
            candidates = [program.module_for(loaded.base)]
            if candidates[0] is None:
                raise BadInput("cannot analyse %s: %s" % (module_name, "; ".join(
                    problem.message for problem in program.problems) or "no readable image"))
    for candidate in candidates:
        function = candidate.find_by_name(name)
        if function is not None:
            return function
    raise BadInput("no function named %r (exports and symbols searched)" % subject)


class HogsResult(object):
    """The ``top`` largest frames and the functions whose worst case exceeds
    ``budget`` (or is unbounded/unknown), finite ones first, deepest first."""

    def __init__(self, module, budget, largest, over_budget, over_budget_count, bounds, problems):
        self.module = module
        self.budget = budget
        self.largest = largest
        self.over_budget = over_budget
        self.over_budget_count = over_budget_count
        self.bounds = bounds
        self.problems = problems

    def as_dict(self):
        return {
            "schema_version": SCHEMA_VERSION,
            "module": self.module.name,
            "budget": self.budget,
            "largest_frames": [function_record(function) for function in self.largest],
            "over_budget": [function_record(function, self.bounds[function.va]) for function in self.over_budget],
            "over_budget_count": self.over_budget_count,
            "problems": self.problems.as_list(),
        }


def hogs(target=None, pe=None, module=None, symbols=None, pdb=None, top=20, budget=None):
    result = analyze(target, pe, module, symbols, pdb, depth=True)
    functions_of = result.module
    if budget is None:
        budget = DEFAULT_BUDGET[functions_of.arch]
    bounds = result.bounds
    # A chained fragment runs in its parent's frame: listing it would repeat the parent.
    primary = [function for function in result.functions if function.fragment_of is None]
    sized = [function for function in primary if function.frame_size is not None]
    largest = sorted(sized, key=lambda function: (-function.frame_size, function.va))[:max(top, 0)]
    over = [function for function in primary if bounds[function.va].status in (UNBOUNDED, UNKNOWN)
            or (bounds[function.va].value or 0) > budget]
    # Finite chains over the budget first (deepest first), then unknown, then
    # unbounded (recursion): the finite ones are what a driver writer can fix.
    over.sort(key=lambda function: (SEVERITY[bounds[function.va].status], -(bounds[function.va].value or 0),
                                    function.va))
    return HogsResult(functions_of, budget, largest, over[:max(top, 0)], len(over), bounds, result.problems)
