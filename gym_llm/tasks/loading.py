"""Loading task records from a list, a local file, a ``datasets`` dataset or the Hugging Face hub."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = ["load_records", "read_jsonl", "load_hub_dataset", "records_from_source", "hub_unreachable",
           "HUB_PROBE_TIMEOUT_S"]

PathLike = str | os.PathLike


_TASK_FILE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet")


def _require_file(path: Path, kind: str) -> None:
    """Raise ``FileNotFoundError`` unless ``path`` is a file (``kind``: e.g. ``".jsonl"``); the message
    says what to pass instead."""
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix.lower() in _TASK_FILE_SUFFIXES and p.is_file())
        example = repr(str(path / (inside[0] if inside else f"<name>{kind.split()[0]}")))
        holds = f" (it holds {', '.join(inside[:5])}{', ...' if len(inside) > 5 else ''})" if inside else ""
        raise FileNotFoundError(
            f"{str(path)!r} is a directory, not a task file{holds}. Pass the path of a {kind} file in it, "
            f"e.g. {example}, or a list of such paths."
        )
    if not path.is_file():
        raise FileNotFoundError(f"Task file not found: {str(path)!r}. Pass the path of an existing {kind} file.")


def read_jsonl(path: PathLike) -> list[dict[str, Any]]:
    """Records of a JSON-lines file (one JSON object per line; blank lines skipped).

    Raises:
        FileNotFoundError: the file does not exist or is a directory (the message says what to pass instead).
        ValueError: a line is not a JSON object (the message names the line).
    """
    path = Path(path)
    _require_file(path, ".jsonl")  # one JSON object per line
    records = []
    try:
        with path.open("r", encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{number}: not valid JSON ({e.msg}); each line must be one JSON object.") from e
                if not isinstance(record, dict):
                    raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}.")
                records.append(record)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e}); pass a UTF-8 .jsonl file.") from e
    if not records:
        raise ValueError(f"{path} holds no records; it must have at least one JSON object line.")
    return records


def _read_file(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        return read_jsonl(path)
    if suffix == ".json":
        _require_file(path, ".json or .jsonl")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:  # JSON lines with a .json suffix
            return read_jsonl(path)
        if isinstance(data, Mapping) and isinstance(data.get("data"), list):
            data = data["data"]
        if not isinstance(data, list):
            raise ValueError(f"{path} must hold a JSON list of records (or {{'data': [...]}}).")
        return list(data)
    if suffix == ".parquet":
        _require_file(path, ".parquet")
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise ImportError("Reading .parquet task files needs pyarrow: pip install 'gym-llm[datasets]'.") from e
        return pq.read_table(path).to_pylist()
    return read_jsonl(path)


HUB_PROBE_TIMEOUT_S = 3.0
"""How long :func:`hub_unreachable` waits for the hub's answer (the hub clients retry for about a minute instead)."""


