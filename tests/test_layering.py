"""The direction of imports: the network (`modeling/`) and the bottom-layer modules import nothing above them, and no
subpackage CLI imports the top-level `cli`. Every import is checked, at module level and inside functions."""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).parents[1] / "diffusiongemma"
UPPER = ("generation", "quantization", "training", "serving", "accuracy", "sudoku", "cli", "loading", "model")
BOTTOM = ("generation_config.py", "sampler_configs.py", "stopper_configs.py", "cli_types.py")
# The layers below the public class (`model.py`, which joins the network with `generate`, the loss and loading):
# none of them may import it, so the class is the only place where they meet.
BELOW_MODEL = ("modeling", "generation", "training", "quantization", "loading", "io")
# ... except the `quantize` command's engine, which reads a dense checkpoint with the public class (nothing below
# the class imports it: `quantization/__init__` exports only the formats).
COMMANDS_BELOW = ("quantization/quantize.py",)


def imported_packages(path: pathlib.Path, rel: pathlib.Path | None = None) -> set[tuple[str, bool]]:
    """(first package below `diffusiongemma`, at module level?) for every import of ours in the file; `rel` is its
    path inside the package (default: where it is)."""
    tree = ast.parse(path.read_text())
    rel = rel if rel is not None else path.relative_to(PACKAGE)
    top_level = {id(node) for node in tree.body}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(rel.parent.parts)[: len(rel.parent.parts) - (node.level - 1)]
                parts = base + (node.module.split(".") if node.module else [])
                if not parts:  # `from .. import x`
                    parts = [alias.name for alias in node.names][:1]
            elif node.module and node.module.split(".")[0] == "diffusiongemma":
                parts = node.module.split(".")[1:]
            else:
                continue
            if parts:
                found.add((parts[0].removesuffix(".py"), id(node) in top_level))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "diffusiongemma" and len(parts) > 1:
                    found.add((parts[1], id(node) in top_level))
    return found


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
    bad = {pkg for pkg, _ in imported_packages(path) if pkg in ("serving", "sudoku", "cli", "training")}
    assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", [p for p in modules() if p.name == "cli.py" and p.parent != PACKAGE],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_subpackage_clis_do_not_import_the_top_level_cli(path):
    assert ("cli", True) not in imported_packages(path) and ("cli", False) not in imported_packages(path)


@pytest.mark.parametrize("path", [p for folder in BELOW_MODEL for p in modules(folder)
                                  if str(p.relative_to(PACKAGE)) not in COMMANDS_BELOW],
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
