"""The layout's rules, read from the source: the oracle stands apart, kernels use public names, imports have no
cycle."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Source folders and the package names they install under (setup.py's package_dir).
PACKAGES = {"dspark": ROOT / "dspark", "dspark.reference": ROOT / "reference", "dspark.kernels": ROOT / "kernels"}


def modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts[:-1]) if parts[-1] == "__init__" else (package, *parts))
            found[name] = path
    return found


def imports(path: Path, name: str) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every import in ``path`` (top-level and inside functions), relative ones resolved."""
    out = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: "." is the module's package, ".." its parent
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.append((base, [alias.name for alias in node.names]))
    return out


def test_the_oracle_imports_only_the_neutral_module():
    """``reference/`` computes everything it checks itself: from the rest of dspark it takes only
    :mod:`dspark.contract` (types and constants)."""
    bad = []
    for name, path in modules().items():
        if not name.startswith("dspark.reference"):
            continue
        for module, _ in imports(path, name):
            if module.startswith("dspark") and not module.startswith(("dspark.reference", "dspark.contract")):
                bad.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not bad, bad


def test_kernels_import_no_private_names():
    bad = [f"{path.relative_to(ROOT)} imports {module}.{n}" for name, path in modules().items()
           if name.startswith("dspark.kernels")
           for module, names in imports(path, name) if module.startswith("dspark") and not module.startswith(
               "dspark.kernels") for n in names if n.startswith("_")]
    assert not bad, bad


def module_graph() -> dict[str, set[str]]:
    """Which dspark modules each dspark module imports (at any depth of its code)."""
    known = modules()
    graph = {}
    for name, path in known.items():
        edges = set()
        for module, names in imports(path, name):
            for candidate in [f"{module}.{n}" for n in names] + [module]:
                if candidate in known and candidate != name:
                    edges.add(candidate)
                    break
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle():
    """No module of the package reaches itself through imports, counting those inside functions: a package
    whose imports flow one way can be read, and split, from the bottom up."""
    assert find_cycle(module_graph()) is None, " → ".join(find_cycle(module_graph()))


# Layers, bottom up: the computations at the top of dspark (with reference/ and kernels/), decoding with real
# targets, drafter files (which read targets), training. A module imports from its own layer or those below;
# the package's __init__, the command line and its demo sit above them all.
LAYERS = ("dspark.runtime", "dspark.files", "dspark.train")
ENTRY_POINTS = {"dspark", "dspark.__main__", "dspark.demo"}


def layer(module: str) -> int:
    if module in ENTRY_POINTS:
        return len(LAYERS) + 1
    return next((i + 1 for i, package in enumerate(LAYERS) if module == package or module.startswith(package + ".")), 0)


def test_imports_flow_one_way():
    upward = [f"{module} imports {imported}" for module, edges in module_graph().items() for imported in sorted(edges)
              if layer(imported) > layer(module)]
    assert not upward, upward


def test_the_trainer_knows_no_corpus_or_prompt_pool():
    """The trainer reads samples and features; answering prompts, pools and recipes sit on top of it."""
    reached, stack = set(), ["dspark.train.trainer"]
    graph = module_graph()
    while stack:
        for imported in graph[stack.pop()] - reached:
            reached.add(imported)
            stack.append(imported)
    pipeline = {f"dspark.train.{name}" for name in ("corpus", "pools", "word_problems", "pipeline", "recipe",
                                                     "any_target", "streaming")}
    assert not reached & pipeline, sorted(reached & pipeline)


def test_each_subpackage_says_what_lives_there():
    for package in LAYERS:
        doc = ast.get_docstring(ast.parse((ROOT / package.replace(".", "/") / "__init__.py").read_text()))
        assert doc and len(doc.splitlines()) == 1, f"{package}/__init__.py needs a one-line docstring"


@pytest.mark.parametrize("graph, cyclic", [({"a": {"b"}, "b": {"c"}, "c": set()}, False),
                                           ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True)])
def test_the_cycle_finder_finds_cycles(graph, cyclic):
    assert (find_cycle(graph) is not None) == cyclic
