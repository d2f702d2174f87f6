"""Render docs/benchmarks.md and the README's compact benchmark table from the records in bench/results/.

Run: ``python scripts/render_benchmarks.py`` (writes both) or ``python scripts/render_benchmarks.py --check`` (exits 1,
naming the stale file and this command, when what is on disk differs from what the records render).

The record schema (one JSON file per benchmark or learning run, ``bench/results/<name>.json``; written by
``bench/_common.py``'s ``write_record``, by ``scripts/learning_record.py``, or by hand when transcribed):

- ``schema``: 1.
- ``kind``: ``"benchmark"`` (throughput and overhead), ``"learning"`` (a training or evaluation run),
  ``"judge"`` or ``"suite"`` (test-suite timings): the document's section.
- ``order``: the record's place in its section (ties: by file name).
- ``title``: the heading.
- ``command``: what was run (``bench/<script>.py`` and its arguments, or the ``gym-llm`` command).
- ``machine``: the CPU (``lscpu``, via ``cpu_paths.describe()``) and GPU, if any; ``machine_short`` optional, for
  the README's table.
- ``commit``, ``date``: the checkout's commit (``+uncommitted`` when dirty) and when it ran.
- ``source``: ``"run"`` (written by the script that measured it) or ``"transcribed from README.md at <commit>"``
  (measured before records existed; copied verbatim from the README of that commit).
- ``rows``: the figures, a list of objects. The usual keys are ``what``, ``command`` (where a row differs from the
  record's), ``ours``, ``baseline``, ``ratio``, ``target`` and ``other`` (other machines, notes); ``columns``, a
  list of ``[key, heading]``, names and orders the table's columns when a record needs others (default:
  :data:`DEFAULT_COLUMNS`; a column no row fills is left out). ``headline: true`` puts a row in the README's compact
  table (at most :data:`MAX_HEADLINE_ROWS` in all records), as ``headline_what`` and ``headline_ratio`` (default:
  ``what`` and ``ratio``).
- ``notes``: markdown under the table (how to read it, what was not measured); optional.
- Optional provenance, shown when present: ``torch``, ``gpu``, ``load_average``; anything else (``figures``: the
  raw numbers a script measured) is kept in the record and not rendered.

Two records predate this schema and are read as they are: ``judge_trust.json`` (``bench/judge_trust.py``) and
``overlap.json`` (``bench/overlap.py``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
# the documents and the record kinds each holds (two files, so neither grows past a screenful of screens)
DOCS = {"docs/benchmarks.md": ("benchmark", "judge"), "docs/learning_runs.md": ("learning", "suite")}
README = ROOT / "README.md"
BEGIN, END = "<!-- benchmarks:begin -->", "<!-- benchmarks:end -->"
COMMAND = "python scripts/render_benchmarks.py"
MAX_HEADLINE_ROWS = 12
REQUIRED = ("kind", "title", "command", "machine", "commit", "date", "source", "rows")
KINDS = {"benchmark": "Throughput and overhead", "learning": "Learning runs", "judge": "Judge trust",
         "suite": "Test-suite timings"}
DEFAULT_COLUMNS = [["what", "what"], ["command", "command"], ["ours", "ours"], ["baseline", "baseline"],
                   ["ratio", "ratio"], ["target", "target"], ["other", "other machines, notes"]]
INTRO = {
    "benchmark": "Each benchmark measures gym-llm and its baseline in the same run, on the same inputs (results are "
                 "checked equal where both compute the same thing); ratios, not absolute times, are what carries "
                 "across machines.",
    "learning": "Held-out pass rates are greedy, with the 95% interval (±) of their sample size; a paired gain "
                "compares the same problems before and after. A run's record comes from its folder: `python "
                "scripts/learning_record.py RUN_DIR --config CONFIG --json bench/results/learning_<name>.json`.",
}


def load_records(results: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every record under ``results``, by file name without ``.json``, in the schema above."""
    records = {}
    for path in sorted(results.glob("*.json")):
        record = json.loads(path.read_text())
        if path.stem == "judge_trust" and "schema" not in record:
            if "injection" in record:
                records["judge_trust.injection"] = from_judge_injection(record)
            record = from_judge_trust(record)
        elif path.stem.startswith("overlap") and "schema" not in record:
            record = from_overlap(record, headline=path.stem == HEADLINE_OVERLAP)
        records[path.stem] = record
    return records


