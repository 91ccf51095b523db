"""The direction of imports, over every module of the package, imports inside functions included: the subpackage
graph is acyclic; the network (`modeling/`) and the bottom-layer modules import nothing above them; `generation/`
imports none of its callers; nothing imports the top-level package but the entry points; no subpackage CLI imports
the top-level `cli`."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).parents[1] / "diffusiongemma"
ROOT = "diffusiongemma"  # the node of the top-level package itself (its __init__)
UPPER = ("generation", "quantization", "training", "serving", "accuracy", "sudoku", "cli", "loading", "model")
BOTTOM = ("generation_config.py", "sampler_configs.py", "stopper_configs.py", "config_registry.py", "cli_types.py", "version.py")
# The layers below the public class (`model.py`, which joins the network with `generate`, the loss and loading):
# none of them may import it, so the class is the only place where they meet.
BELOW_MODEL = ("modeling", "generation", "training", "quantization", "loading", "io")
ENTRY_POINTS = ("cli.py", "__main__.py")  # the only modules that may import the top-level package


def node_of(rel: pathlib.Path) -> str:
    """A module's node in the subpackage graph: its subpackage, or its own name for a top-level module (the
    package's own __init__ is ROOT)."""
    if len(rel.parts) == 1:
        return ROOT if rel.name == "__init__.py" else rel.name.removesuffix(".py")
    return rel.parts[0]


def import_targets(path: pathlib.Path, rel: pathlib.Path | None = None) -> list[tuple[str, bool, int]]:
    """(imported node, at module level?, line) for every import of ours in the file, however deep inside functions;
    `rel` is its path inside the package (default: where it is). A name imported from the top-level package itself
    (`from .. import __version__`, `import diffusiongemma`) is ROOT; a submodule imported from it is that submodule."""
    tree = ast.parse(path.read_text())
    rel = rel if rel is not None else path.relative_to(PACKAGE)
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel.parent.parts)[: len(rel.parent.parts) - (node.level - 1)]
                parts = base + (node.module.split(".") if node.module else [])
            elif node.module and node.module.split(".")[0] == ROOT:
                parts = node.module.split(".")[1:]
            else:
                continue
            if parts:
                targets.append(parts[0].removesuffix(".py"))
            else:  # `from .. import x` at the top: a submodule, or a name of the package's __init__
                for alias in node.names:
                    sub = PACKAGE / alias.name
                    targets.append(alias.name if sub.is_dir() or sub.with_suffix(".py").exists() else ROOT)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == ROOT:
                    targets.append(parts[1] if len(parts) > 1 else ROOT)
        found += [(t, id(node) in top_level, node.lineno) for t in targets]
    return found


def imported_packages(path: pathlib.Path, rel: pathlib.Path | None = None) -> set[tuple[str, bool]]:
    """(first package below `diffusiongemma`, at module level?) for every import of ours in the file."""
    return {(target, top) for target, top, _ in import_targets(path, rel)}


def import_graph(package: pathlib.Path = PACKAGE) -> dict[str, dict[str, list[str]]]:
    """node -> {imported node: ["path:line", ...]} over every module of `package` (self-imports left out)."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        source = node_of(rel)
        graph.setdefault(source, {})
        for target, _, line in import_targets(path, rel):
            if target != source:
                graph[source].setdefault(target, []).append(f"{rel}:{line}")
    return graph


def find_cycle(graph: dict[str, dict]) -> list[str] | None:
    """One cycle of the graph as [a, b, ..., a], or None when it is acyclic (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_the_subpackage_graph_is_acyclic():
    graph = import_graph()
    cycle = find_cycle(graph)
    where = [f"{a} -> {b} ({', '.join(graph[a][b][:3])})" for a, b in zip(cycle, cycle[1:])] if cycle else []
    assert cycle is None, "import cycle: " + "; ".join(where)


def test_find_cycle_on_synthetic_graphs():
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "c": {}}) is None
    assert find_cycle({"a": {"b": [], "c": []}, "b": {"c": []}, "c": {}}) is None  # a diamond is no cycle
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": {"a": []}, "a": {"b": []}, "b": {"a": []}}) == ["a", "b", "a"]


def test_a_planted_cycle_is_found(tmp_path):
    """A package whose `generation/` lazily imports `accuracy`, which imports `generation` at the top."""
    package = tmp_path / ROOT
    for folder, text in [("generation", "def run():\n    from ..accuracy.record import Recorder\n"),
                         ("accuracy", "from ..generation.loop import run\n")]:
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
        (package / folder / "mod.py").write_text(text)
    (package / "__init__.py").write_text("")
    graph = import_graph(package)
    assert graph["generation"] == {"accuracy": ["generation/mod.py:2"]}
    assert find_cycle(graph) == ["accuracy", "generation", "accuracy"]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_entry_points_import_the_top_level_package(path):
    rel = path.relative_to(PACKAGE)
    if len(rel.parts) == 1 and rel.name in ENTRY_POINTS + ("__init__.py",):
        return
    lines = [line for target, _, line in import_targets(path) if target == ROOT]
    assert not lines, f"{rel} imports the top-level package (line {lines}): import from the module that defines " \
                      "the name instead (e.g. diffusiongemma.version)"


def test_the_checker_sees_imports_of_the_top_level_package(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    import diffusiongemma\n    from .. import __version__\n    from .. import model\n")
    assert [t for t, _, _ in import_targets(probe, pathlib.Path("accuracy/probe.py"))] == [ROOT, ROOT, "model"]


def modules(folder: str | None = None):
    root = PACKAGE / folder if folder else PACKAGE
    return sorted(root.rglob("*.py"))


@pytest.mark.parametrize("path", modules("modeling"), ids=lambda p: p.name)
def test_modeling_imports_nothing_above_it(path):
    rel = str(path.relative_to(PACKAGE))
    bad = {pkg for pkg, _ in imported_packages(path) if pkg in UPPER}
    assert not bad, f"{rel} imports {sorted(bad)}"


@pytest.mark.parametrize("name", BOTTOM)
def test_bottom_layer_imports_only_libraries(name):
    ours = {pkg for pkg, _ in imported_packages(PACKAGE / name)} - {n.removesuffix(".py") for n in BOTTOM}
    assert not ours, f"{name} imports {sorted(ours)}"


@pytest.mark.parametrize("path", modules("generation"), ids=lambda p: p.name)
def test_generation_imports_no_caller(path):
    bad = {pkg for pkg, _ in imported_packages(path) if pkg in ("accuracy", "serving", "sudoku", "cli", "training",
                                                                  ROOT)}
    assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", [p for p in modules() if p.name == "cli.py" and p.parent != PACKAGE],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_subpackage_clis_do_not_import_the_top_level_cli(path):
    assert ("cli", True) not in imported_packages(path) and ("cli", False) not in imported_packages(path)


@pytest.mark.parametrize("path", [p for folder in BELOW_MODEL for p in modules(folder)],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_nothing_below_the_public_class_imports_it(path):
    assert not {pkg for pkg, _ in imported_packages(path) if pkg == "model"}


@pytest.mark.parametrize("path", modules("loading"), ids=lambda p: p.name)
def test_loading_imports_no_caller(path):
    bad = {pkg for pkg, _ in imported_packages(path) if pkg in ("generation", "training", "serving", "accuracy",
                                                                  "sudoku", "cli", "model")}
    assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"


def test_the_checker_sees_function_level_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\n\ndef f():\n    from ..training.loss import block_diffusion_loss\n")
    assert imported_packages(probe, pathlib.Path("modeling/probe.py")) == {("training", False)}
