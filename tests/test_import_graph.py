"""No import cycle in the project's packages, counting every import: inside functions too (a cycle
deferred by a local import is still a cycle) and under ``if TYPE_CHECKING:`` (a cycle kept only for an
annotation still ties the two modules together: one cannot be read, moved or tested without the other).
A submodule importing its own package's ``__init__`` counts as well."""
import ast
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("opencood_ext", "gencomm", "experiments")


def _modules() -> Dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node of the module, at any depth."""
    return (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))


def _targets(module: str, is_pkg: bool, node, modules) -> List[str]:
    """The project modules ``node`` (in ``module``) imports: ``from a import b`` is ``a.b`` when that
    is a module, else ``a``; relative imports resolved against the module's package."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = module.split(".")
        if node.level:
            base = base[:len(base) - node.level + (1 if is_pkg else 0)]
            mod = ".".join(base + ([node.module] if node.module else []))
        else:
            mod = node.module or ""
        names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.append(name)
    return out


def import_graph() -> Dict[str, Set[str]]:
    modules = _modules()
    return {m: {t for node in _imports(ast.parse(f.read_text())) for t in _targets(m, f.name == "__init__.py",
                                                                                   node, modules)}
            for m, f in modules.items()}


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_graph_sees_local_and_type_checking_imports():
    graph = import_graph()
    assert "opencood_ext.models.components" in graph["opencood_ext.models.encoder_stack"]
    assert "opencood_ext.experiment" in graph["opencood_ext.runs"]
    assert "opencood_ext.comm.channel" in graph["opencood_ext.run_folder"]  # under TYPE_CHECKING only


def test_no_import_cycle():
    assert cycles(import_graph()) == []


LOWER = ("models", "comm", "data", "geometry")  # never import the layers that use them
UPPER = ("cli", "experiment", "runs", "training", "eval", "methods", "interop", "sim")


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "opencood_ext" and len(parts) > 1 else parts[0]


def rule_breaks(graph: Dict[str, Set[str]]) -> List[str]:
    """docs/architecture.md's dependency rule: opencood_ext never imports gencomm or experiments, gencomm
    never imports experiments (the driver sits on top of both); only the command-line modules and the
    driver import opencood_ext.cli; models, comm, data and geometry import none of the layers above."""
    out = []
    for m, deps in graph.items():
        for d in deps:
            if m.startswith("opencood_ext") and d.startswith("gencomm"):
                out.append(f"{m} -> {d}: the substrate imports the method")
            elif d.startswith("experiments") and not m.startswith("experiments"):
                out.append(f"{m} -> {d}: only the driver imports the driver")
            elif _package(d) == "cli" and _package(m) not in ("cli", "gencomm", "experiments"):
                out.append(f"{m} -> {d}: only command-line modules import opencood_ext.cli")
            elif _package(m) in LOWER and _package(d) in UPPER:
                out.append(f"{m} -> {d}: {_package(m)} imports the layer above it")
    return sorted(out)


def test_the_rule_checker_finds_a_break():
    graph = {"opencood_ext.eval.robustness": {"opencood_ext.cli.inference"},
             "opencood_ext.models.detector": {"opencood_ext.training.trainer", "opencood_ext.comm.wire"},
             "opencood_ext.runs": {"gencomm.link"},
             "gencomm.link": {"experiments.results"}}
    assert len(rule_breaks(graph)) == 4


def test_the_dependency_rule_holds():
    assert rule_breaks(import_graph()) == []
