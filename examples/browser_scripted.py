"""LLMBrowser-v0 with a scripted policy: real headless Chromium (Playwright), browsing the env's own local website.

    python examples/browser_scripted.py                    # all 12 built-in tasks
    python examples/browser_scripted.py --tasks 4,6,8,11   # the CI smoke run: search form, JS button, login, select

Run from the checkout with gym-llm installed (``bash scripts/setup.sh``), or with ``PYTHONPATH=.``; it needs
Playwright and a Chromium (``pip install 'gym-llm[browser]'`` and ``apt-get install chromium``; ``docs/browser.md``).
No model: the "policy" is a script, so what you see is the env's side.

The env serves *Larkspur Harbor*, an invented town's website (a wiki, a shop whose specifications appear only after a
JavaScript button, a login form, a ferry timetable behind a ``<select>``), on 127.0.0.1 as ``http://larkspur.test/``,
and only that host is reachable. Each episode asks one question about it. The scripted policy knows, per task, which
pages to open and what to click or type (:data:`PLANS` — the route a person would take; the answer itself is not in
the script). Each turn it sends one ``<tool_call>`` (``browser_navigate``, ``browser_click``, ``browser_type``); the
env runs it in the episode's own browser context and adds the page's visible text as a ``tool`` message (reward 0).
When the route is done, the policy reads the answer off the last page with a pattern and replies ``Answer: ...``,
which the env scores (1.0 if it matches an accepted answer) and the episode ends.

Printed per task: each call from ``info["tool_calls"]`` (status, time) with the title of the page it led to, the
final reply and its reward; then the mean reward.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from _common import parse_flags  # examples/_common.py

SITE = "http://larkspur.test"


@dataclass
class Args:
    tasks: str = "all"
    """comma-separated task ids (0-11), or all"""
    max_turns: int = 6
    """assistant turns per episode (the longest route is 3 calls + the answer)"""
    timeout_s: float = 10.0
    """per browser action, everything included"""


# task id -> (the route: (action, arguments) per turn, (pattern that reads the answer off the last page, which match))
PLANS: dict[int, tuple[list[tuple[str, dict]], tuple[str, int]]] = {
    0: ([("navigate", {"url": SITE + "/wiki/"}), ("click", {"text": "Greywater Point Lighthouse"})],
        (r"first lit in (\d{4})", 0)),
    1: ([("navigate", {"url": SITE + "/wiki/greywater-point-lighthouse"}), ("click", {"text": "Tobias Merrow"})],
        (r"born in (\w+)", 0)),
    2: ([("navigate", {"url": SITE + "/wiki/"}), ("click", {"text": "Larkspur Harbor"})], (r"^1950\s+([\d,]+)$", 0)),
    3: ([("navigate", {"url": SITE + "/"}), ("click", {"text": "Town wiki"}), ("click", {"text": "Kelp Festival"})],
        (r"every year on (\d+ September)", 0)),
    4: ([("navigate", {"url": SITE + "/wiki/"}), ("type", {"field": "Search the wiki", "text": "mill", "submit": True}),
         ("click", {"text": "Old Mill on Brindle Creek"})], (r"ground (\w+)", 0)),
    5: ([("navigate", {"url": SITE + "/shop/"}), ("click", {"text": "Next page"}), ("click", {"text": "Brass tide clock"})],
        (r"^Price: (\$[\d.]+)$", 0)),
    6: ([("navigate", {"url": SITE + "/shop/?page=2"}), ("click", {"text": "Storm lantern"}),
         ("click", {"text": "Show specifications"})], (r"^Weight\s+(.+)$", 0)),
    7: ([("navigate", {"url": SITE + "/shop/"}), ("click", {"text": "Next page"}), ("click", {"text": "Next page"})],
        (r"^(.+) - \$[\d.]+$", -1)),  # the last product of the last page
    8: ([("navigate", {"url": SITE + "/account"}), ("type", {"field": "Username", "text": "mira"}),
         ("type", {"field": "Password", "text": "saltwater", "submit": True})], (r"^(HS-\d+)\s", 0)),  # newest first
    9: ([("navigate", {"url": SITE + "/wiki/larkspur-harbor"}), ("click", {"text": "Agnes Thorncliffe"})],
        (r"born in (\w+)", 0)),
    10: ([("navigate", {"url": SITE + "/account"}), ("type", {"field": "Username", "text": "tomas"}),
          ("type", {"field": "Password", "text": "ropewalk", "submit": True})], (r"^HS-\d+\s+(\w+)$", 0)),
    11: ([("navigate", {"url": SITE + "/ferry"}), ("type", {"field": "Destination", "text": "Gannet Rock"}),
          ("click", {"text": "Show departures"})], (r"^(\d\d:\d\d)\s+Gannet Rock$", -1)),  # the day's last departure
}


def tool_call(action: str, arguments: dict) -> str:
    return f'<tool_call>{json.dumps({"name": "browser_" + action, "arguments": arguments})}</tool_call>'


def scripted_reply(task_id: int, messages) -> str:
    """The next call of the task's route, or, when the route is done, the answer read off the last page."""
    route, (pattern, pick) = PLANS[task_id]
    calls_made = sum(m.role == "tool" for m in messages)
    if calls_made < len(route):
        return f"Step {calls_made + 1}.\n" + tool_call(*route[calls_made])
    found = re.findall(pattern, messages[-1].content, flags=re.MULTILINE)  # the last page's visible text
    return f"Answer: {found[pick] if found else 'not found'}"


def page_title(tool_message: str) -> str:
    title = re.search(r"^Title: (.*)$", tool_message, re.MULTILINE)
    return title[1] if title else tool_message.strip().splitlines()[0][:80]  # an error message has no title


def main() -> dict:
    args = parse_flags(Args, __doc__)
    import gymnasium as gym

    import gym_llm  # noqa: F401  (registers the env ids)

    task_ids = list(PLANS) if args.tasks == "all" else [int(t) for t in args.tasks.split(",")]
    env = gym.make("LLMBrowser-v0", browser={"page_view": "text", "timeout_s": args.timeout_s}, max_turns=args.max_turns)
    rewards, calls = [], 0
    for task_id in task_ids:
        env.reset(options={"task_id": task_id})
        episode = env.unwrapped.episode  # the task and the conversation so far
        print(f"task {task_id} ({episode.task.data['skill']}): {episode.task.data['question']}")
        done = False
        while not done:
            reply = scripted_reply(task_id, episode.messages)
            _, reward, terminated, truncated, info = env.step(reply)
            done = terminated or truncated
            for call in json.loads(info["tool_calls"]):
                calls += 1
                print(f"  {call['name']} {call['arguments']}  {call['status']} {call['duration_s']:.2f} s "
                      f"-> {page_title(episode.messages[-1].content)!r}")
        print(f"  reply {reply!r} -> reward {reward:.1f} (accepted: {info['reference_answer']!r})")
        rewards.append(reward)
    env.close()
    print(f"{len(rewards)} tasks: mean reward {sum(rewards) / len(rewards):.3f} over {calls} browser calls")
    return {"rewards": rewards, "calls": calls}


if __name__ == "__main__":
    main()
