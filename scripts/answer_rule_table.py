"""Print the GSM8K answer-rule comparison table of docs/verifiers.md: the same final answers graded by gym-llm,
lm-eval's two GSM8K filters and TorchRL's GSM8K reward parser, against the reference 18 (70000 for the
thousands-separator rows).

    python scripts/answer_rule_table.py

* gym-llm: :func:`gym_llm.rewards.gsm8k.grade` on ``"<work>\\n#### <answer>"`` (``\\boxed`` rows as written).
* lm-eval (``lm_eval/tasks/gsm8k/gsm8k.yaml``): its filters are regular expressions in that config, applied here as
  it applies them: *strict-match* takes the first ``#### (\\-?[0-9\\.\\,]+)``, *flexible-extract* the last match of
  ``(-?[$0-9.,]{2,})|(-?[0-9]+)``; then ``exact_match`` ignoring case, ``,``, ``$``, everything up to ``#### `` and a
  trailing ``.``. (lm-eval itself is not a dependency.)
* TorchRL 0.14 (installed with the benchmarks): ``GSM8KRewardParser.extract_tags`` on ``<answer>...</answer>`` and its
  ``normalize_answer`` equality — its own code, called here.
"""

from __future__ import annotations

import re

from gym_llm.rewards.gsm8k import grade

ACCEPTED = ["18", "$18", "18.00", "$18.00", "18 dollars", "18.", "**18**", "9 * 2 = 18", r"\frac{36}{2}", "36/2",
            r"\boxed{18}", r"\$18", r"18 \text{ dollars}", "18%", "70,000", "$70,000", "70000.0"]
REJECTED = ["18 or 19", "[18, 19]", "19 or 18", r"19 \lor 18", "18,5", "not 18", "!= 18", "about 18", "> 17",
            "18e3", "18k", "$18k", "18 thousand", "18**2", "20 - 2", r"\sqrt{324}", "9^{9^{9}}", "-$18", "-18"]


def _lm_eval_strict(text: str) -> str | None:
    found = re.findall(r"#### (\-?[0-9\.\,]+)", text)
    return found[0] if found else None


def _lm_eval_flexible(text: str) -> str | None:
    found = re.findall(r"(-?[$0-9.,]{2,})|(-?[0-9]+)", text)
    if not found:
        return None
    return next(group for group in found[-1] if group)


def _lm_eval_match(extracted: str | None, reference: str) -> bool:
    if extracted is None:
        return False

    def clean(s: str) -> str:
        for pattern in (",", r"\$", r"(?s).*#### ", r"\.$"):
            s = re.sub(pattern, "", s)
        return s.lower().strip()

    return clean(extracted) == clean(reference)


def _torchrl(answer: str, reference: str) -> bool | None:
    try:
        from torchrl.envs.llm.reward.gsm8k import GSM8KRewardParser
    except ImportError:
        return None
    _, potential = GSM8KRewardParser.extract_tags(f"<think>work</think><answer>{answer}</answer>")
    return bool(potential) and GSM8KRewardParser.normalize_answer(potential) == GSM8KRewardParser.normalize_answer(reference)


def rows() -> list[tuple[str, str, bool, bool, bool, bool | None]]:
    out = []
    for answer in ACCEPTED + REJECTED:
        reference = "70000" if "70" in answer else "18"
        completion = answer if answer.startswith("\\boxed") else f"She makes 9 * 2 = 18 dollars.\n#### {answer}"
        ours = grade(completion, reference).correct
        out.append((answer, reference, ours, _lm_eval_match(_lm_eval_strict(completion), reference),
                    _lm_eval_match(_lm_eval_flexible(completion), reference), _torchrl(answer, reference)))
    return out


def main() -> None:
    mark = {True: "1", False: "0", None: "n/a"}
    print("| final answer | reference | gym-llm | lm-eval strict | lm-eval flexible | TorchRL |")
    print("|---|---|:-:|:-:|:-:|:-:|")
    for answer, reference, *verdicts in rows():
        shown = answer.replace("|", "\\|")
        print(f"| `{shown}` | {reference} | " + " | ".join(mark[v] for v in verdicts) + " |")


if __name__ == "__main__":
    main()
