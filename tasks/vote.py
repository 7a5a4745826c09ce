"""Stage 3 — vote: the strategy's decision over all of a question's generations, as VoteRecords."""

from __future__ import annotations

from tasks.context import StageResult, cell_name, read_questions, spec_from, stage_task, store_from
from tasks.generate import history_by_question, reader_inputs
from tasks.readers import get_reader, settings_for
from tracking.events import event_id, new_events


def run_vote(
    spec_dict: dict,
    store_root: str, questions_segment: str,
    retriever_name: str,
    strategy: str,
    qids: list[str],
    retrieval_segments: list[str | None],
    generation_segments: list[str | None],
    stage_key: str,
    run_token: str,
) -> StageResult:
    spec = spec_from(spec_dict)
    store = store_from(store_root)
    entry = spec.reader_entry(strategy)
    reader = get_reader(entry.name)
    settings = settings_for(entry)
    questions = read_questions(store, questions_segment, qids)
    retrievals = store.read("retrievals", paths=[p for p in retrieval_segments if p])
    history = history_by_question(store.read("generations", paths=[p for p in generation_segments if p]))
    cell = cell_name(retriever_name, strategy, spec.model.display_name)
    rows = []
    for item in reader_inputs(questions, retrievals[retrievals["qid"].isin(qids)]):
        d = reader.decide(item, history.get(item.qid, []), settings)
        rows.append(
            {
                "event_id": event_id("votes", spec.name, stage_key, item.qid),
                "cell": cell,
                "qid": item.qid,
                "retriever": retriever_name,
                "strategy": strategy,
                "method": d.method,
                "candidates": list(d.candidates),
                "scores": [float(s) for s in d.scores],
                "chosen": d.chosen,
            }
        )
    segment = store.write("votes", new_events("votes", spec.name, rows)) if rows else None
    return StageResult("vote", cell, stage_key, str(segment) if segment else None, len(rows), run_token, {})


vote_task = stage_task("vote", run_vote)
