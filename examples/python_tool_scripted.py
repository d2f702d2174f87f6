"""LLMPythonTool-v0 with a scripted policy: it writes Python, reads what the sandbox printed, and answers ``#### N``.

    python examples/python_tool_scripted.py                          # offline: generated "What is a + b?" problems
    python examples/python_tool_scripted.py --data-files ../shared/data/gsm8k/test.jsonl   # GSM8K

Run from the checkout with gym-llm installed (``bash scripts/setup.sh``), or with ``PYTHONPATH=.``. No model: the
"policy" is a script, so what you see is the env's side — every code block runs in a real sandboxed interpreter
(bubblewrap + seccomp; one persistent REPL per episode).

An episode, one reply per turn (text mode):

1. the policy reads the problem and replies with a ```python block that computes the answer. For the generated
   problems it parses the question; for GSM8K it plays an oracle that turns the worked solution's calculator
   annotations (``<<48/2=24>>``) into Python lines — the answer itself still comes from running them. With
   probability ``--bug-rate`` the block has a typo in its last line and raises ``NameError``;
2. the env runs the block and adds the output as a ``tool`` message (reward 0, not done). The policy reads it from
   the env's messages (the next observation holds the same text, rendered): a traceback makes it send the fixed
   line — the variables of the failed block persist in the interpreter — and printed output becomes its answer;
3. a reply without code is the final answer: GSM8K's checker scores it (1.0 if right) and the episode ends.

Printed per episode: the question, each tool call from ``info["tool_calls"]`` (status, code, time), what the tool
answered, the final reply and reward; then the mean reward and the tool-call statuses over all episodes. On the
generated problems the policy is always right; on GSM8K the last annotation is not always the final answer (about
one problem in twelve), which the rewards show.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from _common import parse_flags  # examples/_common.py


@dataclass
class Args:
    data_files: str | None = None
    """a GSM8K .jsonl (question + worked answer per line); default: addition problems generated offline"""
    episodes: int = 8
    """episodes to run"""
    max_operand: int = 999
    """generated problems: operands are in [0, max_operand]"""
    bug_rate: float = 0.25
    """probability that the first code block has a bug (the policy then fixes it from the traceback)"""
    max_turns: int = 4
    """assistant turns per episode; on the last one code is not run and the reply is scored"""
    show: int = 4
    """episodes printed in full"""
    seed: int = 0
    """seeds the env's task order and the bugs"""


QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")
ANNOTATION = re.compile(r"<<([^=<>]+)=[^<>]*>>")  # GSM8K's calculator annotations: <<expression=result>>


def solution_code(task) -> list[str] | None:
    """Python lines that compute the task's answer into ``answer`` (None: the policy does not know how)."""
    question = QUESTION.search(task.data["question"])
    if question:
        return [f"a, b = {question[1]}, {question[2]}", "answer = a + b"]
    steps = ANNOTATION.findall(task.data.get("answer", ""))
    if not steps:
        return None
    lines = [f"step_{k} = {expression.strip()}" for k, expression in enumerate(steps, 1)]
    return [*lines, f"answer = step_{len(steps)}"]


class ScriptedCoder:
    """Replies from the conversation so far: code, a fix after a traceback, or the final answer."""

    SHOW = "print(int(answer) if float(answer).is_integer() else answer)"

    def __init__(self, bug_rate: float, rng: np.random.Generator):
        self.bug_rate = bug_rate
        self.rng = rng

    def act(self, messages, task) -> str:
        last = messages[-1]
        if last.role == "user":  # first turn: write the program
            lines = solution_code(task)
            if lines is None:
                return "I could not work this one out.\n#### 0"
            show = self.SHOW.replace("answer)", "answr)") if self.rng.random() < self.bug_rate else self.SHOW
            return "Let me compute it.\n```python\n" + "\n".join([*lines, show]) + "\n```"
        if "Traceback" in last.content:  # the tool's answer was an error: fix the last line, keep the variables
            return f"I misspelt a name; `answer` is still defined.\n```python\n{self.SHOW}\n```"
        value = last.content.strip().splitlines()[-1]
        return f"The code printed {value}.\n#### {value}"


def main() -> dict:
    args = parse_flags(Args, __doc__)
    import gymnasium as gym

    import gym_llm  # noqa: F401  (registers the env ids)

    if args.data_files is not None and not Path(args.data_files).is_file():
        raise SystemExit(f"--data-files {args.data_files}: no such file (GSM8K's test.jsonl or train.jsonl).")
    source = {"data_files": args.data_files} if args.data_files else \
        {"source": "arithmetic", "max_operand": args.max_operand}
    env = gym.make("LLMPythonTool-v0", max_turns=args.max_turns, **source)
    policy = ScriptedCoder(args.bug_rate, np.random.default_rng(args.seed))
    rewards, statuses = [], []
    for index in range(args.episodes):
        env.reset(seed=args.seed if index == 0 else None)  # seeded once: the task stream continues
        episode = env.unwrapped.episode  # holds the task and the conversation (messages)
        show = index < args.show
        if show:
            print(f"episode {index} (task {episode.task.task_id}): {episode.task.data['question'][:100]!r}")
        done = False
        while not done:
            reply = policy.act(episode.messages, episode.task)
            _, reward, terminated, truncated, info = env.step(reply)
            done = terminated or truncated
            calls = json.loads(info["tool_calls"])
            statuses += [call["status"] for call in calls]
            if show:
                for call in calls:
                    code = call["code"].strip().replace("\n", "; ")
                    print(f"  tool call: {call['status']:5s} {call['duration_s'] * 1e3:5.1f} ms  {code}")
                    print(f"  tool said: {episode.messages[-1].content.strip().splitlines()[-1]!r}")
                if done:
                    print(f"  final reply {reply.splitlines()[-1]!r} -> reward {reward:.1f} "
                          f"(answer {info['reference_answer']}, {'correct' if info['correct'] else 'wrong'})")
        rewards.append(reward)
    counts = {status: statuses.count(status) for status in sorted(set(statuses))}
    print(f"{len(rewards)} episodes: mean reward {np.mean(rewards):.3f}; {len(statuses)} tool calls {counts}")
    env.close()
    return {"rewards": rewards, "statuses": counts}


if __name__ == "__main__":
    main()
