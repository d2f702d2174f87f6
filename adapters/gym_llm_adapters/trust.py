"""What a file may set on its own: the allow-list that keeps a rollout file or a config from running code on this host.

``gym-llm replay`` makes envs again from the constructor arguments a rollout file recorded, and ``gym-llm train
--config`` passes a TOML file's ``[env_args]``, ``[eval_env_args]`` and ``[vllm_args]`` on. Both are files someone
may send you. Before anything is imported or made, every argument a file sets is checked against this module's
allow-list:

* **Allowed**: plain data that is not security-relevant (prompts, data files, seeds, turn and length limits, reward
  weights, a tokenizer folder, which is loaded without remote code), and values that keep an env at least as confined
  as its default does (the Python sandbox's ``isolation="bwrap"``, a memory or CPU limit no larger than the default,
  ``cgroups="auto"``/``"required"``).
* **Refused**, naming the argument, the value and the opt-in: code to import (``{"$callable": "module:name"}`` anywhere,
  ``reward_fn``, ``user_simulator``), objects that run programs (``tools``, ``python_tool``), settings that weaken a
  sandbox (``isolation="none"``, ``allow_subprocess``, ``extra_ro_paths``, ``bwrap_path``, ``cgroups="off"``, looser
  limits), more network reach (the browser's ``allowed_hosts`` and ``extra_args``, OpenEnv's ``base_url``), host folders
  served or bound (``site_dir``, MLGym's ``dataset_paths``), task checkouts whose own code runs (MLGym's
  ``task_config_path``), vLLM arguments outside a short list of sizes and switches (``trust_remote_code`` above all).
* **Unknown** arguments — a new constructor argument, a setting this table has not classified, an env registered
  elsewhere — are refused too: it is an allow-list. ``tests/adapters/test_trust.py`` enumerates every constructor
  argument of every registered env (and every Python-sandbox and browser setting) and fails on one without a rule, so
  adding an argument forces the decision here.

The opt-in belongs to the user: ``replay(path, trust_file=True)`` / ``gym-llm replay --trust-file``, ``gym-llm train
--trust-file`` for a config. Values the user gives at the same time (``env_kwargs=``, ``--env-arg``, ``--vllm-arg``)
are the user's own and are not checked. Values are checked as the file holds them (the JSON tags of
:mod:`gym_llm_adapters.env_spec` included), so nothing is imported to check it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable, Mapping

__all__ = ["ENV_ARGUMENTS", "Refusal", "UntrustedFileError", "VLLM_ARGUMENTS", "check_env_arguments",
           "check_vllm_arguments", "refuse"]


@dataclass(frozen=True)
class Refusal:
    """One value a file may not set without the user's opt-in.

    Attributes:
        argument: the argument's name, dotted for a setting inside one (``"sandbox.isolation"``).
        value: the value as the file holds it.
        reason: what the value would do (``"runs the model's code as a plain host process"``).
    """

    argument: str
    value: Any
    reason: str

    def __str__(self) -> str:
        return f"{self.argument} = {_show(self.value)}: {self.reason}"


class UntrustedFileError(ValueError):
    """A file sets what only the user may set (the message names each argument, its value and the opt-in)."""

    def __init__(self, message: str, refusals: tuple[Refusal, ...]):
        super().__init__(message)
        self.refusals = refusals


def refuse(refusals: Iterable[Refusal], *, source: str, opt_in: str) -> None:
    """Raise :class:`UntrustedFileError` for ``refusals`` (nothing when there are none).

    Args:
        source: what set them (``"rollout file runs/x.jsonl, env spec 1a2b... (LLMPythonTool-v0)"``).
        opt_in: how the user says the file is trusted, or gives the values themself (the fix).
    """
    refusals = tuple(refusals)
    if not refusals:
        return
    lines = "\n".join(f"  {r}" for r in refusals)
    raise UntrustedFileError(f"{source} sets what a file may not set on its own (it would run code or weaken "
                             f"isolation on this host):\n{lines}\nFix: {opt_in}", refusals)


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    text = repr(value) if isinstance(value, str) else text
    return text if len(text) <= 200 else text[:200] + "..."


# ------------------------------------------------------------------------------------------------ value forms
def _plain(value: Any) -> Any:
    """``value`` without the env-spec tags for a tuple and a path (a list, a string), to compare with defaults."""
    if isinstance(value, dict):
        if len(value) == 1 and next(iter(value)) in ("$tuple", "$path"):
            return _plain(next(iter(value.values())))
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _callables(value: Any) -> list[str]:
    """Every ``{"$callable": name}`` inside ``value``."""
    if isinstance(value, dict):
        if len(value) == 1 and "$callable" in value:
            return [str(value["$callable"])]
        return [name for v in value.values() for name in _callables(v)]
    if isinstance(value, (list, tuple)):
        return [name for v in value for name in _callables(v)]
    return []


# ------------------------------------------------------------------------------------------------ rules
Rule = Callable[[str, Any], list[Refusal]]
"""``rule(argument, value)``: the refusals of one argument's value (``[]``: the file may set it)."""

