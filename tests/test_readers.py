from strategies.readers import READERS, get_reader
from strategies.readers.base import Generation, Passage, PooledSettings, ReaderInput, fill, majority_vote, parse_output


def test_majority_vote_counts_normalized_forms():
    d = majority_vote(["The Broncos", "Panthers", "broncos", "unknown"])
    assert d.chosen == "The Broncos"
    assert d.scores == (2.0, 1.0, 2.0, 0.0)


def test_majority_vote_tie_goes_to_earliest_passage():
    assert majority_vote(["194", "1924", "1996"]).chosen == "194"
    assert majority_vote(["b", "a", "a", "b"]).chosen == "b"  # b first seen at rank 1


def test_majority_vote_unknowns_abstain_unless_all_unknown():
    assert majority_vote(["unknown", "unknown", "Paris"]).chosen == "Paris"
    assert majority_vote(["unknown", "", "no answer"]).chosen == "unknown"


def test_fill_does_not_rescan_inserted_values():
    template = "Context:\n{retrieved_topk_context}\nQuestion:\n{question}\nAnswer:"
    out = fill(template, retrieved_topk_context="a {question} b {0} {", question="Q?")
    assert out == "Context:\na {question} b {0} {\nQuestion:\nQ?\nAnswer:"


def test_parse_output_never_raises():
    assert parse_output("Answer: Denver Broncos.\nExplanation: ...") == ("Denver Broncos", "ok")
    assert parse_output("") == ("", "empty")
    assert parse_output("   \n ") == ("", "empty")
    assert parse_output('"J. R. R. Tolkien"') == ("J. R. R. Tolkien", "ok")
    assert parse_output("Rationale: blah. Answer: Saw VI", "final_answer") == ("Saw VI", "ok")
    # outputs of the embedded 0.5B model to the Pruning prompt (seed 001 Fig. 8), which skipped "Answer:"
    assert parse_output("2,000,000 base pairs", "final_answer") == ("2,000,000 base pairs", "ok")
    # prose with no "Answer:": the last sentence is the answer as written, flagged unmarked (a parse failure)
    assert parse_output("The Mark of Anarchy was written by Percy Shelley.", "final_answer") == (
        "The Mark of Anarchy was written by Percy Shelley", "unmarked")
    assert parse_output("Saw VI is the movie.\nIt stars Tobin Bell", "final_answer") == ("It stars Tobin Bell", "unmarked")
    # real outputs of the embedded 0.5B model to Fig. 8 (Pruning) and Fig. 9 (Summary) on SQuAD dev
    miami = ("According to the U.S. Census Bureau, Miami's metro area is the eighth-most populous and fourth-largest "
             "urban area in the United States, with a population of around 5.5 million.")
    assert parse_output(miami, "final_answer") == (miami[:-1], "unmarked")  # "U.S. Census" does not end a sentence
    assert parse_output("The mayor of San Francisco is Ed Lee.", "final_answer") == (
        "The mayor of San Francisco is Ed Lee", "unmarked")
    assert parse_output("Source 1 is about Miami. The answer is in source 1.\nMiami is the city.", "final_answer") == (
        "Miami is the city", "unmarked")
    assert parse_output("...", "final_answer") == ("", "unparseable")  # nothing to read


ITEM = ReaderInput("q1", "Who won?", (Passage("p1", "t1"), Passage("p2", "t2"), Passage("p3", "t3")))


def test_concatenation_one_call_with_all_passages_in_order():
    calls = get_reader("concatenation").plan(1, ITEM, [], get_reader("concatenation").Settings())
    assert len(calls) == 1
    assert calls[0].passage_ids == ("p1", "p2", "p3")
    assert calls[0].prompt.index("t1") < calls[0].prompt.index("t2") < calls[0].prompt.index("t3")
    assert "unknown" in calls[0].system  # the abstention instruction lives in the system message


def test_post_fusion_one_call_per_passage_and_self_consistency():
    pf = get_reader("post_fusion")
    calls = pf.plan(1, ITEM, [], PooledSettings())
    assert [c.passage_ids for c in calls] == [("p1",), ("p2",), ("p3",)]
    sampled = pf.plan(1, ITEM, [], PooledSettings(samples=3))
    assert len(sampled) == 9 and {c.sample_index for c in sampled} == {0, 1, 2}
    assert all(c.temperature == 0.7 for c in sampled)


def test_post_fusion_decides_by_majority_in_passage_order():
    gens = [Generation(1, "answer", 0, (f"p{i}",), a, a, "ok") for i, a in enumerate(["x", "y", "y"], 1)]
    assert get_reader("post_fusion").decide(ITEM, gens).chosen == "y"


def test_registry_names_match_classes():
    for name, cls in READERS.items():
        assert cls.name == name and cls.prompt_version
