"""The seed strategies as pure plan/decide functions: prompts, rounds, call counts, decision rules, parsers."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from schemas.spec import SpecError, parse_spec
from strategies.readers import get_reader
from strategies.readers.base import Generation, Passage, ReaderInput, ReaderSettings, parse_output
from strategies.readers.sure import MAX_CHOICES, candidates_from, parse_candidates

ITEM = ReaderInput("q1", "Who won Super Bowl 50?", (
    Passage("p1", "Broncos: The Denver Broncos won.", "Broncos"),
    Passage("p2", "Panthers: The Carolina Panthers lost.", "Panthers"),
    Passage("p3", "Weather: It rained.", "Weather"),
))  # fmt: skip


def knobs(reader, retrieve=None, **settings) -> ReaderSettings:
    """The reader's own settings model with these values, and a feedback retrieval where one is given."""
    return reader.Settings(**settings).with_retrieval(retrieve)


def gen(round_no, role, answer, pids=(), status="ok", output=None, lp=None, sample=0, p=None):
    """A stored generation; `p` is its output's mean token probability (REFEED MODULE-2's P(y | x))."""
    return Generation(round_no, role, sample, tuple(pids), answer if output is None else output, answer, status, lp,
                      output_prob=p)


# ---- seed 001: Pruning / Summary prompts ----------------------------------------------------------

@pytest.mark.parametrize(("name", "marker"), [("pruning", "process of pruning"), ("summary", "By summarizing these details")])
def test_cot_prompts_one_call_numbered_context_final_answer(name, marker):
    calls = get_reader(name).plan(1, ITEM, [], knobs(get_reader(name)))
    assert len(calls) == 1 and calls[0].parser == "final_answer"
    assert marker in calls[0].system and "If don't know the answer, just say unknown" in calls[0].system
    assert "[1] Broncos: The Denver Broncos won.\n[2] Panthers" in calls[0].prompt
    assert calls[0].prompt.endswith("Rationale: Let's think step by step.")
    out = "Source 1 says the Broncos won.\nAnswer: Denver Broncos"
    answer, status = parse_output(out, "final_answer")
    assert status == "ok"
    d = get_reader(name).decide(ITEM, [gen(1, "answer", answer, output=out)])
    assert d.chosen == "Denver Broncos" and d.method == "single"
    sampled = get_reader(name).plan(1, ITEM, [], knobs(get_reader(name), samples=3))
    assert [c.sample_index for c in sampled] == [0, 1, 2] and {c.temperature for c in sampled} == {0.7}


# ---- seed 001: Concat+PF and PF+Concat ------------------------------------------------------------

def test_concat_pf_falls_back_to_post_fusion_only_when_unknown():
    r = get_reader("concat_pf")
    assert len(r.plan(1, ITEM, [], knobs(r))) == 1
    answered = [gen(1, "answer", "Denver Broncos", ["p1", "p2", "p3"])]
    assert r.plan(2, ITEM, answered, knobs(r)) == []
    assert r.decide(ITEM, answered).chosen == "Denver Broncos"
    for unknown in ("unknown", ""):  # an unparseable/empty concat answer also falls back
        hist = [gen(1, "answer", unknown, ["p1", "p2", "p3"])]
        calls = r.plan(2, ITEM, hist, knobs(r))
        assert [c.passage_ids for c in calls] == [("p1",), ("p2",), ("p3",)] and {c.role for c in calls} == {"fallback"}
    hist += [gen(2, "fallback", a, [p]) for a, p in (("unknown", "p1"), ("Panthers", "p2"), ("Panthers", "p3"))]
    d = r.decide(ITEM, hist)
    assert d.chosen == "Panthers" and d.method == "fallback-majority" and d.candidates == ("unknown", "Panthers", "Panthers")


def test_pf_concat_drops_unknown_passages_and_passes_candidates():
    r = get_reader("pf_concat")
    assert len(r.plan(1, ITEM, [], knobs(r))) == 3
    hist = [gen(1, "answer", a, [p]) for a, p in (("Denver Broncos", "p1"), ("unknown", "p2"), ("the Broncos", "p3"))]
    (call,) = r.plan(2, ITEM, hist, knobs(r))
    assert call.passage_ids == ("p1", "p3") and "Panthers" not in call.prompt
    assert "Candidate answers:\n- Denver Broncos\n- the Broncos\nQuestion:" in call.prompt
    d = r.decide(ITEM, [*hist, gen(2, "distill", "Denver Broncos", ["p1", "p3"])])
    assert d.method == "distill" and d.chosen == "Denver Broncos" and d.candidates == ("Denver Broncos", "unknown", "the Broncos")
    all_unknown = [gen(1, "answer", "unknown", [p]) for p in ("p1", "p2", "p3")]
    assert r.plan(2, ITEM, all_unknown, knobs(r)) == []  # nothing left to distil
    assert r.decide(ITEM, all_unknown).chosen == "unknown"


# ---- seed 004: SuRe -------------------------------------------------------------------------------

@pytest.mark.parametrize(("output", "expected"), [
    ("(a) Denver Broncos, (b) Carolina Panthers", ["Denver Broncos", "Carolina Panthers"]),
    ("Answer: (a) 1925 (b) 1926.", ["1925", "1926"]),
    ("a) Paris\nb) Lyon", ["Paris", "Lyon"]),
    ("1. Paris\n2. Lyon\n", ["Paris", "Lyon"]),
    ("Paris or Lyon", ["Paris", "Lyon"]),
    ("(a) Paris, (b) paris", ["Paris"]),
    ("(a) Paris [DONE]", ["Paris"]),
    ("", []),
    ("(a) , (b) ", []),
    ("(a) unknown (b) Paris", ["unknown", "Paris"]),  # the official code keeps an abstention as a candidate
    ("(2000)", ["2000"]),  # seen from the 0.5B model
    ("(Percy Shelley)", ["Percy Shelley"]),
    ("(1) Charles Michel de Langlade", ["Charles Michel de Langlade"]),  # seen from the 0.5B model
    ("(1) 3.4%, (2) 4.5%", ["3.4%", "4.5%"]),
    ("Response: (b) 000", ["000"]),
    ("Sorry, I cannot determine the answer from the passages.", ["Sorry", "I cannot determine the answer from the passages"]),
    ("(a)\nParis\n(b)\nLyon", ["Paris", "Lyon"]),  # a candidate on the line after its mark
])  # fmt: skip
def test_sure_candidate_parser_is_robust(output, expected):
    assert parse_candidates(output) == expected


def test_sure_makes_seven_calls_and_decides_by_v_plus_r_with_ties_to_first():
    r = get_reader("sure")
    (c1,) = r.plan(1, ITEM, [], knobs(r))
    assert "(a) xx, (b) yy" in c1.prompt and "Passage #1 Title: Broncos\nPassage #1 Text: The Denver Broncos won." in c1.prompt
    hist = [gen(1, "candidates", "", output="(a) Carolina Panthers, (b) Denver Broncos")]
    summaries = r.plan(2, ITEM, hist, knobs(r))
    assert len(summaries) == 2 and "Prediction:(b) Denver Broncos" in summaries[1].prompt
    assert "Choices:(a) Carolina Panthers (b) Denver Broncos" in summaries[0].prompt
    hist += [gen(2, "summary", "S-panthers"), gen(2, "summary", "S-broncos")]
    third = r.plan(3, ITEM, hist, knobs(r))
    assert [c.role for c in third] == ["validity", "validity", "rank", "rank"]
    assert third[2].prompt.index("S-panthers") < third[2].prompt.index("S-broncos")  # order (s1, s2)
    assert third[3].prompt.index("S-broncos") < third[3].prompt.index("S-panthers")  # and (s2, s1)
    assert 1 + len(summaries) + len(third) == 7

    def decide(v1, v2, rank1, rank2, s1="ok", s2="ok"):
        h = [*hist, gen(3, "validity", v1), gen(3, "validity", v2)]
        h += [gen(3, "rank", rank1, status=s1), gen(3, "rank", rank2, status=s2)]
        return r.decide(ITEM, h)

    d = decide("False", "True", "2", "1")  # s2 valid and preferred in both orders
    assert d.chosen == "Denver Broncos" and d.scores == (0.0, 2.0) and d.method == "sure"
    d = decide("True", "True", "1", "1")  # position bias: each order prefers Passage 1 -> 0.5 each -> tie
    assert d.scores == (1.5, 1.5) and d.chosen == "Carolina Panthers"
    d = decide("True", "False", "", "", "unparseable", "unparseable")  # unparseable rank -> 0.5; validity decides
    assert d.scores == (1.5, 0.5) and d.chosen == "Carolina Panthers"


