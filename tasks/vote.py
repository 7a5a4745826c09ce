"""Stage 3 — vote: the reader's decision over all of a question's generations, as VoteRecords."""

from __future__ import annotations

from strategies.readers import get_reader
from tasks.generate import history_by_question, reader_inputs
from tasks.stages import RunContext, StageResult, VoteStage
from tracking.store.events import event_id, new_events


def run_vote(run: RunContext, stage: VoteStage, retrieval_segments: list[str | None],
             generation_segments: list[str | None]) -> StageResult:
    spec, store = run.spec, run.store()
    entry = spec.reader_entry(stage.reader)
    reader = get_reader(entry.name)
    settings = entry.settings
    questions = run.questions(store, stage.qids)
    retrievals = store.read("retrievals", paths=[p for p in retrieval_segments if p])
    history = history_by_question(store.read("generations", paths=[p for p in generation_segments if p]))
    rows = []
    for item in reader_inputs(questions, retrievals[retrievals["qid"].isin(stage.qids)]):
        d = reader.decide(item, history.get(item.qid, []), settings)
        rows.append(
            {
                "event_id": event_id("votes", spec.name, stage.key, item.qid),
                "cell": stage.cell.name,
                "qid": item.qid,
                "retriever": stage.retriever,
                "reader": stage.reader,
                "method": d.method,
                "candidates": list(d.candidates),
                "scores": [float(s) for s in d.scores],
                "chosen": d.chosen,
            }
        )
    segment = store.write("votes", new_events("votes", spec.name, rows)) if rows else None
    return stage.result(run, segment, len(rows))
