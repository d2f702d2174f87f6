"""LLMIFEval-v0 on IFEval's 541 real prompts with a rule-based policy that reads each task's instructions.

    python examples/ifeval_heuristic_policy.py                       # data: ../shared/data/ifeval/input_data.jsonl
    python examples/ifeval_heuristic_policy.py --data-files path/to/input_data.jsonl --show 3

Run from the checkout with gym-llm installed (``bash scripts/setup.sh``), or with ``PYTHONPATH=.``. No model, text
mode: the env scores each reply with the official IFEval checks.

The policy never looks at the prompt's topic. It reads the task's ``instruction_id_list`` and ``kwargs`` (the env
keeps the row in ``task.data``) and builds a reply of plain filler sentences that satisfies what a rule can satisfy:
required keywords, placeholders, highlighted sections, capital words and letters are added; the length is padded
or kept short; paragraphs, sections, bullets, a title, the repeated prompt, a postscript, two responses and the end
phrase are laid out; forbidden words, letters and commas are removed; the case is changed; JSON and quotation
marks wrap it last. It cannot answer in another language, and where two instructions pull against each other (say,
a repeated prompt that has commas, with no commas allowed) one of them loses.

Each prompt is played twice — by the policy, and by a naive baseline reply that ignores the instructions — and the
script prints the per-instruction strict pass rates read from ``info["instruction_results"]`` and both mean rewards
(``reward_mode="fraction"``: the share of a prompt's instructions followed).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from _common import parse_flags  # examples/_common.py


@dataclass
class Args:
    data_files: str | None = None
    """IFEval's input_data.jsonl; default: $GYM_LLM_DATA/ifeval/input_data.jsonl, else ../shared/data/ beside the checkout"""
    num_prompts: int = 541
    """score the first this many prompts"""
    show: int = 1
    """replies printed in full (with their per-instruction results)"""


BASELINE = "Sure, here is a helpful answer to your request. I hope it covers what you need, and thanks for asking."
FILLER = ("This reply follows the rules of the request.", "It keeps each part short and plain.",
          "The main point comes first and the details follow.", "Good writing is clear and kind to the reader.",
          "Every line here was made by a simple rule based policy.", "It reads the instructions and meets them one by one.",
          "Short words help the reader move along.", "A calm tone makes the text easy to follow.")


def words(text: str) -> int:
    return len(re.findall(r"\w+", text))


def pad(sentences: list[str], enough) -> list[str]:
    """Append filler sentences (cycling) until ``enough(sentences)``."""
    while not enough(sentences):
        sentences.append(FILLER[len(sentences) % len(FILLER)])
    return sentences