def test_sure_with_three_candidates_ranks_every_pair_and_averages_eq_5():
    """`candidates: 3` (seed 004 Table 6): round 1 asks for three, rounds 2-3 make 3 summaries, 3 validity checks
    and 6 ranking calls (3 pairs, both orders), and the decision is argmax v + r with r Eq. 5's sum over the K - 1 = 2
    pairs divided by 2, so v and r weigh the same (§3.3, "equally contributed").
    Hand-computed: pair (1,2) both orders name s1 -> r = (1, 0); pair (1,3) each order names its first passage
    (order bias) -> 0.5 each; pair (2,3) only the first order readable, naming s3 -> s3 gets 1. Sums (1.5, 0, 1.5),
    means (0.75, 0, 0.75); validity False, False, True -> v = (0, 0, 1): scores (0.75, 0, 1.75), s3 chosen."""
    r = get_reader("sure")
    three = knobs(r, candidates=3)
    (c1,) = r.plan(1, ITEM, [], three)
    assert "provide three correct candidates" in c1.prompt and "(a) xx, (b) yy, (c) zz, and should not" in c1.prompt
    assert r.version_for(three).endswith("+k3-reconstructed") and r.version_for(knobs(r)) == r.prompt_version
    (c1_default,) = r.plan(1, ITEM, [], knobs(r))
    assert "provide two correct candidates" in c1_default.prompt  # K = 2 stays the official string
    hist = [gen(1, "candidates", "", output="(a) Panthers, (b) Broncos, (c) Patriots")]
    assert [c.prompt.split("Prediction:")[1].split("\n")[0] for c in r.plan(2, ITEM, hist, three)] == [
        "(a) Panthers", "(b) Broncos", "(c) Patriots"]
    hist += [gen(2, "summary", f"S{i}") for i in (1, 2, 3)]
    third = r.plan(3, ITEM, hist, three)
    assert [c.role for c in third] == ["validity"] * 3 + ["rank"] * 6
    pairs = [tuple(s for s in ("S1", "S2", "S3") if s in c.prompt) for c in third[3:]]
    assert pairs == [("S1", "S2")] * 2 + [("S1", "S3")] * 2 + [("S2", "S3")] * 2
    assert third[3].prompt.index("S1") < third[3].prompt.index("S2") and third[4].prompt.index("S2") < third[4].prompt.index("S1")
    h = [*hist, gen(3, "validity", "False"), gen(3, "validity", "False"), gen(3, "validity", "True")]
    h += [gen(3, "rank", "", output=o) for o in ("Passage 1", "Passage 2", "Passage 1", "Passage 1", "Passage 2", "no idea")]
    d = r.decide(ITEM, h, three)
    assert d.scores == (0.75, 0.0, 1.75) and d.chosen == "Patriots" and d.candidates == ("Panthers", "Broncos", "Patriots")
    # s1 judged invalid but winning both its pairs, s2 the only valid one: sums (2, 0.5, 0.5) + v (0, 1, 0) would
    # pick s1 (2 > 1.5); means (1, 0.25, 0.25) + v give (1, 1.25, 0.25): the valid s2, as with two candidates
    h = [*hist, gen(3, "validity", "False"), gen(3, "validity", "True"), gen(3, "validity", "False")]
    h += [gen(3, "rank", "", output=o) for o in ("Passage 1", "Passage 2", "Passage 1", "Passage 2", "Passage 1", "Passage 1")]
    d = r.decide(ITEM, h, three)
    assert d.scores == (1.0, 1.25, 0.25) and d.chosen == "Broncos"
    # two parsed of three asked: the official two-candidate rules
    two = [gen(1, "candidates", "", output="(a) Panthers, (b) Broncos"), gen(2, "summary", "S1"), gen(2, "summary", "S2")]
    assert [c.role for c in r.plan(3, ITEM, two, three)] == ["validity", "validity", "rank", "rank"]


def test_candidates_applies_to_sure_only_and_names_the_cell():
    spec = {"name": "x", "retrievers": ["bm25@10"], "readers": [{"name": "sure", "candidates": 3}]}
    assert parse_spec(spec).reader_entries()[0].key == "sure(candidates=3)"
    assert parse_spec(spec).reader_entries()[0].settings.candidates == 3
    assert "candidates" not in parse_spec({**spec, "readers": ["sure"]}).reader_entries()[0].call_settings()
    with pytest.raises(SpecError, match=r"readers\[0\]\.candidates: 3: 'sure_base' has no setting 'candidates' \(its "
                       r"settings: none\); it is a setting of sure$"):
        parse_spec({**spec, "readers": [{"name": "sure_base", "candidates": 3}]})
    with pytest.raises(SpecError, match="candidates"):
        parse_spec({**spec, "readers": [{"name": "sure", "candidates": 4}]})


def test_sure_degenerate_candidates_make_no_further_calls():
    r = get_reader("sure")
    one = [gen(1, "candidates", "", output="Paris")]
    assert r.plan(2, ITEM, one, knobs(r)) == [] and r.plan(3, ITEM, one, knobs(r)) == []
    assert r.decide(ITEM, one).chosen == "Paris"
    none = [gen(1, "candidates", "", output="", status="empty")]
    assert r.decide(ITEM, none).chosen == "unknown"


def test_sure_label_parsers_never_crash():
    assert parse_output("True, because ...", "true_false") == ("True", "ok")
    assert parse_output("false.", "true_false") == ("False", "ok")
    assert parse_output("maybe", "true_false") == ("", "unparseable")
    assert parse_output("Passage 2", "passage_choice") == ("2", "ok")
    assert parse_output("Passage 1 and Passage 2 are equal", "passage_choice") == ("", "unparseable")
    assert parse_output("1", "passage_choice") == ("1", "ok")
    assert parse_output("A summary.\n[DONE] trailing", "sure_summary") == ("A summary.", "ok")
    for garbage in ("\x00\x01", "((((", "(a)(b)(c)(d)(e)", "Answer:" * 50):
        for parser in ("sure_candidates", "sure_summary", "true_false", "passage_choice", "answer_is", "final_answer"):
            answer, status = parse_output(garbage, parser)
            assert isinstance(answer, str) and status in ("ok", "unparseable", "empty", "error")


def test_sure_base_is_listing_5():
    (call,) = get_reader("sure_base").plan(1, ITEM, [], knobs(get_reader("sure_base")))
    assert "Task description: predict the answer to the following question. Do not exceed 3 words." in call.prompt
    (closed,) = get_reader("sure_base").plan(1, ReaderInput("q", "Q?", ()), [], ReaderSettings())
    assert closed.prompt.startswith("Task description") and closed.passage_ids == ()


# ---- seed 004 Table 3 ablations: Sum-and-pred (Gen) and the MCQ prompt ------------------------------

def test_sure_generic_summarizes_then_predicts_from_the_summary():
    r = get_reader("sure_generic")
    (summary,) = r.plan(1, ITEM, [], knobs(r))
    assert summary.prompt.startswith("\n\nPassage #1 Title: Broncos\nPassage #1 Text: The Denver Broncos won.")
    assert "support the prediction about the question only based on" in summary.prompt  # Listing 6, no conditioning
    assert "Choices:" not in summary.prompt and summary.prompt.endswith("Question: Who won Super Bowl 50?\nPassage: ")
    text = "The Denver Broncos won Super Bowl 50. [DONE]"
    hist = [gen(1, "summary", parse_output(text, "sure_summary")[0], output=text)]
    (pred,) = r.plan(2, ITEM, hist, knobs(r))
    assert pred.prompt == official_generic_prediction(ITEM.question, "The Denver Broncos won Super Bowl 50.")
    assert "Passage #1" not in pred.prompt and pred.passage_ids == ()
    assert r.decide(ITEM, [*hist, gen(2, "answer", "Denver Broncos")]).chosen == "Denver Broncos"
    empty = [gen(1, "summary", "", status="empty", output="[DONE]")]
    assert r.plan(2, ITEM, empty, knobs(r)) == []
    assert r.decide(ITEM, empty).chosen == "unknown"


