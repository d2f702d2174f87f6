"""``gym-llm play ENV``: you are the policy. Useful to see what an env shows, accepts and rewards.

The env runs in text mode. Each turn shows what the env added to the conversation (the task, user
follow-ups, tool results), then reads your reply: type lines and end with a line holding only ``.``
(or press Ctrl-D). The step's reward, termination and info follow. Token-level envs (``LLMHashing-v0``)
take one token id per line instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from gym_llm_adapters.cli._common import add_env_options, env_kwargs_from, positive_int

__all__ = ["register", "run"]

_END = "."


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("play", help="play an env yourself (you type the actions)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_env_options(parser)
    parser.add_argument("--episodes", type=positive_int, default=1, help="episodes to play (default: 1)")
    parser.add_argument("--seed", type=int, default=0, help="the env seed (which tasks come up; default: 0)")
    parser.add_argument("--raw", action="store_true",
                        help="show the raw observation (the rendered prompt, special tokens included) instead "
                             "of the new messages")
    parser.set_defaults(func=run)


def _read_action(stream: TextIO, out: TextIO, discrete: bool) -> str | None:
    if discrete:
        out.write("token id> ")
        out.flush()
        line = stream.readline()
        return None if not line else line.strip()
    out.write(f"your reply (end with a line holding only '{_END}', or Ctrl-D):\n")
    out.flush()
    lines = []
    while True:
        line = stream.readline()
        if not line:  # EOF
            return "\n".join(lines) if lines else None
        if line.rstrip("\n") == _END:
            return "\n".join(lines)
        lines.append(line.rstrip("\n"))


def _show(env: Any, obs: Any, shown: int, raw: bool, out: TextIO) -> int:
    """Print what is new since ``shown`` messages; returns the new count."""
    messages = getattr(getattr(env.unwrapped, "episode", None), "messages", None)
    if raw or messages is None:
        text = obs.get("text", obs) if isinstance(obs, dict) else obs
        out.write(f"--- observation ---\n{text}\n")
        return shown
    for message in messages[shown:]:
        if message.role == "assistant":
            continue  # the player's own reply
        out.write(f"--- {message.role} ---\n{message.content}\n")
    return len(messages)


def _info_line(info: dict[str, Any]) -> str:
    shown = {k: v for k, v in info.items() if not k.startswith("_") and k not in ("policy_mask", "tool_calls")}
    return json.dumps(shown, default=str, ensure_ascii=False)


def play(env: Any, *, episodes: int, seed: int, raw: bool, stream: TextIO, out: TextIO) -> list[float]:
    """Play ``episodes`` episodes reading actions from ``stream``; returns each episode's return."""
    from gymnasium.spaces import Discrete

    discrete = isinstance(env.action_space, Discrete)
    returns = []
    for episode in range(episodes):
        obs, info = env.reset(seed=seed if episode == 0 else None)
        out.write(f"=== episode {episode + 1}/{episodes}: task {info.get('task_id')} ===\n")
        shown, total, done = _show(env, obs, 0, raw, out), 0.0, False
        while not done:
            action = _read_action(stream, out, discrete)
            if action is None:
                out.write("(end of input)\n")
                returns.append(total)
                return returns
            try:
                obs, reward, terminated, truncated, info = env.step(int(action) if discrete else action)
            except (TypeError, ValueError) as e:  # the env refused the action and is unchanged: try again
                out.write(f"rejected: {e}\n")
                continue
            total += float(reward)
            done = terminated or truncated
            if "tool_calls" in info:
                for call in json.loads(info["tool_calls"]):
                    out.write(f"[tool {call.get('name')}: {call.get('status')}, {call.get('duration_s', 0):.2f} s]\n")
            if not done:
                shown = _show(env, obs, shown, raw, out)
            out.write(f"reward {reward:g}  terminated {terminated}  truncated {truncated}\ninfo {_info_line(info)}\n")
        out.write(f"=== return {total:g} ===\n")
        returns.append(total)
    return returns


def run(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import gym_llm  # noqa: F401  (registers the ids)
    from gym_llm.core.extras import MissingExtraError
    from gym_llm_adapters.cli._common import check_env, check_paths
    from gym_llm_adapters.cli.errors import UsageError

    check_env(args.env, "play")
    kwargs = env_kwargs_from(args)
    check_paths(kwargs)
    try:
        env = gym.make(args.env, **kwargs)
    except MissingExtraError as e:
        raise UsageError(str(e)) from e
    except (TypeError, ValueError, KeyError, OSError, ImportError, RuntimeError) as e:
        raise UsageError(f"{args.env} cannot be made with these env arguments ({type(e).__name__}: {e}); see "
                         "`gym-llm list` and the env's docs for its arguments") from e
    try:
        returns = play(env, episodes=args.episodes, seed=args.seed, raw=args.raw, stream=sys.stdin, out=sys.stdout)
    finally:
        env.close()
    if returns:
        print(f"mean return {sum(returns) / len(returns):g} over {len(returns)} episode(s)")
    return 0
