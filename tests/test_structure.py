"""How pods_bench/ is wired: its modules import one another one way (no cycle, counting imports
inside functions and those under TYPE_CHECKING: a type-only import is still a dependency), the
config and its plugins point the right way (the config reaches the plugin registries only when it
checks a config; no plugin imports the config), and an import of the package's own modules hides
inside a function only where the laziness is the point:

  - pods_bench/cli.py: `pods-bench --help` and bad-argument errors answer without loading torch;
  - pods_bench/config.py: `validate` reaches the registries (selection rules, engines, tasks,
    allocation strategies), whose modules load torch and the tasks, and types the plugins' sections
    with them; the config itself stays light;
  - pods_bench/engines/__init__.py: the engines' modules (torch) load when a config is checked or an
    engine starts, not when pods_bench.engines is imported.

Ruff's import-outside-toplevel rule (PLC0415) cannot be the check: it flags third-party imports
too, and the lazy imports of torch, transformers or vLLM in light modules are deliberate."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pods_bench"
LAZY_ON_PURPOSE = {"cli.py", "config.py", "engines/__init__.py"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def own_imports(path: Path) -> list[tuple[str, bool]]:
    """(module of pods_bench imported, whether inside a function) for every import in `path`, those
    under `if TYPE_CHECKING:` included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    in_function = {
        id(node)
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(fn)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from pods_bench import run_info` imports a module, `from pods_bench.io import x` a name
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        found += [(name, id(node) in in_function) for name in names if name.split(".")[0] == "pods_bench"]
    return found


def import_graph() -> tuple[dict[str, set[str]], list[str]]:
    """(module -> the package's modules it imports, the function-local ones as 'file: module')."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph, hidden = {m: set() for m in files}, []
    for module, path in files.items():
        for name, local in own_imports(path):
            target = name if name in files else None
            if target is None or target == module:
                continue
            graph[module].add(target)
            if local:
                hidden.append(f"{path.relative_to(PACKAGE).as_posix()}: {target}")
    return graph, hidden


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (a path that returns to its start), or None (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = "done"
        stack.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def test_the_package_imports_one_way():
    graph, _ = import_graph()
    assert len(graph) > 50 and sum(map(len, graph.values())) > 150  # it saw the package
    assert "pods_bench.sampling_config" in graph["pods_bench.sampling"]  # a type-only import counts
    assert cycle(graph) is None, " -> ".join(cycle(graph))


PLUGIN_MODULES = ("pods_bench.allocation", "pods_bench.selection", "pods_bench.engines", "pods_bench.sampling")


def is_plugin_module(module: str) -> bool:
    """The registries and their plugins (allocation strategies, selection rules, rollout engines),
    and the sampler the strategies work with."""
    return any(module == m or module.startswith(f"{m}.") for m in PLUGIN_MODULES)


def test_the_config_and_its_plugins_point_the_right_way():
    """The config imports no plugin registry when it loads (only `validate` and the sections' typing
    reach them, inside functions), and no plugin imports the config: each gets its own settings."""
    loaded = [name for name, local in own_imports(PACKAGE / "config.py") if not local]
    assert [m for m in loaded if is_plugin_module(m)] == []
    assert any(name.startswith("pods_bench.allocation") for name, _ in own_imports(PACKAGE / "config.py"))
    graph, _ = import_graph()
    up = [m for m, targets in graph.items() if is_plugin_module(m) and "pods_bench.config" in targets]
    assert up == [], up


def test_the_cycle_check_finds_a_cycle():
    """Positive control: the same search on a graph with a loop three modules long."""
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"b"}}) is None


def test_own_modules_are_imported_inside_functions_only_where_laziness_is_the_point():
    _, hidden = import_graph()
    assert any(h.startswith("cli.py: ") for h in hidden)  # the check sees function-local imports
    elsewhere = [h for h in hidden if h.split(": ")[0] not in LAZY_ON_PURPOSE]
    assert elsewhere == [], elsewhere


def test_only_the_workflow_imports_its_adapter_and_nothing_imports_snakemake():
    """pods_bench/workflow_jobs.py is the workflow's (workflows/rules/*.smk); the package itself runs
    without Snakemake (`pods-bench plan` is tested so in tests/test_experiment.py)."""
    graph, _ = import_graph()
    assert [m for m, targets in graph.items() if "pods_bench.workflow_jobs" in targets] == []
    rules = "".join(p.read_text(encoding="utf-8") for p in (PACKAGE.parent / "workflows" / "rules").glob("*.smk"))
    assert "from pods_bench import workflow_jobs" in rules
    snakemake_users = [
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if any(name.split(".")[0] == "snakemake" for name in third_party_imports(p))
    ]
    assert snakemake_users == []


def third_party_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


MAX_FUNCTION_LINES = 80


def test_every_function_fits_a_screen():
    """No function of the package is longer than MAX_FUNCTION_LINES lines (docstring included)."""
    long = [
        f"{path.relative_to(PACKAGE).as_posix()}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert long == []
