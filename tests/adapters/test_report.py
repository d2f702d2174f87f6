"""`gym-llm view`: the HTML report of a real (tiny) training run, loaded in headless Chromium with no network."""

from __future__ import annotations

import json
import os

import pytest

import gym_llm  # noqa: F401
from gym_llm_adapters.report import write_report
from gym_llm_adapters.rollout_io import read_rollouts
from gym_llm_adapters.training import TrainConfig, Trainer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("view") / "run"
    cfg = TrainConfig(algorithm="grpo", env_id="LLMGSM8K-v0", model="tiny", out_dir=out, engine="hf", device="cpu",
                      env_kwargs={"source": "arithmetic", "max_operand": 9, "prompt_template": "{question}"},
                      sft_warmup_steps=3, sft_learning_rate=2e-3, learning_rate=3e-4, steps=5, num_tasks=2,
                      group_size=4, max_new_tokens=16, max_seq_len=96, eval_every=0, eval_episodes=12,
                      save_every=100, progress=False)
    with Trainer(cfg) as trainer:
        trainer.run()
    return out


def test_trainer_writes_each_evaluation(run_dir) -> None:
    evals = sorted((run_dir / "eval").glob("step-*.jsonl"))
    # before step 1, where the 3 SFT steps end, after the last GRPO step
    assert [p.name for p in evals] == ["step-000000.jsonl", "step-000003.jsonl", "step-000008.jsonl"]
    assert all(len(read_rollouts(p)) == 12 for p in evals)


def test_cli_writes_a_report_and_says_what_is_wrong(run_dir, tmp_path, capsys) -> None:
    from gym_llm_adapters.cli import main

    assert main(["view", str(run_dir), "--out", str(tmp_path / "r.html"), "--max-episodes", "7"]) == 0
    assert "wrote" in capsys.readouterr().out
    page = (tmp_path / "r.html").read_text()
    data = json.loads(page.split('<script type="application/json" id="data">')[1].split("</script>")[0])
    assert len(data["episodes"]) == 7 and data["tokens"] is True
    assert main(["view", str(tmp_path / "nothing")]) == 2
    assert "no metrics.jsonl or rollouts.jsonl" in capsys.readouterr().err


def test_report_loads_offline_and_filters_by_reward(run_dir, tmp_path) -> None:
    from playwright.sync_api import sync_playwright  # the [browser] extra, in [dev]: a missing one fails here

    from gym_llm.tools.browser.config import find_chromium

    page_path = write_report(run_dir, tmp_path / "report.html")
    episodes = read_rollouts(run_dir / "rollouts.jsonl")
    requests = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium(None), args=["--no-sandbox"] if os.geteuid() == 0 else [])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.as_uri())
            assert not errors
            assert requests == [page_path.as_uri()]  # nothing else fetched: self-contained
            assert page.locator("svg.chart").count() >= 3  # reward, pass rate, loss at least
            rows = page.locator("#episodes tr.ep")
            assert rows.count() == len(episodes)  # fewer than --max-episodes: every one
            shot = page.screenshot(full_page=False)
            assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000
            assert page.locator("#episodes").is_visible()

            passed = sum(t.reward >= 1.0 for t in episodes)
            page.fill("#min-reward", "1")
            assert page.locator("#episodes tr.ep:not([hidden])").count() == passed
            assert page.locator("#count").inner_text() == f"{passed} shown"
            page.fill("#min-reward", "")
            page.fill("#max-reward", "0")
            assert page.locator("#episodes tr.ep:not([hidden])").count() == len(episodes) - passed
            page.fill("#max-reward", "")

            # an episode opens token by token: sampled tokens marked, and they spell the recorded completion
            first = rows.nth(0)
            first.click()
            detail = page.locator("#episodes tr.detail").nth(0)
            assert detail.is_visible()
            sampled = "".join(detail.locator("span.k1").all_inner_texts())
            completion = episodes[0].steps[0].completion_text
            assert sampled.replace("\n", "").strip() == completion.replace("\n", "").strip()
            assert detail.locator("span.k0").count() == episodes[0].prompt_length

            # held-out answers: before/after table with one row per evaluated task
            assert page.locator("#evals tbody tr").count() == 12
            page.select_option("#eval-filter", "improved")
            improved = page.locator("#evals tbody tr:not([hidden])").count()
            page.select_option("#eval-filter", "regressed")
            regressed = page.locator("#evals tbody tr:not([hidden])").count()
            page.select_option("#eval-filter", "same")
            assert improved + regressed + page.locator("#evals tbody tr:not([hidden])").count() == 12
        finally:
            browser.close()
