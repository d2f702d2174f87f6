"""Durable rollout files: append batches of :class:`Trajectory` / :class:`StepRecord` and read them back.

Two formats, both appended once per batch and fsynced before :meth:`RolloutWriter.write` returns:

* **JSONL** (``path`` ends in ``.jsonl``): one record per line, then one **commit line** for the batch
  (``{"kind": "batch", "batch": k, "records": n, "sha256": ...}``, the hash of the batch's record lines), the
  whole batch written with one ``write`` and ``fsync``. A batch counts only once its commit line is complete: a
  process killed mid-write leaves an uncommitted tail that readers drop (with a warning) and a new writer cuts off
  before appending, so a file reads back as exactly the batches that completed. A write that fails (``ENOSPC``,
  Ctrl-C) cuts the file back to where the batch began.
* **Parquet** (``path`` is a folder or ends in ``.parquet``): one ``part-NNNNNN.parquet`` file per batch,
  written to a temporary name, fsynced and renamed (atomic), then the folder is fsynced. Parquet
  cannot be appended in place (its footer is written last), so parts are the durable way.

Records round-trip exactly: ids as int64, log-probs as float32, masks as int8; a step's ``info``
(scalars and strings) is kept as JSON text. Every record carries its env id, task id, group id, policy version(s)
and a ``checksum`` of its tokens, log-probs and rewards; :func:`read_rollouts` drops a record whose checksum or JSON
does not hold, naming its line, and keeps the rest.

**Env specs.** Records made by the collector name the env that ran them (``spec_id``); before the first record that
names a spec, the writer writes the spec itself (a :class:`~gym_llm_adapters.env_spec.RecordedEnvSpec`: env id,
constructor arguments, versions; ``{"kind": "env_spec", ...}``): in JSONL as lines of the same committed batch (the
commit line counts them in ``"specs"``), in Parquet as a part of its own just before the batch's part. They are what
:func:`gym_llm_adapters.replay.replay` rebuilds the env from. :func:`iter_rollouts` yields them only with
``specs=True``; files without specs (older writers, hand-made records) read as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import fields
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

import numpy as np

from gym_llm_adapters.env_spec import RecordedEnvSpec, known_spec
from gym_llm_adapters.types import StepRecord, Trajectory

__all__ = ["CorruptRecordError", "RolloutWriter", "read_rollouts", "record_checksum", "record_to_dict",
           "record_from_dict", "truncate_rollouts"]

logger = logging.getLogger(__name__)

Record = Trajectory | StepRecord
_ARRAYS = {"prompt_ids": np.int64, "completion_ids": np.int64, "token_ids": np.int64, "logprobs": np.float32,
           "policy_mask": np.int8}


def record_to_dict(record: Record) -> dict[str, Any]:
    """A JSON-able dict of ``record`` with a ``"kind"`` tag (``"trajectory"`` or ``"step"``)."""
    if isinstance(record, StepRecord):
        out: dict[str, Any] = {"kind": "step"}
        for f in fields(StepRecord):
            value = getattr(record, f.name)
            if f.name == "info":
                out["info"] = json.dumps(value, default=_json_default, sort_keys=True)
            else:
                out[f.name] = value.tolist() if isinstance(value, np.ndarray) else value
        out["checksum"] = record_checksum(record)
        return out
    if isinstance(record, Trajectory):
        out = {"kind": "trajectory"}
        for f in fields(Trajectory):
            value = getattr(record, f.name)
            if f.name == "steps":
                out["steps"] = [record_to_dict(s) for s in value]
            elif f.name == "scores":  # JSON text, as a step's info: one column type in parquet whatever the stages
                out["scores"] = json.dumps(value, default=_json_default, sort_keys=True)
            else:
                out[f.name] = value.tolist() if isinstance(value, np.ndarray) else value
        out["checksum"] = record_checksum(record)
        return out
    raise TypeError(f"Only Trajectory and StepRecord can be written, got {type(record).__name__}.")


def record_checksum(record: Record) -> str:
    """SHA-256 (hex, 16 chars) of what a record teaches: its ids, log-probs, mask, rewards, labels and versions."""
    h = hashlib.sha256()
    if isinstance(record, StepRecord):
        arrays = (np.asarray(record.prompt_ids, np.int64), np.asarray(record.completion_ids, np.int64),
                  np.asarray(record.logprobs, np.float32))
        labels = (record.env_id, record.task_id, record.group_id, record.round, record.turn, float(record.reward),
                  record.version, bool(record.terminated), bool(record.truncated))
    else:
        arrays = (np.asarray(record.token_ids, np.int64), np.asarray(record.policy_mask, np.int8),
                  np.asarray(record.logprobs, np.float32))
        labels = (record.env_id, record.task_id, record.group_id, record.round, record.prompt_length,
                  [float(r) for r in record.rewards], [int(v) for v in record.versions], bool(record.terminated),
                  bool(record.truncated))
        if record.turn_tokens is not None:  # (records written before the field existed verify as they were)
            labels = (*labels, [int(n) for n in record.turn_tokens])
        if record.shared_turns:  # (likewise: only tree rollouts carry it)
            labels = (*labels, int(record.shared_turns))
        if record.scores:  # (likewise: only runs with reward stages carry them)
            labels = (*labels, float(record.env_weight),
                      [[s.get("source"), s.get("value"), s.get("weight"), s.get("error")] for s in record.scores])
    for array in arrays:
        h.update(np.ascontiguousarray(array).tobytes())
        h.update(b"|")
    h.update(json.dumps(labels, default=_json_default).encode())
    return h.hexdigest()[:16]


class CorruptRecordError(ValueError):
    """A rollout record whose JSON or checksum does not hold."""


def record_from_dict(data: dict[str, Any]) -> Record:
    """Inverse of :func:`record_to_dict`. Raises :class:`CorruptRecordError` when the record's checksum (if it
    has one) does not match its content."""
    record = _record_from_dict(data)
    checksum = data.get("checksum")
    if checksum is not None and checksum != record_checksum(record):
        raise CorruptRecordError("its checksum does not match its tokens, log-probs or labels")
    return record


def _item_from_dict(data: dict[str, Any]) -> Record | RecordedEnvSpec:
    """A record, or an env spec line (``"kind": "env_spec"``)."""
    if data.get("kind") == "env_spec":
        try:
            return RecordedEnvSpec.from_dict(data)
        except ValueError as e:
            raise CorruptRecordError(str(e)) from None
    return record_from_dict(data)


def _record_from_dict(data: dict[str, Any]) -> Record:
    kind = data.get("kind")
    if kind == "step":
        values = {f.name: data[f.name] for f in fields(StepRecord) if f.name in data}
        values["info"] = json.loads(values.get("info") or "{}")
        for name in ("prompt_ids", "completion_ids", "logprobs"):
            values[name] = np.asarray(values[name], dtype=_ARRAYS[name])
        return StepRecord(**values)
    if kind == "trajectory":
        values = {f.name: data[f.name] for f in fields(Trajectory) if f.name in data}
        values["steps"] = [_record_from_dict(dict(s)) for s in values.get("steps") or []]
        if isinstance(values.get("scores"), str):
            values["scores"] = json.loads(values["scores"] or "[]")
        for name in ("token_ids", "policy_mask", "logprobs"):
            values[name] = np.asarray(values[name], dtype=_ARRAYS[name])
        values["rewards"] = [float(r) for r in values["rewards"]]
        values["versions"] = [int(v) for v in values["versions"]]
        return Trajectory(**values)
    raise ValueError(f"Not a rollout record (kind={kind!r}); expected 'trajectory' or 'step'.")


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def _format_of(path: Path, fmt: str | None) -> str:
    if fmt is not None:
        if fmt not in ("jsonl", "parquet"):
            raise ValueError(f"format must be 'jsonl' or 'parquet', got {fmt!r}.")
        return fmt
    if path.suffix == ".jsonl":
        return "jsonl"
    if path.suffix == ".parquet" or path.is_dir():
        return "parquet"
    raise ValueError(f"Cannot tell the rollout format of {str(path)!r}: use a .jsonl file, a .parquet folder, or format=.")


class RolloutWriter:
    """Appends batches of records to ``path`` durably (see the module docstring).

    Args:
        path: a ``.jsonl`` file, or a folder (``.parquet`` suffix or existing) for Parquet parts.
        format: ``"jsonl"`` or ``"parquet"``; default from ``path``.
    """

    def __init__(self, path: str | os.PathLike, *, format: Literal["jsonl", "parquet"] | None = None):
        self.path = Path(path)
        self.format = _format_of(self.path, format)
        self.batches_written = 0
        self.records_written = 0
        self._specs_written: set[str] = set()  # env specs this writer has put in the file (module docstring)
        if self.format == "jsonl":
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _drop_partial_line(self.path)
            _drop_uncommitted_tail(self.path)
            self._file = open(self.path, "ab")
            if self._file.seek(0, os.SEEK_END) == 0:
                self._file.write(_HEADER)
                self._file.flush()
                os.fsync(self._file.fileno())
        else:
            try:
                import pyarrow.parquet  # noqa: F401  (fail at construction, not at the first batch)
            except ImportError as e:
                raise ImportError("Parquet rollouts need pyarrow: pip install 'gym-llm[rollouts]' (or use a .jsonl path).") from e
            self.path.mkdir(parents=True, exist_ok=True)
            self._file = None
            self._next_part = 1 + max((int(p.stem.split("-")[1]) for p in self.path.glob("part-*.parquet")), default=-1)

    def write(self, records: Sequence[Record]) -> None:
        """Append one batch; durable (fsynced) when this returns."""
        if not records:
            return
        rows = [record_to_dict(r) for r in records]
        specs = [spec.to_dict() for spec in self._new_specs(records)]
        if self.format == "jsonl":
            lines = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in [*specs, *rows]).encode()
            commit = {"kind": "batch", "batch": self.batches_written, "records": len(rows),
                      "sha256": hashlib.sha256(lines).hexdigest()}
            if specs:
                commit["specs"] = len(specs)
            payload = lines + (json.dumps(commit, separators=(",", ":")) + "\n").encode()
            start = self._file.seek(0, os.SEEK_END)
            try:
                self._file.write(payload)
                self._file.flush()
                os.fsync(self._file.fileno())
            except BaseException:  # ENOSPC, Ctrl-C: nothing of this batch stays (the caller still holds it)
                self._rollback(start)
                raise
        else:
            if specs:
                self._write_part([{"kind": "env_spec", "spec_id": s["spec_id"], "spec": json.dumps(s)} for s in specs])
            self._write_part(rows)
        self._specs_written.update(s["spec_id"] for s in specs)
        self.batches_written += 1
        self.records_written += len(rows)

    def _new_specs(self, records: Sequence[Record]) -> list[RecordedEnvSpec]:
        """The env specs that ``records`` name and this writer has not written yet (an unknown id is logged once)."""
        out: dict[str, RecordedEnvSpec] = {}
        for record in records:
            spec_id = getattr(record, "spec_id", "")
            if not spec_id or spec_id in self._specs_written or spec_id in out:
                continue
            spec = known_spec(spec_id)
            if spec is None:  # records made in a process whose specs never reached this one: written without
                logger.info("%s: records name env spec %s, which this process does not know (they were made "
                            "elsewhere); `gym-llm replay` cannot replay them.", self.path, spec_id)
                self._specs_written.add(spec_id)
                continue
            out[spec_id] = spec
        return list(out.values())

    def _rollback(self, size: int) -> None:
        try:
            self._file.close()
        except OSError:
            pass
        with open(self.path, "rb+") as f:
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())
        self._file = open(self.path, "ab")

    def _write_part(self, rows: list[dict[str, Any]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        # Nested steps are stored as JSON text: their info dicts vary in keys, which Arrow structs do not allow.
        table = pa.Table.from_pylist([{**row, "steps": json.dumps(row["steps"])} if "steps" in row else row for row in rows])
        final = self.path / f"part-{self._next_part:06d}.parquet"
        tmp = final.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.path)
        self._next_part += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "RolloutWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_rollouts(path: str | os.PathLike, *, format: Literal["jsonl", "parquet"] | None = None) -> list[Record]:
    """All complete records in ``path``, in write order."""
    return list(iter_rollouts(path, format=format))


def iter_rollouts(path: str | os.PathLike, *, format: Literal["jsonl", "parquet"] | None = None,
                  specs: bool = False) -> Iterator[Any]:
    """Stream the records of ``path``: in a JSONL file, the records of committed batches (see the module docstring);
    an uncommitted tail and each torn or corrupt record are skipped with a warning that names the line.

    ``specs=True`` also yields the file's env specs (:class:`~gym_llm_adapters.env_spec.RecordedEnvSpec`), each
    before the records that name it."""
    for item in _iter_items(path, format):
        if specs or not isinstance(item, RecordedEnvSpec):
            yield item


def _iter_items(path: str | os.PathLike, format: str | None) -> Iterator[Record | RecordedEnvSpec]:
    path = Path(path)
    fmt = _format_of(path, format)
    if fmt == "jsonl":
        yield from _iter_jsonl(path)
        return
    import pyarrow.parquet as pq

    for part in sorted(path.glob("part-*.parquet")):
        try:
            rows = pq.read_table(part).to_pylist()
        except Exception as e:  # a torn or damaged part (parts are written to a temp name and renamed, so rare)
            logger.warning("%s: dropping an unreadable part (%s: %s); the other parts are kept", part,
                           type(e).__name__, e)
            continue
        for number, row in enumerate(rows, 1):
            try:
                if row.get("kind") == "trajectory":
                    row["steps"] = json.loads(row["steps"])
                elif row.get("kind") == "env_spec":
                    row = json.loads(row["spec"])
                record = _item_from_dict(row)
            except (CorruptRecordError, ValueError, KeyError, TypeError) as e:
                logger.warning("%s: row %d: dropping a corrupt record (%s); the others are kept", part, number, e)
                continue
            yield record


def _is_commit(line: bytes) -> bool:
    return line.startswith(b'{"kind":"batch"')


def _is_spec(line: bytes) -> bool:
    return line.startswith(b'{"kind":"env_spec"')


def _iter_jsonl(path: Path) -> Iterator[Record | RecordedEnvSpec]:
    pending: list[tuple[int, bytes]] = []  # the current batch's record lines (line number, bytes)
    committed_format = False
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.endswith(b"\n"):
                logger.warning("%s:%d: a partial record (an interrupted write); skipping it.", path, number)
                break
            if number == 1 and line == _HEADER:
                committed_format = True
            elif _is_commit(line):
                committed_format = True
                yield from _checked_batch(path, number, line, pending)
                pending = []
            else:
                pending.append((number, line))
    if pending and committed_format:
        logger.warning("%s: lines %d-%d hold a batch that was never committed (the writer stopped mid-batch); "
                       "skipping them.", path, pending[0][0], pending[-1][0])
    elif pending:  # a file written before commit lines existed: every complete line is a record
        yield from _checked_records(path, pending)


def _checked_batch(path: Path, number: int, commit_line: bytes, lines: list[tuple[int, bytes]]
                   ) -> Iterator[Record | RecordedEnvSpec]:
    try:
        commit = json.loads(commit_line)
        expected, digest = int(commit["records"]) + int(commit.get("specs", 0)), str(commit["sha256"])
    except (ValueError, KeyError, TypeError):
        logger.warning("%s:%d: a corrupt batch commit line; checking its %d records one by one.", path, number, len(lines))
        yield from _checked_records(path, lines)
        return
    if len(lines) != expected or hashlib.sha256(b"".join(line for _, line in lines)).hexdigest() != digest:
        logger.warning("%s:%d: batch %s does not match its commit line (%d of %d records, or changed bytes); "
                       "checking its records one by one.", path, number, commit.get("batch"), len(lines), expected)
    yield from _checked_records(path, lines)


def _checked_records(path: Path, lines: list[tuple[int, bytes]]) -> Iterator[Record | RecordedEnvSpec]:
    for number, line in lines:
        try:
            yield _item_from_dict(json.loads(line))
        except (ValueError, KeyError, TypeError) as e:  # CorruptRecordError is a ValueError
            logger.warning("%s:%d: dropping a corrupt record (%s: %s).", path, number, type(e).__name__, e)


def truncate_rollouts(path: str | os.PathLike, num_records: int) -> int:
    """Keep the first ``num_records`` records of a JSONL rollout file (drop the rest, and any partial line).

    Used when a run resumes from a checkpoint that had written ``num_records`` records: what was appended
    after it (by the interrupted run) is cut, so the file matches the checkpoint. Returns the records
    dropped. A missing file counts as empty (``num_records`` must then be 0).
    """
    path = Path(path)
    if _format_of(path, None) != "jsonl":
        raise ValueError(f"truncate_rollouts handles .jsonl files, got {str(path)!r}.")
    if num_records < 0:
        raise ValueError(f"num_records must be >= 0, got {num_records}.")
    if not path.exists():
        if num_records:
            raise ValueError(f"{path} does not exist, but {num_records} records were expected in it.")
        return 0
    kept = dropped = offset = 0
    with open(path, "rb+") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            if line == _HEADER and offset == 0:
                offset += len(line)
                continue
            if _is_spec(line):  # not a record: kept with the batch it opens, if that batch is kept
                if kept < num_records:
                    offset += len(line)
                continue
            if _is_commit(line):
                if kept <= num_records and not dropped:
                    offset += len(line)  # the commit of a batch that is kept whole
                continue
            if kept < num_records:
                kept += 1
                offset += len(line)
            else:
                dropped += 1
        if kept < num_records:
            raise ValueError(f"{path} holds {kept} complete records, fewer than the {num_records} expected: "
                             "it was changed or truncated outside the run.")
        f.truncate(offset)
        f.flush()
        os.fsync(f.fileno())
    if dropped:
        logger.info("%s: dropped %d records written after the checkpoint", path, dropped)
    return dropped


def _drop_partial_line(path: Path, chunk_bytes: int = 1 << 16) -> None:
    """Cut a trailing partial line (from a crash mid-write) so appends start on a line boundary."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        keep, end = 0, size
        while end > 0:  # scan backwards for the last newline
            start = max(0, end - chunk_bytes)
            f.seek(start)
            at = f.read(end - start).rfind(b"\n")
            if at != -1:
                keep = start + at + 1
                break
            end = start
        logger.warning("%s ended with a partial record; cutting %d bytes before appending.", path, size - keep)
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())


