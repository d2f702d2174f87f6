"""The allow-list of what a file may set (gym_llm_adapters/trust.py): complete for every registered env, and applied to
``gym-llm train --config``.

Completeness is what keeps an allow-list honest: every constructor argument of every registered env — found from the
signatures, following each ``**kwargs`` to the functions and dataclasses it is passed on to — and every Python-sandbox
and browser setting must have a rule, and every rule must name an argument that exists. A new argument fails here
until someone decides whether a file may set it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import pytest
from gymnasium.envs.registration import load_env_creator

import gym_llm
from gym_llm.core.env import VECTOR_ARGUMENTS
from gym_llm_adapters.cli import main
from gym_llm_adapters.trust import (ENV_ARGUMENTS, Refusal, UntrustedFileError, check_env_arguments,
                                    check_vllm_arguments, refuse)

REGISTERED = [info.id for info in (*gym_llm.ENVS, *gym_llm.registration.CHECKOUT_ENVS)] + \
    list(gym_llm.registration.CLIENT_ENVS)


# ---------------------------------------------------------------------------------- every argument, found
def keyword_parameters(target: Any, *, own: bool = True) -> set[str]:
    """Every keyword argument ``target`` (a function, a class, a dataclass, an env class) accepts, following its
    ``**kwargs`` into the calls that pass them on (``own=False``: a function reached that way, whose positional
    parameters without a default are the caller's, not the user's)."""
    if isinstance(target, type):
        if dataclasses.is_dataclass(target):
            return {f.name for f in dataclasses.fields(target) if f.init}
        init = inspect.unwrap(target.__init__)
        if "build" in vars(target) and "_scalar_init" in init.__qualname__:  # declared with build=: LLMEnv's init
            return {"render_mode"} | keyword_parameters(target.build)
        target = init
    function = inspect.unwrap(target)
    names, var_keyword = set(), None
    for p in inspect.signature(function).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            var_keyword = p.name
        elif p.name != "self" and (p.kind is p.KEYWORD_ONLY or (
                p.kind is p.POSITIONAL_OR_KEYWORD and (own or p.default is not p.empty))):
            names.add(p.name)
    return names | (forwarded(function, var_keyword) if var_keyword else set())


def forwarded(function: Callable[..., Any], name: str) -> set[str]:
    """The keyword arguments a ``**name`` dict of ``function`` reaches: ``f(**name)`` passes on all of ``f``'s, and
    ``f(other=name)`` whatever ``f`` does with ``other``."""
    scope = {**function.__globals__, **inspect.getclosurevars(function).nonlocals}
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    out: set[str] = set()
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    passing = [(node, k) for node in calls for k in node.keywords if isinstance(k.value, ast.Name) and k.value.id == name]
    assert passing, f"{function.__qualname__} takes **{name} but passes it nowhere this test can follow"
    for node, keyword in passing:
        callee = eval(compile(ast.Expression(node.func), "<callee>", "eval"), scope)  # a name, as the code calls it
        out |= keyword_parameters(callee, own=False) if keyword.arg is None else \
            forwarded(inspect.unwrap(callee), keyword.arg)
    return out


def constructor_arguments(env_id: str) -> set[str]:
    """What a rollout file or a config can set for ``env_id``: its arguments less the vector env's and the layout's."""
    env_class = load_env_creator(gym.spec(env_id).entry_point)
    return keyword_parameters(env_class) - set(VECTOR_ARGUMENTS) - {"render_mode"}


@pytest.mark.parametrize("env_id", REGISTERED)
def test_every_constructor_argument_has_a_rule(env_id):
    assert env_id in gym.registry
    arguments, table = constructor_arguments(env_id), ENV_ARGUMENTS.get(env_id)
    assert table is not None, f"{env_id} has no allow-list in gym_llm_adapters/trust.py (ENV_ARGUMENTS)"
    unclassified, stale = arguments - set(table), set(table) - arguments
    assert not unclassified, (f"{env_id}: decide whether a rollout file or config may set {sorted(unclassified)} "
                              "(gym_llm_adapters/trust.py: data, never(...), one_of(...), at_most(...), settings(...))")
    assert not stale, f"{env_id} has no arguments {sorted(stale)}: remove their rules"


@pytest.mark.parametrize("env_id, argument, tool", [("LLMPythonTool-v0", "sandbox", "gym_llm.tools.python:PythonTool"),
                                                    ("LLMBrowser-v0", "browser", "gym_llm.tools.browser:BrowserTool")])
def test_every_tool_setting_has_a_rule(env_id, argument, tool):
    module, name = tool.split(":")
    settings = keyword_parameters(getattr(__import__(module, fromlist=[name]), name))
    table = ENV_ARGUMENTS[env_id][argument].table
    assert settings - set(table) == set(), f"decide whether a file may set {argument}.{sorted(settings - set(table))}"
    assert set(table) - settings == set(), f"stale rules: {sorted(set(table) - settings)}"


def test_limits_a_file_may_tighten_are_bounded_by_the_current_defaults():
    from gym_llm.envs.mlgym import build_mlgym
    from gym_llm.tools.sandbox.config import SandboxConfig

    sandbox = ENV_ARGUMENTS["LLMPythonTool-v0"]["sandbox"].table
    defaults = {f.name: f.default for f in dataclasses.fields(SandboxConfig)}
    bounded = {name: rule.limit for name, rule in sandbox.items() if hasattr(rule, "limit")}
    assert bounded and all(limit == defaults[name] for name, limit in bounded.items())
    parameters = inspect.signature(build_mlgym).parameters
    for name in ("memory_limit_mb", "workspace_mb"):
        assert ENV_ARGUMENTS["LLMMLGym-v0"][name].limit == parameters[name].default


# ---------------------------------------------------------------------------------- the rules
def refused(env_id: str, **kwargs: Any) -> dict[str, str]:
    return {r.argument: r.reason for r in check_env_arguments(env_id, kwargs)}


def test_plain_data_passes_and_whatever_can_run_code_or_widen_access_is_refused():
    assert refused("LLMGSM8K-v0", data_files={"$path": "t.jsonl"}, max_turns=2, tokenizer={"$tokenizer": {}},
                   tasks={"$tuple": [{"question": "1+1?", "answer": "2"}]},
                   template_kwargs={"enable_thinking": False}) == {}
    got = refused("LLMGSM8K-v0", reward_fn={"$callable": "m:f"}, template_kwargs={"x": [{"$callable": "os:system"}]},
                  tokenizer={"$callable": "m:Tok"}, tools=[{"name": "mcp"}], nonsense=1)
    assert set(got) == {"reward_fn", "template_kwargs", "tokenizer", "tools", "nonsense"}
    assert "os:system" in got["template_kwargs"] and "not an argument of LLMGSM8K-v0" in got["nonsense"]
    assert refused("LLMGSM8K-v0", reward_fn=None, tools={"$tuple": []}) == {}  # the defaults
    sandbox = {"isolation": "bwrap", "memory_limit_mb": 256, "cgroups": "required", "allow_subprocess": False,
               "timeout_s": 30, "preload": {"$tuple": ["numpy"]}, "min_idle": 0}
    assert refused("LLMPythonTool-v0", sandbox=sandbox) == {}  # as confined as the default, or more
    got = refused("LLMPythonTool-v0", sandbox={"isolation": "none", "allow_subprocess": True, "cgroups": "off",
                                               "memory_limit_mb": 4096, "cpu_limit_s": True, "bwrap_path": "/x",
                                               "extra_ro_paths": ["/root"], "new_setting": 1})
    assert set(got) == {f"sandbox.{k}" for k in ("isolation", "allow_subprocess", "cgroups", "memory_limit_mb",
                                                 "cpu_limit_s", "bwrap_path", "extra_ro_paths", "new_setting")}
    assert "plain host process" in got["sandbox.isolation"] and "at most 1024" in got["sandbox.memory_limit_mb"]
    assert set(refused("LLMPythonTool-v0", sandbox={"$callable": "m:f"})) == {"sandbox"}
    assert set(refused("LLMBrowser-v0", site_dir="/home", browser={"allowed_hosts": ["evil.test"], "timeout_s": 5,
                                                                   "extra_args": ["--renderer-cmd-prefix=sh"]})) == \
        {"site_dir", "browser.allowed_hosts", "browser.extra_args"}
    assert set(refused("LLMMLGym-v0", task_config_path="tasks/x.yaml", dataset_paths={"d": "/data"},
                       memory_limit_mb=1024, workspace_mb=4096)) == {"task_config_path", "dataset_paths",
                                                                     "workspace_mb"}
    assert set(refused("OpenEnv-v0", base_url="http://10.0.0.1:80", connect_timeout_s=1)) == {"base_url"}
    assert refused("SomeoneElses-v0", x=1) == {"x": "SomeoneElses-v0 has no allow-list of arguments a file may set"}


def test_a_refusal_names_each_argument_its_value_and_the_opt_in():
    refuse([], source="x", opt_in="y")  # nothing to refuse: no error
    with pytest.raises(UntrustedFileError) as error:
        refuse(check_env_arguments("LLMChat-v0", {"user_simulator": {"$callable": "sim:User"}, "max_turns": 3}),
               source="rollout file r.jsonl", opt_in="pass --trust-file")
    assert error.value.refusals == (Refusal("user_simulator", {"$callable": "sim:User"},
                                            "names code to import and run: a user simulator the env would call"),)
    assert str(error.value).splitlines() == [
        "rollout file r.jsonl sets what a file may not set on its own (it would run code or weaken isolation on this "
        "host):",
        '  user_simulator = {"$callable": "sim:User"}: names code to import and run: a user simulator the env would '
        "call",
        "Fix: pass --trust-file"]


def test_vllm_arguments_from_a_file_are_sizes_and_switches_only():
    assert check_vllm_arguments({"gpu_memory_utilization": 0.5, "enforce_eager": True, "max_model_len": 512}) == []
    got = {r.argument for r in check_vllm_arguments({"trust_remote_code": True, "worker_extension_cls": "m.C",
                                                     "compilation_config": {"level": 3}, "seed": [1]})}
    assert got == {"trust_remote_code", "worker_extension_cls", "compilation_config", "seed"}


# ---------------------------------------------------------------------------------- gym-llm train --config
def train(config: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "grpo", "--config", str(config), "--out", str(out), *extra]


def test_a_config_cannot_switch_a_sandbox_off_or_trust_remote_code(tmp_path, capsys):
    out = tmp_path / "not-a-folder"
    out.write_text("")  # the check after the config's: reaching it means the config was let through
    config = tmp_path / "crafted.toml"
    config.write_text('env = "LLMPythonTool-v0"\nsource = "arithmetic"\n'
                      '[env_args]\nsandbox = {isolation = "none"}\nmax_turns = 2\n'
                      '[eval_env_args]\nreward_fn = "anything"\n'
                      '[vllm_args]\ntrust_remote_code = true\ngpu_memory_utilization = 0.5\n')
    assert main(train(config, out)) == 2
    err = capsys.readouterr().err
    assert f"gym-llm train: error: --config {config} sets what a file may not set on its own" in err
    for line in ("[env_args] sandbox.isolation = 'none'", "[eval_env_args] reward_fn = 'anything'",
                 "[vllm_args] trust_remote_code = true"):
        assert line in err
    assert "max_turns" not in err and "gpu_memory_utilization" not in err and "--trust-file" in err

    # values given on the command line are the user's own; --trust-file takes the file's as they are
    mine = ["--env-arg", 'sandbox={"min_idle": 0}', "--eval-env-arg", "reward_fn=null", "--vllm-arg",
            "trust_remote_code=false"]
    for extra in (mine, ["--trust-file"]):
        assert main(train(config, out, *extra)) == 2
        err = capsys.readouterr().err
        assert "sets what a file may not set" not in err and "is a file" in err, err


def test_a_config_cannot_say_it_is_trusted(tmp_path, capsys):
    config = tmp_path / "crafted.toml"
    config.write_text('env = "LLMGSM8K-v0"\ntrust_file = true\n')
    assert main(train(config, tmp_path / "run")) == 2
    assert "trust_file cannot be set in a config" in capsys.readouterr().err
