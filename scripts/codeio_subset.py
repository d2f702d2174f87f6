"""Which of reasoning-gym's 3,002 CodeI/O tasks ``LLMCode-v0`` (``source="codeio"``) keeps: the ones precise enough
to grade by differential testing. Writes ``gym_llm/data/codeio_subset.json`` (the kept indices, split train/test, the
rules and the counts each rule removed); docs/code.md explains the rules.

    python -m scripts.codeio_subset            # from the repository root; a few minutes on 2 cores

A task is kept when:

1. **its spec can be judged** (read from the record): it has the dataset's quality fields with ``clarity >= 7``;
   its output is not declared a float; its reference imports only deterministic standard-library modules (no
   ``random``, ``numpy``, ``sympy``, ``time``, ``datetime``, ``os``, ``sys``, threads, hashing, I/O);
2. **its reference behaves** (run in the sandbox, never on this host): the generator's 10 inputs under the task's
   seed are plain data; the reference answers all 10 within 1 s in total; its outputs are plain data with no float
   anywhere, no string that reads as an error message ("error", "invalid", ...), under 2,000 characters each, and
   not all the same (at least 3 distinct outputs: the inputs matter);
3. **it is reproducible**: the reference, submitted as the program, passes its own differential tests twice in
   ``LLMCode-v0``'s grader (another process: string hashing, set order and any hidden state would show).

Kept tasks whose index is divisible by 5 are the **test** split (evaluation); the others are **train**.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "gym_llm" / "data" / "codeio_subset.json"
MIN_CLARITY = 7
ALLOWED_IMPORTS = frozenset({"math", "collections", "itertools", "typing", "re", "string", "functools", "heapq",
                             "bisect", "operator", "copy", "fractions", "json", "decimal", "abc", "enum",
                             "dataclasses", "queue", "numbers", "cmath", "statistics", "array", "textwrap"})
FLOAT_TYPES = {"float", "double"}
ERROR_WORDS = re.compile(r"error|invalid|cannot|can't|not possible|impossible|undefined|exception", re.IGNORECASE)

_ANALYSE = r'''
import copy as _copy, json as _json, random as _random, time as _time
def _has_float(v):
    if isinstance(v, float):
        return True
    if isinstance(v, dict):
        return any(_has_float(k) or _has_float(x) for k, x in v.items())
    if isinstance(v, (list, tuple, set, frozenset)):
        return any(_has_float(x) for x in v)
    return False
def _strings(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from _strings(k)
            yield from _strings(x)
    elif isinstance(v, (list, tuple, set, frozenset)):
        for x in v:
            yield from _strings(x)
def _analyse(reference, generator, seed, cases):
    ref = {"__name__": "__reference__"}
    gen = {"__name__": "__generator__", "Random": _random.Random}
    exec(reference, ref)
    exec(generator, gen)
    make = gen.get("generate_inputs") or gen.get("generate_input")
    rng = _random.Random(seed)
    outputs, took, floats, errors, sizes = [], 0.0, False, [], []
    for case in range(cases):
        inputs = make(rng)
        _json.dumps(inputs)
        _random.seed(seed + case)
        start = _time.perf_counter()
        out = ref["main_solution"](**_copy.deepcopy(inputs))
        took += _time.perf_counter() - start
        floats = floats or _has_float(out)
        errors += [s for s in _strings(out)]
        text = _json.dumps(out, sort_keys=True)
        sizes.append(len(text))
        outputs.append(text)
    print(_json.dumps({"took_s": took, "floats": floats, "strings": errors[:50], "sizes": sizes,
                       "distinct": len(set(outputs))}))
'''


def records() -> list[dict]:
    import reasoning_gym

    path = Path(reasoning_gym.__file__).parent / "data" / "codeio.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def static_reason(record: dict) -> str | None:
    """Why the record's spec cannot be judged (rule 1), or None."""
    if record.get("clarity") is None:
        return "no quality fields"
    if record["clarity"] < MIN_CLARITY:
        return f"clarity < {MIN_CLARITY}"
    match = re.search(r"Output:\s*\n\s*`?\w+`?\s*\((\w+)", record["input_output_spec"])
    if match is not None and match.group(1).lower() in FLOAT_TYPES:
        return "float output"
    imports = {m.split(".")[0] for m in re.findall(r"^\s*(?:import|from)\s+([\w.]+)", record["code_sample"], re.M)}
    if imports - ALLOWED_IMPORTS:
        return "imports " + ",".join(sorted(imports - ALLOWED_IMPORTS)[:2])
    if "random" in record["code_sample"]:
        return "uses random"
    return None


