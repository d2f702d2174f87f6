"""LLMMLGym-v0 with a scripted policy: five MLGym tasks at once in the native vector env, each beating its baseline.

    python examples/mlgym_scripted.py --mlgym-root ~/MLGym          # your MLGym checkout
    python examples/mlgym_scripted.py --mlgym-root ../shared/mlgym  # the five CPU tasks kept as fixtures here

No model: the "policy" is a script per task that does what an agent would — open the file it must change, replace
its lines with ``edit``, run code, ``validate``, then ``submit``. Every command runs in the episode's sandboxed
workspace, and the score comes from the task's own evaluation script in a separate grading sandbox.

* battleOfSexes: always play 0 (the partner copies your first move with probability 0.8);
* prisonersDilemma: always defect; blotto: (30, 30, 30, 30, 0, 0) against random allocations;
* 3SATTime: pick the most frequent variable of the unresolved clauses, with its majority polarity;
* titanic: write ``train_and_predict.py`` (a gender + class rule learned from train.csv), run it, submit the CSV.

3SATTime's dataset config (``configs/datasets/3SAT.yaml``) is not in every checkout (not in the fixtures):
:func:`write_3sat_dataset` generates random 3-SAT formulas in the pickle format its ``evaluate.py`` reads, passed as
``dataset_paths={"datasets/3SAT.yaml": folder}``. Printed: each task's metric, baseline and reward (pass/fail).
"""

from __future__ import annotations

import json
import pickle
import random
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from _common import parse_flags  # examples/_common.py

TASKS = ("battleOfSexes", "prisonersDilemma", "blotto", "3SATTime", "titanic")


@dataclass
class Args:
    mlgym_root: str = next((str(p) for p in (Path(__file__).resolve().parents[1].parent / "shared" / "mlgym",
                                             Path("/work/shared/mlgym")) if (p / "configs").is_dir()),
                           "../shared/mlgym")
    """the MLGym checkout (it holds configs/tasks and data/)"""
    num_formulas: int = 40
    """3SATTime: random formulas generated when the checkout has no 3SAT dataset"""
    seed: int = 0
    """seeds the generated 3-SAT formulas and the env"""


def _satisfiable(clauses: list[list[int]], assignment: dict[int, bool]) -> bool:
    """A tiny DPLL (unit propagation + branching): the reference answer of a generated formula."""
    clauses = [c for c in clauses if not any(assignment.get(abs(l)) == (l > 0) for l in c)]
    clauses = [[l for l in c if abs(l) not in assignment] for c in clauses]
    if not clauses:
        return True
    if any(not c for c in clauses):
        return False
    unit = next((c[0] for c in clauses if len(c) == 1), None)
    literal = unit if unit is not None else clauses[0][0]
    branches = [literal > 0] if unit is not None else [literal > 0, literal < 0]
    return any(_satisfiable(clauses, {**assignment, abs(literal): value}) for value in branches)


def write_3sat_dataset(folder: Path, num_formulas: int = 40, seed: int = 0) -> Path:
    """``folder/dataset.pkl``: ``3 + num_formulas`` random 3-SAT formulas near the phase transition (the evaluation
    skips the first three), each ``(index, num_vars, num_clauses, clauses, is_sat, None)``."""
    rng = random.Random(seed)
    records = []
    for index in range(num_formulas + 3):
        num_vars = rng.randint(8, 14)
        num_clauses = round(4.26 * num_vars)
        clauses = [[v * rng.choice((1, -1)) for v in rng.sample(range(1, num_vars + 1), 3)] for _ in range(num_clauses)]
        records.append((index, num_vars, num_clauses, clauses, _satisfiable(clauses, {}), None))
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "dataset.pkl", "wb") as f:
        pickle.dump(records, f)
    return folder


