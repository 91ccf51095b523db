"""docs/conversion.md's walkthrough runs as written: make the synthetic checkpoint, convert, verify, load with the
Auto class."""

import re
import shlex
from pathlib import Path

import orbax_fixtures  # noqa: F401  (skips without the convert extra)

from diffusiongemma.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "conversion.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_walkthrough_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    make, load = blocks("python")
    exec(compile(make, "make_synthetic.py", "exec"), {"__name__": "__main__"})
    commands = [line for line in blocks("bash")[0].splitlines() if line.startswith("diffusiongemma ")]
    assert [c.split()[2] for c in commands] == ["orbax", "verify"]
    for command in commands:
        assert main(shlex.split(command)[1:] + ["--quiet"]) == 0, command
    exec(compile(load, "load.py", "exec"), {"__name__": "__main__"})
    assert "every tensor equals the original" in capsys.readouterr().out