@pytest.mark.parametrize(("output", "chosen", "method"), [
    ("(b)", "Carolina Panthers", "mcq"),
    ("b) Carolina Panthers", "Carolina Panthers", "mcq"),
    ("Answer: (a) Denver Broncos", "Denver Broncos", "mcq"),
    ("a", "Denver Broncos", "mcq"),
    ("Denver Broncos.", "Denver Broncos", "mcq"),
    ("The Carolina Panthers", "Carolina Panthers", "mcq"),
    ("Seattle Seahawks", "Seattle Seahawks", "mcq-off-choices"),
    ("", "unknown", "mcq-off-choices"),
])  # fmt: skip
def test_sure_mcq_offers_the_candidates_and_maps_the_pick(output, chosen, method):
    r = get_reader("sure_mcq")
    (cands,) = r.plan(1, ITEM, [], knobs(r))
    assert cands == get_reader("sure").plan(1, ITEM, [], knobs(get_reader("sure")))[0]  # the same call: shared via the LLM cache
    out = "(a) Denver Broncos, (b) Carolina Panthers"
    hist = [gen(1, "candidates", parse_output(out, "sure_candidates")[0], output=out)]
    (mcq,) = r.plan(2, ITEM, hist, knobs(r))
    assert "Task description: predict the answer to the following question. Do not exceed 3 words." in mcq.prompt
    assert mcq.prompt.endswith("Question: Who won Super Bowl 50?.\n\nChoices: (a) Denver Broncos (b) Carolina Panthers\n\n"
                               "Answer: ")
    d = r.decide(ITEM, [*hist, gen(2, "choice", parse_output(output)[0], output=output)])
    assert (d.chosen, d.method) == (chosen, method) and d.candidates == ("Denver Broncos", "Carolina Panthers")


def test_sure_mcq_with_one_candidate_makes_no_second_call():
    r = get_reader("sure_mcq")
    hist = [gen(1, "candidates", "Denver Broncos", output="Denver Broncos")]
    assert r.plan(2, ITEM, hist, knobs(r)) == []
    assert r.decide(ITEM, hist).chosen == "Denver Broncos"
    sentence = "The passages do not say which team won the game."  # kept whole, as the official handle_except keeps it
    assert r.decide(ITEM, [gen(1, "candidates", "", output=sentence)]).chosen == "The passages do not say which team won the game"
    assert r.decide(ITEM, [gen(1, "candidates", "", status="empty", output="")]).chosen == "unknown"


# ---- seed 004: the official SuRe code as the reference values -------------------------------------
# The official implementation (GitHub bbuing9/ICLR24_SuRe; the ChatGPT path functions/*.py and pref_eval.ipynb),
# transcribed for one question: the tests below check the readers against what it builds and decides.

SUM_INSTRUCTION = ("\n\nYour job is to act as a professional writer. You will write a good-quality passage that can support "
                   "the given prediction about the question only based on the information in the provided supporting "
                   "passages.\n\nNow, let's start. After you write, please write [DONE] to indicate you are done. Do not "
                   "write a prefix (e.g., \"Response:\") while writing a passage.")


def _ctx(item: ReaderInput) -> list[tuple[str, str]]:
    return [(p.title, p.body) for p in item.passages]


def official_query_candidate(question, contexts):  # functions/gen_candidates.py get_query_candidate
    text = (f"Below are {len(contexts)} passages related to the question at the end. After reading the passages, provide "
            "two correct candidates for the answer to the question at the end. Each answer should be in the form: (a) xx, "
            "(b) yy, and should not exceed 3 words for each candidate.")
    for i, (title, body) in enumerate(contexts):
        text += f"\n\nPassage #{i+1} Title: {title}\nPassage #{i+1} Text: {body}"
    return text + f"\n\nQuestion:\n{question}" + "\n\nAnswer: "


def _official_normalize(s):  # functions/gen_candidates.py normalize_answer
    while s[0] in (" ", ",", "."):
        s = s[1:]
    while s[-1] in (" ", ",", "."):
        s = s[:-1]
    return s


def official_candidates(raw):  # functions/gen_candidates.py divide_candidates + handle_except + get_choices_sampling
    item = []
    for i in range(4):
        try:
            idx = raw.index(f"({chr(i + ord('a'))})")
            if i < 3:
                try:
                    idx_next = raw.index(f"({chr(i + 1 + ord('a'))})")
                    item.append(_official_normalize(raw[idx + 3 : idx_next]))
                except Exception:
                    item.append(_official_normalize(raw[idx + 3 :]))
                    break
            else:
                item.append(_official_normalize(raw[idx + 3 :]))
        except Exception:
            item.append(_official_normalize(raw))
            break
    if len(item) == 1:
        assert item[0], "handle_except's empty case is not transcribed"
        item = [raw] if len(item[0].split(",")) > 4 else [_official_normalize(s) for s in item[0].split(",")]
    return [c for i, c in enumerate(item) if c not in item[:i]]


def official_summary_prompt(question, contexts, choices, pred_idx):  # functions/gen_summary.py gen_summary_mcq
    text = "".join(f"\n\nPassage #{i+1} Title: {t}\nPassage #{i+1} Text: {b}" for i, (t, b) in enumerate(contexts))
    listed = "".join(f"({chr(ord('a') + i)}) {c} " for i, c in enumerate(choices))[:-1]  # convert_choices_to_texts
    text += SUM_INSTRUCTION
    text += f"\n\nQuestion: {question}\nChoices:{listed}\nPrediction:({chr(ord('a') + pred_idx)}) {choices[pred_idx]}"
    return text + "\nPassage: "


def official_verification(question, pred, passage):  # functions/verification.py verification
    return (f"Question:\n{question}\n\nPrediction:\n{pred}\n\nPassage:\n{passage}"
            "\n\nDoes the passage correctly support the prediction? Choices: [True, False]. Answer:")


def official_ranking(question, passages1, passages2):  # functions/verification.py ranking_summary
    text = ("Question: Given the following passages, determine which one provides a more informative answer to the "
            "subsequent question.")
    text += f"\n\nPassage 1:\n{passages1}" + f"\n\nPassage 2:\n{passages2}" + f"\n\nTarget Question:\nQuestion: {question}"
    return text + ("\n\nYour Task:\nIdentify which passage (Passage 1 or Passage 2) is more relevant and informative to answer "
                   "the question at hand. Choices: [Passage 1, Passage 2].\n\nAnswer:")


def official_query_baseline(question, contexts):  # functions/common.py get_query_baseline
    text = "".join(f"Passage #{i+1} Title: {t}\nPassage #{i+1} Text: {b} \n\n" for i, (t, b) in enumerate(contexts))
    text += "Task description: predict the answer to the following question. Do not exceed 3 words."
    return text + f"\n\nQuestion: {question}." + "\n\nAnswer: "


def official_generic_summary(question, contexts):  # pref_eval.ipynb summarize
    text = "".join(f"\n\nPassage #{i+1} Title: {t}\nPassage #{i+1} Text: {b}" for i, (t, b) in enumerate(contexts))
    return text + SUM_INSTRUCTION.replace("the given prediction", "the prediction") + f"\n\nQuestion: {question}" + "\nPassage: "


def official_generic_prediction(question, summary):  # pref_eval.ipynb prediction
    text = ("Below is the passage related to the question at the end. After reading the passage, provide correct answer to "
            "the question at the end. Answer should not exceed 3 words.")
    return text + f"\n\nPassage:\n{summary}" + f"\n\nQuestion:\n{question}" + "\n\nAnswer: "


_RANK_CORNER_CASES = ["passage 1, passage 2", "choice (a) summary 2", "(b) the wood (summary 2)", "(b) summary 2",
                      "[summary 1, summary 2]", "[summary 1]", "[summary 2]", "passage 1.", "passage 2.", "brady seals",
                      "passage 1 or passage 2", "inconclusive", "no articles", "sorry", "3", "uncertain", "n", "both",
                      "either", "passage 3", "passage 4", "passage 5", "passage 6", "passage 7", "passage 8",
                      "not possible", "insufficient"]  # functions/verification.py error_check


