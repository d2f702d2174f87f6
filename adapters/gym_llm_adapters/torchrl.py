"""TorchRL environments from gym_llm's native vector envs: text, tokens and hashing, batched.

TorchRL's own :class:`torchrl.envs.GymWrapper` handles a *single* gym_llm env in text mode. It cannot express the
rest, which is what :class:`GymLLMEnv` is for:

- a native vector env in text mode: TorchRL reads the batched ``Tuple(Text, ...)`` space as one string, so
  ``rand_action`` gives one string for the whole batch and ``step`` fails;
- a native vector env in tokens mode: the batched ``Dict`` of ``(N, L)`` spaces comes out with the wrong batch shape;
- tokens mode, even for one env: the action's ``input_ids``/``attention_mask`` land at the root beside the
  observation's, so a rollout keeps the action's and loses the observation (and without
  ``categorical_action_encoding=True`` every observed token id is one-hot encoded: ``(L, V)`` per observation);
- ``LLMHashing-v0``: its 64-bit node hash is ``uint64``, which TorchRL's dtype table lacks (``KeyError``).

:class:`GymLLMEnv` builds the specs from the env's *single* spaces, batched to ``(N,)``:

==========================  =====================================================================================
gym_llm space               TorchRL spec (batch ``N``)
==========================  =====================================================================================
``UnicodeText`` (text)      ``NonTensor`` of shape ``(N,)`` (a ``NonTensorStack`` of ``N`` strings)
``MultiDiscrete([V] * L)``  ``Categorical(V)`` of shape ``(N, L)``, int64 (token ids, never one-hot)
``MultiBinary(L)``          ``Binary`` of shape ``(N, L)``, int8 (attention masks)
``Discrete(V)``             ``Categorical(V)`` of shape ``(N,)``, int64 (the hashing env's next token)
``Box(uint64)`` (hash)      ``Unbounded`` int64 of shape ``(N, 1)``: the same 64 bits, read as a signed integer
                            (``hash_u64 = hash_i64 & (2**64 - 1)``; equal hashes stay equal, so ids still work)
``Dict``                    ``Composite`` (observations at the root, actions under ``"action"``)
==========================  =====================================================================================

A non-``Dict`` observation is stored under ``"observation"``; rewards are ``(N, 1)`` float32; ``done``,
``terminated`` and ``truncated`` are ``(N, 1)`` bool. The vector env runs with Gymnasium's ``DISABLED`` autoreset,
so TorchRL decides when sub-envs reset (``env.rollout(..., break_when_any_done=False)`` resets the finished ones
through the ``"_reset"`` mask, as with any TorchRL env).

Example::

    from gym_llm_adapters.torchrl import GymLLMEnv
    env = GymLLMEnv("LLMGSM8K-v0", num_envs=4, source="arithmetic")
    td = env.reset()                              # td["observation"]: 4 prompts
    td["action"] = ["#### 5"] * 4                 # or env.rand_action(td)
    td = env.step(td)                             # td["next", "reward"]: (4, 1)

Needs ``torchrl`` and ``tensordict`` (``pip install 'gym-llm[torchrl]'``; tested with torchrl 0.14.1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase
from torchrl.data import Binary, Bounded, Categorical, Composite, NonTensor, TensorSpec, Unbounded
from torchrl.envs import EnvBase

import gym_llm  # noqa: F401  (registers the env ids)

__all__ = ["GymLLMEnv", "spec_from_space"]

_TORCH_DTYPES = {np.dtype(k): v for k, v in {np.float32: torch.float32, np.float64: torch.float64,
                                             np.int64: torch.int64, np.int32: torch.int32, np.int8: torch.int8,
                                             np.uint8: torch.uint8, np.bool_: torch.bool}.items()}


def spec_from_space(space: spaces.Space, batch: tuple[int, ...], path: str = "space") -> TensorSpec:
    """The TorchRL spec of ``batch`` copies of one gym_llm ``space`` (the table in the module docstring)."""
    if isinstance(space, spaces.Dict):
        return Composite({k: spec_from_space(s, batch, f"{path}[{k!r}]") for k, s in space.spaces.items()},
                         shape=batch)
    if isinstance(space, spaces.Text):
        return NonTensor(shape=batch, example_data="")
    if isinstance(space, spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec)
        if nvec.ndim != 1 or len(np.unique(nvec)) != 1:
            raise TypeError(f"{path}: expected token ids, MultiDiscrete([V] * L), got nvec of shape {nvec.shape} with "
                            f"values {np.unique(nvec)[:4]}.")
        return Categorical(int(nvec[0]), shape=(*batch, len(nvec)), dtype=torch.int64)
    if isinstance(space, spaces.MultiBinary):
        return Binary(shape=(*batch, *space.shape), dtype=torch.int8)
    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            raise TypeError(f"{path}: expected Discrete starting at 0, got start={space.start}.")
        return Categorical(int(space.n), shape=batch, dtype=torch.int64)
    if isinstance(space, spaces.Box):
        shape = (*batch, *(space.shape or (1,)))
        if space.dtype == np.uint64:  # the hashing env's node id: the same 64 bits as int64
            return Unbounded(shape=shape, dtype=torch.int64)
        dtype = _TORCH_DTYPES.get(np.dtype(space.dtype))
        if dtype is None:
            raise TypeError(f"{path}: Box of dtype {space.dtype} has no TorchRL equivalent here; expected one of "
                            f"{sorted(str(d) for d in _TORCH_DTYPES)} (or uint64 for a hash).")
        low = torch.as_tensor(np.broadcast_to(space.low, space.shape or (1,)), dtype=dtype).expand(shape)
        high = torch.as_tensor(np.broadcast_to(space.high, space.shape or (1,)), dtype=dtype).expand(shape)
        return Bounded(low, high, shape=shape, dtype=dtype)
    raise TypeError(f"{path}: {type(space).__name__} has no TorchRL spec in gym_llm_adapters.torchrl; expected Text, "
                    "MultiDiscrete, MultiBinary, Discrete, Box or a Dict of those.")


def _to_torch(value: Any, space: spaces.Space, batch: int) -> Any:
    """A batched gym_llm observation -> tensors / NonTensorStack, following :func:`spec_from_space`."""
    if isinstance(space, spaces.Dict):
        return {k: _to_torch(value[k], s, batch) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Text):
        return NonTensorStack(*(NonTensorData(str(v)) for v in value), batch_size=(batch,))
    array = np.asarray(value)
    if array.dtype == np.uint64:
        array = array.view(np.int64)
    if isinstance(space, spaces.Box) and not space.shape:
        array = array.reshape(batch, 1)
    return torch.from_numpy(np.ascontiguousarray(array))


def _to_numpy(value: Any, space: spaces.Space, batch: int, path: str = "action") -> Any:
    """A batched TorchRL action -> what the gym_llm vector env's ``step`` takes."""
    if isinstance(space, spaces.Dict):
        if not isinstance(value, TensorDictBase):
            raise TypeError(f"{path}: expected a TensorDict with keys {list(space.spaces)}, got {type(value).__name__}.")
        return {k: _to_numpy(value.get(k), s, batch, f"{path}[{k!r}]") for k, s in space.spaces.items()}
    if isinstance(space, spaces.Text):
        texts = value.tolist() if isinstance(value, (NonTensorStack, NonTensorData)) else value
        if isinstance(texts, str):  # one string set on the batch: TensorDict broadcasts it to every sub-env
            texts = [texts] * batch
        if (not isinstance(texts, (list, tuple)) or len(texts) != batch
                or not all(isinstance(t, str) for t in texts)):
            got = type(value).__name__ if isinstance(value, torch.Tensor) or not isinstance(texts, (list, tuple)) \
                else f"{len(texts)} items of types {sorted({type(t).__name__ for t in texts})}"
            raise TypeError(f"{path}: expected {batch} strings (one per sub-env: td['action'] = [...]), got {got}.")
        return tuple(texts)
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    return array.astype(space.dtype, copy=False).reshape((batch, *space.shape))


