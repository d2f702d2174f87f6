"""One self-contained HTML report of a training run: ``gym-llm view RUN_DIR`` (:func:`write_report`).

It reads what ``gym-llm train`` writes into its ``--out`` folder and needs nothing else (no network, no server,
no JavaScript libraries): the page opens from disk.

* **Curves** (``metrics.jsonl``): training reward, held-out pass rate, KL to the reference, loss and tokens/s
  against the step, drawn as inline SVG.
* **Held-out answers, before and after** (``eval/step-NNNNNN.jsonl``, written at every evaluation): the first and
  the last evaluation side by side, task by task (matched by prompt), filterable to the tasks that changed.
* **Episodes** (``rollouts.jsonl``): up to ``max_episodes`` training episodes spread evenly over the run, in a
  table filterable by reward, truncation and text. Opening a row shows the whole episode token by token, coloured
  by the policy mask (sampled tokens; the prompt; env/tool turns after it), with each sampled token's log-prob on
  hover, the tool calls and results, and how it ended. Tokens are decoded with the run's own tokenizer (the
  newest checkpoint's ``tokenizer.json``); without one the episode is shown turn by turn from the recorded text.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any, Iterable

__all__ = ["write_report", "CURVES"]

#: (metric key, title) of the curves drawn, in order; a metric the run did not log is skipped.
CURVES = (
    ("train/reward_mean", "training reward (mean)"),
    ("eval/pass_rate", "held-out pass rate"),
    ("train/kl", "KL to the reference (per token)"),
    ("train/loss", "loss"),
    ("collector/tokens_per_s", "rollout tokens/s"),
)


def write_report(run_dir: str | Path, out: str | Path | None = None, *, max_episodes: int = 2000) -> Path:
    """Write the report of the run in ``run_dir`` to ``out`` (default ``run_dir/report.html``); returns its path.

    Raises ``FileNotFoundError`` when ``run_dir`` holds neither ``metrics.jsonl`` nor ``rollouts.jsonl``.
    """
    run_dir = Path(run_dir)
    metrics_path, rollouts_path = run_dir / "metrics.jsonl", run_dir / "rollouts.jsonl"
    if not metrics_path.exists() and not rollouts_path.exists():
        raise FileNotFoundError(
            f"{run_dir} holds no metrics.jsonl or rollouts.jsonl: expected the --out folder of `gym-llm train`.")
    if max_episodes < 0:
        raise ValueError(f"max_episodes must be >= 0; got {max_episodes}.")
    rows = _read_jsonl(metrics_path) if metrics_path.exists() else []
    decode = _token_decoder(run_dir)
    evals = sorted((run_dir / "eval").glob("step-*.jsonl"))
    before_after = _before_after(evals) if evals else None
    total, episodes = _sample_episodes(rollouts_path, max_episodes, decode) if rollouts_path.exists() else (0, [])
    page = _page(run_dir, rows, before_after, total, episodes, tokens=decode is not None)
    out = Path(out) if out is not None else run_dir / "report.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


# ------------------------------------------------------------------------------------------------ reading
def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut by a crash: the rest is still worth showing
                    continue
    return rows


def _records(path: Path) -> Iterable[dict[str, Any]]:
    from gym_llm_adapters.rollout_io import iter_rollouts, record_to_dict

    for record in iter_rollouts(path):
        data = record_to_dict(record)
        if data.get("kind") == "trajectory":
            yield data


def _token_decoder(run_dir: Path):
    """``ids -> list of token strings`` from the newest checkpoint's tokenizer, or None."""
    candidates = sorted((run_dir / "checkpoints").glob("*/tokenizer.json"))
    if not candidates:
        return None
    try:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(candidates[-1]))
    except Exception:  # an unreadable tokenizer: fall back to the recorded text
        return None
    cache: dict[int, str] = {}

    def decode(ids: list[int]) -> list[str]:
        out = []
        for i in ids:
            if i not in cache:
                cache[i] = tokenizer.decode([i], skip_special_tokens=False)
            out.append(cache[i])
        return out

    return decode


def _answer(data: dict[str, Any]) -> str:
    return "".join(step.get("completion_text") or "" for step in data.get("steps", []))


def _prompt(data: dict[str, Any]) -> str:
    steps = data.get("steps") or [{}]
    return steps[0].get("prompt_text") or ""