STRATEGY = "def row_strategy(history):\n    return {move}\n"
SOLUTIONS = {
    "battleOfSexes": ("strategy.py", STRATEGY.format(move="0")),
    "prisonersDilemma": ("strategy.py", STRATEGY.format(move="1")),
    "blotto": ("strategy.py", STRATEGY.format(move="[30, 30, 30, 30, 0, 0]")),
    "3SATTime": ("heuristic.py", '''from collections import Counter


def heuristic_fn(clauses, assignments, conflict_count, assignment_history, level):
    """The most frequent unassigned variable, set to its majority polarity."""
    counts = Counter(lit for clause in clauses for lit in clause if abs(lit) not in assignments)
    if not counts:
        return None, True
    variable = max({abs(lit) for lit in counts}, key=lambda v: (counts[v] + counts[-v], -v))
    return variable, counts[variable] >= counts[-variable]
'''),
}
TITANIC = '''import pandas as pd

train = pd.read_csv("data/train.csv")
test = pd.read_csv("data/test.csv")
# survival rate per (sex, class) in train; predict survival where it is above one half
rates = train.groupby(["Sex", "Pclass"])["Survived"].mean()
keys = zip(test["Sex"], test["Pclass"])
survived = [int(rates.get(key, 0.0) > 0.5) for key in keys]
pd.DataFrame({"PassengerId": test["PassengerId"], "Survived": survived}).to_csv("submission.csv", index=False)
print("wrote", len(survived), "predictions")
'''


def call(name: str, **arguments) -> str:
    """One tool call in the Hermes/Qwen format the env parses."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class ScriptedAgent:
    """One sub-env's script: each reply reads the last command output from the observation (text mode)."""

    def __init__(self, task: str):
        self.task = task
        self.step = 0

    def act(self, observation: str) -> str:
        self.step += 1
        if self.task == "titanic":
            script = [call("create", filename="train_and_predict.py", content=TITANIC),
                      call("run", command="python train_and_predict.py && head -3 submission.csv"),
                      call("validate"), call("submit")]
            return script[min(self.step, len(script)) - 1]
        filename, content = SOLUTIONS[self.task]
        if self.step == 1:
            return call("open", path=filename)
        if self.step == 2:  # replace every line of the file: the open command said how many there are
            total = int(re.findall(r"\((\d+) lines total\)", observation)[-1])
            return call("edit", start_line=1, end_line=total, replacement=content)
        return call("validate") if self.step == 3 else call("submit")


def main(args: Args) -> dict[str, dict]:
    import gymnasium as gym

    import gym_llm  # noqa: F401  (registers LLMMLGym-v0)

    root = Path(args.mlgym_root).expanduser()
    dataset_paths = {}
    if not (root / "configs" / "datasets" / "3SAT.yaml").exists():
        dataset_paths["datasets/3SAT.yaml"] = str(write_3sat_dataset(Path(tempfile.mkdtemp()) / "3sat",
                                                                    args.num_formulas, args.seed))
    configs = [str(root / "configs" / "tasks" / f"{name}.yaml") for name in TASKS]
    envs = gym.make_vec("LLMMLGym-v0", num_envs=len(TASKS), vectorization_mode="vector_entry_point",
                        task_config_path=configs, dataset_paths=dataset_paths, max_turns=8)
    results: dict[str, dict] = {}
    try:
        observations, _ = envs.reset(seed=args.seed, options={"task_ids": list(range(len(TASKS)))})
        agents = [ScriptedAgent(name) for name in TASKS]
        while len(results) < len(TASKS):
            actions = [agent.act(obs) if name not in results else "(done)"
                       for agent, obs, name in zip(agents, observations, TASKS)]
            observations, rewards, terminated, truncated, infos = envs.step(actions)
            for i, name in enumerate(TASKS):
                if (terminated[i] or truncated[i]) and name not in results:
                    final = infos["final_info"] if "final_info" in infos else infos
                    results[name] = {"reward": float(rewards[i]), "metric": float(final["metric"][i]),
                                     "baseline": float(final["baseline"][i]), "passed": bool(final["passed"][i]),
                                     "metrics": final["metrics"][i]}
    finally:
        envs.close()
    for name, result in results.items():
        print(f"{name:18s} metric {result['metric']:10.4f}  baseline {result['baseline']:10.4f}  "
              f"reward {result['reward']:.1f}  {result['metrics']}")
    return results


if __name__ == "__main__":
    main(parse_flags(Args, __doc__))
