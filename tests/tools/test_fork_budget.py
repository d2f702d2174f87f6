"""What a family of copy-on-write copies may take from the host (docs/security.md, class 6).

A REPL and its copy-on-write copies share one sandbox. Where a memory cgroup exists, the kernel counts their pages
together in the sandbox's cgroup. Where none does (an unprivileged host; ``cgroups="off"``), each copy would get its
own full ``RLIMIT_AS``: eight copies of a 128 MiB REPL could hold a gigabyte. There the family is charged what each
member can take (``memory_limit_mb + scratch_size_mb``) against ``family_memory_mb``, and forks past it are refused.
And a copy's scratch dir costs what the parent's holds: sparse files are copied as holes, not written out in full.

Runs as the user running the suite (with ``cgroups="off"``) and again as uid 65534 (``test_sandbox_unprivileged.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gym_llm.core.episode import ForkError
from gym_llm.tools import PythonTool
from gym_llm.tools.base import ToolCall
from gym_llm.tools.sandbox.process import pidfd_pid

MEMORY_MB, SCRATCH_MB = 128, 8
HOLD_MB = 96  # what each member writes: well inside its own limit


def call(session, code: str):
    return session.run(ToolCall("python", {"code": code}))


def _rss_mb(session) -> float:
    pid = pidfd_pid(session._channel.pidfd)
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture(scope="module")
def tool():
    tool = PythonTool(min_idle=0, cgroups="off", memory_limit_mb=MEMORY_MB, scratch_size_mb=SCRATCH_MB,
                      timeout_s=30.0)
    tool.attach()
    yield tool
    tool.detach()


def test_a_family_without_a_memory_cgroup_stays_within_its_budget(tool):
    """Eight forks of a REPL, each then writing 96 MiB: only as many copies as the budget holds (a REPL and three:
    4 x (128 + 8) MiB by default) share the sandbox; the others re-run the calls in fresh sandboxes, each bounded
    like any episode. The family's resident memory stays within the budget (at 7b432b8 all eight were copies)."""
    assert "cgroup" not in tool.limits["memory"].replace("cgroups='off'", "")
    budget_mb = 4 * (MEMORY_MB + SCRATCH_MB)  # the default family_memory_mb
    root = tool.open_session()
    siblings = []
    try:
        assert call(root, "base = 6").status == "ok"
        siblings = [root.fork() for _ in range(8)]
        copies = [s for s in siblings if s.forked_by == "copy"]
        assert len(copies) == budget_mb // (MEMORY_MB + SCRATCH_MB) - 1 == 3, [s.forked_by for s in siblings]
        assert tool.config.family_budget_mb == budget_mb
        hold = f"held = bytearray(b'\\x01') * ({HOLD_MB} << 20)\nprint(base * 7)"
        for session in [root, *siblings]:
            result = call(session, hold)
            assert (result.status, result.content) == ("ok", "42\n"), result.content
        family_mb = sum(_rss_mb(s) for s in [root, *copies])
        assert family_mb <= budget_mb, f"the family holds {family_mb:.0f} MiB, over its {budget_mb} MiB budget"
        assert family_mb >= 4 * HOLD_MB  # (each member really holds its memory: the check measures something)
    finally:
        for session in siblings:
            session.close()
        root.close()


def test_a_copy_past_the_budget_is_refused_when_only_copies_will_do():
    tool = PythonTool(min_idle=0, cgroups="off", memory_limit_mb=MEMORY_MB, scratch_size_mb=SCRATCH_MB,
                      family_memory_mb=2 * (MEMORY_MB + SCRATCH_MB), fork="copy")
    tool.attach()
    root = tool.open_session()
    try:
        assert call(root, "x = 1").status == "ok"
        first = root.fork()
        assert first.forked_by == "copy"
        with pytest.raises(ForkError, match="family's memory budget is spent"):
            root.fork()
        first.close()  # its share comes back
        again = root.fork()
        assert again.forked_by == "copy" and call(again, "x + 1").content.strip() == "2"
        again.close()
    finally:
        root.close()
        tool.detach()


def test_sparse_scratch_files_are_copied_as_holes(tool):
    """Four sparse 15 MiB files in an 8 MiB scratch dir: a copy holds them with the same sizes and bytes, using no
    more space than the parent (they were written out in full, which does not fit: the fork fell back to
    re-running the calls)."""
    root = tool.open_session()
    copy = None
    try:
        make = ("import os\nfor i in range(4):\n    with open(f'sparse{i}', 'wb') as f:\n"
                "        f.truncate(15 << 20)\n        f.seek(7 << 20)\n        f.write(b'mid%d' % i)\n"
                "        f.seek((15 << 20) - 3)\n        f.write(b'end')\nprint('made')")
        assert call(root, make).content == "made\n"
        copy = root.fork()
        assert copy.forked_by == "copy"
        check = ("import os\nout = []\nfor i in range(4):\n    data = open(f'sparse{i}', 'rb').read()\n"
                 "    out.append((len(data), data[7 << 20:(7 << 20) + 4], data[-3:], data.count(0) == len(data) - 7,"
                 " os.stat(f'sparse{i}').st_blocks * 512 < (1 << 20)))\nprint(out)")
        expected = str([(15 << 20, f"mid{i}".encode(), b"end", True, True) for i in range(4)])
        assert call(copy, check).content.strip() == expected
        assert call(root, check).content.strip() == expected
    finally:
        if copy is not None:
            copy.close()
        root.close()
