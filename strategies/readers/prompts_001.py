"""Prompts of seed 001 (Post-Fusion as fallback), Appendix A.

Fig. 7 (Concatenation and Post-Fusion). The task description and the "say unknown" instruction
go in the system message: the small embedded models follow an abstention instruction far more
reliably there than in the user turn (observed on the 0.5B/1.5B Qwen models; docs/papers.md, seed 001 prompts).
"""

FIG7_VERSION = "001-fig7-v2"

# Fig. 7 in its order: task description, answer-format examples, the abstention instruction, then
# context and question. Everything before the context is fixed, so it goes in the system message
# (the small embedded models copy the examples' answers far less, and abstain far more reliably,
# when examples and instruction are there rather than in the user turn; docs/papers.md, seed 001 prompts).
FIG7_SYSTEM = """Given the relevant background contexts, answer the current question using one of the context \
in short factoid phrase manner.

Question: Who produced the album that included a re-recording of "Lithium"?
Answer: Butch Vig
Question: What city was the victim of Joseph Druces working in?
Answer: Boston, Massachusetts
Question: In what year was the star of To Hell and Back born?
Answer: 1925

Try your best to guess an extractive answer. If don't know the answer, just say unknown"""

FIG7_USER = """Context:
{retrieved_topk_context}
Question:
{question}
Answer:"""


def majority_vote_or_single(answers: list[str]):
    """A single answer is taken as it is (method 'single'); a pool goes to the majority vote."""
    from strategies.readers.base import Decision, majority_vote

    if len(answers) == 1:
        return Decision("single", (answers[0],), (1.0,), answers[0] if answers[0] else "unknown")
    return majority_vote(answers)


# ---- Fig. 8 (Pruning prompt) and Fig. 9 (Summary prompt): one-shot chain of thought --------------
# The paper's text where the PDF extraction kept it, including the demonstration's passages as printed (their
# titles repeated, "Peter Outerbridge Peter Outerbridge Peter Outerbridge ...", as the retriever gave them).
# Reconstructed (docs/papers.md, seed 001): the cut ends of the rationales, completed with the shortest wording the
# visible text implies; passage [4], lost entirely (Fig. 9's rationale cites "Source 3 and Source 4"), written as
# one line stating the fact the rationale uses; passage [3]'s word order, garbled in Fig. 8's two columns, taken
# from Fig. 9.
COT_VERSION = "001-fig8-9-v3"  # v2: the demonstration passages as printed; a lone short answer is parsed; v3: an
# unmarked prose answer is read as its last sentence (status unmarked)

_COT_HEADER = """Answer questions with short factoid answers.

Question: Who produced the album that included a re-recording of "Lithium"? Answer: Butch Vig
Question: What city was the victim of Joseph Druces working in? Answer: Boston, Massachusetts
Question: In what year was the star of To Hell and Back born? Answer: 1925

Follow the following format.

Context: sources that may contain relevant content
Question: the question to be answered
Rationale: Let's think step by step. {rationale_format}
Answer: a short factoid answer, often between 1 and 5 words. Make sure generate "Answer": in the end!
If don't know the answer, just say unknown as answer.

Context:
[1] Peter Outerbridge Peter Outerbridge Peter Outerbridge (born June 30, 1966) is a Canadian actor
[2] Except the Dying 2008. On March 3, 2015, Acorn Media announced a re-release for all three movies, set for May 26, 2015
[3] Saw VI Saw VI Saw VI is a 2009 American horror film directed by Kevin Greutert from a screenplay written by Patrick \
Melton and Marcus Dunstan. It is the sixth installment in the "Saw" franchise and stars Tobin Bell.
[4] William Easton is a character of the "Saw" franchise, played by Peter Outerbridge in Saw VI.
Question: Which 2009 movie does Peter Outerbridge feature as William Easton?
Rationale: Let's think step by step. {rationale}
Answer: Saw VI"""

FIG8_SYSTEM = (
    _COT_HEADER.replace("{rationale_format}", "a step-by-step deduction that identifies the correct response").replace(
        "{rationale}",
        "The question is asking for the 2009 movie that Peter Outerbridge was in as William Easton. We can use process of "
        "pruning to figure this out. Source 1 doesn't contain the information. In source 2, it talks about a re-release, "
        "which is not relevant. Source 3 talks about the sixth installment in the \"Saw\" franchise. This must be the movie "
        "we are looking for.",
    )
)
FIG9_SYSTEM = (
    _COT_HEADER.replace("{rationale_format}", "a step-by-step summary that identifies the correct response").replace(
        "{rationale}",
        "The question requires information on the 2009 movie that Peter Outerbridge was in as William Easton. From the "
        "sources, we can narrow down our focus to Source 3 and Source 4 that mention \"Saw VI\", a 2009 film in which "
        "Peter Outerbridge starred. By summarizing these details, the movie from 2009 featuring Peter Outerbridge is "
        "\"Saw VI\".",
    )
)
COT_USER = """Context:
{retrieved_topk_context}
Question:
{question}
Rationale: Let's think step by step."""
COT_MAX_TOKENS = 256  # room for the rationale before "Answer:"


def numbered_context(passages) -> str:
    """`[i] passage` lines, as in the demonstrations of Fig. 8-9."""
    return "\n".join(f"[{i}] {p.text}" for i, p in enumerate(passages, 1))


# ---- PF+Concat, round 2 (Concatenation as the Distiller, §3.3) -----------------------------------
# The paper describes the input (the unfiltered passages, the question and the first round's answer
# candidates) but prints no template; this is Fig. 7 with the candidates added before the question.
DISTILL_VERSION = "001-distill-v1"
DISTILL_USER = """Context:
{retrieved_topk_context}
Candidate answers:
{candidates}
Question:
{question}
Answer:"""