def problems(records: dict[str, dict[str, Any]]) -> list[str]:
    """What is wrong with the records: missing provenance, an unknown kind, too many headline rows."""
    found = []
    for name, record in records.items():
        name = name.split(".")[0]
        missing = [key for key in REQUIRED if record.get(key) in (None, "")]
        if missing:
            found.append(f"bench/results/{name}.json lacks {', '.join(missing)}")
        if record.get("kind") not in KINDS:
            found.append(f"bench/results/{name}.json: kind must be one of {sorted(KINDS)}, got {record.get('kind')!r}")
        source = str(record.get("source", ""))
        if source != "run" and not source.startswith("transcribed from "):
            found.append(f"bench/results/{name}.json: source must be 'run' or 'transcribed from ...', got {source!r}")
    headline = sum(1 for _, row in headline_rows(records))
    if headline > MAX_HEADLINE_ROWS:
        found.append(f"{headline} headline rows; the README's table takes at most {MAX_HEADLINE_ROWS}")
    return found


def ordered(records: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    kinds = list(KINDS)
    return sorted(records.items(), key=lambda item: (kinds.index(item[1]["kind"]) if item[1].get("kind") in kinds
                                                     else len(kinds), item[1].get("order", 0), item[0]))


def headline_rows(records: dict[str, dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(record, row) for _, record in ordered(records) for row in record.get("rows", []) if row.get("headline")]


def cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def table(columns: list[list[str]], rows: list[dict[str, Any]]) -> list[str]:
    used = [(key, heading) for key, heading in columns if any(row.get(key) not in (None, "") for row in rows)]
    lines = ["| " + " | ".join(heading for _, heading in used) + " |", "|" + "---|" * len(used)]
    lines += ["| " + " | ".join(cell(row.get(key)) for key, _ in used) + " |" for row in rows]
    return lines


def render_record(name: str, record: dict[str, Any]) -> list[str]:
    file = name.split(".")[0] + ".json"  # judge_trust.injection comes from judge_trust.json
    source = record["source"]
    if source == "run":
        source = "written by the command above when it ran"
    else:
        source += " (measured before records existed; not re-run since)"
    lines = [f"### {record['title']}", "", f"- command: `{record['command']}`", f"- machine: {record['machine']}"]
    for key in ("gpu", "torch", "load_average"):
        if record.get(key):
            lines.append(f"- {key.replace('_', ' ')}: {record[key]}")
    lines += [f"- commit: {record['commit']}", f"- date: {record['date']}", f"- source: {source}",
              f"- record: [bench/results/{file}](../bench/results/{file})", ""]
    if record["rows"]:
        lines += table(record.get("columns") or DEFAULT_COLUMNS, record["rows"]) + [""]
    if record.get("notes"):
        lines += [record["notes"].strip(), ""]
    return lines


def render_doc(records: dict[str, dict[str, Any]], path: str = "docs/benchmarks.md") -> str:
    """The document ``path`` of :data:`DOCS`: the records of its kinds, grouped by kind."""
    kinds = DOCS[path]
    other = next(p for p in DOCS if p != path)
    title = "Benchmarks" if path == "docs/benchmarks.md" else "Learning runs and test-suite timings"
    lines = [f"# {title}", "",
             f"<!-- Generated by `{COMMAND}` from bench/results/*.json: edit the records, not this file. -->", "",
             "Every number here belongs to a record under `bench/results/` that names its command, machine, commit, "
             "date and source: `run` (the script wrote the record when it measured) or *transcribed* (measured "
             "before records existed, copied verbatim from the README of the commit named; re-running the command "
             "replaces it). The README's compact table is the rows marked as headlines. To measure again: "
             "`python bench/<script>.py ... --json bench/results/<name>.json`, then `" + COMMAND + "`. "
             f"{', '.join(KINDS[k] for k in DOCS[other])}: [{other.split('/')[1]}]({other.split('/')[1]}).", ""]
    for kind in kinds:
        heading = KINDS[kind]
        group = [(name, record) for name, record in ordered(records) if record["kind"] == kind]
        if not group:
            continue
        lines += [f"## {heading}", ""]
        if kind in INTRO:
            lines += [INTRO[kind], ""]
        for name, record in group:
            lines += render_record(name, record)
    return "\n".join(lines).rstrip() + "\n"


def short_machine(record: dict[str, Any]) -> str:
    """``machine_short``, else the GPU where one ran, else the CPU's name and cores from ``cpu_paths.describe()``
    (``"AMD EPYC (2 CPUs; avx2 ...)"`` -> ``"AMD EPYC, 2 cores"``)."""
    if record.get("machine_short"):
        return record["machine_short"]
    if record.get("gpu") not in (None, "", "none"):
        return record["gpu"]
    match = re.match(r"(.+?) \((\d+) CPUs", record["machine"])
    return f"{match.group(1)}, {match.group(2)} cores" if match else record["machine"]


def render_readme_block(records: dict[str, dict[str, Any]]) -> str:
    rows = [{"what": row.get("headline_what") or row.get("what"),
             "ratio": row.get("headline_ratio") or row.get("ratio"), "machine": short_machine(record)}
            for record, row in headline_rows(records)]
    lines = table([["what", "what"], ["ratio", "ratio vs baseline"], ["machine", "machine"]], rows)
    lines += ["", "The full tables, with the command, machine, commit and date of every number: "
                  "[docs/benchmarks.md](docs/benchmarks.md)."]
    return "\n".join(lines) + "\n"


def splice(readme: str, block: str) -> str | None:
    """``readme`` with ``block`` between the markers; None when it lacks them."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        return None
    return readme[:start + len(BEGIN)] + "\n" + block + readme[end:]


def check(root: Path = ROOT) -> list[str]:
    """What is stale or wrong, one message each; empty when the files on disk equal the records' rendering."""
    records = load_records(root / "bench" / "results")
    found = problems(records)
    if found:
        return found
    for path in DOCS:
        doc = root / path
        if not doc.is_file() or doc.read_text() != render_doc(records, path):
            found.append(f"{path} is stale: run `{COMMAND}`")
    readme = (root / "README.md").read_text()
    spliced = splice(readme, render_readme_block(records))
    if spliced is None:
        found.append(f"README.md has no `{BEGIN}` … `{END}` markers for the compact benchmark table: add them, then "
                     f"run `{COMMAND}`")
    elif spliced != readme:
        found.append(f"README.md's benchmark table is stale: run `{COMMAND}`")
    return found


def write(root: Path = ROOT) -> list[str]:
    records = load_records(root / "bench" / "results")
    found = problems(records)
    if found:
        return found
    for path in DOCS:
        (root / path).write_text(render_doc(records, path))
    readme_path = root / "README.md"
    spliced = splice(readme_path.read_text(), render_readme_block(records))
    if spliced is None:
        print(f"README.md has no {BEGIN} / {END} markers: left as it is", file=sys.stderr)
    else:
        readme_path.write_text(spliced)
    return []


def percent(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{100 * value:.{digits}f}%"


def from_judge_trust(raw: dict[str, Any]) -> dict[str, Any]:
    """``bench/judge_trust.py``'s record (agreement with rule-checked labels; prompt-injection attacks) as a record of
    this schema: the columns of docs/judges.md's tables."""
    rows = []
    for variant, r in sorted(raw["agreement"].items()):
        rows.append({"what": variant, "accuracy": percent(r["accuracy"]), "balanced": percent(r["balanced_accuracy"]),
                     "auc": "—" if r["auc"] is None else f"{r['auc']:.2f}", "passes": percent(r["true_pass_rate"]),
                     "fails": percent(r["true_fail_rate"]),
                     "failures": percent(r["failure_rate"], 0), "seconds": f"{r['seconds'] / r['calls']:.2f}"})
    return {"schema": 1, "kind": "judge", "order": 10, "title": f"LLM judge ({raw['judge']}): agreement and injection",
            "command": raw["command"], "machine": raw["machine"], "commit": raw["commit"], "date": raw["date"],
            "source": "run", "rows": rows,
            "columns": [["what", "rubric variant"], ["accuracy", "accuracy"], ["balanced", "balanced"], ["auc", "AUC"],
                        ["passes", "passes judged pass"], ["fails", "fails judged fail"],
                        ["failures", "judge failures"], ["seconds", "s / reply"]],
            "notes": "Agreement rows: the judge's verdict (a reward >= 0.5) against rule-checked labels on the same "
                     "replies; AUC is the chance a passing reply scores above a failing one (0.5 is chance). "
                     "Method and reading: [docs/judges.md](judges.md#how-far-this-judge-can-be-trusted-measured)."}


def from_judge_injection(raw: dict[str, Any]) -> dict[str, Any]:
    """The prompt-injection part of ``bench/judge_trust.py``'s record, one row per set of defences."""
    attacks = sorted({attack for cells in raw["injection"].values() for attack in cells if not attack.startswith("_")})
    rows = []
    for defences, cells in sorted(raw["injection"].items()):
        row = {"what": defences, "clean": percent(cells.get("_clean_false_pass_rate"), 0)}
        for attack in attacks:
            a = cells.get(attack)
            row[attack] = ("—" if a is None else f"{a['judge_failures']} of {a['n']} judge failures"
                           if a["mean_inflation"] is None else
                           f"{a['mean_inflation']:+.2f} / {percent(a['false_pass_rate'], 0)}")
        rows.append(row)
    return {"schema": 1, "kind": "judge", "order": 20, "title": f"LLM judge ({raw['judge']}): prompt injection",
            "command": raw["command"], "machine": raw["machine"], "commit": raw["commit"], "date": raw["date"],
            "source": "run", "rows": rows,
            "columns": [["what", "defences, output"], *[[attack, attack.replace("_", " ")] for attack in attacks],
                        ["clean", "clean fails judged pass"]],
            "notes": "Each attack cell: mean inflation `score(attacked) - score(clean)` on the 0-10 scale / share of "
                     "attacked replies judged to pass (every one fails its rule); 0-10 rubric with reasoning."}


# the overlap record whose async row the README's compact table shows (the realistic shape where generation and
# training are closest to balanced); a presentation choice, the records stay as bench/overlap.py wrote them
HEADLINE_OVERLAP = "overlap_smollm2_long"


def from_overlap(raw: dict[str, Any], *, headline: bool = False) -> dict[str, Any]:
    """``bench/overlap.py``'s record (rollouts overlapped with training, data parallel, against TRL) in this schema."""
    rows = []
    model = raw.get("model", "tiny")
    shape = (f"{raw.get('num_tasks', '?')} groups x {raw.get('group_size', '?')}, {raw.get('max_new_tokens', '?')} new "
             f"tokens, {model}")
    if "async" in raw:
        a = raw["async"]
        rows.append({"what": f"a GRPO step with `--async-steps 1` ({shape}; engine on core 0, trainer on core 1)",
                     "ours": f"{a['async']['step_s']:.2f} s/step (waiting for the batch "
                             f"{a['async']['phases'].get('rollout', 0.0):.2f} s)",
                     "baseline": f"synchronous, same cores: {a['sync']['step_s']:.2f} s/step (rollout "
                                 f"{a['sync']['phases'].get('rollout', 0.0):.2f} s)",
                     "ratio": f"**{a['ratio']:.2f}x** the synchronous step", "target": "≤ 0.8x",
                     "other": f"ideal max(generate, train) / sum: {a['ideal']:.2f}x",
                     "headline": headline,
                     "headline_what": f"GRPO step with rollouts overlapped (`--async-steps 1`), {model}",
                     "headline_ratio": f"**{a['ratio']:.2f}x** the synchronous step (engine and trainer on a core each)"})
    if "dp" in raw:
        d = raw["dp"]  # records before FSDP2 was added hold the DDP row only
        for key, ratio, sharding in (("two", "ratio", "DDP"), ("fsdp", "ratio_fsdp", "FSDP2")):
            if key in d:
                held = d[key].get("policy_state_bytes")  # recorded from the FSDP2 stop on
                memory = "" if held is None else (
                    f"; policy weights + AdamW state per rank {held / 2**20:.1f} MiB (one process "
                    f"{d['one']['policy_state_bytes'] / 2**20:.1f} MiB), peak RSS {d[key]['peak_rss_bytes'] / 2**20:.0f} MiB")
                rows.append({"what": f"data parallel, {sharding}: torchrun 2 ranks x 1 thread ({shape}, engine hf)",
                             "ours": f"{d[key]['step_s']:.2f} s/step{memory}",
                             "baseline": f"1 process x 2 threads: {d['one']['step_s']:.2f} s/step",
                             "ratio": f"{d[ratio]:.2f}x the step time"})
    for key, label in (("trl", "transformers generation"), ("trl_vllm", "vLLM in-process (TRL: colocate)")):
        if key in raw:
            t = raw[key]
            ours_cps = t["ours"]["completions"] / t["ours"]["step_s"]
            trl_cps = t["trl"]["completions"] / t["trl"]["step_s"]
            rows.append({"what": f"the same GRPO step, {label} on both sides ({shape}): completions/s",
                         "ours": f"{ours_cps:.1f}/s ({t['ours']['step_s']:.2f} s/step)",
                         "baseline": f"TRL {t['trl_version']} GRPOTrainer {trl_cps:.1f}/s ({t['trl']['step_s']:.2f} s/step)",
                         "ratio": f"{t['ratio']:.2f}x"})
    return {"schema": 1, "kind": "benchmark", "order": 125 if model == "tiny" else 126,
            "title": f"Data parallel, DDP and FSDP2 ({model})" if set(raw) & {"async", "dp", "trl", "trl_vllm"} == {"dp"}
            else f"Rollouts overlapped with training, data parallel, TRL's step ({model})",
            "command": raw["command"], "machine": raw["machine"], "commit": raw["commit"], "date": raw["date"],
            "source": "run", "rows": rows,
            **{key: raw[key] for key in ("torch", "gpu", "load_average") if key in raw}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a rendered file is stale; write nothing")
    args = parser.parse_args(argv)
    found = check() if args.check else write()
    for message in found:
        print(message, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
