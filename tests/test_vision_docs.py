"""docs/vision.md's offline example runs as written (no network, a tiny random model)."""

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_offline_example_runs(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "vision.md").read_text(), flags=re.S)
    example = blocks[-1]
    assert "tempfile.mkdtemp()" in example  # the self-contained one, not a Hub snippet
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", example], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'role': 'assistant'" in done.stdout