def _before_after(paths: list[Path]) -> dict[str, Any]:
    first, last = paths[0], paths[-1]
    step_of = lambda p: int(p.stem.split("-")[1])  # noqa: E731
    # An evaluation runs the same task list every time: pair by position (a task drawn twice stays two rows); a
    # position whose prompt differs (the eval set changed between runs) falls back to the prompt's first match.
    earlier = list(_records(first))
    by_prompt = {}
    for d in earlier:
        by_prompt.setdefault(_prompt(d), d)
    pairs = []
    for index, d in enumerate(_records(last)):
        b = earlier[index] if index < len(earlier) and _prompt(earlier[index]) == _prompt(d) else by_prompt.get(_prompt(d))
        if b is None:
            continue
        pairs.append({"prompt": _prompt(d), "before": _answer(b), "before_reward": float(sum(b["rewards"])),
                      "after": _answer(d), "after_reward": float(sum(d["rewards"]))})
    return {"before_step": step_of(first), "after_step": step_of(last), "pairs": pairs,
            "steps": [step_of(p) for p in paths]}


def _sample_episodes(path: Path, limit: int, decode) -> tuple[int, list[dict[str, Any]]]:
    total = sum(1 for _ in _records(path))
    if total == 0 or limit == 0:
        return total, []
    keep = {math.floor(i * total / min(limit, total)) for i in range(min(limit, total))}
    episodes = []
    for index, data in enumerate(_records(path)):
        if index in keep:
            episodes.append(_episode(index, data, decode))
    return total, episodes


