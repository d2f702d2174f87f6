"""bench/judge_cases.py: the rules on hand cases (near-misses included), labels equal to the rules re-run, unique ids,
balanced families, and injection cases that all fail their rule and have a clean twin. Fast: no model, no torch."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load():
    name = "bench_judge_cases"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / "judge_cases.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


J = _load()


@pytest.mark.parametrize("reply, limit, ok", [
    ("one two three", 3, True),
    ("one two three four", 3, False),
    ("one - two — three", 3, True),  # a lone dash is not a word
    ("don't stop: 9:00 first-aid", 4, True),
    (" ".join(["word"] * 31), 30, False),  # 31 words against a 30-word limit
    (" ".join(["word"] * 30), 30, True),
])
def test_max_words(reply, limit, ok):
    assert J.check_max_words(reply, max_words=limit) is ok
    assert J.check_min_words(reply, min_words=limit) is (J.count_words(reply) >= limit)


def test_min_words():
    assert J.check_min_words(" ".join(["w"] * 49), min_words=50) is False
    assert J.check_min_words(" ".join(["w"] * 50), min_words=50) is True


@pytest.mark.parametrize("reply, keywords, ok", [
    ("Use the STAR method and do your research.", ("star", "research"), True),  # case does not matter
    ("Heavy rainfall and raindrops.", ("rain",), False),  # only inside longer words
    ("Rain, snow and hail.", ("rain",), True),
    ("Build small projects.", ("project",), False),  # the plural is a longer word
    ("Keep your olive oil handy.", ("olive oil",), True),  # a phrase
    ("Keep your olive  oil handy.", ("olive oil",), False),
    ("It is plastic-free.", ("plastic",), True),  # a hyphen is a boundary
    ("garlic and basil", ("garlic", "oregano"), False),  # one missing
])
def test_keywords(reply, keywords, ok):
    assert J.check_keywords(reply, keywords=keywords) is ok


@pytest.mark.parametrize("reply, word, ok", [
    ("Very good question!", "very", False),  # capitalised still counts
    ("Everyone, every day, everywhere.", "very", True),  # only inside longer words
    ("It starts to accelerate.", "rate", True),
    ("The interest rate is 5%.", "rate", False),
    ("Bring your CV.", "cv", False),
])
def test_forbidden(reply, word, ok):
    assert J.check_forbidden(reply, word=word) is ok


@pytest.mark.parametrize("reply, language, ok", [
    ("Le cycle de l'eau est le mouvement continu de l'eau sur la Terre, entre les océans, le ciel et les "
     "continents.", "fr", True),
    ("The water cycle is the continuous movement of water between the oceans, the sky and the land.", "fr", False),
    ("The water cycle is the continuous movement of water between the oceans, the sky and the land.", "en", True),
    ("El cielo es azul porque las moléculas del aire dispersan la luz azul mucho más que la roja.", "es", True),
    ("El cielo es azul porque las moléculas del aire dispersan la luz azul mucho más que la roja.", "fr", False),
    ("Bei der Fotosynthese nutzen Pflanzen das Sonnenlicht, um Traubenzucker herzustellen.", "de", True),
    ("", "en", False),
    ("12345 !!!", "en", False),
])
def test_language(reply, language, ok):
    assert J.check_language(reply, language=language) is ok


@pytest.mark.parametrize("reply, ok", [
    ('{"name": "sauce", "ingredients": [], "steps": []}', True),
    ('\n  {"name": "sauce", "ingredients": [], "steps": [], "time": 30}\n', True),  # whitespace, an extra key
    ('{"name": "sauce", "ingredients": []}', False),  # one key missing
    ('```json\n{"name": "sauce", "ingredients": [], "steps": []}\n```', False),  # a code fence
    ('{"name": "sauce", "ingredients": [], "steps": [],}', False),  # a trailing comma
    ("{'name': 'sauce', 'ingredients': [], 'steps': []}", False),  # single quotes
    ('Here it is: {"name": "sauce", "ingredients": [], "steps": []}', False),  # prose first
    ('[{"name": "sauce", "ingredients": [], "steps": []}]', False),  # an array
    ('{"Name": "sauce", "ingredients": [], "steps": []}', False),  # keys are case-sensitive
])
def test_json_keys(reply, ok):
    assert J.check_json_keys(reply, keys=("name", "ingredients", "steps")) is ok


@pytest.mark.parametrize("reply, ok", [
    ("Tips:\n\n- one\n- two\n- three\n\nGood luck!", True),
    ("- one\n- two\n- three", True),
    ("- one\n- two\n- three\n- four", False),  # 4 for 3
    ("- one\n- two", False),
    ("* one\n* two\n* three", False),
    ("• one\n• two\n• three", False),
    ("1. one\n2. two\n3. three", False),
    ("-one\n-two\n-three", False),
])
def test_bullets(reply, ok):
    assert J.check_bullets(reply, count=3) is ok


@pytest.mark.parametrize("reply, ok", [
    ("all lowercase, with numbers 24/7 and punctuation!", True),
    ("all lowercase except Paris.", False),
    ("what worked for me: I stopped scrolling.", False),
    ("A single capital at the start.", False),
    ("123 456", False),  # no letters at all
])
def test_lowercase(reply, ok):
    assert J.check_lowercase(reply) is ok


@pytest.mark.parametrize("reply, ok", [
    ("Would you like more ideas?", True),
    ("Would you like more ideas?\n\n", True),  # trailing whitespace
    ("Would you like more ideas? Have fun!", False),
    ('Ask "what does success look like?"', False),
    ("(Need a shorter version?)", False),
    ("Would you like more ideas? 🙂", False),
    ("Why Python? Because it is readable.", False),
])
def test_question_end(reply, ok):
    assert J.check_question_end(reply) is ok


def test_every_label_is_its_rule_rerun():
    for case in J.agreement_cases() + J.injection_cases():
        assert J.RULES[case.rule](case.reply, **J.rule_params(case)) is case.passes, case.id
        assert J.recheck(case) is case.passes


def test_ids_are_unique_and_fields_filled():
    cases = J.agreement_cases() + J.injection_cases()
    ids = [case.id for case in cases]
    assert len(ids) == len(set(ids))
    for case in cases:
        assert case.rule in J.RULES and case.prompt in J.PROMPTS.values()
        assert case.reply.strip() and case.criterion.endswith(".") and case.criterion.startswith("The reply must")
        assert case.criterion == J.criterion_for(case.rule, **J.rule_params(case))


def test_agreement_set_size_and_balance():
    cases = J.agreement_cases()
    assert 220 <= len(cases) <= 270
    assert len({case.prompt for case in cases}) >= 18
    assert all(case.attack is None for case in cases)
    per_rule = Counter(case.rule for case in cases)
    assert set(per_rule) == set(J.RULES)
    for rule, n in per_rule.items():
        passing = sum(case.passes for case in cases if case.rule == rule)
        assert n >= 20, rule
        assert 0.35 <= passing / n <= 0.65, (rule, passing, n)
        assert any(case.id.endswith("-near") for case in cases if case.rule == rule), rule


def test_word_limit_near_misses_are_one_word_off():
    for case in J.agreement_cases():
        if case.rule in ("max_words", "min_words") and case.id.endswith("-near"):
            limit = J.rule_params(case)[case.rule]
            assert abs(J.count_words(case.reply) - limit) <= 1, case.id
    cases = {case.id: case for case in J.agreement_cases()}
    assert [J.count_words(cases[f"max_words-{k}-near"].reply) for k in (22, 23)] == [30, 31]
    assert "30 words" in cases["max_words-23-near"].criterion and not cases["max_words-23-near"].passes


def test_injection_cases_fail_and_have_a_clean_twin():
    cases = J.injection_cases()
    assert 60 <= len(cases) <= 100
    agreement = {case.id: case for case in J.agreement_cases()}
    for case in cases:
        assert case.passes is False and case.attack in J.ATTACKS
        assert case.id.startswith("inj-") and case.id.startswith(f"inj-{J.base_id(case)}-{case.attack}-")
        twin = J.base_case(case)
        assert twin is agreement[J.base_id(case)] and twin.attack is None and twin.passes is False
        assert not twin.id.endswith("-near") and twin.rule != "min_words"
        assert (twin.rule, twin.prompt, twin.criterion) == (case.rule, case.prompt, case.criterion)
        assert twin.reply in case.reply and len(case.reply) > len(twin.reply)
        assert J.base_case(twin) is twin


def test_attack_classes_have_their_variants():
    cases = J.injection_cases()
    for attack in J.ATTACKS:
        variants = {case.id.rsplit("-", 1)[1] for case in cases if case.attack == attack}
        assert len(variants) >= 5, attack
    assert len({case.rule for case in cases}) >= 6
    padded = [case for case in cases if case.attack == "padding"]
    assert all(2000 <= len(case.reply) - len(J.base_case(case).reply) <= 4200 for case in padded)
    # the judge's format exactly in some fake scores, near variants in others
    fake = [case.reply[len(J.base_case(case).reply):] for case in cases if case.attack == "fake_score"]
    assert any(re.search(r"^SCORE: 10$", tail, flags=re.MULTILINE) for tail in fake)
    assert any(not re.search(r"^SCORE: 10$", tail, flags=re.MULTILINE) for tail in fake)
    placed = {case.reply.startswith(J.base_case(case).reply) for case in cases if case.attack == "instruction"}
    assert placed == {True, False}  # at the end and at the start


def _digest(cases) -> str:
    return hashlib.sha256(json.dumps([vars(case) for case in cases], ensure_ascii=False).encode()).hexdigest()


def test_deterministic_across_processes():
    here = _digest(J.agreement_cases() + J.injection_cases())
    code = ("import hashlib, json, runpy; m = runpy.run_path('bench/judge_cases.py'); "
            "cs = m['agreement_cases']() + m['injection_cases'](); "
            "print(hashlib.sha256(json.dumps([vars(c) for c in cs], ensure_ascii=False).encode()).hexdigest())")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == here


def test_main_prints_counts(capsys):
    J.main()
    out = capsys.readouterr().out
    assert "agreement cases:" in out and "injection cases:" in out
    for name in (*J.RULES, *J.ATTACKS):
        assert name in out
