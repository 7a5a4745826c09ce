import pytest

from core.answers import em_score, f1_score, has_answer, is_unknown, normalize_answer, token_f1


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("The Denver Broncos!", "denver broncos"),
        ("  an   apple, a day ", "apple day"),
        ("Theatre of the absurd", "theatre of absurd"),  # 'the' only as a whole word
        ("U.S.A.", "usa"),
        ("", ""),
        ("a an the", ""),
        ("Ça va — très bien", "ça va — très bien"),  # only ASCII punctuation is stripped (official script)
    ],
)
def test_normalize_matches_squad_v11(raw, norm):
    assert normalize_answer(raw) == norm


def official_normalize_answer(s: str) -> str:
    """normalize_answer of the official SQuAD v1.1 evaluate-v1.1.py, as written there."""
    import re
    import string

    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text):
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def test_normalize_equals_the_official_script_on_squad_paragraphs_and_odd_text(data_dir):
    import gzip
    import json

    with gzip.open(data_dir / "squad" / "dev-v1.1.json.gz", "rt", encoding="utf-8") as fh:
        texts = [p["context"] for a in json.load(fh)["data"] for p in a["paragraphs"]]
    texts += ["the’s an a\tb\x01the\x01c", "Ünïcode THE straße An", "a_the the_a the.", "x\u00a0the\u00a0y",
              "the\u2028a", "1the 2an", "a-the", "\x0bthe\x0c", "lone \ud800 surrogate, the end", "İstanbul the"]
    assert [normalize_answer(t) for t in texts] == [official_normalize_answer(t) for t in texts]


def test_em_is_max_over_golds():
    assert em_score("denver broncos", ["Carolina Panthers", "The Denver Broncos"]) == 1.0
    assert em_score("Broncos", ["Denver Broncos"]) == 0.0


def test_f1_partial_overlap_and_duplicates():
    # pred tokens: denver broncos team ; gold: denver broncos -> P=2/3 R=1 F1=0.8
    assert token_f1("Denver Broncos team", "Denver Broncos") == pytest.approx(0.8)
    # repeated tokens count with multiplicity (Counter intersection)
    assert token_f1("the the cat cat", "cat") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f1_score("", ["anything"]) == 0.0
    assert f1_score("x", ["a", "x y"]) == pytest.approx(2 / 3)


@pytest.mark.parametrize("text", ["unknown", "Unknown.", "UNKNOWN - the passage does not say", "", "  ", "No answer",
                                  "cannot be determined", "I don't know", "Unknown, the context does not say.", "no answer."])
def test_unknown_variants(text):
    assert is_unknown(text)


@pytest.mark.parametrize("text", ["Unknown Pleasures", "Denver", "nonetheless", "known", "unknowns"])
def test_answers_that_are_not_abstentions(text):
    assert not is_unknown(text)


def test_has_answer_token_subsequence():
    ctx = "Super Bowl 50 was won by the Denver Broncos, who beat Carolina."
    assert has_answer(ctx, ["Denver Broncos"])
    assert has_answer(ctx, ["the Denver Broncos"])  # articles dropped on both sides
    assert not has_answer(ctx, ["Denver Bronco"])  # whole tokens only
    assert not has_answer(ctx, ["Broncos Denver"])
    assert not has_answer("", ["x"])


def test_token_subsequence_search_equals_the_token_list_definition():
    """`contains_token_sequence` searches a space-padded string; it must agree with the definition
    (the needle's normalized tokens occur as a contiguous run of the haystack's) on arbitrary text."""
    import random

    from core.answers import contains_token_sequence, normalize_answer

    def by_definition(haystack: str, needle: str) -> bool:
        n, h = normalize_answer(needle).split(), normalize_answer(haystack).split()
        return bool(n) and any(h[i : i + len(n)] == n for i in range(len(h) - len(n) + 1))

    rng = random.Random(0)
    words = ["a", "the", "cat", "Cat.", "dog", "an", "x-y", "1,000", "é", "  ", "the cat", "(dog)", "cats"]
    for _ in range(5000):
        haystack = " ".join(rng.choice(words) for _ in range(rng.randint(0, 8)))
        needle = " ".join(rng.choice(words) for _ in range(rng.randint(0, 3)))
        assert contains_token_sequence(haystack, needle) == by_definition(haystack, needle), (haystack, needle)


def test_a_context_normalized_once_gives_the_same_checks_as_the_raw_text():
    from core.answers import contains_token_sequence, has_answer, normalized_context

    context = "The Broncos beat the Panthers 24–10 in Super Bowl 50, at Levi's Stadium (Santa Clara)."
    once = normalized_context(context)
    assert normalized_context(once) is once  # not normalized twice
    for golds in (["Denver Broncos", "Broncos"], ["Levi's Stadium"], ["Panthers 24"], ["Carolina"], ["the"]):
        assert has_answer(once, golds) == has_answer(context, golds), golds
    for needle in ("levis stadium", "Santa Clara", "Super Bowl 51", "beat the Panthers", ""):
        assert contains_token_sequence(once, needle) == contains_token_sequence(context, needle), needle
    assert has_answer(once, ["levi's stadium"]) and not has_answer(once, ["Carolina"])


def test_passages_normalized_one_by_one_give_the_joined_context_normalized_whole():
    """evaluate normalizes each retrieved passage once per process (`normalized_passages`); the result must be
    the string `normalized_context` gives for the passages joined by blank lines, or gold/prediction-in-context
    (and so the error decomposition) would change. Real SQuAD paragraphs, plus edges: empty and
    punctuation-only passages, articles and punctuation at a passage's ends, non-ASCII dashes."""
    import random

    from core.answers import normalized_context, normalized_passages
    from core.datasets import iter_corpus

    texts = [text for _, _, _, text in iter_corpus("squad-paragraphs", ["squad/dev-v1.1.json.gz"])]
    edges = ["", "...", "The", "the end, the", "—the— A. an", "  An apple ", "Ωmega—the", "\n\n", "a"]
    rng = random.Random(0)
    for _ in range(400):
        group = rng.sample(texts, rng.randint(0, 6)) + rng.sample(edges, rng.randint(0, 3))
        rng.shuffle(group)
        assert normalized_passages(group) == normalized_context("\n\n".join(group)), group
        assert normalized_passages(iter(group)) == normalized_passages(group)  # a generator, as evaluate passes
