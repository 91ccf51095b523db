"""The README's install section says which torch build `pip install torch` gives and how to choose one, its two
set-up commands are the ones CI (.ci/run) runs, and the browser packages it names are the ones CI installs."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def install_section() -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]


def test_set_up_commands_are_the_ones_ci_runs():
    first_block = re.search(r"```bash\n(.*?)```", install_section(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    ci = (REPO / ".ci" / "run").read_text()
    assert commands == ["pip install torch==2.13.0", 'pip install -e ".[test]"']
    for command in commands:
        assert f"\n{command}\n" in ci


def test_cpu_only_and_cuda_builds_are_explained():
    text = install_section()
    assert "the CPU wheel" not in text  # PyPI's Linux wheel is the CUDA build
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text
    assert "https://download.pytorch.org/whl/cuXYZ" in text and "pytorch.org/get-started" in text


def test_browser_packages_are_the_ones_ci_installs():
    apt = re.search(r"apt-get install -y ([\w -]+?)\s+#", install_section()).group(1).split()
    assert apt == ["chromium", "chromium-driver"]
    assert f"apt-get install -y {' '.join(apt)}\n" in (REPO / ".ci" / "run").read_text()
