"""Engine over a running ``vllm serve`` (its OpenAI-compatible HTTP API), token ids in and out.

Requests (vLLM 0.32's ``/v1/completions``; see ``vllm/entrypoints/openai/completion/protocol.py``):

* generation: ``{"prompt": [ids...], "n", "max_tokens", "temperature", "top_p", "top_k", "seed",
  "stop", "stop_token_ids", "ignore_eos", "include_stop_str_in_output", "logprobs": 0,
  "return_token_ids": true}`` — a token-id ``prompt`` is not re-tokenised; ``return_token_ids`` adds
  ``choices[i].token_ids``; ``logprobs: 0`` gives ``choices[i].logprobs.token_logprobs``, the sampled
  token's log-prob at every position.
* teacher forcing: ``{"prompt": ids, "max_tokens": 1, "prompt_logprobs": 0}`` gives
  ``choices[0].prompt_logprobs``: ``None`` then one ``{str(token_id): {"logprob": ...}}`` per position.
* weights (server started with ``VLLM_SERVER_DEV_MODE=1``): the tensors are written as safetensors to
  ``weights_dir`` (a folder the server can read at the same path), then ``POST /collective_rpc
  {"method": "reload_weights", "kwargs": {"weights_path": dir}}`` and ``POST /reset_prefix_cache``.
* LoRA adapters (server started with ``--enable-lora --max-lora-rank R`` and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; ``VLLMServer(lora_rank=R)`` does both): ``POST /v1/load_lora_adapter
  {"lora_name": name, "lora_path": folder}`` (the server reads the folder: it must see the same path), then requests
  name the adapter as their ``"model"``. The server gives every load a new int id and keys prefix-cache blocks by
  the adapter's name and path, all new per version. The adapter before the previous one is unloaded (``POST
  /v1/unload_lora_adapter``) at each push: the previous one stays registered so that requests sent just before the
  push still find it (they are tagged with the version they were sent at).

One HTTP request per prompt, sent concurrently (``max_concurrency``), so per-prompt seeds follow the
in-process engine's rule (``seed + i * n``) and the server batches the requests itself.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from gym_llm_adapters.engines.base import EngineBase, SamplingConfig
from gym_llm_adapters.engines.checkpoint import CheckpointSpec
from gym_llm_adapters.types import Completion

if TYPE_CHECKING:
    from gym_llm_adapters.lora import Adapter

__all__ = ["VLLMServerEngine"]

logger = logging.getLogger(__name__)


class VLLMServerEngine(EngineBase):
    """A running vLLM OpenAI-compatible server behind the :class:`~gym_llm_adapters.engines.base.Engine` protocol.

    Args:
        base_url: e.g. ``"http://127.0.0.1:8000"`` (without ``/v1``).
        model: the served model name (default: the first one ``/v1/models`` lists).
        tokenizer: for text prompts and the collector's text mode (default: loaded with
            ``AutoTokenizer.from_pretrained`` from the model's ``root`` folder, when it is local).
        api_key: sent as a bearer token when set.
        timeout_s: per-request timeout.
        max_concurrency: requests in flight at once.
        weights_dir: a folder shared with the server for :meth:`load_weights` (default: a temp folder,
            which works when the server runs on this machine).
        version: the initial policy version (default 0, or ``adapter.version``).
        adapter: a LoRA adapter to serve from the start (a resumed run), at ``version=adapter.version``; its folder
            must be readable by the server. Whether the server serves adapters, and up to which rank, is read from
            it (``/server_info`` in dev mode; without dev mode the rank is not known here and the server checks it).
        version: the initial policy version.
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        tokenizer: Any = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_concurrency: int = 64,
        weights_dir: str | Path | None = None,
        version: int | None = None,
        adapter: "Adapter | None" = None,
    ):
        try:
            import httpx
        except ImportError as e:
            raise ImportError("VLLMServerEngine needs httpx: pip install 'gym-llm[server]'.") from e
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s,
                                    limits=httpx.Limits(max_connections=max_concurrency))
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="vllm_server_engine")
        models = self._request("GET", "/v1/models")["data"]
        entry = models[0] if model is None else next((m for m in models if m["id"] == model), None)
        if entry is None:
            raise ValueError(f"The server at {self.base_url} does not serve {model!r}; it serves {[m['id'] for m in models]}.")
        self.model = entry["id"]
        if tokenizer is None:
            tokenizer = _local_tokenizer(entry.get("root"), self.base_url)
        super().__init__(tokenizer, version=version, adapter=adapter)
        self.checkpoint = CheckpointSpec.from_folder(entry.get("root"))
        self._own_weights_dir = weights_dir is None
        self.weights_dir = Path(weights_dir) if weights_dir is not None else Path(tempfile.mkdtemp(prefix="gym-llm-weights-"))
        self._lora, self._lora_max_rank = self._server_lora()
        self._registered: list[str] = []  # adapters this engine loaded into the server, oldest first
        try:
            self._serve_initial_adapter(adapter)
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------------------------- http
    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import httpx

        try:
            response = self._client.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise RuntimeError(f"vLLM server request {method} {self.base_url}{path} failed: {type(e).__name__}: {e}") from e
        if response.status_code != 200:
            hint = ""
            if response.status_code == 404 and path in ("/collective_rpc", "/reset_prefix_cache"):
                hint = " Start the server with VLLM_SERVER_DEV_MODE=1 to enable weight updates."
            raise RuntimeError(
                f"vLLM server answered {response.status_code} to {method} {path}: {response.text[:500]}{hint}"
            )
        return response.json() if response.content else None

    # ---------------------------------------------------------------------------- generation
    def _body(self, prompt: np.ndarray, sampling: SamplingConfig, seed: int | None, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "prompt": prompt.tolist(),
            "n": sampling.n,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k if sampling.top_k > 0 else -1,
            "ignore_eos": sampling.ignore_eos,
            "include_stop_str_in_output": sampling.include_stop_str_in_output,
            "logprobs": 0,
            "return_token_ids": True,
        }
        if seed is not None:
            body["seed"] = seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        return body

    def _generate_ids(self, prompts: list[np.ndarray], sampling: SamplingConfig) -> list[Completion]:
        adapter, version = self._served()  # a push during this call does not change what it asks for or its tag
        model = self.model if adapter is None else adapter.name

        def one(i: int) -> list[Completion]:
            seed = None if sampling.seed is None else sampling.seed + i * sampling.n
            body = self._body(prompts[i], sampling, seed, model)
            choices = sorted(self._request("POST", "/v1/completions", body)["choices"], key=lambda c: c["index"])
            if len(choices) != sampling.n:
                raise RuntimeError(f"The server returned {len(choices)} choices for a prompt, expected {sampling.n}.")
            out = []
            for choice in choices:
                if choice.get("token_ids") is None or choice.get("logprobs") is None:
                    raise RuntimeError("The server returned no token_ids/logprobs; it must be vLLM >= 0.10 (return_token_ids).")
                out.append(self._completion(prompts[i], choice["token_ids"], choice["logprobs"]["token_logprobs"],
                                            choice["finish_reason"], sampling, version=version))
            return out

        return [c for group in self._pool.map(one, range(len(prompts))) for c in group]

    # ------------------------------------------------------------------------ teacher forcing
    def logprobs(self, sequences: Sequence[Any]) -> list[np.ndarray]:
        """Teacher-forced raw log-probs via ``prompt_logprobs`` (``out[0] = 0.0``)."""
        self._check_open()
        ids = self.prompt_ids(sequences)
        adapter, _ = self._served()
        model = self.model if adapter is None else adapter.name

        def one(seq: np.ndarray) -> np.ndarray:
            body = {"model": model, "prompt": seq.tolist(), "max_tokens": 1, "temperature": 0.0,
                    "prompt_logprobs": 0}
            positions = self._request("POST", "/v1/completions", body)["choices"][0]["prompt_logprobs"]
            if positions is None or len(positions) != len(seq):
                raise RuntimeError(f"The server returned prompt log-probs for {len(positions or [])} of {len(seq)} tokens.")
            out = np.zeros(len(seq), dtype=np.float32)
            for t in range(1, len(seq)):
                out[t] = positions[t][str(int(seq[t]))]["logprob"]
            return out

        return list(self._pool.map(one, ids))

    # ------------------------------------------------------------------------------- weights
    def _load_weights(self, items: list[tuple[str, Any]]) -> None:
        from safetensors.torch import save_file

        items = self.checkpoint.validate(items)  # vLLM's reload is not transactional: refuse bad updates first
        target = self.weights_dir / f"v{self._version + 1}"
        target.mkdir(parents=True, exist_ok=True)
        save_file({name: t.detach().to("cpu").contiguous().clone() for name, t in items}, str(target / "model.safetensors"))
        try:
            self._request("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(target)}})
            self._request("POST", "/reset_prefix_cache")
        finally:
            for old in self.weights_dir.glob("v*"):  # the server has read them; keep the folder small
                if old != target:
                    shutil.rmtree(old, ignore_errors=True)

    # ------------------------------------------------------------------------------ adapters
    @property
    def serves_adapters(self) -> bool:
        return self._lora

    @property
    def max_lora_rank(self) -> int | None:
        return self._lora_max_rank

    def _lora_hint(self) -> str:
        return ("start the server with --enable-lora --max-lora-rank R and the environment variable "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (VLLMServer(..., lora_rank=R) does both), R >= the adapter's "
                "rank.")

    def _server_lora(self) -> tuple[bool, int | None]:
        """Whether the server can load adapters at run time, and its ``max_lora_rank`` when it says."""
        import httpx

        try:  # dev mode: the server's whole config and its VLLM_* environment
            info = self._client.get("/server_info", params={"config_format": "json"})
        except httpx.HTTPError:
            info = None
        if info is not None and info.status_code == 200:
            data = info.json()
            lora = (data.get("vllm_config") or {}).get("lora_config")
            runtime = str((data.get("vllm_env") or {}).get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "")).lower()
            if isinstance(lora, dict) and runtime in ("true", "1"):
                return True, int(lora["max_lora_rank"]) if lora.get("max_lora_rank") else None
            return False, None
        try:  # no dev mode: the load route exists only with runtime updating on (an empty body is refused, 4xx)
            probe = self._client.post("/v1/load_lora_adapter", json={})
        except httpx.HTTPError:
            return False, None
        return probe.status_code not in (404, 405), None

    def _load_adapter(self, adapter: "Adapter", previous: "Adapter | None") -> None:
        import httpx

        body = {"lora_name": adapter.name, "lora_path": str(Path(adapter.path).resolve())}
        try:
            response = self._client.post("/v1/load_lora_adapter", json=body)
        except httpx.HTTPError as e:
            raise RuntimeError(f"vLLM server request POST /v1/load_lora_adapter failed: {type(e).__name__}: {e}") from e
        if response.status_code != 200 and not self._already_serving(adapter, response):
            unread = response.status_code == 404 or "not found" in response.text.lower()
            hint = "; the folder must be readable by the server at that path" if unread else ""
            raise RuntimeError(f"The vLLM server did not load the adapter {adapter.name!r} from {body['lora_path']} "
                               f"({response.status_code}: {response.text[:500]}){hint}.")
        self._registered.append(adapter.name)
        # keep the previous adapter registered (requests sent just before this push may still name it); unload older
        while len(self._registered) > 2:
            self._unload(self._registered.pop(0))

    def _already_serving(self, adapter: "Adapter", response: Any) -> bool:
        """A load refused because the server already serves this very adapter (same name and folder: a reconnect
        after the trainer restarted, or a retry after a lost answer). Names are unique per run and version."""
        if response.status_code != 400 or "already been loaded" not in response.text:
            return False
        models = self._request("GET", "/v1/models")["data"]
        path = str(Path(adapter.path).resolve())
        return any(m.get("id") == adapter.name and m.get("root") == path for m in models)

    def _unload(self, name: str) -> None:
        """Drop an older adapter from the server's registry (its slot in the engine is freed by vLLM's LRU cache). A
        failure is logged, never raised: the new adapter is served by then, and the old one costs a registry entry."""
        try:
            response = self._client.post("/v1/unload_lora_adapter", json={"lora_name": name})  # answers plain text
            if response.status_code != 200:
                logger.warning("the vLLM server did not unload the adapter %s: %d %s", name, response.status_code,
                               response.text[:200])
        except Exception as e:
            logger.warning("could not unload the adapter %s from the vLLM server: %s: %s", name, type(e).__name__, e)

    def close(self) -> None:
        if not self._closed:
            for name in self._registered:  # a long-lived server keeps no adapters of this run
                self._unload(name)
            self._registered = []
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._client.close()
            if self._own_weights_dir:
                shutil.rmtree(self.weights_dir, ignore_errors=True)
        super().close()


def _local_tokenizer(root: str | None, base_url: str) -> Any:
    if root and Path(root).is_dir():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(root)
    raise ValueError(
        f"The server at {base_url} serves {root!r}, which is not a local folder, so its tokenizer cannot be "
        "loaded here; pass tokenizer= (e.g. AutoTokenizer.from_pretrained(<the model id>))."
    )
