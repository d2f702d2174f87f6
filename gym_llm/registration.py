"""Registration of every gym-llm env id with Gymnasium (entry points are strings: importing gym_llm stays cheap), and
of the envs other packages declare in the ``gym_llm.envs`` entry-point group (:func:`load_plugin_envs`)."""

from __future__ import annotations

import dataclasses
import logging
import warnings
from dataclasses import dataclass

import gymnasium as gym

__all__ = ["CLIENT_ENVS", "CHECKOUT_ENVS", "ENVS", "PLUGIN_GROUP", "EnvInfo", "load_plugin_envs", "markdown_table",
           "plugin_envs", "register_env", "register_envs", "registered_envs"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnvInfo:
    """One env id: what Gymnasium registers, what ``gym-llm list`` shows and the README's env table holds
    (``gym-llm list --markdown`` writes that table from these; ``tests/test_readme.py`` checks it)."""

    id: str
    entry_point: str
    """``"module:Class"`` of the scalar env."""
    description: str
    reward_range: str
    """What a step pays, in short (``gym-llm list``)."""
    reward: str = ""
    """The README table's reward column, in full (default: ``reward_range``)."""
    action: str = "reply text (UnicodeText), or sampled token ids in tokens mode"
    observation: str = "the conversation rendered up to the generation prompt (text), or its ids + mask"
    commands: tuple[str, ...] = ("play", "eval", "train")
    """The ``gym-llm`` subcommands that work with this env (the others refuse it up front, saying why)."""
    not_for: str = ""
    """Why the other subcommands do not apply (shown when one is refused)."""
    vector_entry_point: str = ""
    """``"module:Class"`` of the native vector env; by default the one :class:`~gym_llm.core.env.LLMEnv` derives
    for an env declared with ``build=`` (``LLMFooEnv`` -> ``LLMFooVectorEnv`` in the same module)."""
    variants: str = ""
    """Optional ``"module:function"`` returning the names of what the env can be pointed at (e.g. every
    reasoning-gym dataset), listed by ``gym-llm list``; imported only then."""
    package: str = "gym-llm"
    """The distribution that registered the env: ``gym-llm``, or the package whose ``gym_llm.envs`` entry point
    registered it (set by :func:`load_plugin_envs`)."""

    def __post_init__(self) -> None:
        if not self.vector_entry_point:
            from gym_llm.core.env import vector_name

            module, name = self.entry_point.split(":")
            object.__setattr__(self, "vector_entry_point", f"{module}:{vector_name(name)}")


ENVS: tuple[EnvInfo, ...] = (
    EnvInfo("LLMChat-v0", "gym_llm.envs.chat:LLMChatEnv",
            "multi-turn chat; scripted or simulated user; reward hook", "reward_fn (default 0)",
            reward="`reward_fn(task, messages)`, default 0"),
    EnvInfo("LLMGSM8K-v0", "gym_llm.envs.gsm8k:LLMGSM8KEnv",
            "grade-school math (local jsonl, `datasets`, or generated offline)", "{0, 1} (+ format_reward)",
            reward="1.0 if the final answer is right under the one-answer rule ([docs/verifiers.md](docs/verifiers.md): "
            "exactly one final answer — no candidate lists, negations, hedges, operators or multipliers; math-verify "
            "under a hard deadline), else 0.0; + `format_reward` for `#### N`"),
    EnvInfo("LLMIFEval-v0", "gym_llm.envs.ifeval:LLMIFEvalEnv",
            "instruction following (IFEval's 541 prompts), scored exactly like the official evaluation",
            "[0, 1] (fraction or all-or-nothing)",
            reward="fraction of instructions followed (strict; or all-or-nothing, or loose), per-instruction results in "
            "`info`"),
    EnvInfo("LLMCountdown-v0", "gym_llm.envs.countdown:LLMCountdownEnv",
            "Countdown (TinyZero): reach the target with + - * / over the given numbers, each at most once; "
            "generated offline with known solutions, or TinyZero's `nums`/`target` files", "{0, 1} (+ format_reward)",
            reward="1.0 if the expression in `<answer>` is valid and equals the target (exact arithmetic, no `eval`), else "
            "0.0; + `format_reward` for a parseable `<answer>`"),
    EnvInfo("LLMReasoningGym-v0", "gym_llm.envs.reasoning_gym:LLMReasoningGymEnv",
            "any of reasoning-gym's procedural datasets by name (arithmetic, logic, puzzles, ...), difficulty "
            "settings passed through", "[0, 1]: the dataset's score_answer (+ format_reward)",
            reward="the dataset's own `score_answer` on the `<answer>` (0.0–1.0); + `format_reward` for an `<answer>` tag",
            variants="gym_llm.envs.reasoning_gym:dataset_names"),
    EnvInfo("LLMPythonTool-v0", "gym_llm.envs.python_tool:LLMPythonToolEnv",
            "chat with a sandboxed persistent Python interpreter; default task GSM8K solved with code",
            "task reward: {0, 1} on GSM8K (+ format_reward)", reward="the task's reward (GSM8K correctness)",
            observation="the conversation rendered up to the generation prompt (text), or its ids + mask; tool "
                        "results come back as `tool` turns"),
    EnvInfo("LLMCode-v0", "gym_llm.envs.code:LLMCodeEnv",
            "write a program that passes the task's unit tests, run in sandboxes (HumanEval offline, CodeI/O, "
            "generated function tasks, your jsonl)", "{0, 1} (or the fraction of tests passed)",
            reward="1.0 if the reply's program passes every test (the program in one sandbox, the tests in another, "
            "plain data between: [docs/code.md](docs/code.md)), else 0.0; or the fraction passed"),
    EnvInfo("LLMBrowser-v0", "gym_llm.envs.browser:LLMBrowserEnv",
            "answer questions by browsing a local website the env serves on 127.0.0.1 with a real headless Chromium "
            "(Playwright); built-in site: an invented town's wiki, shop, accounts, ferry", "{0, 1} (+ format_reward)",
            reward="1.0 if the `Answer:` line matches an accepted answer, else 0.0 (+ `format_reward`)",
            observation="the conversation rendered up to the generation prompt (text), or its ids + mask; browser "
                        "results come back as `tool` turns"),
    EnvInfo("LLMHashing-v0", "gym_llm.envs.hashing:LLMHashingEnv",
            "token-level env for tree search: one action = one token, 64-bit chain hash per node",
            "reward_fn at episode end (default 0)", reward="`reward_fn` at episode end, default 0",
            action="one token id (`Discrete(V)`)",
            observation="token ids + mask + 64-bit chain `hash` (uint64) (+ incrementally decoded text)",
            commands=("play",),
            not_for="it is a token-level env for tree search (one action = one token id), while `gym-llm eval` and "
                    "`train` sample whole replies; drive it from Python (examples/mcts_hashing.py), or play it "
                    "yourself with `gym-llm play LLMHashing-v0`"),
    EnvInfo("LLMTokens-v0", "gym_llm.envs.tokens:LLMTokensEnv",
            "generic token/text concatenation; eos / stop strings / length end it", "reward_fn (default 0)",
            reward="`reward_fn(task, sequence, done)`, default 0",
            action="token ids (MultiDiscrete + mask), or text", observation="the sequence so far (ids + mask, or text)"),
)


def markdown_table(envs: tuple[EnvInfo, ...] = ENVS) -> str:
    """The README's env table: one row per id; a cell equal to the one above it reads "same"."""
    rows = ["| id | what | action | observation | reward |", "|---|---|---|---|---|"]
    previous: tuple[str, ...] = ()
    for info in envs:
        cells = (info.description, info.action, info.observation, info.reward or info.reward_range)
        shown = ["same" if previous and cell == previous[i] else cell.replace("|", "\\|")
                 for i, cell in enumerate(cells)]
        rows.append(f"| `{info.id}` | " + " | ".join(shown) + " |")
        previous = cells
    return "\n".join(rows)


CLIENT_ENVS: dict[str, str] = {
    "OpenEnv-v0": "gym_llm.integrations.openenv_client:OpenEnvClientEnv",
}
"""Ids of envs that are clients of an env somewhere else (``gym.make("OpenEnv-v0", base_url=...)`` drives an OpenEnv
server: docs/peers.md), id -> entry point. Not in :data:`ENVS`: they need a server, so ``gym-llm list``, the README
table and the every-env tests leave them out."""


CHECKOUT_ENVS: tuple[EnvInfo, ...] = (
    EnvInfo("LLMMLGym-v0", "gym_llm.envs.mlgym:LLMMLGymEnv",
            "MLGym's ML research tasks from a user's MLGym checkout (edit, run, validate, submit in a sandboxed "
            "workspace; graded by the task's own evaluation in a separate sandbox), no Docker",
            "{0, 1} vs the baseline (or the metric, or its improvement)",
            reward="1.0 if the task's metric reaches its baseline (or `threshold`), else 0.0; or the metric, or its "
                   "improvement over the baseline ([docs/mlgym.md](docs/mlgym.md))",
            observation="the conversation rendered up to the generation prompt (text), or its ids + mask; command "
                        "outputs come back as `tool` turns"),
)
"""Envs over tasks read from a checkout the user points them at (``gym.make("LLMMLGym-v0", task_config_path=...)``):
registered with their native vector envs, but not in :data:`ENVS` — nothing to build them from by default, so
``gym-llm list``, the README table and the every-env tests leave them out."""


def register_envs() -> None:
    """Register every env id, the :data:`CHECKOUT_ENVS` and the :data:`CLIENT_ENVS` (idempotent)."""
    for info in ENVS:
        if info.id in gym.registry:
            continue
        gym.register(
            id=info.id,
            entry_point=info.entry_point,
            vector_entry_point=info.vector_entry_point,
            disable_env_checker=False,
        )
    for info in CHECKOUT_ENVS:
        if info.id not in gym.registry:
            gym.register(id=info.id, entry_point=info.entry_point, vector_entry_point=info.vector_entry_point,
                         disable_env_checker=False)
    for env_id, entry_point in CLIENT_ENVS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, disable_env_checker=False)