def official_postprocess_rank(pred1, pred2):  # functions/verification.py postprocess_rank
    def error(res):
        return any(item in res for item in _RANK_CORNER_CASES)

    p1, p2 = pred1.lower(), pred2.lower()
    if p1 == "passage 1" and p2 == "passage 2":
        return 0
    if p1 == "passage 2" and p2 == "passage 1":
        return 1
    if p1 == p2:
        return 0.5
    if error(p1):
        return 0.5 if error(p2) else (0 if p2 == "passage 2" else 1)
    if error(p2):
        return 0 if p1 == "passage 1" else 1
    return 0.5


def official_final_index(correct1, correct2, answer1, answer2):  # functions/get_preds.py get_final_pred_sure, one question
    def error_fin(res):
        return any(item in res for item in ("Cannot", "False", "Unknown"))

    res = official_postprocess_rank(answer1, answer2)  # use_api_rank
    rank = [1.0, 0.0] if res == 0 else [0.0, 1.0] if res == 1 else [0.5, 0.5]
    if ("True" in correct1 and "True" in correct2) or ("False" in correct1 and "False" in correct2):
        pass
    elif "True" in correct1 and error_fin(correct2):
        rank = [0.5 * r + 0.5 * o for r, o in zip(rank, (1, 0), strict=True)]
    elif error_fin(correct1) and "True" in correct2:
        rank = [0.5 * r + 0.5 * o for r, o in zip(rank, (0, 1), strict=True)]
    best = max(rank)
    return 0 if rank.count(best) > 1 else rank.index(best)  # a tie: the first candidate


SURE_HIST = [gen(1, "candidates", "", output="(a) Carolina Panthers, (b) Denver Broncos"),
             gen(2, "summary", "S-panthers"), gen(2, "summary", "S-broncos")]


def sure_history(v1: str, v2: str, rank1: str, rank2: str) -> list[Generation]:
    """SURE_HIST plus round 3's outputs, parsed as the generate stage parses them."""
    return [*SURE_HIST, *(gen(3, "validity", parse_output(v, "true_false")[0], output=v) for v in (v1, v2)),
            *(gen(3, "rank", *parse_output(o, "passage_choice"), output=o) for o in (rank1, rank2))]


def test_sure_prompts_are_the_official_strings():
    r, q, ctx = get_reader("sure"), ITEM.question, _ctx(ITEM)
    (c1,) = r.plan(1, ITEM, [], knobs(r))
    assert c1.prompt == official_query_candidate(q, ctx)
    out = "(a) Carolina Panthers, (b) Denver Broncos, (c) Seattle Seahawks"
    hist = [gen(1, "candidates", "", output=out)]
    choices = official_candidates(out)
    summaries = r.plan(2, ITEM, hist, knobs(r))  # two summaries; the choices line lists all three candidates
    assert [c.prompt for c in summaries] == [official_summary_prompt(q, ctx, choices, k) for k in (0, 1)]
    hist += [gen(2, "summary", "S-panthers"), gen(2, "summary", "S-broncos")]
    assert [c.prompt for c in r.plan(3, ITEM, hist, knobs(r))] == [
        official_verification(q, "Carolina Panthers", "S-panthers"), official_verification(q, "Denver Broncos", "S-broncos"),
        official_ranking(q, "S-panthers", "S-broncos"), official_ranking(q, "S-broncos", "S-panthers")]
    (base,) = get_reader("sure_base").plan(1, ITEM, [], knobs(get_reader("sure_base")))
    assert base.prompt == official_query_baseline(q, ctx)
    (closed,) = get_reader("sure_base").plan(1, ReaderInput("q", "who won super bowl 50", ()), [], ReaderSettings())
    assert closed.prompt == official_query_baseline("who won super bowl 50", [])  # No retrieval: N = 0
    generic = get_reader("sure_generic")
    assert generic.plan(1, ITEM, [], knobs(generic))[0].prompt == official_generic_summary(q, ctx)


@pytest.mark.parametrize("output", [
    "(a) The Treaty of Paris signed in 1783, (b) Treaty of Versailles",  # 8 words: kept (it was dropped over 6)
    "(a) Paris, (b) the First Continental Congress of the United States",
    "(a) unknown, (b) Paris",  # an abstention is a candidate
    "(a) Paris, (b) Lyon, (c) Marseille",
    "(a) 1925",
    "Sorry, I cannot determine the answer from the passages.",  # unmarked: split on commas
    "The passages do not say which of the two teams won the game in question",  # unmarked, no comma: kept whole
    "It could be Paris, Lyon, Marseille, Nice, Toulouse or Bordeaux in France",  # more than 4 comma parts: kept whole
])  # fmt: skip
def test_sure_candidates_keep_what_the_official_code_keeps(output):
    assert parse_candidates(output, MAX_CHOICES) == official_candidates(output)
    assert candidates_from([gen(1, "candidates", "", output=output)]) == official_candidates(output)[:2]


RANK_OUTPUTS = ("Passage 1", "Passage 2", "I cannot tell", "Both")  # the last two: unparseable for both codes
VALIDITY_OUTPUTS = ("True", "False", "Unknown", "Cannot be determined", "Maybe")


@pytest.mark.parametrize(("v1", "v2"), [(a, b) for a in VALIDITY_OUTPUTS for b in VALIDITY_OUTPUTS])
def test_sure_decides_as_the_official_code_for_every_verdict_and_ranking(v1, v2):
    r = get_reader("sure")
    for rank1 in RANK_OUTPUTS:
        for rank2 in RANK_OUTPUTS:
            d = r.decide(ITEM, sure_history(v1, v2, rank1, rank2))
            official = ("Carolina Panthers", "Denver Broncos")[official_final_index(v1, v2, rank1, rank2)]
            assert d.chosen == official, (v1, v2, rank1, rank2, d.scores)


def test_sure_one_unparseable_ranking_order_decides_as_the_official_code():
    r = get_reader("sure")
    # order (s1, s2) prefers s1, order (s2, s1) is unreadable: postprocess_rank gives s1 the whole rank, r = (1, 0)
    assert official_postprocess_rank("Passage 1", "I cannot tell") == 0
    d = r.decide(ITEM, sure_history("False", "True", "Passage 1", "I cannot tell"))
    # v + r = (0 + 1, 1 + 0): a tie, so the first candidate (get_final_pred_sure: 0.5 r + 0.5 v = (0.5, 0.5));
    # scoring the unreadable order 0.5 each (Eq. 5) would give (0.75, 1.25) and the second candidate
    assert d.scores == (1.0, 1.0) and d.chosen == "Carolina Panthers"
    assert official_final_index("False", "True", "Passage 1", "I cannot tell") == 0
    # the second order alone: "Passage 1" there is s2
    d = r.decide(ITEM, sure_history("True", "True", "Both", "Passage 1"))
    assert d.scores == (1.0, 2.0) and d.chosen == "Denver Broncos"
    # both unreadable: 0.5 each, validity decides
    assert r.decide(ITEM, sure_history("True", "False", "Both", "I cannot tell")).scores == (1.5, 0.5)
    # a True against a validity output without a verdict: get_final_pred_sure ranks alone (Eq. 4 would count it)
    d = r.decide(ITEM, sure_history("True", "Maybe", "Passage 2", "Passage 1"))
    assert d.scores == (0.0, 1.0) and d.chosen == "Denver Broncos"


