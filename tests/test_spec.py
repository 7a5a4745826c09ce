from enum import Enum
from typing import Literal, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError

from schemas.spec import SpecError, load_spec, parse_spec

GOOD = {"name": "t", "retrievers": ["bm25@5"], "readers": ["concatenation"]}


def test_minimal_spec_defaults():
    spec = parse_spec(GOOD)
    assert spec.model.backend == "embedded" and spec.dataset.name == "squad"
    assert len(spec.spec_hash()) == 16


def test_spec_hash_ignores_tracking_but_not_model():
    a = parse_spec(GOOD)
    b = parse_spec({**GOOD, "tracking": {"store": "/elsewhere"}})
    c = parse_spec({**GOOD, "model": {"temperature": 0.5}})
    assert a.spec_hash() == b.spec_hash() != c.spec_hash()


def test_a_scheduler_address_means_the_dask_runner():
    spec = parse_spec({**GOOD, "execution": {"scheduler_address": "tcp://h:8786"}})
    assert spec.execution.runner == "dask"
    assert parse_spec(spec.model_dump()).execution.runner == "dask"
    assert parse_spec(GOOD).execution.runner == "thread"


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"colour": "red"}, "field 'colour': unknown field"),
        ({"model": {"temprature": 0.1}}, "field 'model.temprature': unknown field"),
        ({"retrievers": ["bm99@5"]}, "unknown retriever 'bm99'"),
        ({"retrievers": ["bm25@0"]}, "k must be a positive integer"),
        ({"retrievers": ["bm25@-3"]}, "k must be a positive integer"),
        ({"readers": ["telepathy"]}, "unknown reader strategy 'telepathy'"),
        ({"dataset": {"limit": "many"}}, "field 'dataset.limit'"),
        ({"model": {"backend": "openai"}}, "model.base_url is required"),
        ({"name": "has space"}, "field 'name'"),
        ({"execution": {"runner": "thread", "scheduler_address": "tcp://h:8786"}}, "set runner: dask"),
    ],
)
def test_bad_fields_are_named(patch, needle):
    with pytest.raises(SpecError) as exc:
        parse_spec({**GOOD, **patch}, "spec.yaml")
    assert needle in str(exc.value)
    assert str(exc.value).startswith("spec.yaml")


@pytest.mark.parametrize("url", ["notaurl", "127.0.0.1:8000/v1", "http:///v1", "ftp://h/v1", "http://h:port/v1"])
def test_an_endpoint_url_needs_a_scheme_and_a_host(url):
    with pytest.raises(SpecError) as exc:
        parse_spec({**GOOD, "model": {"backend": "openai", "base_url": url}}, "spec.yaml")
    assert str(exc.value).startswith("spec.yaml: field 'model': model.base_url: "), str(exc.value)
    assert f"{url!r} is not an http:// or https:// URL with a host" in str(exc.value), str(exc.value)
    for good in ("http://127.0.0.1:8000/v1", "https://api.openai.com/v1", "HTTP://[::1]:8000/v1"):
        assert parse_spec({**GOOD, "model": {"backend": "openai", "base_url": good}}).model.base_url == good
    # the embedded backend calls no base_url: a spec stored with one it never used still reads
    assert parse_spec({**GOOD, "model": {"base_url": url}}).model.backend == "embedded"


def test_file_level_errors(tmp_path):
    with pytest.raises(SpecError, match="spec file not found"):
        load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad.yaml: line \d+, column \d+ malformed YAML"):
        load_spec(bad)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(SpecError, match="not valid UTF-8"):
        load_spec(binary)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(SpecError, match="must be a YAML mapping"):
        load_spec(scalar)


