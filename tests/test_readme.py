"""The README's two commands are what CI runs, and its quickstart snippets stay true."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_ci_runs_the_readme_set_up_and_test_commands():
    readme = (REPO / "README.md").read_text()
    blocks = _bash_blocks(readme)
    test_command = next(b for b in blocks if "pytest" in b)
    ci_lines = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    assert " && ".join(ci_lines) == test_command
    main_job = blocks[0]
    assert main_job.startswith("bash scripts/setup.sh && ")
    script = main_job.split("&& ", 1)[1].split()[1]
    assert (REPO / script).is_file(), f"the README's main job runs {script}, which does not exist"


def test_readme_env_table_lists_every_env():
    import gym_llm

    readme = (REPO / "README.md").read_text()
    for info in gym_llm.ENVS:
        assert f"`{info.id}`" in readme
