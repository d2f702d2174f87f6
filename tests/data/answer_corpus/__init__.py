"""A labelled corpus of model replies for each scored env, to measure answer rules' false negatives and positives.

``build(env)`` returns :class:`Item` s: a reply, its reference, its class and its label, made deterministically
(no randomness but ``random.Random`` seeded with the env and class names) from real material and the endings in
:mod:`.gsm8k_endings` / :mod:`.tag_endings`:

* ``gsm8k`` — GSM8K **train** worked solutions (``$GYM_LLM_DATA/gsm8k/train.jsonl``, every 47th problem; calculator
  notes and the ``####`` line removed) and real GPT-3 solutions with OpenAI's labels (``tests/data/
  gsm8k_model_solutions*.jsonl``; their answer line removed), each closed by an ending of its class;
* ``python_tool`` — the final reply after a Python tool call (a line about the code's output, the solution's last
  sentence, an ending in the tool's voice), on the same GSM8K train problems;
* ``countdown`` — ``generate_countdown(300, seed=45)`` puzzles with their known solutions (each number used once),
  an equation in the forms models write it, wrong equations made by changing one operator;
* ``reasoning_gym`` — entries of eleven reasoning-gym datasets (``seed=4500``), the reference in the forms models
  write it, wrong answers taken from another entry (numbers) or with two letters swapped (words).

Correct classes (a false negative when refused): ``plain``, ``sign_off``, ``justification``, ``restatement``,
``units``/``format``, ``question``, ``no_marker``. Wrong classes (a false positive when paid): ``wrong_value``,
``alternative``, ``hedge``, ``correction``, ``two_answers``, ``contradiction``; in every one of these but
``wrong_value`` the reply *also* states the right answer (first or second), so a grader that picks one number
can be fooled either way.

``python -m tests.data.answer_corpus OUT_DIR`` writes one ``<env>.jsonl`` per env (the corpus is small and fast to
build, so the tests build it rather than read committed copies).
"""

from __future__ import annotations

from tests.data.answer_corpus.build import CORRECT_CLASSES, ENVS, WRONG_CLASSES, Item, build

__all__ = ["CORRECT_CLASSES", "ENVS", "WRONG_CLASSES", "Item", "build"]