# ------------------------------------------------------------------------------------------------ other packages' envs
PLUGIN_GROUP = "gym_llm.envs"
"""The entry-point group through which another package registers its envs. In its ``pyproject.toml``::

    [project.entry-points."gym_llm.envs"]
    my_envs = "my_envs.registration:register"

names a function (called with no arguments) that registers the package's envs — with :func:`register_env` (an
:class:`EnvInfo`: ``gym-llm list`` describes the env, ``play``/``eval``/``train`` take it) or with
``gymnasium.register``. As in Gymnasium's own ``gymnasium.envs`` group, the value names a function, not a module.
:func:`load_plugin_envs` calls each once, when ``gym_llm`` is imported (docs/adding_an_env.md)."""

_OWN_IDS = frozenset({info.id for info in (*ENVS, *CHECKOUT_ENVS)} | set(CLIENT_ENVS))
_PLUGIN_ENVS: dict[str, EnvInfo] = {}
_loading: str | None = None  # the package whose entry point is being called
_plugins_loaded = False


def register_env(info: EnvInfo) -> None:
    """Register ``info``'s env with Gymnasium (its scalar and native vector entry points) and make it known to the
    ``gym-llm`` commands (``list``, and those in ``info.commands``). Called from a ``gym_llm.envs`` entry point, the env
    is credited to that entry point's package; called from a program, to ``info.package`` (``"(this program)"`` when
    left at its default).

    Raises:
        TypeError: ``info`` is not an :class:`EnvInfo`.
        ValueError: ``info.id`` is one of gym-llm's own ids, or another package registered it.
    """
    if not isinstance(info, EnvInfo):
        raise TypeError(f"register_env takes an EnvInfo(id, entry_point, description, reward_range, ...), got "
                        f"{type(info).__name__}.")
    if _loading is not None or info.package == "gym-llm":
        info = dataclasses.replace(info, package=_loading or "(this program)")
    if info.id in _OWN_IDS:
        raise ValueError(f"{info.id} is one of gym-llm's own env ids; give your env another id (e.g. with your "
                         "package's name in it).")
    other = _PLUGIN_ENVS.get(info.id)
    if other is not None and other.package != info.package:
        raise ValueError(f"{info.id} is already registered by package {other.package}; give your env another id.")
    gym.register(id=info.id, entry_point=info.entry_point, vector_entry_point=info.vector_entry_point,
                 disable_env_checker=False)
    _PLUGIN_ENVS[info.id] = info


