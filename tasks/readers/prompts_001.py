"""Prompts of seed 001 (Post-Fusion as fallback), Appendix A.

Fig. 7 (Concatenation and Post-Fusion). The task description and the "say unknown" instruction
go in the system message: the small embedded models follow an abstention instruction far more
reliably there than in the user turn (measured on the 0.5B/1.5B Qwen models; see README).
"""

FIG7_VERSION = "001-fig7-v2"

# Fig. 7 in its order: task description, answer-format examples, the abstention instruction, then
# context and question. Everything before the context is fixed, so it goes in the system message
# (the small embedded models copy the examples' answers far less, and abstain far more reliably,
# when examples and instruction are there rather than in the user turn; see README).
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
    from tasks.readers.base import Decision, majority_vote

    if len(answers) == 1:
        return Decision("single", (answers[0],), (1.0,), answers[0] if answers[0] else "unknown")
    return majority_vote(answers)