def _json_value(value: Any) -> Any:
    """Records keep ``info`` (and the tool envs their ``tool_calls``) as JSON text: the parsed value."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _episode(index: int, data: dict[str, Any], decode) -> dict[str, Any]:
    steps = data.get("steps", [])
    versions = data.get("versions") or [-1]
    calls = []
    for turn, step in enumerate(steps, 1):  # the tool envs' per-turn record (name, code, status, duration)
        info = _json_value(step.get("info")) or {}
        if isinstance(info, dict) and info.get("tool_calls"):
            calls.append({"turn": turn, "tool_calls": _json_value(info["tool_calls"])})
    episode = {
        "i": index, "version": int(min(versions)), "task": data.get("task_id"), "group": data.get("group_id"),
        "reward": round(float(sum(data.get("rewards") or [0.0])), 4), "turns": len(steps),
        "truncated": bool(data.get("truncated")), "tokens": len(data.get("token_ids") or []),
        "policy": int(sum(data.get("policy_mask") or [])), "prompt": _prompt(data)[-300:],
        "answer": _answer(data), "finish": steps[-1].get("finish_reason") if steps else None, "tools": calls,
    }
    if decode is not None and data.get("token_ids"):
        ids, mask = data["token_ids"], data["policy_mask"]
        logprobs = data.get("logprobs") or [0.0] * len(ids)
        prompt_length = int(data.get("prompt_length") or 0)
        # kind per token: 1 sampled (policy mask), 0 the first prompt, 2 env/tool tokens after it
        kinds = [1 if m else (0 if t < prompt_length else 2) for t, m in enumerate(mask)]
        episode["tok"] = decode(ids)
        episode["kind"] = kinds
        episode["lp"] = [round(float(lp), 3) if m else None for lp, m in zip(logprobs, mask)]
    else:
        episode["turn_text"] = [[s.get("prompt_text") or "", s.get("completion_text") or ""] for s in steps]
    return episode


# ------------------------------------------------------------------------------------------------ drawing
def _svg_chart(title: str, points: list[tuple[float, float]], width: int = 360, height: int = 200) -> str:
    """A line chart of ``(step, value)`` points as an inline SVG (axes labelled with the ranges)."""
    left, right, top, bottom = 60, 10, 24, 28
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def sy(y: float) -> float:
        return height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)

    line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    dots = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5"/>' for x, y in points) if len(points) <= 40 else ""
    fmt = _tick
    return (
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{html.escape(title)}"><text x="{left}" y="15" class="title">{html.escape(title)}</text>'
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" class="axis"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" class="axis"/>'
        f'<text x="{left - 4}" y="{sy(y1) + 4:.1f}" class="tick" text-anchor="end">{fmt(y1)}</text>'
        f'<text x="{left - 4}" y="{sy(y0) + 4:.1f}" class="tick" text-anchor="end">{fmt(y0)}</text>'
        f'<text x="{left}" y="{height - 10}" class="tick">{fmt(x0)}</text>'
        f'<text x="{width - right}" y="{height - 10}" class="tick" text-anchor="end">step {fmt(x1)}</text>'
        f'<polyline points="{line}" class="line"/>{dots}</svg>'
    )


def _tick(value: float) -> str:
    """A short axis label: ``12.3k``, ``0.95``, ``3e-05``."""
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value / 1000:.3g}k"
    if abs(value) < 1e-3:
        return f"{value:.0e}"
    return f"{value:.3g}"


def _curves(rows: list[dict[str, Any]]) -> str:
    charts = []
    for key, title in CURVES:
        points = [(float(r["step"]), float(r[key])) for r in rows
                  if key in r and "step" in r and isinstance(r[key], (int, float)) and math.isfinite(r[key])]
        if points:
            charts.append(_svg_chart(title, points))
    return "".join(charts) or "<p>No metrics logged yet.</p>"


def _page(run_dir: Path, rows, before_after, total: int, episodes: list[dict[str, Any]], *, tokens: bool) -> str:
    data = {"episodes": episodes, "before_after": before_after, "tokens": tokens}
    blob = json.dumps(data, ensure_ascii=True).replace("</", "<\\/")  # safe inside <script>
    evals = ""
    if before_after is not None:
        pairs = before_after["pairs"]
        changed = sum(p["before_reward"] != p["after_reward"] for p in pairs)
        mean = lambda k: sum(p[k] for p in pairs) / max(len(pairs), 1)  # noqa: E731
        evals = (
            f'<h2>Held-out answers: step {before_after["before_step"]} vs step {before_after["after_step"]}</h2>'
            f'<p id="eval-summary">{len(pairs)} tasks (evaluations at steps '
            f'{", ".join(map(str, before_after["steps"]))}); mean reward {mean("before_reward"):.3f} &rarr; '
            f'{mean("after_reward"):.3f}; {changed} changed.</p>'
            '<label>show <select id="eval-filter"><option value="all">all tasks</option>'
            '<option value="improved">improved</option><option value="regressed">regressed</option>'
            '<option value="same">unchanged</option></select></label>'
            '<table id="evals"><thead><tr><th>prompt</th><th>before</th><th>r</th><th>after</th><th>r</th></tr>'
            '</thead><tbody></tbody></table>'
        )
    title = f"gym-llm run {run_dir.resolve().name}"
    shown = f"{len(episodes)} of {total} training episodes" + (" (spread evenly over the run)" if total > len(episodes) else "")
    return _TEMPLATE.format(title=html.escape(title), curves=_curves(rows), evals=evals, shown=html.escape(shown),
                            data=blob)


_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<style>
body {{ font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }}
.charts {{ display: flex; flex-wrap: wrap; gap: 12px; }}
.chart .axis {{ stroke: #999; }} .chart .line {{ fill: none; stroke: #1f77b4; stroke-width: 1.8; }}
.chart circle {{ fill: #1f77b4; }} .chart .title {{ font-weight: 600; font-size: 13px; }} .chart .tick {{ font-size: 11px; fill: #555; }}
table {{ border-collapse: collapse; width: 100%; margin-top: .5em; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 3px 6px; text-align: left; vertical-align: top; }}
tr.ep {{ cursor: pointer; }} tr.ep:hover {{ background: #f4f7fb; }}
td.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
td.answer {{ max-width: 60ch; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }}
pre, .toks {{ white-space: pre-wrap; font: 12px ui-monospace, monospace; margin: 0; }}
.k0 {{ color: #666; }} .k1 {{ background: #d9f2d9; }} .k2 {{ background: #dde8fb; }}
.good {{ color: #16794a; }} .bad {{ color: #b3261e; }}
.filters label {{ margin-right: 1em; }}
</style></head><body>
<h1>{title}</h1>
<h2>Curves</h2><div class="charts">{curves}</div>
{evals}
<h2>Episodes</h2>
<p>{shown}. Click a row for the whole episode:
<span class="k0">prompt</span>, <span class="k1">sampled tokens (policy mask)</span>, <span class="k2">env / tool turns</span>.</p>
<div class="filters">
<label>reward &ge; <input id="min-reward" type="number" step="any"></label>
<label>reward &le; <input id="max-reward" type="number" step="any"></label>
<label><input id="only-truncated" type="checkbox"> truncated only</label>
<label>text <input id="search" type="search" placeholder="in prompt or answer"></label>
<span id="count"></span></div>
<table id="episodes"><thead><tr><th>#</th><th>version</th><th>task</th><th>reward</th><th>turns</th><th>tokens</th>
<th>sampled</th><th>end</th><th>answer</th></tr></thead><tbody></tbody></table>
<script type="application/json" id="data">{data}</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const el = (tag, attrs, text) => {{ const e = document.createElement(tag); Object.assign(e, attrs || {{}});
  if (text !== undefined) e.textContent = text; return e; }};
function episodeDetail(ep) {{
  const box = el("div");
  if (ep.tok) {{
    const toks = el("div", {{className: "toks"}});
    ep.tok.forEach((t, i) => {{ const s = el("span", {{className: "k" + ep.kind[i]}}, t);
      if (ep.lp[i] !== null) s.title = "log-prob " + ep.lp[i]; toks.appendChild(s); }});
    box.appendChild(toks);
  }} else {{
    ep.turn_text.forEach(([p, c]) => {{ const pre = el("pre");
      pre.appendChild(el("span", {{className: "k0"}}, p)); pre.appendChild(el("span", {{className: "k1"}}, c));
      box.appendChild(pre); }});
  }}
  if (ep.tools.length) box.appendChild(el("pre", {{}}, "tools: " + JSON.stringify(ep.tools, null, 1)));
  return box;
}}
function renderEpisodes() {{
  const tbody = document.querySelector("#episodes tbody");
  for (const ep of DATA.episodes) {{
    const tr = el("tr", {{className: "ep"}});
    tr.dataset.reward = ep.reward; tr.dataset.truncated = ep.truncated;
    tr.dataset.text = (ep.prompt + "\\n" + ep.answer).toLowerCase();
    const end = ep.truncated ? "truncated" : (ep.finish || "done");
    for (const [v, num] of [[ep.i, 1], [ep.version, 1], [ep.task, 1], [ep.reward, 1], [ep.turns, 1], [ep.tokens, 1],
                             [ep.policy, 1], [end, 0], [ep.answer.slice(0, 120), 0]]) {{
      tr.appendChild(el("td", {{className: num ? "num" : "", title: num ? "" : String(v)}}, String(v))); }}
    tr.lastChild.className = "answer";
    const detail = el("tr", {{className: "detail", hidden: true}});
    const td = el("td", {{colSpan: 9}}); detail.appendChild(td);
    tr.addEventListener("click", () => {{ if (!td.firstChild) td.appendChild(episodeDetail(ep));
      detail.hidden = !detail.hidden; }});
    tbody.appendChild(tr); tbody.appendChild(detail);
  }}
}}
function applyFilters() {{
  const lo = parseFloat(document.getElementById("min-reward").value);
  const hi = parseFloat(document.getElementById("max-reward").value);
  const trunc = document.getElementById("only-truncated").checked;
  const q = document.getElementById("search").value.toLowerCase();
  let shown = 0;
  for (const tr of document.querySelectorAll("#episodes tr.ep")) {{
    const r = parseFloat(tr.dataset.reward);
    const ok = !(r < lo) && !(r > hi) && (!trunc || tr.dataset.truncated === "true") && tr.dataset.text.includes(q);
    tr.hidden = !ok; if (!ok) tr.nextSibling.hidden = true; shown += ok;
  }}
  document.getElementById("count").textContent = shown + " shown";
}}
function renderEvals() {{
  const ba = DATA.before_after; if (!ba) return;
  const tbody = document.querySelector("#evals tbody");
  for (const p of ba.pairs) {{
    const tr = el("tr");
    tr.dataset.change = p.after_reward > p.before_reward ? "improved" : p.after_reward < p.before_reward ? "regressed" : "same";
    tr.appendChild(el("td", {{}}, "")).appendChild(el("pre", {{}}, p.prompt.slice(-400)));
    tr.appendChild(el("td", {{}}, "")).appendChild(el("pre", {{}}, p.before));
    tr.appendChild(el("td", {{className: "num " + (p.before_reward > 0 ? "good" : "bad")}}, String(p.before_reward)));
    tr.appendChild(el("td", {{}}, "")).appendChild(el("pre", {{}}, p.after));
    tr.appendChild(el("td", {{className: "num " + (p.after_reward > 0 ? "good" : "bad")}}, String(p.after_reward)));
    tbody.appendChild(tr);
  }}
  document.getElementById("eval-filter").addEventListener("change", e => {{
    for (const tr of tbody.rows) tr.hidden = e.target.value !== "all" && tr.dataset.change !== e.target.value; }});
}}
renderEpisodes(); renderEvals(); applyFilters();
for (const id of ["min-reward", "max-reward", "only-truncated", "search"])
  document.getElementById(id).addEventListener("input", applyFilters);
</script></body></html>
"""
