"""CI: check a non-editable install of diffusiongemma (run by `.ci/run` from a folder outside the checkout).

    python check_installed.py CHECKOUT

1. `diffusiongemma` is imported from site-packages, not from the checkout.
2. Every .py file of the checkout's package and every file of the bundled Sudoku model is installed.
3. Every module of the installed package imports (found with `pkgutil.walk_packages`, so a new subpackage is
   covered without editing this script).
4. `diffusiongemma --help` works, and `diffusiongemma sudoku --puzzle P --json` prints one JSON object with the
   documented keys.
Exits 1 with a list of every failure.
"""

import importlib
import json
import pkgutil
import subprocess
import sys
import sysconfig
import traceback
from pathlib import Path

PUZZLE = "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"
SUDOKU_KEYS = {"puzzle", "givens", "solution", "valid", "steps"}


def installed_package() -> Path:
    import diffusiongemma

    root = Path(diffusiongemma.__file__).resolve().parent
    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    if site not in root.parents:
        raise SystemExit(f"diffusiongemma was imported from {root}, not from this venv's site-packages {site}")
    return root


def missing_files(checkout: Path, installed: Path) -> list[str]:
    """Source .py files, demo-model files and the playground page of the checkout that the install lacks."""
    source = checkout / "diffusiongemma"
    wanted = [p for p in source.rglob("*.py") if "__pycache__" not in p.parts]
    wanted += [p for p in (source / "sudoku" / "demo_model").iterdir() if p.is_file()]
    wanted.append(source / "serving" / "playground.html")  # the page `GET /playground` serves
    return [str(p.relative_to(source)) for p in wanted if not (installed / p.relative_to(source)).is_file()]


def import_failures(installed: Path) -> tuple[list[str], list[str]]:
    """Import every module under the installed package; return (imported names, failure messages)."""
    failures = []

    def on_error(name):  # walk_packages ignores ImportError of a subpackage unless told otherwise
        failures.append(f"{name}: {traceback.format_exc(limit=1).strip()}")

    names = ["diffusiongemma"]
    for info in pkgutil.walk_packages([str(installed)], prefix="diffusiongemma.", onerror=on_error):
        names.append(info.name)
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            failures.append(f"import {name}: {traceback.format_exc(limit=1).strip()}")
    return names, failures


def cli_failures() -> list[str]:
    failures = []
    help_run = subprocess.run(["diffusiongemma", "--help"], capture_output=True, text=True)
    if help_run.returncode != 0 or "sudoku" not in help_run.stdout:
        failures.append(f"diffusiongemma --help: exit {help_run.returncode}\n{help_run.stdout}{help_run.stderr}")
    run = subprocess.run(["diffusiongemma", "sudoku", "--puzzle", PUZZLE, "--json", "--seed", "0"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        return failures + [f"diffusiongemma sudoku: exit {run.returncode}\n{run.stderr[-2000:]}"]
    try:
        result = json.loads(run.stdout)
    except json.JSONDecodeError as err:
        return failures + [f"diffusiongemma sudoku --json printed no JSON ({err}): {run.stdout!r}"]
    if not isinstance(result, dict) or set(result) != SUDOKU_KEYS:
        failures.append(f"diffusiongemma sudoku --json: keys {sorted(result)}, expected {sorted(SUDOKU_KEYS)}")
    elif result["puzzle"] != PUZZLE or len(result["solution"]) != 81 or not isinstance(result["valid"], bool):
        failures.append(f"diffusiongemma sudoku --json: unexpected values {result}")
    else:
        print(f"sudoku: valid={result['valid']} in {result['steps']} steps")
    return failures


def main() -> int:
    checkout = Path(sys.argv[1]).resolve()
    if Path.cwd().resolve() == checkout or checkout in Path.cwd().resolve().parents:
        raise SystemExit("run this from a folder outside the checkout")
    installed = installed_package()
    print(f"installed at {installed}")
    failures = [f"not installed: {name}" for name in missing_files(checkout, installed)]
    names, import_errors = import_failures(installed)
    print(f"imported {len(names)} modules")
    failures += import_errors + cli_failures()
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
