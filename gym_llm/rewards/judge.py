"""LLM judges: rewards nobody can write as a rule, scored by a model behind any OpenAI-compatible endpoint.

A judge turns a conversation into a score by asking a model (a local ``vllm serve``, or a provider by URL and key)
with a **rubric**: a prompt template over the task, the conversation and optionally a reference answer. What makes it
safe to train on:

* **Failures are failures, never zeros.** The judge's reply is parsed strictly — its last non-empty line must be
  ``SCORE: <integer>`` inside the rubric's range — and anything else (prose, a second score, a score out of range), a
  missed deadline, a refused or unreachable request is a :class:`JudgeError`. As an env's ``reward_fn`` that becomes
  ``info["reward_error"]``; the collector counts such episodes and the trainer leaves them out of the loss
  (``Trajectory.reward_failed``), so a judge outage never trains the policy towards anything.
* **Bounded cost.** A deadline per score (retries included), bounded retries with backoff, a concurrency limit across
  threads, and a cache keyed by (judge model, rubric, conversation): a repeated conversation makes no call.
* **Defences against replies that address the judge** (:class:`Defences`; measured in ``docs/judges.md``): the reply
  is delimited by tags carrying a nonce the policy cannot see, only the judge's last line is read, and a reply that
  itself contains the score format can be scored the minimum without a call.
* **Fails fast.** Making a judge probes the endpoint once: an unreachable server, a model it does not serve, a
  template with unknown fields or a score range that cannot be parsed is refused there, not an hour into training.
* **Recorded with its source.** Every score carries ``judge:<model>/<rubric name>@<rubric digest>``, so a rollout file
  says which judge and which rubric produced it.

Group-relative judging (one call ranks all G replies of a GRPO group, as ART's RULER does) is
:class:`GroupJudge`; the collector runs it as a reward stage (``gym_llm_adapters.reward_stages``).

Example::

    judge = LLMJudge(Endpoint("http://127.0.0.1:8000/v1", model="judge"),
                     Rubric.criterion("The reply must be at most 30 words long."))
    env = gym.make("LLMChat-v0", reward_fn=judge)

The HTTP client is ``openai``'s (the ``judge`` extra), the library every OpenAI-compatible server is tested against.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from gym_llm.core.messages import Message
from gym_llm.core.tasks import Task
# the rubric and the score parser live in judge_rubric.py, the endpoint and HTTP client in judge_client.py; the
# public names are imported from here
from gym_llm.rewards.judge_client import Endpoint, _Client, _digit, _score_regex, expected_score  # noqa: F401
from gym_llm.rewards.judge_rubric import (FIELDS, SCORE_PREFIX, _SCORE_LIKE, Defences, JudgeError,  # noqa: F401
                                          JudgeResult, Rubric, parse_score, render_conversation)

__all__ = ["Endpoint", "Rubric", "Defences", "JudgeError", "JudgeResult", "LLMJudge", "GroupJudge", "parse_score",
           "render_conversation", "SCORE_PREFIX"]

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------- the judges
class _JudgeBase:
    keeps_own_deadline = True
    """Envs call a judge in their own thread (``isolate_hook``): it enforces its deadline itself and holds a cache."""

    def __init__(self, endpoint: Endpoint, rubric: Rubric, *, defences: Defences, deadline_s: float,
                 max_retries: int, max_concurrency: int, cache_size: int, probe: bool, seed: int | None):
        if not isinstance(endpoint, Endpoint):
            raise TypeError(f"endpoint must be an Endpoint(base_url, model), got {type(endpoint).__name__}.")
        if not isinstance(rubric, Rubric):
            raise TypeError(f"rubric must be a Rubric, got {type(rubric).__name__}.")
        self.endpoint, self.rubric, self.defences = endpoint, rubric, defences
        self._nonce_key = (str(seed) if seed is not None else os.urandom(8).hex()).encode()
        self.client = _Client(endpoint, deadline_s=deadline_s, max_retries=max_retries,
                              max_concurrency=max_concurrency, cache_size=cache_size, probe=probe)

    @property
    def source(self) -> str:
        return f"judge:{self.endpoint.model}/{self.rubric.name}@{self.rubric.digest}"

    def _nonce(self, text: str) -> str:
        return hashlib.blake2b(text.encode(), key=self._nonce_key, digest_size=5).hexdigest()

    def _block(self, reply: str, label: str, nonce: str) -> str:
        if not self.defences.delimit:
            return reply
        tag = f"{label}-{nonce}"
        reply = reply.replace(nonce, "")  # the reply cannot name the block's tag
        return f"<{tag}>\n{reply}\n</{tag}>"

    def _fields(self, task: Task, before: Sequence[Message]) -> dict[str, Any]:
        turns = [Message(m.role, self._block(m.content, "turn", self._nonce(m.content)))
                 if m.role == "assistant" else m for m in before]  # the policy's earlier turns are delimited too
        return {"prompt": task.prompt, "conversation": render_conversation(turns), "reference": task.answer,
                "low": self.rubric.low, "high": self.rubric.high, "task": dict(task.data)}

    def _format(self, values: dict[str, Any]) -> str:
        if "reference" in self.rubric.fields() and values.get("reference") is None:
            raise JudgeError("the rubric uses {reference} but the task has no reference answer")
        try:
            return self.rubric.template.format(**values)
        except (KeyError, IndexError) as e:
            raise JudgeError(f"the rubric template needs {e} that the task's record does not have") from None
        except (TypeError, AttributeError, ValueError) as e:  # {task[meta][k]} on a str meta, a bad format spec
            raise JudgeError(f"the rubric template cannot be filled from this task ({type(e).__name__}: {e})") from None

    def _refused(self, reply: str) -> bool:
        return self.defences.refuse_score_format and _SCORE_LIKE.search(reply) is not None


class LLMJudge(_JudgeBase):
    """A per-reply judge, usable as any chat env's ``reward_fn``: ``judge(task, messages) -> (reward, info)``.

    The reward is ``(score - low) / (high - low)`` in [0, 1]. On a judge failure the reward is 0.0 **with**
    ``info["reward_error"]``: not a score (the collector and trainer leave the episode out of the loss).
    ``info["reward_source"]`` names the judge and rubric; ``info["judge_score"]`` the raw score.

    Args:
        endpoint: where the judge model is served.
        rubric: the template and score range (:meth:`Rubric.criterion` for a criterion per task or fixed).
        defences: :class:`Defences` (default: delimited reply, last line only).
        deadline_s: per score, retries and waiting for a concurrency slot included.
        max_retries: retries after a timeout, a connection error, HTTP 408/409/429 or 5xx (other 4xx fail at once).
        max_concurrency: calls in flight at once from this judge (threads share it).
        cache_size: conversations remembered (LRU); 0 turns the cache off.
        probe: check the endpoint when the judge is made (``/models``, and the model is served).
        seed: fixes the delimiter nonces (reproducible judge prompts); None draws a secret one.
        score: ``"sampled"`` — the integer the judge wrote; ``"expected"`` — its probability-weighted score
            ``sum n p(n) / sum p(n)`` over the score digits at the position it wrote one (G-Eval): a continuous
            score that ranks replies even when a small judge writes the same integer for all of them (GRPO only
            compares replies within a group). Needs single-digit scores (``0 <= low < high <= 9``) and a server that
            sends log-probs; the written score must still parse.
    """

    def __init__(self, endpoint: Endpoint, rubric: Rubric, *, defences: Defences = Defences(), deadline_s: float = 60.0,
                 max_retries: int = 2, max_concurrency: int = 8, cache_size: int = 65536, probe: bool = True,
                 seed: int | None = None, score: str = "sampled"):
        if score not in ("sampled", "expected"):
            raise ValueError(f"score must be 'sampled' or 'expected', got {score!r}.")
        if score == "expected" and not 0 <= rubric.low < rubric.high <= 9:
            raise ValueError(f"score='expected' reads one digit's probabilities: the rubric's range must lie in 0..9, "
                             f"got [{rubric.low}, {rubric.high}] (e.g. Rubric.criterion(..., low=0, high=1)).")
        super().__init__(endpoint, rubric, defences=defences, deadline_s=deadline_s, max_retries=max_retries,
                         max_concurrency=max_concurrency, cache_size=cache_size, probe=probe, seed=seed)
        if rubric.group:
            raise ValueError("This rubric uses {replies} (a group rubric): use GroupJudge with it, or a per-reply "
                             "rubric with {reply} here.")
        self.score_mode = score
        self.__name__ = "LLMJudge"

    @property
    def source(self) -> str:
        return super().source + ("+expected" if self.score_mode == "expected" else "")

    def prompt(self, task: Task, messages: Sequence[Message]) -> str:
        """The text the judge is sent for the conversation's last message (the reply)."""
        *before, reply = messages
        values = self._fields(task, before)
        values["reply"] = self._block(reply.content, "reply", self._nonce(reply.content))
        return self._format(values)

    def judge(self, task: Task, messages: Sequence[Message]) -> JudgeResult:
        """Score the conversation's last message; never raises for a judge failure (see :class:`JudgeResult`)."""
        if not messages:
            raise ValueError("A judge needs the conversation, ending with the reply to grade; got no messages.")
        reply = messages[-1].content
        earlier = "conversation" in self.rubric.fields() and any(
            self._refused(m.content) for m in messages[:-1] if m.role == "assistant")
        if self._refused(reply) or earlier:
            return JudgeResult(0.0, self.rubric.low, None, self.source, refused=True)
        try:
            prompt = self.prompt(task, messages)
            expected = self.score_mode == "expected"
            text, tokens, cached, last = self.client.complete(
                prompt, max_tokens=self.rubric.max_tokens, regex=_score_regex(self.rubric.low, self.rubric.high),
                distribution=expected)
            score = parse_score(text, self.rubric.low, self.rubric.high,
                                last_line_only=self.defences.last_line_only)
            if expected:
                if last is None or _digit(last[0]) != score:
                    raise JudgeError(f"the judge's score {score} is not the last digit it generated "
                                     f"({None if last is None else last[0]!r}): no probabilities for it")
                value = expected_score(last[1], self.rubric.low, self.rubric.high)
            else:
                value = float(score)
        except JudgeError as e:
            return JudgeResult(None, None, f"JudgeError: {e}", self.source)
        except Exception as e:  # noqa: BLE001  (whatever else breaks, the reward is unknown: counted, never a crash)
            logger.warning("the judge failed unexpectedly: %s: %s", type(e).__name__, e)
            return JudgeResult(None, None, f"{type(e).__name__}: {e}", self.source)
        span = self.rubric.high - self.rubric.low
        return JudgeResult((value - self.rubric.low) / span, score, None, self.source, cached=cached, text=text,
                           tokens=tokens)

    def judge_many(self, items: Sequence[tuple[Task, Sequence[Message]]]) -> list[JudgeResult]:
        """Judge several conversations concurrently (up to ``max_concurrency`` in flight); results in order."""
        if len(items) <= 1:
            return [self.judge(t, m) for t, m in items]
        with ThreadPoolExecutor(min(self.client.max_concurrency, len(items)), thread_name_prefix="judge") as pool:
            return list(pool.map(lambda item: self.judge(*item), items))

    def __call__(self, task: Task, messages: Sequence[Message]) -> tuple[float, dict[str, Any]]:
        result = self.judge(task, messages)
        return (result.reward if result.reward is not None else 0.0), result.info()

    def __repr__(self) -> str:
        return f"LLMJudge({self.endpoint.base_url}, model={self.endpoint.model!r}, rubric={self.rubric.name!r})"


