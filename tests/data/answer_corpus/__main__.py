"""``python -m tests.data.answer_corpus OUT_DIR``: write the corpus, one ``<env>.jsonl`` per env."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from tests.data.answer_corpus import ENVS, build

if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "answer_corpus")
    out.mkdir(parents=True, exist_ok=True)
    for env in ENVS:
        items = build(env)
        with open(out / f"{env}.jsonl", "w", encoding="utf-8") as f:
            for item in items:
                f.write(json.dumps(asdict(item), ensure_ascii=False, default=str) + "\n")
        print(f"{env}: {len(items)} replies -> {out / f'{env}.jsonl'}")
