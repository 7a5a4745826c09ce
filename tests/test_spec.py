import pytest

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