def plugin_envs() -> tuple[EnvInfo, ...]:
    """The envs other packages registered (through :data:`PLUGIN_GROUP`, or :func:`register_env`), in load order."""
    return tuple(_PLUGIN_ENVS.values())


def registered_envs() -> tuple[EnvInfo, ...]:
    """Every env the ``gym-llm`` commands know: :data:`ENVS`, then :func:`plugin_envs`."""
    return ENVS + plugin_envs()


def load_plugin_envs() -> None:
    """Call every :data:`PLUGIN_GROUP` entry point once (``import gym_llm`` does). A plugin that fails — it does not
    import, its function raises, it names a module instead of a function — is skipped with a ``RuntimeWarning`` that
    names its package and the fix; what it registered is removed, and gym-llm's own envs are never replaced."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib import metadata

    try:
        entry_points = list(metadata.entry_points(group=PLUGIN_GROUP))
    except Exception as e:  # noqa: BLE001 — unreadable package metadata must not break `import gym_llm`
        warnings.warn(f"gym_llm: could not read the {PLUGIN_GROUP!r} entry points ({type(e).__name__}: {e}); envs "
                      "from other packages are not loaded", RuntimeWarning, stacklevel=2)
        return
    for entry_point in entry_points:
        _load_plugin(entry_point)


def _load_plugin(entry_point) -> None:
    global _loading
    dist = getattr(entry_point, "dist", None)
    package = dist.name if dist is not None else entry_point.value.split(":")[0].split(".")[0]
    where = f"the {PLUGIN_GROUP} entry point {entry_point.name} = {entry_point.value!r} of package {package}"
    fix = f"fix that package, or update it (pip install -U {package}), or uninstall it (pip uninstall {package})"
    if not entry_point.attr:
        warnings.warn(f"gym_llm: {where} names a module, not a function: it must be 'module:function', a function "
                      f"that registers the envs; its envs are not loaded. To fix: {fix}.", RuntimeWarning, stacklevel=3)
        return
    own = {env_id: gym.registry[env_id] for env_id in _OWN_IDS if env_id in gym.registry}
    before = set(gym.registry)
    _loading = package
    try:
        entry_point.load()()
    except Exception as e:  # noqa: BLE001 — a broken plugin must not break `import gym_llm`
        for env_id in set(gym.registry) - before:
            del gym.registry[env_id]
            _PLUGIN_ENVS.pop(env_id, None)
        warnings.warn(f"gym_llm: {where} failed ({type(e).__name__}: {e}); its envs are not loaded (gym-llm's own "
                      f"are). To fix: {fix}.", RuntimeWarning, stacklevel=3)
        return
    finally:
        _loading = None
    replaced = sorted(env_id for env_id, spec in own.items() if gym.registry.get(env_id) is not spec)
    if replaced:
        gym.registry.update({env_id: own[env_id] for env_id in replaced})
        warnings.warn(f"gym_llm: {where} registered gym-llm's own id(s) {', '.join(replaced)}; gym-llm's are kept. "
                      f"To fix: {fix}.", RuntimeWarning, stacklevel=3)
    for env_id in sorted(set(gym.registry) - before - set(_PLUGIN_ENVS)):  # registered with gymnasium.register
        _PLUGIN_ENVS[env_id] = _info_of_spec(gym.registry[env_id], package)
    logger.debug("%s registered %s", where, sorted(set(gym.registry) - before))


def _info_of_spec(spec: gym.envs.registration.EnvSpec, package: str) -> EnvInfo:
    """What ``gym-llm`` knows of an env a plugin registered with ``gymnasium.register`` (no description)."""
    def name(entry_point) -> str:
        if entry_point is None or isinstance(entry_point, str):
            return entry_point or ""
        return f"{getattr(entry_point, '__module__', '?')}:{getattr(entry_point, '__qualname__', entry_point)}"

    vector = name(spec.vector_entry_point)
    return EnvInfo(spec.id, name(spec.entry_point) or vector, f"registered by {package} with gymnasium.register",
                   "(not described)", vector_entry_point=vector or "(none: gym.make_vec wraps the scalar env)",
                   commands=("play", "eval", "train") if vector else ("play",),
                   not_for="it has no native vector env (gym-llm eval and train drive one): its package registers it "
                           "without vector_entry_point", package=package)