def behaviour_reason(pool, record: dict, index: int) -> str | None:
    """Why the reference does not behave (rule 2), or None; run in a fresh sandboxed REPL."""
    from gym_llm.envs.code_tasks import CODEIO_NUM_CASES, CODEIO_SEED

    sandbox = pool.acquire()
    try:
        repl = sandbox.start_repl()
        reply = repl.execute(_ANALYSE + f"_analyse({record['code_sample']!r}, {record['input_generator']!r}, "
                                        f"{CODEIO_SEED + index}, {CODEIO_NUM_CASES})", timeout_s=10)
        sandbox.end_repl(repl)
    finally:
        pool.release(sandbox, reusable=sandbox.alive)
    if reply.status != "ok":
        return "reference fails" if reply.status == "error" else f"reference {reply.status}"
    data = json.loads(reply.output.strip().splitlines()[-1])
    if data["took_s"] > 1.0:
        return "reference slow"
    if data["floats"]:
        return "float in output"
    if any(ERROR_WORDS.search(s) for s in data["strings"]):
        return "error-like string output"
    if max(data["sizes"]) > 2000:
        return "large output"
    if data["distinct"] < 3:
        return "output barely depends on input"
    return None


def reproducible(sandboxes, record: dict, index: int) -> bool:
    """Rule 3: the reference, as the program, passes its own differential tests (twice)."""
    from gym_llm.envs.code_grader import Grading
    from gym_llm.envs.code_tasks import CODEIO_NUM_CASES, CODEIO_SEED

    grading = Grading(kind="differential", program=record["code_sample"], entry_point="main_solution",
                      reference=record["code_sample"], generator=record["input_generator"], seed=CODEIO_SEED + index,
                      num_cases=CODEIO_NUM_CASES)
    return all(sandboxes.grade(grading).passed for _ in range(2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    from gym_llm.envs.code_grader import CodeSandboxes
    from gym_llm.tools.sandbox import SandboxConfig, SandboxPool
    from gym_llm.tools.sandbox.process import find_bwrap

    start = time.perf_counter()
    data = records()
    removed: Counter[str] = Counter()
    candidates = []
    for index, record in enumerate(data):
        reason = static_reason(record)
        if reason is None:
            candidates.append(index)
        else:
            removed[reason.split(" ", 1)[0] if reason.startswith("imports") else reason] += 1
    print(f"{len(candidates)} of {len(data)} pass rule 1", file=sys.stderr)
    pool = SandboxPool(SandboxConfig(timeout_s=10, max_output_chars=100_000, memory_limit_mb=512), min_idle=1,
                       bwrap=find_bwrap())
    sandboxes = CodeSandboxes(timeout_s=5.0)

    def check(index: int) -> tuple[int, str | None]:
        reason = behaviour_reason(pool, data[index], index)
        if reason is None and not reproducible(sandboxes, data[index], index):
            reason = "not reproducible"
        return index, reason

    kept = []
    try:
        with ThreadPoolExecutor(args.workers) as executor:
            for done, (index, reason) in enumerate(executor.map(check, candidates), start=1):
                if reason is None:
                    kept.append(index)
                else:
                    removed[reason] += 1
                if done % 100 == 0:
                    print(f"{done}/{len(candidates)} checked, {len(kept)} kept", file=sys.stderr)
    finally:
        pool.close()
        sandboxes.close()
    kept.sort()
    subset = {
        "source": "reasoning-gym 0.1.25, reasoning_gym/data/codeio.jsonl.gz (index = line number - 1)",
        "made_by": "python -m scripts.codeio_subset",
        "rules": {"min_clarity": MIN_CLARITY, "allowed_imports": sorted(ALLOWED_IMPORTS),
                  "cases": "10 generated inputs, seed 1234 + index", "no floats in outputs": True,
                  "reference time": "<= 1 s for the 10 cases", "distinct outputs": ">= 3 of 10",
                  "reproducible": "the reference passes its own differential tests twice in the env's grader",
                  "split": "index % 5 == 0: test; else train"},
        "removed": dict(sorted(removed.items(), key=lambda kv: -kv[1])),
        "train": [i for i in kept if i % 5],
        "test": [i for i in kept if i % 5 == 0],
    }
    args.out.write_text(json.dumps(subset, indent=1) + "\n", encoding="utf-8")
    print(f"kept {len(kept)} of {len(data)} ({len(subset['train'])} train, {len(subset['test'])} test) in "
          f"{time.perf_counter() - start:.0f} s; removed: {dict(removed)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