def test_table3_pairwise_ranking_row_ranks_sures_summaries_without_validity():
    sure, ranking, s = get_reader("sure"), get_reader("sure_ranking"), ReaderSettings()
    assert ranking.plan(1, ITEM, [], s) == sure.plan(1, ITEM, [], s)  # the same calls: shared via the LLM-call cache
    assert ranking.plan(2, ITEM, SURE_HIST[:1], s) == sure.plan(2, ITEM, SURE_HIST[:1], s)
    assert ranking.plan(3, ITEM, SURE_HIST, s) == [c for c in sure.plan(3, ITEM, SURE_HIST, s) if c.role == "rank"]
    hist = sure_history("True", "False", "Passage 2", "Passage 1")  # both orders prefer s2; s2 is not valid
    d = ranking.decide(ITEM, hist)
    assert (d.method, d.scores, d.chosen) == ("sure-rank-only", (0.0, 1.0), "Denver Broncos")
    assert sure.decide(ITEM, hist).chosen == "Carolina Panthers"  # with validity: v + r = (1, 1), a tie to the first
    assert ranking.decide(ITEM, sure_history("True", "False", "Passage 1", "Passage 1")).chosen == "Carolina Panthers"
    assert ranking.decide(ITEM, sure_history("False", "True", "Both", "Passage 1")).chosen == "Denver Broncos"
    one = [gen(1, "candidates", "", output="(a) Denver Broncos")]
    assert ranking.plan(2, ITEM, one, s) == [] and ranking.plan(3, ITEM, one, s) == []
    assert ranking.decide(ITEM, one).chosen == "Denver Broncos"


def test_table3_conditional_summaries_row_appends_sures_summaries_to_base():
    sure, row, s = get_reader("sure"), get_reader("sure_summaries"), ReaderSettings()
    assert row.plan(1, ITEM, [], s) == sure.plan(1, ITEM, [], s)
    assert row.plan(2, ITEM, SURE_HIST[:1], s) == sure.plan(2, ITEM, SURE_HIST[:1], s)
    (call,) = row.plan(3, ITEM, SURE_HIST, s)
    base = official_query_baseline(ITEM.question, _ctx(ITEM))
    at = base.index("Task description")
    assert call.prompt == base[:at] + "Summary #1: S-panthers\n\nSummary #2: S-broncos\n\n" + base[at:]
    assert call.passage_ids == ("p1", "p2", "p3")
    d = row.decide(ITEM, [*SURE_HIST, gen(3, "answer", "Denver Broncos")])
    assert (d.method, d.chosen) == ("summaries-appended", "Denver Broncos")
    one = [gen(1, "candidates", "", output="(a) Denver Broncos")]  # no summaries: Base's own call
    assert row.plan(2, ITEM, one, s) == [] and row.plan(3, ITEM, one, s) == get_reader("sure_base").plan(1, ITEM, [], s)


# ---- seed 003: REFEED -----------------------------------------------------------------------------

def test_refeed_retrieves_with_question_plus_answer_and_refines():
    r = get_reader("refeed")
    (initial,) = r.plan(1, ITEM, [], knobs(r))
    assert initial.passage_ids == () and initial.logprobs and initial.temperature == 0.0
    assert initial.prompt == "Question: Who won Super Bowl 50? The answer is"
    queries = []

    def retrieve(text, k):
        queries.append((text, k))
        return [Passage("f1", "Feedback doc one."), Passage("f2", "Feedback doc two.")]

    hist = [gen(1, "initial", "Carolina Panthers", lp=-0.2, p=0.8)]
    (refine,) = r.plan(2, ITEM, hist, knobs(r, retrieve=retrieve, feedback_k=10))
    assert queries == [("Who won Super Bowl 50? Carolina Panthers", 10)]
    assert refine.passage_ids == ("f1", "f2") and refine.logprobs
    # Table 11 in §4.1's order [prompt words; passage; question]: the instruction, the documents, the question,
    # "The answer is"; no initial answer by default
    assert refine.prompt == ("Refer to the passages below and answer the following question with just a few words.\n"
                             "Passage: Feedback doc one.\nPassage: Feedback doc two.\n"
                             "Question: Who won Super Bowl 50?\nThe answer is")
    assert refine.system == initial.system and initial.system.count("Question:") == 5  # the five printed shots
    docs = r.feedback_documents(ITEM.question, "refine", refine.prompt)
    assert docs == "Passage: Feedback doc one.\nPassage: Feedback doc two."
    assert r.plan(2, ITEM, hist, knobs(r)) == []  # closed-book cell: no retriever, no refinement
    r.plan(2, ITEM, hist, knobs(r, retrieve=retrieve))
    assert queries[-1][1] == 10  # the paper's k by default

    keep_initial = r.decide(ITEM, [*hist, gen(2, "refine", "Denver Broncos", lp=-0.9, p=0.4)])
    assert keep_initial.chosen == "Carolina Panthers" and keep_initial.method == "refeed-answer-prob"
    take_refined = r.decide(ITEM, [gen(1, "initial", "Carolina Panthers", lp=-2.0, p=0.2),
                                   gen(2, "refine", "Denver Broncos", lp=-0.9, p=0.4)])
    assert take_refined.chosen == "Denver Broncos" and take_refined.scores == (0.2, 0.4)
    no_lp = r.decide(ITEM, [gen(1, "initial", "Carolina Panthers"), gen(2, "refine", "Denver Broncos")])
    assert no_lp.method == "refeed-no-logprobs" and no_lp.chosen == "Denver Broncos" and math.isnan(no_lp.scores[0])
    ablation = get_reader("refeed_refined").decide(ITEM, [*hist, gen(2, "refine", "Denver Broncos", lp=-0.9, p=0.4)])
    assert ablation.chosen == "Denver Broncos"


def test_refeed_table11_titles_shots_and_the_initial_answer_option():
    r = get_reader("refeed")

    def retrieve(text, k):
        return [Passage("d1", "Deadpool: Screen Rant called it a campaign.", title="Deadpool")]

    hist = [gen(1, "initial", "Carolina Panthers")]
    (refine,) = r.plan(2, ITEM, hist, knobs(r, retrieve=retrieve))
    assert "\nTitle: Deadpool. Passage: Screen Rant called it a campaign.\n" in refine.prompt
    (zero,) = r.plan(1, ITEM, [], knobs(r, shots=0))
    assert zero.system == "" and zero.prompt == "Question: Who won Super Bowl 50? The answer is"
    (two,) = r.plan(1, ITEM, [], knobs(r, shots=2))
    assert two.system.splitlines() == ["Question: total number of death row inmates in the us? The answer is 2,718",
                                       "Question: big little lies season 2 how many episodes? The answer is seven"]
    (shown,) = r.plan(2, ITEM, hist, knobs(r, retrieve=retrieve, show_initial=True))
    assert shown.prompt.endswith("Passage: Screen Rant called it a campaign.\n"
                                 "Initial answer (before reading the passages): Carolina Panthers\n"
                                 "Question: Who won Super Bowl 50?\nThe answer is")
    shown_docs = r.feedback_documents(ITEM.question, "refine", shown.prompt)
    assert shown_docs == "Title: Deadpool. Passage: Screen Rant called it a campaign."
    versions = {r.version_for(knobs(r)), r.version_for(knobs(r, shots=0)),
                r.version_for(knobs(r, show_initial=True))}
    assert len(versions) == 3
    spec = parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": [{"name": "refeed", "shots": 0}]})
    assert spec.reader_entries()[0].key == "refeed(shots=0)" and spec.reader_entries()[0].settings.shots == 0
    with pytest.raises(SpecError, match=r"readers\[0\]\.shots: 0: 'concatenation' has no setting 'shots' \(its settings: "
                       r"samples, sample_temperature\); it is a setting of refeed, refeed_refined, retrieve_read"):
        parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": [{"name": "concatenation", "shots": 0}]})


def test_retrieve_read_is_table_11s_prompt_over_the_cells_own_retrieval():
    """Seed 003's Retrieve-Read in §4.1's order [prompt words; passage; question]: the instruction, the cell's
    passages as "Title: ... Passage: ...", the question, "The answer is" (GenRead's reading prompt, by REFEED's first
    author, has the same order); the first `shots` demonstrations as the system prompt; one greedy call; the answer
    as written."""
    r = get_reader("retrieve_read")
    (call,) = r.plan(1, ITEM, [], knobs(r, shots=0))
    assert call.prompt == ("Refer to the passages below and answer the following question with just a few words.\n"
                           "Title: Broncos. Passage: The Denver Broncos won.\n"
                           "Title: Panthers. Passage: The Carolina Panthers lost.\n"
                           "Title: Weather. Passage: It rained.\n"
                           "Question: Who won Super Bowl 50?\n"
                           "The answer is")
    assert call.system == "" and call.passage_ids == ("p1", "p2", "p3") and call.temperature == 0.0
    assert r.plan(1, ITEM, [], knobs(r)).pop().system.count("The answer is") == 5  # all five by default
    closed = r.plan(1, ReaderInput("q1", "Who won Super Bowl 50?", ()), [], knobs(r, shots=0)).pop()
    assert closed.prompt == "Question: Who won Super Bowl 50? The answer is"  # no passages: Table 10's QA prompt
    output = " Denver Broncos."
    d = r.decide(ITEM, [gen(1, "answer", parse_output(output, "answer_is")[0], output=output)])
    assert (d.method, d.chosen) == ("single", "Denver Broncos")
    assert r.version_for(knobs(r, shots=0)) != r.version_for(knobs(r))
    spec = parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": [{"name": "retrieve_read", "shots": 0}]})
    assert spec.reader_entries()[0].key == "retrieve_read(shots=0)"
    with pytest.raises(SpecError, match="'retrieve_read' has no setting 'feedback_k'"):
        parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": [{"name": "retrieve_read", "feedback_k": 5}]})


