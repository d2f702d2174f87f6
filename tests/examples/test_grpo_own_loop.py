"""examples/grpo_own_loop.py's smoke command: SFT warm start, then GRPO steps through the real engine, collector,
reference KL, loss and weight sync, on the tiny model."""

from __future__ import annotations

import math
import re

import pytest

from tests.examples.documented import documented_command, run_example


@pytest.mark.slow
def test_own_loop_warm_starts_then_runs_grpo_steps(tmp_path):
    out = run_example(documented_command("grpo_own_loop.py"), tmp_path)
    sft = [float(loss) for loss in re.findall(r"^sft step \d+: loss ([\d.]+)$", out, re.MULTILINE)]
    assert len(sft) >= 2 and sft[-1] < sft[0] / 4, out  # the worked answers were learned
    steps = re.findall(r"^grpo step (\d+): reward ([\d.]+) \(pass ([\d.]+)\) kl (\S+) loss (\S+) engine v(\d+)$", out,
                       re.MULTILINE)
    assert [int(s[0]) for s in steps] == [1, 2, 3], out
    assert [int(s[5]) for s in steps] == [2, 3, 4]  # one push after SFT, then one per GRPO step
    rewards, kls, losses = ([float(s[i]) for s in steps] for i in (1, 3, 4))
    assert all(0 <= r <= 1 for r in rewards) and sum(rewards) > 0, out  # the warm start makes rewards non-zero
    assert kls[0] == 0.0 and all(math.isfinite(k) and k >= 0 for k in kls)  # the reference is the SFT policy
    assert all(math.isfinite(loss) for loss in losses)
    assert re.search(r"^eval after SFT: greedy reward [\d.]+ on 16 problems", out, re.MULTILINE), out
    assert re.search(r"^eval at the end: greedy reward [\d.]+ \(after SFT [\d.]+\); 3 GRPO steps", out, re.MULTILINE)
