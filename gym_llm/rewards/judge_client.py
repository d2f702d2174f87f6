"""An LLM judge's HTTP side: the :class:`Endpoint` it is served at, and the client that calls it under a deadline with
bounded retries, a concurrency limit and a cache; reading a reply's text, tokens and score distribution.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Mapping

from gym_llm.rewards.judge_rubric import JudgeError


# ------------------------------------------------------------------------------------------------ the endpoint
@dataclass(frozen=True)
class Endpoint:
    """Where the judge model is served: any OpenAI-compatible ``/v1`` API.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000/v1`` (``vllm serve``) or a provider's URL.
        model: the model name the server serves (``vllm serve --served-model-name``).
        api_key_env: the environment variable holding the key (read when the judge is made, never stored in
            records); a local server needs none.
        structured: ask the server to constrain the judge's output to the score format (vLLM's ``structured_outputs``
            regex). Makes a small local judge always answer in format; providers without it must leave it False.
        extra_body: further fields of every request's JSON body, as the server names them: e.g.
            ``{"chat_template_kwargs": {"enable_thinking": False}}`` for a Qwen3 judge on vLLM, ``{"top_k": 1}``.
            ``structured_outputs`` is set by ``structured`` and cannot be given here.
    """

    base_url: str
    model: str
    api_key_env: str | None = None
    structured: bool = False
    extra_body: Mapping[str, Any] | None = field(default=None, hash=False)

    def __post_init__(self) -> None:
        if self.extra_body is None:
            return
        if not isinstance(self.extra_body, Mapping):
            raise TypeError(f"extra_body must be a mapping of request fields, got {type(self.extra_body).__name__}; "
                            "pass e.g. extra_body={'top_k': 1}.")
        if "structured_outputs" in self.extra_body:
            raise ValueError("extra_body must not set 'structured_outputs': pass structured=True, which sets the "
                             "score format's regex.")
        try:
            json.dumps(dict(self.extra_body))
        except (TypeError, ValueError) as e:
            raise TypeError(f"extra_body must be JSON-serialisable (it is sent as the request body): {e}") from None

    def api_key(self) -> str:
        if self.api_key_env is None:
            return "EMPTY"
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ValueError(f"The judge endpoint's key variable {self.api_key_env!r} is not set: export it (or pass "
                             "api_key_env=None for a local server that needs no key).")
        return key


# -------------------------------------------------------------------------------------------------- the client
class _Client:
    """The HTTP side: one ``openai`` client, a concurrency limit, a deadline with bounded retries, a cache."""

    def __init__(self, endpoint: Endpoint, *, deadline_s: float, max_retries: int, max_concurrency: int,
                 cache_size: int, probe: bool):
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0 seconds, got {deadline_s!r}.")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries!r}.")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency!r}.")
        self.endpoint = endpoint
        self.deadline_s, self.max_retries, self.max_concurrency = float(deadline_s), int(max_retries), int(max_concurrency)
        self.cache_size = int(cache_size)
        self.calls = 0  # requests sent (retries included)
        self.tokens = 0  # prompt + completion tokens the server reported
        self._setup()
        if probe:
            self.probe()

    def _setup(self) -> None:
        try:
            import openai
        except ImportError as e:  # pragma: no cover - the judge extra is in dev
            raise ImportError("LLM judges need the 'openai' client: pip install 'gym-llm[judge]'.") from e
        self._openai = openai
        self._client = openai.OpenAI(base_url=self.endpoint.base_url, api_key=self.endpoint.api_key(),
                                     max_retries=0, timeout=self.deadline_s)
        self._slots = threading.BoundedSemaphore(self.max_concurrency)
        self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="judge_http")
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[str, int]] = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def probe(self) -> None:
        """One call to ``/models``: the server answers within the deadline and serves the model."""
        try:
            served = [m.id for m in self._client.with_options(timeout=min(self.deadline_s, 30.0)).models.list()]
        except self._openai.APIConnectionError as e:
            raise ConnectionError(f"The judge endpoint {self.endpoint.base_url} is unreachable ({e}): start the server "
                                  "(e.g. `vllm serve MODEL --served-model-name NAME`) or fix base_url.") from None
        except self._openai.APIStatusError as e:
            hint = " (an OpenAI-compatible base URL usually ends in /v1)" if e.status_code == 404 and not \
                self.endpoint.base_url.rstrip("/").endswith("/v1") else ""
            raise ConnectionError(f"The judge endpoint {self.endpoint.base_url} refused the probe: HTTP "
                                  f"{e.status_code} ({e.message}); check the URL{hint} and the key variable "
                                  f"{self.endpoint.api_key_env!r}.") from None
        if served and self.endpoint.model not in served:
            raise ValueError(f"The judge endpoint {self.endpoint.base_url} does not serve model "
                             f"{self.endpoint.model!r}; it serves {served}. Pass one of those as model=.")

    def complete(self, prompt: str, *, max_tokens: int, regex: str | None,
                 distribution: bool = False) -> tuple[str, int, bool, tuple[str, dict[str, float]] | None]:
        """``(text, tokens, cached, last)`` for ``prompt`` at temperature 0, ``last`` (with ``distribution``) the
        judge's last generated digit and its top log-probs (``(token, {token: logprob})``, what the score's digit was
        drawn from); raises :class:`JudgeError` past the deadline, after the retries, on a refused request or on a
        response that is not a chat completion.

        The deadline bounds the whole judgement: a request runs in a worker thread and is abandoned when the time is
        up, however slowly a server sends its body (an HTTP client's own timeout bounds each read, not the total); the
        abandoned request keeps its concurrency slot until it ends, so the limit holds."""
        key = hashlib.sha256(json.dumps([self.endpoint.model, prompt, max_tokens, regex, distribution]).encode()
                             ).hexdigest()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit[0], 0, True, hit[2]
        start = time.monotonic()
        more = dict(self.endpoint.extra_body or {})
        extra = {**more, "structured_outputs": {"regex": regex}} if regex is not None and self.endpoint.structured \
            else (more or None)
        options = {"logprobs": True, "top_logprobs": 20} if distribution else {}
        attempt, last = 0, "no attempt"
        while True:
            left = self.deadline_s - (time.monotonic() - start)
            if left <= 0:
                raise JudgeError(f"the judge's deadline of {self.deadline_s:g} s passed ({last})")
            if not self._slots.acquire(timeout=left):
                raise JudgeError(f"the judge's deadline of {self.deadline_s:g} s passed waiting for one of "
                                 f"{self.max_concurrency} concurrent calls")
            with self._lock:
                self.calls += 1
            left = max(self.deadline_s - (time.monotonic() - start), 1e-3)
            future = self._pool.submit(self._request, prompt, max_tokens, extra, options, left)
            try:
                response = future.result(timeout=left)
                text, tokens, last_digit = _read_response(response, distribution)
                break
            except FutureTimeout:
                last = "timed out"
            except self._openai.APITimeoutError:
                last = "timed out"
            except self._openai.APIConnectionError as e:
                last = f"connection failed: {e}"
            except self._openai.APIStatusError as e:
                last = f"HTTP {e.status_code}: {str(e.message)[:200]}"
                if e.status_code < 500 and e.status_code not in (408, 409, 429):
                    raise JudgeError(f"the judge endpoint refused the request ({last})") from None
            except JudgeError as e:  # a 200 that is not a chat completion (a proxy's page, no choices)
                last = str(e)
            attempt += 1
            if attempt > self.max_retries:
                raise JudgeError(f"the judge failed after {attempt} attempt(s): {last}")
            time.sleep(min(0.25 * 2 ** (attempt - 1) * (1 + random.random()), max(self.deadline_s
                                                                                    - (time.monotonic() - start), 0)))
        with self._lock:
            self.tokens += tokens
            if self.cache_size > 0:
                self._cache[key] = (text, tokens, last_digit)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return text, tokens, False, last_digit

    def _request(self, prompt: str, max_tokens: int, extra: Any, options: dict[str, Any], timeout: float) -> Any:
        """One HTTP request, in a worker thread; it holds its concurrency slot until it ends."""
        try:
            return self._client.with_options(timeout=timeout).chat.completions.create(
                model=self.endpoint.model, messages=[{"role": "user", "content": prompt}], temperature=0.0,
                max_tokens=max_tokens, extra_body=extra, **options)
        finally:
            self._slots.release()


def _read_response(response: Any, distribution: bool) -> tuple[str, int, tuple[str, dict[str, float]] | None]:
    """``(text, tokens, last digit)`` of a chat completion; :class:`JudgeError` for anything else."""
    try:
        choice = response.choices[0]
        text = choice.message.content or ""
        if not isinstance(text, str):
            raise TypeError(f"content is {type(text).__name__}")
        usage = getattr(response, "usage", None)
        tokens = int((usage.prompt_tokens or 0) + (usage.completion_tokens or 0)) if usage else 0
        last = None
        if distribution:
            content = getattr(getattr(choice, "logprobs", None), "content", None) or []
            for item in reversed(content):
                if _digit(item.token) is not None:
                    top = {t.token: float(t.logprob) for t in (item.top_logprobs or [])}
                    last = (item.token, top or {item.token: float(item.logprob)})
                    break
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as e:
        raise JudgeError(f"the judge endpoint's reply is not a chat completion ({type(e).__name__}: {e})") from None
    return text, tokens, last


def _digit(token: str) -> int | None:
    """The ASCII digit a token spells (surrounding blanks allowed), else None (``"²"`` is not a score)."""
    token = token.strip()
    return int(token) if len(token) == 1 and token in "0123456789" else None


def expected_score(top: dict[str, float] | None, low: int, high: int) -> float:
    """``sum n p(n) / sum p(n)`` over the score digits ``low..high`` among the judge's top tokens at the score's
    position (G-Eval's probability-weighted score); :class:`JudgeError` when none of them is there.

    >>> round(expected_score({"1": math.log(0.7), "0": math.log(0.2), "S": math.log(0.1)}, 0, 1), 6)
    0.777778
    """
    weights: dict[int, float] = {}
    for token, logprob in (top or {}).items():
        digit = _digit(token)
        if digit is not None and low <= digit <= high and logprob > -1e3:
            weights[digit] = weights.get(digit, 0.0) + math.exp(logprob)
    total = sum(weights.values())
    if not total > 0:
        raise JudgeError("the judge's score position has no probability on a score (no log-probs sent?)")
    return sum(n * w for n, w in weights.items()) / total


def _score_regex(low: int, high: int, chars: int = 100) -> str:
    """The judge's output for a constrained server: one line of at most ``chars`` characters of reasoning (fits the
    rubric's default 128-token budget whatever the tokenizer), then the score line."""
    numbers = "|".join(str(n) for n in range(low, high + 1))
    return rf"([^\n]{{0,{chars}}}\n)?SCORE: ({numbers})"