_GROUP_LINE = re.compile(r"^REPLY[ \t]+(\d+):[ \t]*SCORE:[ \t]*(-?\d+)[ \t]*$")


class GroupJudge(_JudgeBase):
    """A group-relative judge (RULER-style): one call shows the judge all G replies to one task and scores each
    against the others. Cheaper per reply than G calls (the request is sent once) and steadier (the judge compares).

    The judge must answer exactly G lines ``REPLY k: SCORE: n`` (k = 1..G in order, nothing else); anything else
    fails the whole group (every member's reward is unknown). Same arguments as :class:`LLMJudge`; the rubric
    must use ``{replies}`` (:meth:`Rubric.group_criterion`).
    """

    def __init__(self, endpoint: Endpoint, rubric: Rubric, *, defences: Defences = Defences(), deadline_s: float = 120.0,
                 max_retries: int = 2, max_concurrency: int = 4, cache_size: int = 16384, probe: bool = True,
                 seed: int | None = None):
        if not rubric.group:
            raise ValueError("A GroupJudge's rubric must show all the replies with {replies} "
                             "(Rubric.group_criterion); for one reply at a time use LLMJudge.")
        super().__init__(endpoint, rubric, defences=defences, deadline_s=deadline_s, max_retries=max_retries,
                         max_concurrency=max_concurrency, cache_size=cache_size, probe=probe, seed=seed)

    def prompt(self, task: Task, before: Sequence[Message], replies: Sequence[str]) -> str:
        values = self._fields(task, before)
        nonce = self._nonce("\x00".join(replies))
        values["replies"] = "\n".join(self._block(r, f"reply-{k}", nonce) if self.defences.delimit
                                      else f"REPLY {k}:\n{r}" for k, r in enumerate(replies, 1))
        values["count"] = len(replies)
        values["reply"] = ""
        return self._format(values)

    def judge_group(self, task: Task, before: Sequence[Message], replies: Sequence[str]) -> list[JudgeResult]:
        """One result per reply, in order. A refused reply (``refuse_score_format``) is scored ``low`` and shown to
        the judge as an empty reply; a failed call fails every member."""
        if not replies:
            return []
        refused = [self._refused(r) for r in replies]
        shown = ["" if r else text for r, text in zip(refused, replies)]
        try:
            prompt = self.prompt(task, before, shown)
            regex = None
            if self.endpoint.structured:
                numbers = "|".join(str(n) for n in range(self.rubric.low, self.rubric.high + 1))
                regex = "\n".join(f"REPLY {k}: SCORE: ({numbers})" for k in range(1, len(replies) + 1))
            text, tokens, cached, _ = self.client.complete(prompt, max_tokens=max(self.rubric.max_tokens,
                                                                               12 * len(replies)), regex=regex)
            scores = self._parse_group(text, len(replies))
        except JudgeError as e:
            return [JudgeResult(None, None, f"JudgeError: {e}", self.source) for _ in replies]
        except Exception as e:  # noqa: BLE001  (as LLMJudge.judge: unknown rewards, never a crash)
            logger.warning("the group judge failed unexpectedly: %s: %s", type(e).__name__, e)
            return [JudgeResult(None, None, f"{type(e).__name__}: {e}", self.source) for _ in replies]
        span = self.rubric.high - self.rubric.low
        out = []
        for k, (score, was_refused) in enumerate(zip(scores, refused)):
            if was_refused:
                score = self.rubric.low
            out.append(JudgeResult((score - self.rubric.low) / span, score, None, self.source, cached=cached,
                                   refused=was_refused, text=text if k == 0 else "", tokens=tokens if k == 0 else 0))
        return out

    def _parse_group(self, text: str, count: int) -> list[int]:
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        if len(lines) != count:
            raise JudgeError(f"the group judge answered {len(lines)} line(s) for {count} replies: {text[-160:]!r}")
        scores = []
        for k, line in enumerate(lines, 1):
            match = _GROUP_LINE.match(line)
            if match is None or int(match.group(1)) != k:
                raise JudgeError(f"the group judge's line {k} is not 'REPLY {k}: SCORE: n': {line[:120]!r}")
            score = int(match.group(2))
            if not self.rubric.low <= score <= self.rubric.high:
                raise JudgeError(f"the group judge's score {score} for reply {k} is outside [{self.rubric.low}, "
                                 f"{self.rubric.high}]")
            scores.append(score)
        return scores

    def __repr__(self) -> str:
        return f"GroupJudge({self.endpoint.base_url}, model={self.endpoint.model!r}, rubric={self.rubric.name!r})"