_CODE = "names code to import and run"


def data(argument: str, value: Any) -> list[Refusal]:
    """Plain data that is not security-relevant: any value, except one that names code (``$callable``)."""
    return [Refusal(argument, value, f"{_CODE} ({name})") for name in _callables(value)]


def tokenizer(argument: str, value: Any) -> list[Refusal]:
    """A recorded tokenizer (``{"$tokenizer": {...}}``, loaded from its folder without remote code) or None."""
    if value is None or (isinstance(value, dict) and set(value) == {"$tokenizer"}):
        return []
    return [Refusal(argument, value, "a tokenizer is a recorded {\"$tokenizer\": ...} folder, or None")]


def never(reason: str) -> Rule:
    """Only the default (None or empty) may come from a file; any other value ``reason``."""
    def rule(argument: str, value: Any) -> list[Refusal]:
        return [] if _plain(value) in (None, [], {}) else [Refusal(argument, value, reason)]
    return rule


def one_of(allowed: tuple[Any, ...], reason: str) -> Rule:
    """Only values in ``allowed`` (the default and stricter ones); another ``reason``."""
    def rule(argument: str, value: Any) -> list[Refusal]:
        if any(type(value) is type(a) and value == a for a in allowed):
            return []
        return [Refusal(argument, value, f"{reason} (a file may set {' or '.join(map(_show, allowed))})")]
    return rule


def at_most(limit: float, reason: str) -> Rule:
    """A number no larger than ``limit`` (the default: a file may tighten the limit, not loosen it)."""
    def rule(argument: str, value: Any) -> list[Refusal]:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= limit:
            return []
        return [Refusal(argument, value, f"{reason} (a file may set at most {limit:g}, the default)")]
    rule.limit = limit  # type: ignore[attr-defined]  (tests/adapters/test_trust.py checks it against the default)
    return rule


def settings(table: Mapping[str, Rule], what: str) -> Rule:
    """A mapping of settings (``sandbox={...}``), each checked by its rule in ``table``; None is the default."""
    def rule(argument: str, value: Any) -> list[Refusal]:
        if value is None:
            return []
        if not isinstance(value, dict) or "$callable" in value:
            return [Refusal(argument, value, f"{what} are a table of settings")] + data(argument, value)
        out: list[Refusal] = []
        for key, setting in value.items():
            check = table.get(key)
            if check is None:
                out.append(Refusal(f"{argument}.{key}", setting, f"not a {what} setting a file may set (the "
                                                                 "allow-list in gym_llm_adapters/trust.py)"))
            else:
                out += check(f"{argument}.{key}", setting)
        return out
    rule.table = table  # type: ignore[attr-defined]
    return rule


# ------------------------------------------------------------------------------------------------ the tables
_REWARD_FN = never(f"{_CODE}: a reward function the env would call")
_TOOLS = never("tools are objects that run programs (an MCP server's command, a browser) and reach the network")

CHAT_CONFIG: dict[str, Rule] = {
    "mode": data, "tokenizer": tokenizer, "vocab_size": data,
    "chat_template": data,  # rendered in jinja2's sandboxed environment (gym_llm.core.templates)
    "template_kwargs": data, "system_prompt": data, "max_turns": data, "max_action_chars": data,
    "max_observation_chars": data, "max_action_tokens": data, "max_seq_len": data, "record_messages": data,
}
""":class:`gym_llm.core.chat.ChatConfig`'s fields, which every chat-style env takes."""

SCORED: dict[str, Rule] = {
    "format_reward": data, "reward_fn": _REWARD_FN, "reward_timeout_s": data, "task_order": data, "tools": _TOOLS,
    "max_tool_calls_per_turn": data, **CHAT_CONFIG,
}
""":func:`gym_llm.envs.scored.scored_reply_parts`'s arguments (the scored-reply envs)."""

GSM8K: dict[str, Rule] = {
    # source="hub" downloads a dataset (data: the `datasets` library runs no loading scripts)
    **dict.fromkeys(("data_files", "tasks", "source", "dataset_name", "dataset_config", "split", "num_generated",
                     "generator_seed", "max_operand", "operand_pairs", "prompt_template"), data),
    **SCORED,
}