@pytest.mark.parametrize(
    ("patch", "needle"),
    [
        ({"corpus": {"name": "wikipedia-xl", "paths": ["x.jsonl"]}},
         "field 'corpus.name': 'wikipedia-xl' is not one of 'squad-paragraphs', 'jsonl', 'dpr-tsv', 'lucene' or 'prebuilt'"),
        ({"model": {"backend": "vllm"}}, "field 'model.backend': 'vllm' is not one of 'embedded' or 'openai'"),
        ({"dataset": {"name": 7}}, "field 'dataset.name': 7 is not one of 'squad', "),
        ({"execution": {"runner": "ray"}}, "field 'execution.runner': 'ray' is not one of 'thread' or 'dask'"),
    ],
)
def test_a_value_outside_a_choice_is_named_with_the_choices(patch, needle):
    with pytest.raises(SpecError) as exc:
        parse_spec({**GOOD, **patch}, "spec.yaml")
    assert needle in str(exc.value), str(exc.value)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"dataset": {"limit": -5}}, "field 'dataset.limit': Input should be greater than 0, got -5"),
        ({"model": {"temperature": "hot"}}, "field 'model.temperature': Input should be a valid number, unable to parse "
                                            "string as a number, got 'hot'"),
        ({"model": {"concurrency": 0}}, "field 'model.concurrency': Input should be greater than 0, got 0"),
        ({"name": None}, "field 'name': Input should be a valid string, got None"),
        ({"readers": [{"name": "sure", "candidates": -1}]},  # a reader's own settings read the same (schemas/messages.py)
         "field 'readers': readers[0].candidates: Input should be greater than or equal to 2, got -1"),
        # several bad values: all named on the one error line, the file once
        ({"dataset": {"limit": -3}, "model": {"max_tokens": 99999}},
         "field 'dataset.limit': Input should be greater than 0, got -3; "
         "field 'model.max_tokens': Input should be less than or equal to 4096, got 99999"),
        ({"readers": [{"name": "sure", "candidates": "3x"}], "model": {"temperature": "hot"}},
         "field 'readers': readers[0].candidates: Input should be a valid integer, unable to parse string as an "
         "integer, got '3x'; field 'model.temperature': Input should be a valid number, unable to parse string as a "
         "number, got 'hot'"),
    ],
)
def test_a_value_out_of_bounds_or_of_the_wrong_type_is_named(patch, message):
    with pytest.raises(SpecError) as exc:
        parse_spec({**GOOD, **patch}, "spec.yaml")
    assert str(exc.value) == f"spec.yaml: {message}"


def test_a_missing_field_names_no_value():
    with pytest.raises(SpecError) as exc:
        parse_spec({"retrievers": ["bm25@5"], "readers": ["concatenation"]}, "spec.yaml")
    assert str(exc.value) == "spec.yaml: field 'name': Field required"


def test_a_typo_of_a_required_field_is_one_error_naming_the_field_meant():
    """`retriever:` for `retrievers:` is one mistake: an unknown field beside a missing one it resembles."""
    spec = {k: v for k, v in GOOD.items() if k != "retrievers"}
    with pytest.raises(SpecError) as exc:
        parse_spec({**spec, "retriever": ["bm25@3"]}, "spec.yaml")
    assert str(exc.value) == "spec.yaml: field 'retriever': unknown field (did you mean 'retrievers'?)"
    with pytest.raises(SpecError) as exc:  # unlike any missing field: both named, on one line
        parse_spec({**spec, "colour": "red"}, "spec.yaml")
    assert str(exc.value) == "spec.yaml: field 'retrievers': Field required; field 'colour': unknown field"


def _is_choice(annotation: object) -> bool:
    if get_origin(annotation) is Literal:
        return True
    if isinstance(annotation, type):
        return issubclass(annotation, Enum)
    return any(_is_choice(a) for a in get_args(annotation))  # inside a union (`Literal[...] | None`)


def test_every_choice_field_names_the_value_given():
    """Every field of the spec's models whose values are an enumeration (a Literal or an Enum): a value outside it
    is named in the message, with the choices."""
    import schemas.spec as spec_module
    from strategies.readers import READERS

    models = [m for m in vars(spec_module).values()
              if isinstance(m, type) and issubclass(m, BaseModel) and m.__module__ == spec_module.__name__]
    models += list(dict.fromkeys(r.Settings for r in READERS.values()))  # each reader's own settings (the vote)
    fields = [(m, name) for m in models for name, info in m.model_fields.items() if _is_choice(info.annotation)]
    fields += [(spec_module.DatasetSpec, "name"), (spec_module.CorpusSpec, "name")]  # names the registries hold
    assert len(fields) >= 5, fields  # the dataset's and the corpus's names, the backend, the runner, the vote at least
    for model, name in fields:
        with pytest.raises(ValidationError) as exc:
            model.model_validate({name: "no-such-choice"})
        message = spec_module._format_errors("spec.yaml", exc.value)
        assert f"field '{name}': 'no-such-choice' is not one of '" in message, (model.__name__, message)


def test_a_runs_default_shards_are_25_questions_or_more_so_that_there_are_at_most_16():
    from schemas.spec import ExecutionSpec

    default = ExecutionSpec()
    # 20 questions: one shard of 25; 400: 16 of 25; 401: 16 of 26 (the last of 11); 2,000: 16 of 125
    assert [default.shard_size_for(n) for n in (20, 400, 401, 2000)] == [25, 25, 26, 125]
    assert ExecutionSpec(shard_size=10).shard_size_for(2000) == 10  # a given size is kept