def test_settings_added_later_leave_the_settings_of_older_entries_unchanged():
    """Cache keys of entries written before `shots`/`show_initial` existed, and before each reader declared its own
    settings, stay the same; a stored spec's legacy settings at their defaults still read."""
    spec = parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": [{"name": "post_fusion", "samples": 3}]})
    assert spec.reader_entries()[0].call_settings() == {"samples": 3, "sample_temperature": 0.7, "feedback_k": None,
                                                        "feedback_samples": None}
    stored = {"name": "post_fusion", "samples": 3, "sample_temperature": 0.7, "feedback_k": None, "feedback_samples": None,
              "shots": None, "show_initial": False, "candidates": None, "vote": "majority", "label": None}
    again = parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": [stored]})
    assert again.reader_entries() == spec.reader_entries() and again.spec_hash() == spec.spec_hash()
    with pytest.raises(SpecError, match=r"readers\[0\]\.shots: 2: 'post_fusion' has no setting 'shots'"):
        parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": [{**stored, "shots": 2}]})


def test_refeed_output_probability_is_the_arithmetic_mean_over_all_output_tokens():
    """Seed 003 §3.2.2: P(y | x) = (1/t) sum_i p(y_i | y_<i, x) over the output's t tokens. Hand-computed: the
    initial output "Carolina Panthers." with tokens p = [0.9, 0.9, 0.01] has P = 1.81 / 3 = 0.6033; the refined
    "Denver Broncos" [0.7, 0.7] has 0.7, so MODULE-2 keeps the refined answer. Over the parsed answer's tokens only
    (answer_prob: 0.9 against 0.7) it would keep the initial one; a geometric mean (0.2008 against 0.7) agrees with
    the paper here, but not on [0.99, 0.30] against [0.6, 0.6] (0.645 > 0.6 arithmetic, 0.545 < 0.6 geometric)."""
    from strategies.readers.base import output_token_prob

    initial = [("Carolina", math.log(0.9)), (" Panthers", math.log(0.9)), (".", math.log(0.01))]
    refined = [(" Denver", math.log(0.7)), (" Broncos", math.log(0.7))]
    assert output_token_prob(initial) == pytest.approx(1.81 / 3) and output_token_prob(refined) == pytest.approx(0.7)
    assert output_token_prob([("a", math.log(0.99)), ("b", math.log(0.30))]) == pytest.approx(0.645)
    assert output_token_prob(None) is None and output_token_prob([]) is None
    r = get_reader("refeed")
    d = r.decide(ITEM, [gen(1, "initial", "Carolina Panthers", lp=-0.5, p=output_token_prob(initial)),
                        gen(2, "refine", "Denver Broncos", lp=-0.5, p=output_token_prob(refined))])
    assert d.chosen == "Denver Broncos" and d.method == "refeed-answer-prob"
    assert d.scores == pytest.approx((1.81 / 3, 0.7))
    # an output with no answer parsed from it loses, whatever its tokens' probability
    empty = r.decide(ITEM, [gen(1, "initial", "", output="...", lp=-0.1, p=0.95),
                            gen(2, "refine", "Denver Broncos", lp=-0.5, p=0.2)])
    assert empty.chosen == "Denver Broncos"


def test_answer_token_prob_is_the_arithmetic_mean_over_the_answer_tokens():
    """answer_prob, stored beside output_prob: the parsed answer's own tokens. Tokens p = [0.99, 0.30] (mean 0.645,
    geometric 0.545) against [0.6, 0.6] (0.6); a trailing "." at p = 0.01 is not an answer token."""
    from strategies.readers.base import answer_token_prob

    first = [("Carolina", math.log(0.99)), (" Panthers", math.log(0.30)), (".", math.log(0.01))]
    assert answer_token_prob("Carolina Panthers.", first, "Carolina Panthers") == pytest.approx(0.645)
    second = [("The", math.log(0.1)), (" answer", math.log(0.1)), (" is", math.log(0.1)), (" Denver", math.log(0.6)),
              (" Broncos", math.log(0.6))]
    assert answer_token_prob("The answer is Denver Broncos", second, "Denver Broncos") == pytest.approx(0.6)
    assert answer_token_prob("The answer is", second[:3], "") is None
    assert answer_token_prob("Denver", None, "Denver") is None


def test_refeed_module1_samples_merges_feedback_by_score_and_ensembles():
    r = get_reader("refeed")
    s3 = knobs(r, feedback_samples=3, feedback_k=3)
    initial = r.plan(1, ITEM, [], s3)
    assert [c.sample_index for c in initial] == [0, 1, 2]
    assert {(c.temperature, c.top_p, c.logprobs) for c in initial} == {(0.7, 0.9, True)}
    assert r.version_for(s3) != r.version_for(knobs(r)) == r.prompt_version
    p1, p2 = Passage("p1", "Broncos won.", score=12.0), Passage("p2", "Panthers lost.", score=5.0)
    lists = {
        "Who won Super Bowl 50? Carolina Panthers": [Passage("p2", "Panthers lost.", score=9.0), Passage("w", "x", score=2.0)],
        "Who won Super Bowl 50? Denver Broncos": [p1, p2, Passage("x", "Other.", score=4.0)],
    }
    queries = []

    def retrieve(text, k):
        queries.append((text, k))
        return lists[text]

    hist = [gen(1, "initial", a, lp=-0.5, p=lp, sample=j)
            for j, (a, lp) in enumerate((("Carolina Panthers", 0.7), ("Denver Broncos", 0.45), ("Carolina Panthers", 0.7)))]
    (refine,) = r.plan(2, ITEM, hist, knobs(r, retrieve=retrieve, feedback_samples=3, feedback_k=3))
    assert queries == [("Who won Super Bowl 50? Carolina Panthers", 3), ("Who won Super Bowl 50? Denver Broncos", 3)]
    assert refine.passage_ids == ("p1", "p2", "x")  # merged, deduplicated at the best score, top k = 3
    assert "Initial answers (before reading the passages): Carolina Panthers; Denver Broncos\n" in refine.prompt
    docs = r.feedback_documents(ITEM.question, "refine", refine.prompt)
    assert docs == "Passage: Broncos won.\nPassage: Panthers lost.\nPassage: Other."
    assert r.feedback_documents(ITEM.question, "initial", "Question: x The answer is") is None

    d = r.decide(ITEM, [*hist, gen(2, "refine", "Denver Broncos", lp=-0.5, p=0.6)])
    assert d.candidates == ("Carolina Panthers", "Denver Broncos", "Carolina Panthers", "Denver Broncos")
    assert d.chosen == "Carolina Panthers" and d.method == "refeed-answer-prob"  # the best initial (0.7) beats the refined
    ablation = get_reader("refeed_refined").decide(ITEM, [*hist, gen(2, "refine", "Denver Broncos", lp=-0.5, p=0.6)])
    assert ablation.chosen == "Denver Broncos"

    # without scores (an LLM-written retriever) the lists are interleaved by rank
    from strategies.readers.refeed import merge_by_score

    a = [Passage("a1", "x"), Passage("a2", "x")]
    b = [Passage("b1", "x"), Passage("a1", "x")]
    assert [p.pid for p in merge_by_score([a, b], 3)] == ["a1", "b1", "a2"]