def chunks(sentences: list[str], n: int) -> list[str]:
    """``n`` non-empty paragraphs of consecutive sentences."""
    pad(sentences, lambda s: len(s) >= n)
    size = -(-len(sentences) // n)
    return [" ".join(sentences[k * size:(k + 1) * size]) or FILLER[k % len(FILLER)] for k in range(n)]


def rule_based_reply(rules: dict[str, dict]) -> str:
    """A reply built to follow ``rules`` (instruction id -> kwargs), in the order that keeps them compatible."""
    sentences = list(FILLER[:2])
    # 1. content the reply must contain
    if "keywords:existence" in rules:
        sentences.append(f"It mentions {' and '.join(rules['keywords:existence']['keywords'])}.")
    if (kw := rules.get("keywords:frequency")) and kw["relation"] == "at least":
        sentences.append(" ".join([kw["keyword"]] * kw["frequency"]) + ".")
    if kw := rules.get("detectable_content:number_placeholders"):
        sentences.append("Fill in " + " ".join(f"[field {k + 1}]" for k in range(kw["num_placeholders"])) + ".")
    if kw := rules.get("detectable_format:number_highlighted_sections"):
        sentences.append("Key parts: " + " and ".join(f"*part {k + 1}*" for k in range(kw["num_highlights"])) + ".")
    if (kw := rules.get("change_case:capital_word_frequency")) and kw["capital_relation"] == "at least":
        sentences.append(" ".join(["NOTE"] * kw["capital_frequency"]) + ".")
    if (kw := rules.get("keywords:letter_frequency")) and kw["let_relation"] == "at least":
        sentences.append(kw["letter"] * kw["let_frequency"] + ".")
    if "detectable_format:constrained_response" in rules:
        sentences.append("My answer is yes.")
    # 2. length
    if (kw := rules.get("length_constraints:number_words")) and kw["relation"] == "at least":
        pad(sentences, lambda s: words(" ".join(s)) >= kw["num_words"])
    if (kw := rules.get("length_constraints:number_sentences")) and kw["relation"] == "at least":
        pad(sentences, lambda s: len(s) >= kw["num_sentences"])
    # 3. layout
    if kw := rules.get("length_constraints:number_paragraphs"):
        text = "\n\n***\n\n".join(chunks(sentences, kw["num_paragraphs"]))
    elif kw := rules.get("length_constraints:nth_paragraph_first_word"):
        paragraphs = chunks(sentences, kw["num_paragraphs"])
        paragraphs[kw["nth_paragraph"] - 1] = f"{kw['first_word']} {paragraphs[kw['nth_paragraph'] - 1]}"
        text = "\n\n".join(paragraphs)
    elif kw := rules.get("detectable_format:multiple_sections"):
        parts = chunks(sentences, kw["num_sections"])
        text = "\n\n".join(f"{kw['section_spliter']} {k + 1}\n{part}" for k, part in enumerate(parts))
    else:
        text = " ".join(sentences)
    if kw := rules.get("detectable_format:number_bullet_lists"):
        text += "\n" + "\n".join(f"* point {k + 1} of the list." for k in range(kw["num_bullets"]))
    if "detectable_format:title" in rules:
        text = "<<a plain reply>>\n" + text
    if kw := rules.get("combination:repeat_prompt"):
        text = kw["prompt_to_repeat"] + "\n" + text
    if kw := rules.get("detectable_content:postscript"):
        text += f"\n{kw['postscript_marker']} thanks for reading."
    if "combination:two_responses" in rules:
        text += "\n******\nAnother take: " + text
    if kw := rules.get("startend:end_checker"):
        text += "\n" + kw["end_phrase"]
    # 4. what must not be there
    for word in rules.get("keywords:forbidden_words", {}).get("forbidden_words", []):
        text = re.sub(rf"\b{re.escape(word)}\b", "", text, flags=re.IGNORECASE)
    if (kw := rules.get("keywords:letter_frequency")) and kw["let_relation"] == "less than":
        text = re.sub(re.escape(kw["letter"]), "", text, flags=re.IGNORECASE)
    if "punctuation:no_comma" in rules:
        text = text.replace(",", "")
    # 5. case, then wrappers
    if "change_case:english_lowercase" in rules:
        text = text.lower()
    if "change_case:english_capital" in rules:
        text = text.upper()
    if "detectable_format:json_format" in rules:
        text = json.dumps({"answer": text})
    if "startend:quotation" in rules:
        text = f'"{text}"'
    return text


def default_data_file() -> Path:
    checkout = Path(__file__).resolve().parents[1]
    candidates = [Path(os.environ["GYM_LLM_DATA"]) if os.environ.get("GYM_LLM_DATA") else None,
                  checkout.parent / "shared" / "data"]
    for folder in filter(None, candidates):
        if (folder / "ifeval" / "input_data.jsonl").is_file():
            return folder / "ifeval" / "input_data.jsonl"
    raise SystemExit("IFEval's input_data.jsonl was not found (looked in $GYM_LLM_DATA/ifeval/ and "
                     f"{checkout.parent / 'shared' / 'data' / 'ifeval'}); pass --data-files path/to/input_data.jsonl "
                     "(google-research/instruction_following_eval's data/input_data.jsonl).")


def main() -> dict:
    args = parse_flags(Args, __doc__)
    import gymnasium as gym

    import gym_llm  # noqa: F401  (registers the env ids)

    data_file = Path(args.data_files) if args.data_files else default_data_file()
    if not data_file.is_file():
        raise SystemExit(f"--data-files {data_file}: no such file (IFEval's input_data.jsonl).")
    # The official checkers log an error (and count the instruction as followed) when langdetect finds no letters,
    # e.g. in the loose variants of a reply; that is expected here, not a failure.
    logging.getLogger().addFilter(lambda record: "Unable to detect language" not in record.getMessage())
    env = gym.make("LLMIFEval-v0", data_files=str(data_file), reward_mode="fraction")
    count = min(args.num_prompts, len(env.unwrapped.parts.tasks))
    passed: dict[str, dict[str, list[bool]]] = defaultdict(lambda: {"policy": [], "baseline": []})
    rewards: dict[str, list[float]] = {"policy": [], "baseline": []}
    all_followed: dict[str, int] = {"policy": 0, "baseline": 0}
    for task_id in range(count):
        for who in ("policy", "baseline"):
            env.reset(options={"task_id": task_id})
            row = env.unwrapped.episode.task.data  # the IFEval row: prompt, instruction_id_list, kwargs
            reply = rule_based_reply(dict(zip(row["instruction_id_list"], row["kwargs"]))) if who == "policy" else BASELINE
            _, reward, terminated, _, info = env.step(reply)
            assert terminated  # one reply per episode
            results = json.loads(info["instruction_results"])  # [{"id", "strict", "loose"}, ...]
            for result in results:
                passed[result["id"]][who].append(result["strict"])
            rewards[who].append(reward)
            all_followed[who] += bool(info["prompt_strict"])
            if who == "policy" and task_id < args.show:
                print(f"prompt {task_id}: {row['prompt'][:160]!r}...\nreply:\n{reply}\n"
                      f"results: {[(r['id'], r['strict']) for r in results]}\n")
    env.close()

    print(f"{'instruction':48s} {'prompts':>7s} {'policy':>7s} {'baseline':>8s}   (strict pass rate)")
    for instruction_id in sorted(passed):
        runs = passed[instruction_id]
        print(f"{instruction_id:48s} {len(runs['policy']):7d} {sum(runs['policy']) / len(runs['policy']):7.2f} "
              f"{sum(runs['baseline']) / len(runs['baseline']):8.2f}")
    mean = {who: sum(values) / len(values) for who, values in rewards.items()}
    print(f"mean reward over {count} prompts: policy {mean['policy']:.3f}, baseline {mean['baseline']:.3f}; "
          f"all instructions followed: policy {all_followed['policy']}, baseline {all_followed['baseline']}")
    return {"mean": mean, "count": count}


if __name__ == "__main__":
    main()
