"""setup.py: every package folder is packaged, and every third-party import is a declared dependency.

The full proof (build a wheel, install it in a fresh venv, import everything) is `.ci/wheel`; these are the quick
checks that catch the same mistakes in the ordinary test run.
"""

import ast
import importlib.metadata
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "diffusiongemma"


def setup_keyword(name: str):
    """The literal value of `setup(name=...)` in setup.py (read, not run: running it would build)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"setup.py has no {name}=")


def python_folders() -> list[str]:
    """Dotted names of the folders under diffusiongemma/ that hold .py files."""
    folders = {p.parent for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    return sorted(".".join(f.relative_to(ROOT).parts) for f in folders)


def third_party_imports() -> dict[str, str]:
    """Top-level module imported anywhere in the package (absolute imports only) -> one file importing it."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "diffusiongemma" and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_folder_with_python_files_is_a_package():
    # setup.py's find_packages only takes folders with an __init__.py: one without is left out of the wheel (as
    # diffusiongemma/generation was). Checked directly, so the test needs no setuptools in the environment.
    missing = [name for name in python_folders() if not (ROOT / name.replace(".", "/") / "__init__.py").is_file()]
    assert missing == []


def test_every_third_party_import_is_declared():
    declared = {canonical(re.split(r"[<>=!~ \[;]", req)[0]) for req in setup_keyword("install_requires")}
    optional = {canonical(re.split(r"[<>=!~ \[;]", req)[0]) for reqs in setup_keyword("extras_require").values()
                for req in reqs}
    distributions = importlib.metadata.packages_distributions()  # "safetensors" -> ["safetensors"], ...
    undeclared = {}
    for module, where in third_party_imports().items():
        names = {canonical(d) for d in distributions.get(module, [module])}
        if not names & (declared | optional):
            undeclared[module] = where
    assert undeclared == {}, f"imported but not in setup.py install_requires: {undeclared}"


def test_demo_model_is_package_data():
    patterns = setup_keyword("package_data")["diffusiongemma"]
    files = [p for p in (PACKAGE / "sudoku" / "demo_model").iterdir() if p.is_file()]
    assert files and all(any(p.match(f"*/diffusiongemma/{pat}") for pat in patterns) for p in files)