class GymLLMEnv(EnvBase):
    """A gym_llm env id (or a native vector env) as a batched TorchRL env; the module docstring has the specs.

    Args:
        env: a registered gym_llm id (``"LLMGSM8K-v0"``), or a native vector env made with
            ``autoreset_mode=gym.vector.AutoresetMode.DISABLED``.
        num_envs: ``N``, the batch size (with an id).
        device: where tensors live (default CPU).
        info_keys: numeric per-sub-env ``info`` entries to carry as tensors beside the observation, e.g.
            ``("policy_mask", "task_id", "group_id")`` — ``(N, L)`` or ``(N, 1)``, zeros where a sub-env's info
            lacks the key. Their specs come from one reset at construction.
        **kwargs: the env's own arguments (``mode="tokens"``, ``tokenizer=...``, ``group_size=...``).
    """

    def __init__(self, env: str | gym.vector.VectorEnv, num_envs: int = 1, *, device: Any = "cpu",
                 info_keys: tuple[str, ...] = (), **kwargs: Any):
        if isinstance(env, str):
            if not isinstance(num_envs, int) or num_envs < 1:
                raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}.")
            env = gym.make_vec(env, num_envs=num_envs, vectorization_mode="vector_entry_point",
                               autoreset_mode=gym.vector.AutoresetMode.DISABLED, **kwargs)
        elif kwargs:
            raise TypeError(f"keyword arguments {sorted(kwargs)} apply to an env id, not to a built vector env.")
        mode = getattr(env, "autoreset_mode", None)
        if mode != gym.vector.AutoresetMode.DISABLED:
            raise ValueError(f"GymLLMEnv needs a vector env with autoreset_mode=DISABLED (TorchRL resets sub-envs "
                             f"itself), got {mode}; build it with gym.make_vec(..., vectorization_mode="
                             "'vector_entry_point', autoreset_mode=gym.vector.AutoresetMode.DISABLED) or pass its id.")
        n = int(env.num_envs)
        super().__init__(device=device, batch_size=torch.Size([n]))
        self.env = env
        self._obs_space, self._act_space = env.single_observation_space, env.single_action_space
        self._dict_obs = isinstance(self._obs_space, spaces.Dict)
        obs = spec_from_space(self._obs_space, (n,), "observation")
        self.observation_spec = obs if self._dict_obs else Composite(observation=obs, shape=(n,))
        action = spec_from_space(self._act_space, (n,), "action")
        if isinstance(action, Composite):  # tokens: ("action", "input_ids") and ("action", "attention_mask")
            self.full_action_spec = Composite(action=action, shape=(n,))
        else:
            self.action_spec = action
        self.reward_spec = Unbounded(shape=(n, 1), dtype=torch.float32)
        self.full_done_spec = Composite({k: Categorical(2, shape=(n, 1), dtype=torch.bool)
                                         for k in ("done", "terminated", "truncated")}, shape=(n,))
        self._next_seed: int | None = None
        self._info_keys = tuple(info_keys)
        self._info_dtypes: dict[str, np.dtype] = {}
        if self._info_keys:  # their specs come from one probe reset (the next reset() starts over)
            _, info = env.reset()
            for key in self._info_keys:
                value = np.asarray(info.get(key)) if key in info else None
                if value is None or value.dtype.kind not in "biuf" or value.shape[:1] != (n,):
                    numeric = sorted(k for k, v in info.items() if not k.startswith("_")
                                     and np.asarray(v).dtype.kind in "biuf" and np.asarray(v).shape[:1] == (n,))
                    raise ValueError(f"info_keys: {key!r} is not a numeric per-sub-env entry of this env's reset "
                                     f"info; expected one of {numeric}.")
                shape = (n, *value.shape[1:]) if value.ndim > 1 else (n, 1)
                if value.dtype not in _TORCH_DTYPES:  # other ints -> int64, other floats -> float32
                    value = value.astype(np.int64 if value.dtype.kind in "iu" else np.float32)
                self._info_dtypes[key] = value.dtype
                dtype = _TORCH_DTYPES[value.dtype]
                self.observation_spec[key] = Unbounded(shape=shape, dtype=dtype) if dtype != torch.bool else \
                    Categorical(2, shape=shape, dtype=torch.bool)

    def _observation(self, obs: Any, info: Mapping[str, Any] | None = None) -> dict[str, Any]:
        value = _to_torch(obs, self._obs_space, self.batch_size[0])
        out = value if self._dict_obs else {"observation": value}
        for key in self._info_keys:  # zeros where a sub-env's info lacks the key (Gymnasium's "_key" mask)
            spec = self.observation_spec[key]
            array = np.zeros(spec.shape, dtype=self._info_dtypes[key])
            if info is not None and key in info:
                present = np.asarray(info.get("_" + key, np.ones(spec.shape[0], dtype=bool)), dtype=bool)
                array[present] = np.asarray(info[key])[present].reshape(array[present].shape)
            out[key] = torch.from_numpy(array)
        return out

    def _flags(self, **values: np.ndarray) -> dict[str, torch.Tensor]:
        return {k: torch.as_tensor(np.asarray(v, dtype=bool)).reshape(self.batch_size[0], 1) for k, v in values.items()}

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        n = self.batch_size[0]
        mask = None
        if tensordict is not None and "_reset" in tensordict.keys():
            mask = tensordict.get("_reset").reshape(n).cpu().numpy().astype(bool)
        options = {"reset_mask": mask} if mask is not None and not mask.all() else None
        seed, self._next_seed = self._next_seed, None
        obs, info = self.env.reset(seed=seed, options=options)
        zeros = np.zeros(n, dtype=bool)
        return TensorDict({**self._observation(obs, info), **self._flags(done=zeros, terminated=zeros, truncated=zeros)},
                          batch_size=self.batch_size, device=self.device)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        n = self.batch_size[0]
        actions = _to_numpy(tensordict.get("action"), self._act_space, n)
        obs, reward, terminated, truncated, info = self.env.step(actions)
        reward = torch.as_tensor(np.asarray(reward, dtype=np.float32)).reshape(n, 1)
        flags = self._flags(done=np.logical_or(terminated, truncated), terminated=terminated, truncated=truncated)
        return TensorDict({**self._observation(obs, info), "reward": reward, **flags}, batch_size=self.batch_size,
                          device=self.device)

    def _set_seed(self, seed: int | None) -> None:
        self._next_seed = seed  # applied at the next reset (gym_llm envs seed through reset)

    def close(self, *, raise_if_closed: bool = True) -> None:
        self.env.close()
        super().close(raise_if_closed=raise_if_closed)
