"""What a rollout file records about the env behind its episodes, so that they can be replayed (docs/replay.md).

A :class:`RecordedEnvSpec` is the recipe of one collector env (shard): the registered env id, the env's constructor
arguments as JSON, its mode (text or tokens), the longest action it took, the collector's tokenizer, and the
``gym_llm`` / ``gymnasium`` versions that ran it. The collector builds one per env it drives
(:func:`spec_of_env`) and stamps its :attr:`~RecordedEnvSpec.spec_id` on every step and trajectory;
:class:`~gym_llm_adapters.rollout_io.RolloutWriter` writes the spec into the file before the first record that names
it. What else makes an episode reproducible is already in each record: its ``task_id`` (the vector env's seeds only
choose tasks; an episode is a function of its task and its actions) and its actions (the sampled ids and text).

Constructor arguments are stored as JSON, with tags for what JSON lacks (:func:`encode_kwargs`)::

    {"$tuple": [...]}                       a tuple
    {"$path": "data/test.jsonl"}            a pathlib.Path
    {"$callable": "package.module:name"}    an importable function or class (imported again on replay, only for a
                                            file the user trusts: :mod:`gym_llm_adapters.trust`)
    {"$tokenizer": {"name_or_path": ..., "class": ..., "vocab_size": ..., "fingerprint": ...}}
                                            a tokenizer loaded from a folder (loaded from it again on replay)

An argument that cannot be written so (a lambda, a closure, an object) is left out and named in
:attr:`~RecordedEnvSpec.unreplayable` with the reason; a replay then needs it passed in (``env_kwargs=``).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = ["COLLECTOR_TOKENIZER", "RecordedEnvSpec", "decode_kwargs", "encode_kwargs", "known_spec", "register_spec",
           "spec_of_env", "tokenizer_fingerprint", "tokenizer_record"]

logger = logging.getLogger(__name__)

_LAYOUT_ARGUMENTS = frozenset({"num_envs", "group_size", "autoreset_mode", "task_assignment", "num_workers",
                               "render_mode", "vectorization_mode", "vector_kwargs", "wrappers", "max_episode_steps"})
"""Arguments that shape the vector env (or ``gym.make_vec``), not the episodes: not part of the env's recipe."""

COLLECTOR_TOKENIZER = "tokenizer (the collector's)"
"""The :attr:`RecordedEnvSpec.unreplayable` key of a collector tokenizer that could not be recorded."""

_PROBE = ("Grüße, 世界! 🙂 The answer is 42.\n\n#### 3,141.59\n<|im_start|>user\nHi<|im_end|>\n"
          "def f(x):\n\treturn x ** 2  # café")
"""Text whose ids, with the vocabulary size and chat template, fingerprint a tokenizer (see tokenizer_fingerprint)."""


