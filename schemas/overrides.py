"""Command-line overrides of a spec (`ragledger run --limit/--embedded/--corpus`): the spec re-validated with them."""

from __future__ import annotations

from schemas.spec import AnySpec, CorpusSpec, ModelSpec, SpecError, parse_spec


def with_overrides(spec: AnySpec, limit: int | None = None, embedded: bool = False, corpus: str | None = None,
                   source: str = "<spec>") -> AnySpec:
    """The spec with command-line overrides: `limit` questions per dataset, the embedded CPU model in place of the
    spec's endpoint (its sampling settings kept), and/or another `corpus` ("KIND" with its default paths, or
    "KIND:PATH[,PATH...]"). A paper config sized for a vLLM server and DPR's Wikipedia then runs on a laptop as
    `ragledger run SPEC --embedded --limit 10 --corpus squad-paragraphs`; the overrides enter the spec hash like any
    other change."""
    data = spec.model_dump(exclude_unset=False)
    if corpus is not None:
        kind, _, paths = corpus.partition(":")
        data["corpus"] = {"name": kind, **({"paths": paths.split(",")} if paths else {})}
        if not paths and kind != CorpusSpec.model_fields["name"].default:
            raise SpecError(f"{source}: --corpus {corpus}: give the {kind} corpus's location as --corpus {kind}:PATH")
    if limit is not None:
        if limit <= 0:
            raise SpecError(f"{source}: --limit must be a positive integer, got {limit}")
        for entry in data["dataset"] if isinstance(data["dataset"], list) else [data["dataset"]]:
            entry["limit"] = limit
    if embedded:
        keep = {k: data["model"][k] for k in ("temperature", "top_p", "max_tokens", "seed", "timeout_s", "max_retries",
                                              "context_window")}
        data["model"] = {**ModelSpec().model_dump(), **keep, "concurrency": 1}  # it answers one request at a time
    return parse_spec(data, source)