def _sandbox_settings() -> dict[str, Rule]:
    """``LLMPythonTool-v0``'s ``sandbox={...}``: :class:`~gym_llm.tools.python.PythonTool`'s own arguments and every
    :class:`~gym_llm.tools.sandbox.config.SandboxConfig` field; a limit may be tightened, never loosened."""
    from gym_llm.tools.sandbox.config import SandboxConfig

    default = {f.name: f.default for f in fields(SandboxConfig)}

    def limit(name: str) -> Rule:
        return at_most(default[name], f"a looser {name} than the sandbox's default")

    return {
        "name": data, "code_blocks": data, "description": data, "min_idle": data,
        "bwrap_path": never("a program the tool runs as its sandbox"),
        "config": never("a SandboxConfig object; give its settings one by one"),
        "isolation": one_of(("bwrap",), "'none' runs the model's code as a plain host process, outside the sandbox"),
        "allow_subprocess": one_of((False,), "lets the model's code start processes"),
        "cgroups": one_of(("auto", "required"), "'off' drops the sandbox's memory and pids cgroup"),
        "extra_ro_paths": never("binds host paths into the sandbox, where the model's code reads them"),
        "family_memory_mb": never("sets the memory a REPL's copies may take together (only its default, derived "
                                  "from the limits above, may come from a file)"),
        **{name: limit(name) for name in ("memory_limit_mb", "cpu_limit_s", "file_size_limit_mb", "max_open_files",
                                          "max_threads", "scratch_size_mb", "max_files")},
        # wall-clock waits and output sizes confine nothing; preloads import inside the sandbox; symlinks live in the
        # sandbox's own mount namespace (they reach nothing it does not mount); site_packages is on by default
        **dict.fromkeys(("timeout_s", "startup_timeout_s", "max_output_chars", "max_error_chars",
                         "max_episodes_per_sandbox", "fork", "preload", "symlinks", "site_packages"), data),
    }


def _code_sandbox_settings() -> dict[str, Rule]:
    """``LLMCode-v0``'s ``sandbox={...}``: the program's sandbox, the Python sandbox's rules for its
    :class:`~gym_llm.tools.sandbox.config.SandboxConfig` fields (less the binds, links and subprocesses, which that
    env refuses from anyone)."""
    from gym_llm.tools.sandbox.config import SandboxConfig

    names = {f.name for f in fields(SandboxConfig)} - {"extra_ro_paths", "symlinks", "allow_subprocess"}
    return {name: rule for name, rule in _sandbox_settings().items() if name in names}


BROWSER_SETTINGS: dict[str, Rule] = {
    "name_prefix": data, "timeout_s": data, "max_output_chars": data, "max_links": data, "page_view": data,
    "javascript": data, "blocked_resource_types": data, "viewport": data, "locale": data,
    "chromium_sandbox": data,  # off by default: either value is at least as confined
    "config": never("a BrowserConfig object; give its settings one by one"),
    "allowed_hosts": never("lets the browser reach more hosts of the network"),
    "host_map": never("points the browser's hosts at other addresses"),
    "executable_path": never("a program the browser tool runs as Chromium"),
    "extra_args": never("Chromium flags can run programs (--renderer-cmd-prefix) or open the network"),
}
"""``LLMBrowser-v0``'s ``browser={...}``: :class:`~gym_llm.tools.browser.BrowserTool`'s arguments and every
:class:`~gym_llm.tools.browser.config.BrowserConfig` field."""

_MLGYM_CHECKOUT = never("names an MLGym task or checkout whose own code (its evaluation, its baseline) runs")
_TOKENS_COMMON: dict[str, Rule] = {
    "prompts": data, "split": data, "task_order": data, "tokenizer": tokenizer, "vocab_size": data,
    "max_seq_len": data, "eos_token_ids": data, "apply_chat_template": data, "reward_fn": _REWARD_FN,
    "reward_timeout_s": data,
}