@dataclass(frozen=True)
class RecordedEnvSpec:
    """The env behind a rollout file's episodes (module docstring).

    Attributes:
        env_id: the registered id (``"LLMGSM8K-v0"``); ``""`` when the env was not registered (not replayable).
        env_kwargs: the env's constructor arguments, JSON with tags (:func:`encode_kwargs`); the vector env's own
            arguments (``num_envs``, ``group_size``, ...) are in :attr:`vector` instead.
        mode: ``"text"`` or ``"tokens"``: what the actions were (the sampled text, or the sampled ids).
        action_length: the longest action the env took (tokens, or characters in text mode); the collector clipped
            text actions to it, and a replay feeds the same clipped text.
        gym_llm_version / gymnasium_version: the packages that ran the episodes.
        tokenizer: the collector's tokenizer (``$tokenizer`` payload; it encoded text observations into the records'
            ``prompt_ids``), or None.
        unreplayable: constructor arguments that could not be recorded, name -> why.
        vector: how the vector env was laid out (``class``, ``num_envs``, ``group_size``, ``autoreset_mode``,
            ``task_assignment``); informative, a replay runs each episode alone.
        wrappers: the vector wrappers around the env (class names); a replay runs the bare env.
        spec_id: 16 hex characters of the SHA-256 of everything above: identical recipes share an id.
    """

    env_id: str
    env_kwargs: dict[str, Any]
    mode: str
    action_length: int
    gym_llm_version: str
    gymnasium_version: str
    tokenizer: dict[str, Any] | None = None
    unreplayable: dict[str, str] = field(default_factory=dict)
    vector: dict[str, Any] = field(default_factory=dict)
    wrappers: tuple[str, ...] = ()
    spec_id: str = ""

    def __post_init__(self) -> None:
        if not self.spec_id:
            object.__setattr__(self, "spec_id", self.content_id())

    def content_id(self) -> str:
        """The id this spec's content hashes to (equal to :attr:`spec_id` unless the spec was altered)."""
        content = {k: v for k, v in self.to_dict().items() if k not in ("spec_id", "kind")}
        text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able form written to rollout files (``"kind": "env_spec"``)."""
        out = {"kind": "env_spec", **asdict(self)}
        out["wrappers"] = list(self.wrappers)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RecordedEnvSpec":
        """Inverse of :meth:`to_dict`; ``ValueError`` when the stored id does not match the content (an edited or
        damaged spec)."""
        names = cls.__dataclass_fields__
        values = {k: v for k, v in data.items() if k in names}
        values["wrappers"] = tuple(values.get("wrappers") or ())
        spec = cls(**values)
        if spec.spec_id != spec.content_id():
            raise ValueError(f"env spec {spec.spec_id}: its id does not match its content (the spec was changed after "
                             "it was written)")
        return spec


# ------------------------------------------------------------------------------------------------ the registry
_KNOWN: "OrderedDict[str, RecordedEnvSpec]" = OrderedDict()
_MAX_KNOWN = 4096


def register_spec(spec: RecordedEnvSpec) -> None:
    """Make ``spec`` findable by its id (:func:`known_spec`), for writers of records that carry the id."""
    _KNOWN[spec.spec_id] = spec
    _KNOWN.move_to_end(spec.spec_id)
    while len(_KNOWN) > _MAX_KNOWN:
        _KNOWN.popitem(last=False)


def known_spec(spec_id: str) -> RecordedEnvSpec | None:
    """The spec registered under ``spec_id`` in this process, or None."""
    return _KNOWN.get(spec_id)


# ------------------------------------------------------------------------------------------------ tokenizers
def tokenizer_fingerprint(tokenizer: Any) -> str:
    """16 hex characters that change when a tokenizer encodes differently: its vocabulary size, chat template and the
    ids of a fixed probe text (multilingual, digits, code, ChatML markers)."""
    from gym_llm.core.tokenizer import TokenizerView

    view = TokenizerView(tokenizer)
    content = [view.vocab_size, getattr(tokenizer, "chat_template", None), view.encode(_PROBE)]
    return hashlib.sha256(json.dumps(content, default=str).encode()).hexdigest()[:16]


def tokenizer_record(tokenizer: Any) -> dict[str, Any]:
    """The ``$tokenizer`` payload of a tokenizer loaded from a folder; ``ValueError`` (saying the fix) for one that
    was built in memory and so cannot be loaded again."""
    name = getattr(tokenizer, "name_or_path", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {type(tokenizer).__name__} built in memory (no name_or_path): save it with "
                         "save_pretrained and load it from that folder, or pass tokenizer= to the replay")
    if os.path.isdir(name):
        name = os.path.abspath(name)
    try:
        vocab_size, fingerprint = len(tokenizer), tokenizer_fingerprint(tokenizer)
    except Exception as e:  # a tokenizer that cannot encode the probe: recorded without a fingerprint
        logger.debug("no fingerprint for %s: %s", name, e)
        vocab_size, fingerprint = getattr(tokenizer, "vocab_size", None), None
    return {"name_or_path": name, "class": type(tokenizer).__name__, "vocab_size": vocab_size,
            "fingerprint": fingerprint}


def _is_tokenizer(value: Any) -> bool:
    return not isinstance(value, type) and callable(getattr(value, "encode", None)) \
        and callable(getattr(value, "decode", None))


# ------------------------------------------------------------------------------------------------ JSON with tags
class _Unencodable(ValueError):
    pass


def encode_kwargs(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``(encoded, unreplayable)``: the arguments as JSON with tags (module docstring), and those that cannot be
    written so, name -> why.

    >>> from pathlib import Path
    >>> encoded, unreplayable = encode_kwargs({"max_turns": 2, "stop": ("a", "b"), "data_files": Path("t.jsonl"),
    ...                                        "reward_fn": lambda task, messages: 0.0})
    >>> encoded
    {'max_turns': 2, 'stop': {'$tuple': ['a', 'b']}, 'data_files': {'$path': 't.jsonl'}}
    >>> list(unreplayable)
    ['reward_fn']
    """
    encoded: dict[str, Any] = {}
    unreplayable: dict[str, str] = {}
    for name, value in kwargs.items():
        try:
            encoded[name] = _encode(value)
        except _Unencodable as e:
            unreplayable[name] = str(e)
    return encoded, unreplayable


