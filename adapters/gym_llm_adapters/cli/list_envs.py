"""``gym-llm list``: the registered envs — gym-llm's own, then those of other packages (their ``gym_llm.envs`` entry
points) with the package's name — with what they do, their spaces and reward ranges."""

from __future__ import annotations

import argparse
import json
import textwrap

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("list", help="list the registered envs",
                                   description="The registered gym_llm envs: description, spaces, rewards.")
    parser.add_argument("--json", action="store_true", help="print JSON (one object per env) instead of text")
    parser.add_argument("--markdown", action="store_true",
                        help="print the README's env table (Markdown), generated from the registry")
    parser.set_defaults(func=run)


def _variants(env) -> list[str] | None:
    """What the env can be pointed at (e.g. reasoning-gym's datasets), or None when it has no list or the optional
    package that provides it is not installed."""
    if not env.variants:
        return None
    import importlib

    module, name = env.variants.split(":")
    try:
        return list(getattr(importlib.import_module(module), name)())
    except ImportError:
        return None


def run(args: argparse.Namespace) -> int:
    from gym_llm.registration import registered_envs

    if args.markdown:
        from gym_llm.registration import markdown_table

        print(markdown_table())
        return 0
    envs = registered_envs()
    if args.json:
        print(json.dumps([{"id": e.id, "description": e.description, "action": e.action,
                           "observation": e.observation, "reward": e.reward_range,
                           "vector_entry_point": e.vector_entry_point, "commands": list(e.commands),
                           "package": e.package, **({"variants": _variants(e)} if e.variants else {})}
                          for e in envs], indent=1))
        return 0
    for env in envs:
        print(env.id if env.package == "gym-llm" else f"{env.id}  (from {env.package})")
        for label, text in (("", env.description), ("action: ", env.action), ("observation: ", env.observation),
                            ("reward: ", env.reward_range), ("commands: ", "gym-llm " + ", ".join(env.commands))):
            print(textwrap.fill(label + text, width=100, initial_indent="  ", subsequent_indent="    "))
        if env.variants:
            names = _variants(env)
            text = (f"{len(names)} datasets: " + ", ".join(names)) if names is not None else \
                "(install its optional package to list what it offers)"
            print(textwrap.fill(text, width=100, initial_indent="  ", subsequent_indent="    "))
    others = sorted({env.package for env in envs} - {"gym-llm"})
    own = sum(env.package == "gym-llm" for env in envs)
    origin = f" ({own} from gym-llm, {len(envs) - own} from {', '.join(others)})" if others else ""
    print(f"\n{len(envs)} envs{origin}"
          "; each also has a native vector env: gym.make_vec(id, num_envs=N, group_size=G). "
          "Try one: gym-llm play LLMGSM8K-v0 --source arithmetic")
    return 0
