"""Every snippet in docs/interop.md runs as written (in a fresh namespace, from a scratch working directory)."""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEXT = (REPO / "docs" / "interop.md").read_text()
SNIPPETS = {heading: code for heading, code in re.findall(r"^## (.+?)\n.*?```python\n(.*?)```", TEXT, flags=re.S | re.M)}

# what each snippet prints (its comments say so): checked, so a snippet that runs but does the wrong thing fails
PRINTS = {"Gymnasium vector envs": r"\[1\. 1\.\]", "TorchRL": r"torch\.Size\(\[4, 1\]\)",
          "SkyRL-gym": r"^(0\.0|1\.0) True$", "OpenEnv": r"^(0\.0|1\.0) True$", "verifiers": r"^3$"}

pytestmark = pytest.mark.xdist_group("openenv")  # the OpenEnv and verifiers imports are shared with that group


def test_every_library_has_a_snippet():
    names = " ".join(SNIPPETS)
    for library in ("Gymnasium", "TorchRL", "Stable-Baselines3", "SkyRL", "OpenEnv", "verifiers", "TRL"):
        assert library in names, f"docs/interop.md has no snippet for {library}"
    assert all(len(code.strip().splitlines()) <= 16 for code in SNIPPETS.values())  # short enough to copy


@pytest.mark.slow
@pytest.mark.parametrize("heading", list(SNIPPETS))
def test_snippet_runs_as_written(heading, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        namespace = {"__name__": "__main__"}
        try:
            exec(compile(SNIPPETS[heading], f"docs/interop.md: {heading}", "exec"), namespace)
        finally:  # a script's process would end here; this worker goes on: free the TRL factory's sandboxes
            if hasattr(namespace.get("factory"), "close"):
                namespace["factory"].close()
    for key, pattern in PRINTS.items():
        if heading.startswith(key):
            assert re.search(pattern, out.getvalue().strip(), flags=re.M), (heading, out.getvalue())