def _encode(value: Any) -> Any:
    import numpy as np

    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, os.PathLike):
        return {"$path": os.fspath(value)}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v) for v in value]}
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise _Unencodable("a mapping with keys that are not strings cannot be written as JSON")
        if len(value) == 1 and next(iter(value)).startswith("$"):
            raise _Unencodable(f"a one-key mapping whose key starts with '$' ({next(iter(value))!r}) reads as a tag")
        return {k: _encode(v) for k, v in value.items()}
    if _is_tokenizer(value):
        try:
            return {"$tokenizer": tokenizer_record(value)}
        except ValueError as e:
            raise _Unencodable(str(e)) from None
    if callable(value):
        return {"$callable": _importable_name(value)}
    raise _Unencodable(f"a {type(value).__name__} is not JSON; pass JSON values (numbers, strings, lists, dicts), "
                       "paths or importable functions, or give it to the replay (env_kwargs=)")


def _importable_name(value: Any) -> str:
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise _Unencodable("a lambda or a function defined inside another function cannot be imported again; pass an "
                           "importable (module-level) function, or give it to the replay (env_kwargs=)")
    try:
        found = _import(f"{module}:{qualname}")
    except (ImportError, AttributeError) as e:
        raise _Unencodable(f"{module}:{qualname} cannot be imported ({e})") from None
    if found is not value:
        raise _Unencodable(f"{module}:{qualname} names a different object than the one passed (a bound method, a "
                           "partial or a replaced attribute); pass a module-level function")
    return f"{module}:{qualname}"


def _import(name: str) -> Any:
    module, _, qualname = name.partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def decode_kwargs(encoded: Mapping[str, Any], *, tokenizer: Callable[[dict[str, Any]], Any],
                  import_callables: bool = False) -> dict[str, Any]:
    """Inverse of :func:`encode_kwargs`: ``tokenizer(payload)`` gives the object of each ``$tokenizer`` value, and
    ``$callable`` values are imported again (the code as it is now) — only with ``import_callables=True``: importing a
    module a file names runs that module, so a file must be trusted first (:mod:`gym_llm_adapters.trust`).

    >>> import os.path
    >>> kwargs = decode_kwargs({"stop": {"$tuple": ["a"]}, "f": {"$callable": "os.path:join"}}, tokenizer=None,
    ...                        import_callables=True)
    >>> kwargs["stop"], kwargs["f"] is os.path.join
    (('a',), True)
    >>> decode_kwargs({"f": {"$callable": "os:system"}}, tokenizer=None)
    Traceback (most recent call last):
    ...
    ValueError: f names code to import ({'$callable': 'os:system'}), which is imported only from a file you trust: pass import_callables=True (replay: trust_file=True, CLI: --trust-file), or give f yourself
    """
    return {name: _decode(value, tokenizer, name if not import_callables else None) for name, value in encoded.items()}