def test_feedback_settings_only_for_refeed_and_enter_labels():
    spec = parse_spec({"name": "t", "retrievers": ["bm25@5"],
                       "readers": ["refeed", {"name": "refeed", "feedback_samples": 3}]})
    assert [e.key for e in spec.reader_entries()] == ["refeed", "refeed(feedback_samples=3)"]
    assert spec.reader_entry("refeed(feedback_samples=3)").settings.initial_answers == 3
    assert spec.reader_entry("refeed").settings.initial_answers == 1
    with pytest.raises(SpecError, match=r"'sure' has no setting 'feedback_samples'.*a setting of refeed, refeed_refined"):
        parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": [{"name": "sure", "feedback_samples": 3}]})
    with pytest.raises(SpecError, match=r"readers\[0\]\.feedback_samples"):
        parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": [{"name": "refeed", "feedback_samples": 1}]})


def test_answer_is_parser():
    assert parse_output("The answer is Denver Broncos.", "answer_is") == ("Denver Broncos", "ok")
    assert parse_output(" Saltfjellet\nQuestion: next?", "answer_is") == ("Saltfjellet", "ok")
    assert parse_output("The answer is", "answer_is") == ("", "unparseable")


# ---- reader settings in the spec ------------------------------------------------------------------

def test_reader_entries_accept_names_and_settings():
    spec = parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": ["post_fusion", {"name": "post_fusion", "samples": 3},
                                                                         {"name": "refeed", "feedback_k": 10}]})
    keys = [e.key for e in spec.reader_entries()]
    assert keys == ["post_fusion", "post_fusion(samples=3)", "refeed(feedback_k=10)"]
    s = spec.reader_entry("post_fusion(samples=3)").settings
    assert s.samples == 3 and s.sample_temperature == 0.7
    assert spec.spec_hash() != parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": ["post_fusion"]}).spec_hash()
    with pytest.raises(SpecError, match="duplicate reader entries"):
        parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": ["sure", {"name": "sure"}]})
    with pytest.raises(SpecError, match="samples"):
        parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": [{"name": "sure", "samples": 0}]})
    with pytest.raises(SpecError, match=r"readers\[0\]\.colour: 'red': 'sure' has no setting 'colour' \(its settings: "
                       r"candidates\)$"):
        parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": [{"name": "sure", "colour": "red"}]})
    with pytest.raises(SpecError, match=r"readers\[1\]: expected a reader name or a mapping"):
        parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": ["sure", 3]})
    with pytest.raises(SpecError, match="unknown reader strategy 'nope'"):
        parse_spec({"name": "t", "retrievers": ["bm25@5"], "readers": [{"name": "nope"}]})


# ---- %NM (seed 001): over all questions; a single answer is a one-answer pool -------------------------

def test_the_semantic_match_embeds_only_wrong_answers_and_holds_them_to_the_threshold(monkeypatch):
    """EM decides a correct answer and an abstention never matches, with no embedding; a wrong answer matches when
    its cosine to a gold answer (the real encoder) reaches SEMANTIC_THRESHOLD."""
    import engines.semantic as semantic
    from tasks.evaluate import semantic_matches

    votes = pd.DataFrame({"qid": ["q1", "q2", "q3", "q4"],
                          "chosen": ["Denver Broncos", "unknown", "the Broncos from Denver", "photosynthesis"]})
    answers = {"q1": ["Denver Broncos"], "q2": ["Carolina Panthers"], "q3": ["Denver Broncos", "Broncos"],
               "q4": ["Denver Broncos"]}
    real, asked = semantic.max_similarity, []
    monkeypatch.setattr(semantic, "max_similarity", lambda p, g: asked.append((p, g)) or real(p, g))
    close, far = real(["the Broncos from Denver", "photosynthesis"], [answers["q3"], answers["q4"]])
    assert far < semantic.SEMANTIC_THRESHOLD
    assert semantic_matches(votes, answers) == [False, False, close >= semantic.SEMANTIC_THRESHOLD, False]
    assert asked == [(["the Broncos from Denver", "photosynthesis"], [answers["q3"], answers["q4"]])]


def test_nm_is_a_rate_over_all_questions_and_a_single_answer_is_a_one_answer_pool():
    from tasks.evaluate import outcome_rows
    from tracking.analysis.metrics import cell_metrics

    questions = pd.DataFrame({"qid": ["a", "b", "c", "d"], "answers": [["Paris"]] * 4})
    retrievals = pd.DataFrame({"qid": ["a"], "rank": [1], "pid": ["p"], "text": ["Paris is in France."], "title": ["x"]})
    votes = pd.DataFrame({
        "qid": ["a", "b", "c", "d"],
        "method": ["majority", "majority", "majority", "single"],
        "candidates": [["Paris", "Lyon", "Lyon"], ["Paris", "Lyon"], ["Lyon", "Nice"], ["Paris"]],
        "chosen": ["Lyon", "Paris", "Lyon", "Paris"],
    })  # fmt: skip
    rows = outcome_rows("e", "c", "r", "s", "m", "k", questions, retrievals, votes, pd.DataFrame(), semantic=False)
    out = pd.DataFrame(rows)
    assert out.set_index("qid")["pool_has_correct"].to_dict() == {"a": True, "b": True, "c": False, "d": True}
    m = cell_metrics(out)
    assert m["nm_pct"] == 25.0  # a (pool correct, picked wrong) of all four questions
    assert m["nm_cond_pct"] == 33.33  # a of {a, b, d}, the questions whose pool holds a correct answer


def test_concat_pf_nm_counts_fallback_misses_over_all_questions():
    """001's Concat+PF: only questions where Concatenation said "unknown" are pooled (Post-Fusion over the k passages).
    Hand-computed on 10 questions: 2 fall back; one fallback pool holds "Paris" but the majority says "Lyon".
    %NM = 1/10 = 10.0 (the paper's rate over all questions; the old rate over pooled questions said 100.0), and
    %NM|pool = 1/(1 + 5 single correct answers) = 16.67."""
    from tasks.evaluate import outcome_rows
    from tracking.analysis.metrics import cell_metrics

    qids = [f"q{i}" for i in range(10)]
    single = {"q2": "Paris", "q3": "Paris", "q4": "Paris", "q5": "Paris", "q6": "Paris", "q7": "Rome", "q8": "Rome",
              "q9": "Rome"}
    votes = pd.DataFrame({
        "qid": qids,
        "method": ["fallback-majority", "fallback-majority"] + ["single"] * 8,
        "candidates": [["Paris", "Lyon", "Lyon"], ["Rome", "Nice", "Nice"]] + [[single[q]] for q in qids[2:]],
        "chosen": ["Lyon", "Nice"] + [single[q] for q in qids[2:]],
    })  # fmt: skip
    questions = pd.DataFrame({"qid": qids, "answers": [["Paris"]] * 10})
    rows = outcome_rows("e", "c", "r", "s", "m", "k", questions, pd.DataFrame(columns=["qid", "rank", "pid", "text"]),
                        votes, pd.DataFrame(), semantic=False)
    m = cell_metrics(pd.DataFrame(rows))
    assert (m["em"], m["nm_pct"], m["nm_cond_pct"]) == (50.0, 10.0, 16.67)


# ---- error decomposition context (seed 002): what the reader saw in its final round ----------------

