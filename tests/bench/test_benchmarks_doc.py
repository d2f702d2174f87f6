"""docs/benchmarks.md and the README's compact benchmark table are the rendering of bench/results/*.json
(scripts/render_benchmarks.py): what is on disk equals what the records render, every record names its provenance,
the README's table stays short, every benchmark script can write its record, and scripts/learning_record.py builds
the record of a `gym-llm train` run from its folder."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HELPERS = {"_common.py", "judge_cases.py", "torchrl_chat.py"}  # not benchmarks: shared code and data


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


render = load(REPO / "scripts" / "render_benchmarks.py", "render_benchmarks")
learning_record = load(REPO / "scripts" / "learning_record.py", "learning_record")


def test_the_rendered_files_equal_the_records_rendering():
    readme_has_markers = render.BEGIN in (REPO / "README.md").read_text()
    stale = [message for message in render.check(REPO)
             if readme_has_markers or not message.startswith("README.md has no")]
    assert stale == [], "\n".join(stale)


def test_every_record_names_its_command_machine_commit_date_and_source():
    records = render.load_records()
    assert render.problems(records) == []
    for name, record in records.items():
        assert record["rows"], name
        source = record["source"]
        assert source == "run" or source.startswith("transcribed from README.md at "), (name, source)
    kinds = {record["kind"] for record in records.values()}
    assert {"benchmark", "learning", "suite", "judge"} <= kinds


def test_the_readme_table_takes_at_most_twelve_headline_rows_with_a_link_to_the_document():
    records = render.load_records()
    headline = render.headline_rows(records)
    assert 1 <= len(headline) <= render.MAX_HEADLINE_ROWS
    block = render.render_readme_block(records)
    assert block.splitlines()[0] == "| what | ratio vs baseline | machine |"
    assert len([line for line in block.splitlines() if line.startswith("| ")]) == len(headline) + 1
    assert block.rstrip().endswith("[docs/benchmarks.md](docs/benchmarks.md).")


def copy_tree(tmp_path: Path, readme: str) -> Path:
    (tmp_path / "bench").mkdir()
    shutil.copytree(REPO / "bench" / "results", tmp_path / "bench" / "results")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(readme)
    return tmp_path


def test_check_names_the_stale_file_and_the_command_and_write_fills_only_between_the_markers(tmp_path):
    root = copy_tree(tmp_path, "# x\n\nbefore\n<!-- benchmarks:begin -->\nold table\n<!-- benchmarks:end -->\nafter\n")
    assert render.check(root) == ["docs/benchmarks.md is stale: run `python scripts/render_benchmarks.py`",
                                  "docs/learning_runs.md is stale: run `python scripts/render_benchmarks.py`",
                                  "README.md's benchmark table is stale: run `python scripts/render_benchmarks.py`"]
    assert render.write(root) == [] and render.check(root) == []
    readme = (root / "README.md").read_text()
    assert readme.startswith("# x\n\nbefore\n<!-- benchmarks:begin -->\n| what | ratio vs baseline | machine |")
    assert readme.endswith("(docs/benchmarks.md).\n<!-- benchmarks:end -->\nafter\n") and "old table" not in readme
    record = root / "bench" / "results" / "python_tool.json"  # a changed headline figure makes both files stale
    data = json.loads(record.read_text())
    row = next(row for row in data["rows"] if row.get("headline"))
    row["headline_ratio"], row["ratio"] = "changed " + row["headline_ratio"], "changed " + row["ratio"]
    record.write_text(json.dumps(data))
    assert render.check(root) == ["docs/benchmarks.md is stale: run `python scripts/render_benchmarks.py`",
                                  "README.md's benchmark table is stale: run `python scripts/render_benchmarks.py`"]


def test_without_markers_the_readme_is_left_alone_and_check_says_what_to_add(tmp_path):
    root = copy_tree(tmp_path, "# no markers\n")
    assert render.write(root) == []
    assert (root / "README.md").read_text() == "# no markers\n"
    assert render.check(root) == ["README.md has no `<!-- benchmarks:begin -->` … `<!-- benchmarks:end -->` markers "
                                  "for the compact benchmark table: add them, then run "
                                  "`python scripts/render_benchmarks.py`"]


def test_a_record_without_provenance_or_with_too_many_headlines_is_refused():
    base = {"schema": 1, "kind": "benchmark", "title": "t", "command": "c", "machine": "m", "commit": "abc1234",
            "date": "2026-11-29", "source": "run", "rows": [{"what": "w", "headline": True}]}
    assert render.problems({"a": base}) == []
    assert render.problems({"a": {**base, "commit": ""}}) == ["bench/results/a.json lacks commit"]
    assert "source must be" in render.problems({"a": {**base, "source": "memory"}})[0]
    many = {f"r{i}": base for i in range(13)}
    assert render.problems(many) == ["13 headline rows; the README's table takes at most 12"]


def test_every_benchmark_script_can_write_its_record():
    for script in sorted((REPO / "bench").glob("*.py")):
        if script.name in HELPERS or "__main__" not in script.read_text():
            continue
        text = script.read_text()
        assert '"--json"' in text or '"--out"' in text, f"{script.name} has no --json PATH"
        assert "write_record" in text or script.name in {"judge_trust.py", "overlap.py"}, script.name


def test_write_record_refuses_a_record_without_provenance(tmp_path):
    # loaded under its own name: a module called _common left in sys.modules would shadow examples/_common.py for
    # the example tests that run later in the same worker
    spec = importlib.util.spec_from_file_location("bench_common_for_test", REPO / "bench" / "_common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    write_record = common.write_record
    record = {"kind": "benchmark", "title": "t", "command": "c", "machine": "m", "commit": "x", "date": "d",
              "source": "run", "rows": [{"what": "w", "ours": 1.5}]}
    write_record(tmp_path / "sub" / "r.json", record)
    assert json.loads((tmp_path / "sub" / "r.json").read_text()) == {"schema": 1, **record}
    with pytest.raises(ValueError, match="lacks machine"):
        write_record(tmp_path / "bad.json", {**record, "machine": ""})


def fake_run(run_dir: Path) -> None:
    """A run folder as `gym-llm train` leaves it: metrics.jsonl (evaluations and steps) and train.log."""
    run_dir.mkdir()
    rows = [{"step": 0, "eval/episodes": 200.0, "eval/pass_rate": 0.045, "eval/reward_mean": 0.05},
            {"step": 1, "train/step_s": 30.0, "time/rollout_s": 7.0, "time/policy_s": 17.0},
            {"step": 2, "train/step_s": 28.0, "time/rollout_s": 6.0, "time/policy_s": 16.0},
            {"step": 2, "eval/episodes": 200.0, "eval/pass_rate": 0.475, "eval/reward_mean": 0.5},
            {"step": 3, "train/step_s": 29.0, "time/rollout_s": 8.0, "time/policy_s": 18.0},
            {"step": 3, "eval/episodes": 200.0, "eval/pass_rate": 0.62, "eval/reward_mean": 0.63}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run_dir / "train.log").write_text("2026-11-29 10:00:00,123 INFO vllm: starting\nnot a timestamp\n")
    os.utime(run_dir / "metrics.jsonl", (0, __import__("datetime").datetime(2026, 11, 29, 10, 4, 59).timestamp()))


def test_learning_record_builds_a_record_from_a_run_folder(tmp_path):
    fake_run(tmp_path / "run")
    out = tmp_path / "learning_x.json"
    assert learning_record.main([str(tmp_path / "run"), "--config", str(REPO / "examples/configs/smollm2_quick.toml"),
                                 "--json", str(out), "--headline"]) == 0
    record = json.loads(out.read_text())
    assert render.problems({"learning_x": record}) == []
    assert record["kind"] == "learning" and record["source"] == "run" and record["date"] == "2026-11-29 10:00:00"
    assert record["command"].startswith("gym-llm train grpo --config examples/configs/smollm2_quick.toml")
    evals, step, wall = record["rows"]
    assert evals["baseline"] == "4.5% ± 2.9 (step 0, n = 200)"
    assert evals["ours"] == "**62.0% ± 6.7 (step 3, n = 200)** at the end" and "on the way: 47.5%" in evals["other"]
    assert evals["headline"] and evals["headline_ratio"] == "held-out pass rate 4.5% → **62.0%** (n = 200)"
    assert step["ours"] == "29.00 s" and step["other"] == "rollout 7.00 s, policy 17.00 s"
    assert wall["ours"] == "4 min 59 s"
    assert "## Learning runs" in render.render_doc({"learning_x": record}, "docs/learning_runs.md")


@pytest.mark.slow  # trains the tiny model for 2 GRPO steps with vLLM: ~2 minutes on 2 cores
def test_learning_record_reads_a_real_tiny_run(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "learning_tiny.json"
    train = subprocess.run([str(Path(sys.executable).parent / "gym-llm"), "train", "grpo", "--config",
                            "examples/configs/arithmetic_tiny.toml", "--steps", "2", "--sft-warmup-steps", "0",
                            "--eval-episodes", "4", "--out", str(run_dir), "--no-progress"],
                           cwd=REPO, capture_output=True, text=True, timeout=900)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert learning_record.main([str(run_dir), "--config", "examples/configs/arithmetic_tiny.toml", "--json",
                                 str(out)]) == 0
    record = json.loads(out.read_text())
    assert render.problems({"learning_tiny": record}) == []
    evals, step, wall = record["rows"]
    assert "(step 0, n = 4)" in evals["baseline"] and "(step 2, n = 4)" in evals["ours"]
    assert step["what"] == "a training step (median of 2)" and "rollout" in step["other"]
    assert wall["ours"].endswith(" s")


def test_overlap_json_is_read_as_bench_overlap_writes_it():
    """The records bench/overlap.py wrote (tiny and SmolLM2 shapes) render with their ratios, each recomputed here from
    the record's own step times."""
    import json

    for path in sorted((REPO / "bench" / "results").glob("overlap*.json")):
        raw = json.loads(path.read_text())
        record = render.from_overlap(raw)
        assert render.problems({path.stem: record}) == [], path
        rows = {row["what"].split(" (")[0]: row for row in record["rows"]}
        if "async" in raw:
            a = raw["async"]
            assert a["ratio"] == a["async"]["step_s"] / a["sync"]["step_s"]
            assert rows["a GRPO step with `--async-steps 1`"]["ratio"] == f"**{a['ratio']:.2f}x** the synchronous step"
        if "dp" in raw:
            assert raw["dp"]["ratio"] == raw["dp"]["two"]["step_s"] / raw["dp"]["one"]["step_s"]
            assert rows["data parallel, DDP: torchrun 2 ranks x 1 thread"]["ratio"] == f"{raw['dp']['ratio']:.2f}x the step time"
            if "fsdp" in raw["dp"]:
                assert raw["dp"]["ratio_fsdp"] == raw["dp"]["fsdp"]["step_s"] / raw["dp"]["one"]["step_s"]
                assert rows["data parallel, FSDP2: torchrun 2 ranks x 1 thread"]["ratio"] == \
                    f"{raw['dp']['ratio_fsdp']:.2f}x the step time"
        for key in ("trl", "trl_vllm"):
            if key in raw:
                t = raw[key]
                ours, trl = (t[side]["completions"] / t[side]["step_s"] for side in ("ours", "trl"))
                assert abs(t["ratio"] - ours / trl) < 1e-12
                assert f"TRL {t['trl_version']} GRPOTrainer" in render.render_doc({path.stem: record})




def test_a_failed_overlap_row_keeps_its_engine_and_trainer_logs(tmp_path, monkeypatch):
    """bench/overlap.py deletes its temporary run folders; a row that fails keeps its logs where the message says."""
    overlap = load(REPO / "bench" / "overlap.py", "bench_overlap_for_test")
    out = tmp_path / "tmp" / "async"
    out.mkdir(parents=True)
    (out / "engine.log").write_text("ERROR Connection reset by peer\n")
    (out / "train.log").write_text("step 3\n")
    monkeypatch.chdir(tmp_path)
    said = overlap._keep_logs(["--child", "train", "--out", str(out)])
    kept = tmp_path / "overlap-failed-async"
    assert str(kept) in said and "engine.log" in said
    assert (kept / "engine.log").read_text() == "ERROR Connection reset by peer\n"
    assert (kept / "train.log").read_text() == "step 3\n"
    assert overlap._keep_logs(["--child", "trl"]) == ""  # no run folder named: nothing to keep