_HEADER = b'{"kind":"header","format":2}\n'
"""First line of a JSONL file written with commit lines (files without it, from older writers, have none)."""


def _last_commit_end(f: Any, size: int, chunk_bytes: int) -> int | None:
    """Byte offset just after the last commit line of an open file, or None if there is none."""
    end, buf = size, b""
    while end > 0:
        start = max(0, end - chunk_bytes)
        f.seek(start)
        buf = f.read(end - start) + buf
        at = buf.rfind(b'\n{"kind":"batch"')
        line_start = start + at + 1 if at != -1 else (0 if start == 0 and _is_commit(buf) else None)
        if line_start is not None:
            newline = buf.find(b"\n", line_start - start)
            return size if newline == -1 else start + newline + 1
        end = start
    return None


def _drop_uncommitted_tail(path: Path, chunk_bytes: int = 1 << 16) -> None:
    """Cut the records after the last commit line (a batch the previous writer never finished), so appends start
    on a batch boundary. Files from older writers (no header line) are left as they are."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        if f.read(len(_HEADER)) != _HEADER:
            return
        size = f.seek(0, os.SEEK_END)
        keep = _last_commit_end(f, size, chunk_bytes)
        keep = len(_HEADER) if keep is None else keep
        if keep < size:
            logger.warning("%s ends with an uncommitted batch; cutting %d bytes before appending.", path, size - keep)
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