def _offline_flag() -> bool:
    return any(os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
               for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_unreachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the Hugging Face hub cannot be used from here — ``HF_HUB_OFFLINE`` (or ``HF_DATASETS_OFFLINE``,
    ``TRANSFORMERS_OFFLINE``) is set, or ``HF_ENDPOINT`` (default https://huggingface.co) does not answer within
    ``timeout_s`` — or None when it answers. The network answer is remembered for the process."""
    if _offline_flag():
        return "offline mode is on (HF_HUB_OFFLINE)"
    return _probe(os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/"), float(timeout_s))


@functools.lru_cache(maxsize=None)
def _probe(endpoint: str, timeout_s: float) -> str | None:
    import urllib.error
    import urllib.request

    try:  # urllib honours HTTPS_PROXY like the hub clients do; any HTTP answer (even an error status) is an answer
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout_s).close()
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        return f"{endpoint} cannot be reached ({reason})"
    return None


def load_hub_dataset(name: str, config: str | None, split: str) -> list[dict[str, Any]]:
    """Records of a hub dataset through ``datasets.load_dataset`` (needs the ``datasets`` extra).

    Raises:
        ConnectionError: the hub does not answer (within :data:`HUB_PROBE_TIMEOUT_S`) and offline mode is off —
            at once, not after the hub client's minute of retries. (With ``HF_HUB_OFFLINE=1`` a copy in the
            ``datasets`` cache is used.)
    """
    try:
        import datasets
    except ImportError as e:
        raise ImportError(
            f"Loading {name!r} from the Hugging Face hub needs the datasets package: pip install 'gym-llm[datasets]'."
        ) from e
    if not _offline_flag():
        unreachable = hub_unreachable()
        if unreachable is not None:
            raise ConnectionError(f"the Hugging Face hub is needed to load {name!r}, but {unreachable}; a copy "
                                  "already in your datasets cache is used with HF_HUB_OFFLINE=1")
    dataset = datasets.load_dataset(name, config, split=split)
    return [dict(row) for row in dataset]


def _is_dataset(obj: Any) -> bool:
    return hasattr(obj, "column_names") and hasattr(obj, "__getitem__") and hasattr(obj, "__len__")


def load_records(
    source: Sequence[Any] | PathLike | Iterable[Any] | Any,
    *,
    split: str | None = None,
) -> list[Any]:
    """Records from any supported source.

    Args:
        source: a list/tuple of records (strings or mappings); a path to a ``.jsonl``, ``.json`` or
            ``.parquet`` file (or a list of such paths); a ``datasets.Dataset``; a ``datasets.DatasetDict``
            (with ``split``); or any iterable of records.
        split: which split of a ``DatasetDict`` to use.
    """
    if source is None:
        raise ValueError("No task source given; pass a list of prompts, a .jsonl path or a datasets.Dataset.")
    if isinstance(source, (str, os.PathLike)):
        return _read_file(Path(source))
    if _is_dataset(source):
        return [dict(row) for row in source]
    if isinstance(source, Mapping):
        if split is None or split not in source:
            raise ValueError(
                f"A DatasetDict/mapping of splits needs split= naming one of {sorted(source)}, got {split!r}."
            )
        return load_records(source[split])
    if isinstance(source, (list, tuple)) and source and all(isinstance(s, (str, os.PathLike)) for s in source) \
            and all(Path(s).suffix.lower() in (".jsonl", ".json", ".parquet", ".ndjson") for s in source):
        records: list[Any] = []
        for path in source:
            records.extend(_read_file(Path(path)))
        return records
    try:
        records = list(source)
    except TypeError as e:
        raise TypeError(
            f"Cannot read tasks from a {type(source).__name__}; pass a list of prompts or records, a .jsonl "
            "path, or a datasets.Dataset."
        ) from e
    if not records:
        raise ValueError("The task source is empty; it must hold at least one prompt or record.")
    return records


def records_from_source(*, tasks: Any, data_files: Any, source: str | None, split: str | None, file_hint: str,
                        sources: Mapping[str, Callable[[], list[Any]]], default: str) -> list[Any]:
    """The records of an env's task source, by the rule every env follows: ``tasks=`` (records or a
    ``datasets.Dataset``), else ``data_files=`` (or ``source="file"``), else the named ``source`` — one of ``sources``
    (e.g. ``"hub"``, a generator), ``default`` when None.

    Raises:
        ValueError: ``source="file"`` without ``data_files`` (``file_hint`` says what file), or an unknown source,
            naming the choices.
    """
    if tasks is not None:
        return load_records(tasks, split=split)
    if data_files is not None or source == "file":
        if data_files is None:
            raise ValueError(f"source='file' needs data_files= ({file_hint}).")
        return load_records(data_files)
    name = default if source is None else source
    if name not in sources:
        choices = ["file", *sources]
        raise ValueError(f"source must be {', '.join(map(repr, choices))} or None, got {source!r}.")
    return sources[name]()