def _env_arguments() -> dict[str, dict[str, Rule]]:
    return {
        "LLMChat-v0": {"prompts": data, "split": data, "follow_ups": data, "max_turns": data,
                       "user_simulator": never(f"{_CODE}: a user simulator the env would call"),
                       **{k: v for k, v in SCORED.items() if k != "format_reward"}},
        "LLMGSM8K-v0": GSM8K,
        "LLMIFEval-v0": {**dict.fromkeys(("data_files", "tasks", "source", "dataset_name", "split", "reward_mode",
                                          "loose", "strip_thinking", "scoring_workers", "quality_guard",
                                          "task_order", "max_tool_calls_per_turn"), data),
                         "tools": _TOOLS, **CHAT_CONFIG},
        "LLMCountdown-v0": {**dict.fromkeys(("use_all_numbers", "data_files", "tasks", "source", "dataset_name",
                                             "split", "num_generated", "generator_seed", "num_numbers", "max_number",
                                             "max_target", "prompt_template"), data), **SCORED},
        "LLMReasoningGym-v0": {**dict.fromkeys(("dataset", "config", "size", "seed", "score_timeout_s"), data),
                               **SCORED},
        "LLMPythonTool-v0": {**GSM8K, "python_tool": never("a tool object that runs code"),
                             "sandbox": settings(_sandbox_settings(), "Python sandbox")},
        # the tests and reference solutions a file names run in the grader's sandbox, never on this host
        "LLMCode-v0": {**dict.fromkeys(("source", "data_files", "tasks", "split", "size", "seed", "reward",
                                        "max_attempts", "program", "timeout_s", "max_output_chars", "task_order"), data),
                       "sandbox": settings(_code_sandbox_settings(), "code sandbox"), **CHAT_CONFIG},
        "LLMBrowser-v0": {**dict.fromkeys(("tasks", "site_host", "prompt_template", "format_reward", "task_order",
                                           "max_tool_calls_per_turn"), data),
                          "site_dir": never("serves a host folder to the browser"),
                          "browser": settings(BROWSER_SETTINGS, "browser"), "tools": _TOOLS, **CHAT_CONFIG},
        "LLMHashing-v0": {**_TOKENS_COMMON, **dict.fromkeys(("max_new_tokens", "text_output", "max_text_chars",
                                                             "hash_seed"), data)},
        "LLMTokens-v0": {**_TOKENS_COMMON, **dict.fromkeys(("mode", "max_action_tokens", "max_chars", "max_steps",
                                                            "stop_strings"), data)},
        "LLMMLGym-v0": {"task_config_path": _MLGYM_CHECKOUT, "mlgym_root": _MLGYM_CHECKOUT,
                        "dataset_paths": never("binds host folders into the agent's workspace"),
                        **dict.fromkeys(("submission_files", "metric", "higher_is_better", "hidden_files", "reward",
                                         "threshold", "failure_reward", "max_turns", "command_timeout_s",
                                         "eval_timeout_s", "episode_timeout_s", "max_output_chars", "eval_seed",
                                         "task_order"), data),
                        "memory_limit_mb": at_most(2048, "a looser memory limit than the default"),
                        "workspace_mb": at_most(512, "a larger workspace than the default"),
                        **{k: v for k, v in CHAT_CONFIG.items()}},
        "OpenEnv-v0": {"base_url": never("connects to a server the file names"),
                       **dict.fromkeys(("action_field", "observation_field", "action_defaults", "reset_kwargs",
                                        "max_observation_chars", "max_action_chars", "connect_timeout_s",
                                        "message_timeout_s"), data)},
    }


ENV_ARGUMENTS: dict[str, dict[str, Rule]] = _env_arguments()
"""env id -> constructor argument -> :data:`Rule`: what a file may set for each registered env (module docstring)."""


def check_env_arguments(env_id: str, kwargs: Mapping[str, Any]) -> list[Refusal]:
    """The arguments of ``kwargs`` (as the file holds them) that a file may not set for ``env_id``."""
    table = ENV_ARGUMENTS.get(env_id)
    out: list[Refusal] = []
    for name, value in kwargs.items():
        rule = table.get(name) if table is not None else None
        if rule is None:
            reason = (f"not an argument of {env_id} a file may set (the allow-list in gym_llm_adapters/trust.py)"
                      if table is not None else f"{env_id} has no allow-list of arguments a file may set")
            out.append(Refusal(name, value, reason))
        else:
            out += rule(name, value)
    return out


# ------------------------------------------------------------------------------------------------ vLLM
VLLM_ARGUMENTS = frozenset({
    "gpu_memory_utilization", "max_model_len", "enforce_eager", "kv_cache_memory_bytes", "max_num_seqs",
    "max_num_batched_tokens", "enable_prefix_caching", "enable_chunked_prefill", "block_size", "swap_space",
    "cpu_offload_gb", "seed", "dtype", "kv_cache_dtype", "quantization", "tensor_parallel_size", "max_logprobs",
    "disable_log_stats",
})
"""``vllm.LLM`` arguments a config file may set: sizes and switches, as plain numbers, strings or booleans. The others
(``trust_remote_code``, worker and executor classes, plugins, logits processors, table-valued settings) can import or
run code, and need ``--trust-file``."""


def check_vllm_arguments(kwargs: Mapping[str, Any]) -> list[Refusal]:
    """The ``[vllm_args]`` of a config that a file may not set (:data:`VLLM_ARGUMENTS`)."""
    out = []
    for name, value in kwargs.items():
        if name not in VLLM_ARGUMENTS:
            out.append(Refusal(name, value, "not a vLLM argument a file may set (trust_remote_code, classes, plugins "
                                             "and tables can run code)"))
        elif not isinstance(value, (bool, int, float, str)) and value is not None:
            out.append(Refusal(name, value, "a file sets vLLM arguments as plain numbers, strings or booleans"))
    return out