def test_refeed_answer_found_in_feedback_documents_is_correct_not_a_lucky_guess():
    """The cell's retrieval lacks the answer; REFEED's refine call read feedback documents that hold it. The context
    of the decomposition is the final round's: correct (not lucky_guess); Recall@k still counts the cell's retrieval."""
    from tasks.evaluate import outcome_rows
    from tracking.analysis.metrics import cell_metrics

    questions = pd.DataFrame({"qid": ["a", "b"], "question": ["capital of France?", "capital of Italy?"],
                              "answers": [["Paris"], ["Rome"]]})
    retrievals = pd.DataFrame({"qid": ["a", "b"], "rank": [1, 1], "pid": ["p1", "p2"],
                               "text": ["France is in Europe.", "Rome is the capital of Italy."]})
    votes = pd.DataFrame({"qid": ["a", "b"], "method": ["refeed-answer-prob"] * 2,
                          "candidates": [["Lyon", "Paris"], ["Milan", "Milan"]], "chosen": ["Paris", "Milan"]})
    generations = pd.DataFrame({
        "qid": ["a", "a", "b", "b"], "role": ["initial", "refine", "initial", "refine"],
        "prompt": ["", "DOCS: Paris is the capital of France.", "", "DOCS: Milan is in Lombardy."],
        "tokens_in": [1, 1, 1, 1], "tokens_out": [1, 1, 1, 1],
    })  # fmt: skip

    def feedback_documents(question: str, role: str, prompt: str) -> str | None:
        return prompt.removeprefix("DOCS: ") if role == "refine" else None

    rows = pd.DataFrame(outcome_rows("e", "c", "r", "refeed", "m", "k", questions, retrievals, votes, generations,
                                     semantic=False, feedback_documents=feedback_documents)).set_index("qid")
    assert rows.loc["a", ["gold_in_context", "gold_in_retrieval", "gold_in_feedback", "error_type"]].tolist() == \
        [True, False, True, "correct"]
    # b: the feedback documents lack "Rome" and hold the (wrong) prediction: a retrieval failure of the final context,
    # though the cell's own retrieval had the answer
    assert rows.loc["b", ["gold_in_context", "gold_in_retrieval", "error_type"]].tolist() == \
        [False, True, "retrieval_failure"]
    m = cell_metrics(rows.reset_index())
    assert m["recall_at_k"] == 50.0 and m["recall_feedback_at_k"] == 50.0


def test_pf_concat_answer_in_a_passage_dropped_before_the_distil_call_is_a_retrieval_failure():
    """pf_concat's distil call reads only the passages Post-Fusion kept. Question a: the answer is in p1, whose PF
    call said unknown, so the distil call read p2 alone: the wrong answer "Lyon" (in p2) is a retrieval failure of the
    final context, though the retrieval had the answer (Recall@k counts it). Question b: every PF call said unknown,
    no distil call: the final round read both passages, which hold the answer: an abstention, gold in context."""
    from strategies.readers import get_reader
    from tasks.evaluate import outcome_rows

    questions = pd.DataFrame({"qid": ["a", "b"], "answers": [["Paris"], ["Rome"]]})
    retrievals = pd.DataFrame({"qid": ["a", "a", "b", "b"], "rank": [1, 2, 1, 2], "pid": ["p1", "p2", "p3", "p4"],
                               "text": ["Paris is the capital of France.", "Lyon is a city in France.",
                                        "Rome is the capital of Italy.", "Milan is in Italy."]})
    votes = pd.DataFrame({"qid": ["a", "b"], "method": ["distill"] * 2, "candidates": [["Lyon"], []],
                          "chosen": ["Lyon", "unknown"]})
    generations = pd.DataFrame({
        "qid": ["a", "a", "a", "b", "b"], "round": [1, 1, 2, 1, 1], "call_index": [0, 1, 0, 0, 1],
        "role": ["answer", "answer", "distill", "answer", "answer"],
        "passage_ids": [("p1",), ("p2",), ("p2",), ("p3",), ("p4",)],
        "parsed_answer": ["unknown", "Lyon", "Lyon", "unknown", "unknown"],
        "tokens_in": [1] * 5, "tokens_out": [1] * 5,
    })  # fmt: skip
    reader = get_reader("pf_concat")
    rows = pd.DataFrame(outcome_rows("e", "c", "r", "pf_concat", "m", "k", questions, retrievals, votes, generations,
                                     semantic=False, final_context=reader.final_context)).set_index("qid")
    assert rows.loc["a", ["gold_in_context", "gold_in_retrieval", "error_type"]].tolist() == \
        [False, True, "retrieval_failure"]
    assert rows.loc["b", ["gold_in_context", "gold_in_retrieval", "error_type"]].tolist() == [True, True, "abstention"]
    assert rows["gold_in_feedback"].isna().all()  # not feedback retrieval: Recall@k of feedback stays REFEED's
    # without the reader's final context, a is an extraction error over the whole retrieval (what was counted before)
    before = pd.DataFrame(outcome_rows("e", "c", "r", "pf_concat", "m", "k", questions, retrievals, votes, generations,
                                       semantic=False)).set_index("qid")
    assert before.loc["a", "error_type"] == "extraction_error"


def test_sure_generic_reads_the_summary_alone_in_its_final_call():
    """sure_generic answers from its generic summary. a: the summary dropped "Paris" (in the passages) and the model
    answered "Lyon", which the summary holds: a retrieval failure of the final context. b: the summary holds "Rome"
    and the answer is right: correct. c: the summary call failed, no answer call: the final round read the passages."""
    from strategies.readers import get_reader
    from tasks.evaluate import outcome_rows

    questions = pd.DataFrame({"qid": ["a", "b", "c"], "answers": [["Paris"], ["Rome"], ["Oslo"]]})
    retrievals = pd.DataFrame({"qid": ["a", "b", "c"], "rank": [1, 1, 1], "pid": ["p1", "p2", "p3"],
                               "text": ["Paris and Lyon are in France.", "Rome is in Italy.", "Oslo is in Norway."]})
    votes = pd.DataFrame({"qid": ["a", "b", "c"], "method": ["single", "single", "sum-and-pred-no-summary"],
                          "candidates": [["Lyon"], ["Rome"], []], "chosen": ["Lyon", "Rome", "unknown"]})
    generations = pd.DataFrame({
        "qid": ["a", "a", "b", "b", "c"], "round": [1, 2, 1, 2, 1], "call_index": [0] * 5,
        "role": ["summary", "answer", "summary", "answer", "summary"],
        "passage_ids": [("p1",), (), ("p2",), (), ("p3",)],
        "parsed_answer": ["Lyon is a city in France.", "Lyon", "Rome is the Italian capital.", "Rome", ""],
        "tokens_in": [1] * 5, "tokens_out": [1] * 5,
    })  # fmt: skip
    rows = pd.DataFrame(outcome_rows("e", "c", "r", "sure_generic", "m", "k", questions, retrievals, votes, generations,
                                     semantic=False, final_context=get_reader("sure_generic").final_context)).set_index("qid")
    assert rows["error_type"].to_dict() == {"a": "retrieval_failure", "b": "correct", "c": "abstention"}
    assert rows["gold_in_context"].to_dict() == {"a": False, "b": True, "c": True}
    assert rows["gold_in_retrieval"].all()


def test_only_the_narrowing_readers_evaluation_keys_change():
    """The evaluate stage key takes the final-context version for pf_concat and sure_generic only: every other reader's
    key is computed as before (so its stored outcomes and the pins of tests/test_plan_pinning.py hold)."""
    from core.cell import Cell
    from strategies.readers import READERS
    from strategies.readers.base import FINAL_CONTEXT_VERSION
    from tasks.stages import EVALUATE_VERSION, EvaluateStage
    from tracking.store.events import stable_hash

    assert {name for name, cls in READERS.items() if cls.narrows_context} == {"pf_concat", "sure_generic"}
    cell = Cell("bm25@5", "concatenation", "m")
    assert EvaluateStage("vote-key", cell, ("q",)).key == stable_hash("evaluate", "vote-key", EVALUATE_VERSION)
    assert EvaluateStage("vote-key", cell, ("q",), FINAL_CONTEXT_VERSION).key != EvaluateStage("vote-key", cell, ("q",)).key


def test_parse_failure_share_counts_the_cells_model_calls_not_ok():
    from tracking.analysis.metrics import cell_metrics
    from tracking.analysis.readers_table import readers_table
    from tracking.report.readers_table import display_rows

    outcomes = pd.DataFrame({"qid": ["a", "b"], "em": [1.0, 0.0], "f1": [1.0, 0.0], "semantic_match": [None, None],
                             "is_unknown": [False, False], "gold_in_context": [True, True], "pool_has_correct": [True, False],
                             "tokens_in": [5, 5], "tokens_out": [1, 1], "llm_calls": [4, 4]})
    generations = pd.DataFrame({"parse_status": ["ok", "ok", "unparseable", "ok", "empty", "ok", "ok", "error"]})
    m = cell_metrics(outcomes, generations=generations)
    assert m["parse_fail_pct"] == 37.5  # 3 of 8 calls
    assert display_rows(readers_table({"bm25@5 · sure · m": m}))[0][-1] == "37.5"
    assert math.isnan(cell_metrics(outcomes)["parse_fail_pct"])  # no generations given: unknown, shown as '-'