def _decode(value: Any, tokenizer: Callable[[dict[str, Any]], Any], refuse_code: str | None) -> Any:
    """``refuse_code``: the argument's name when ``$callable`` values are refused, else None."""
    if isinstance(value, list):
        return [_decode(v, tokenizer, refuse_code) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            (tag, payload), = value.items()
            if tag == "$tuple":
                return tuple(_decode(v, tokenizer, refuse_code) for v in payload)
            if tag == "$path":
                return Path(payload)
            if tag == "$callable":
                if refuse_code is not None:
                    raise ValueError(f"{refuse_code} names code to import ({value}), which is imported only from a "
                                     "file you trust: pass import_callables=True (replay: trust_file=True, CLI: "
                                     f"--trust-file), or give {refuse_code} yourself")
                return _import(payload)
            if tag == "$tokenizer":
                return tokenizer(payload)
        return {k: _decode(v, tokenizer, refuse_code) for k, v in value.items()}
    return value


# ------------------------------------------------------------------------------------------------ from an env
def spec_of_env(env: Any, *, mode: str, action_length: int, tokenizer: Any = None) -> RecordedEnvSpec:
    """The recipe of a vector env the collector drives: a gym_llm native vector env (made with ``gym.make_vec`` or
    its class), or Gymnasium's ``SyncVectorEnv`` / ``AsyncVectorEnv`` over gym_llm envs made with ``gym.make``.

    What cannot be found or written is named in ``unreplayable`` (``"env"`` for an unregistered env), not raised."""
    import gymnasium as gym

    import gym_llm

    unwrapped = env.unwrapped
    wrappers: list[str] = []
    outer = env
    while outer is not unwrapped and hasattr(outer, "env"):
        wrappers.append(type(outer).__name__)
        outer = outer.env
    scalar = None
    if "_constructor" not in vars(unwrapped):  # SyncVectorEnv: the scalar envs hold the recipe
        envs = getattr(unwrapped, "envs", None)
        scalar = envs[0].unwrapped if envs else None
    target = unwrapped if scalar is None else scalar
    unreplayable: dict[str, str] = {}
    kwargs = _constructor_kwargs(target, getattr(unwrapped, "spec", None), unreplayable)
    env_id = _registered_id(unwrapped, scalar)
    if not env_id:
        unreplayable["env"] = (f"{type(target).__name__} is not registered with Gymnasium; register it "
                               "(gymnasium.register) and make it with gym.make_vec(id, ...)")
    encoded, bad = encode_kwargs(kwargs)
    unreplayable.update(bad)
    recorded_tokenizer = None
    if tokenizer is not None:
        try:
            recorded_tokenizer = tokenizer_record(tokenizer)
        except ValueError as e:
            if mode == "text":  # text observations were encoded with it: a replay needs it
                unreplayable[COLLECTOR_TOKENIZER] = str(e)
    autoreset = env.metadata.get("autoreset_mode")
    vector = {"class": type(unwrapped).__name__, "num_envs": int(env.num_envs),
              "group_size": int(getattr(unwrapped, "group_size", 1) or 1),
              "autoreset_mode": getattr(autoreset, "value", str(autoreset)),
              "task_assignment": getattr(unwrapped, "task_assignment", "per_group")}
    return RecordedEnvSpec(env_id=env_id, env_kwargs=encoded, mode=mode, action_length=int(action_length),
                           gym_llm_version=gym_llm.__version__, gymnasium_version=gym.__version__,
                           tokenizer=recorded_tokenizer, unreplayable=unreplayable, vector=vector,
                           wrappers=tuple(wrappers))


def _constructor_kwargs(target: Any, spec: Any, unreplayable: dict[str, str]) -> dict[str, Any]:
    recorded = vars(target).get("_constructor")
    if recorded is not None:
        _, args, kwargs = recorded
        extra_args = args[1:] if getattr(target, "num_envs", None) is not None else args  # a vector env's num_envs
        if extra_args:
            unreplayable["positional arguments"] = "the env was made with positional arguments; pass keywords"
    elif spec is not None and getattr(spec, "kwargs", None) is not None:
        kwargs = dict(spec.kwargs)
    else:
        unreplayable["env arguments"] = "the env's constructor arguments are unknown (no gym_llm env inside it)"
        kwargs = {}
    return {k: v for k, v in kwargs.items() if k not in _LAYOUT_ARGUMENTS}


def _registered_id(unwrapped: Any, scalar: Any) -> str:
    import gymnasium as gym

    for env in (unwrapped, scalar):
        spec = getattr(env, "spec", None) if env is not None else None
        if spec is not None and getattr(spec, "id", None) in gym.registry:
            return spec.id
    target = scalar if scalar is not None else unwrapped
    name = f"{type(target).__module__}:{type(target).__qualname__}"
    for env_id, registered in gym.registry.items():
        if name in (registered.entry_point, getattr(registered, "vector_entry_point", None)):
            return env_id
    return ""
