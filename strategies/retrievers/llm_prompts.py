"""Prompts of the retrievers that call the model (seed 002, Appendix; GenRead).

The seed's PDF extraction lost both templates' text; what survives is that the GenRead template
has one placeholder `{query}` and "is following GenRead", and the compression template has
`{query}` and `{document}`. The GenRead prompt below is GenRead's published step-1 prompt
(Yu et al., 2023, "Generate rather than Retrieve"); the compression prompt is our reconstruction
with exactly the paper's two placeholders. Each carries a version that enters the retrieve cache key.
"""

GENREAD_VERSION = "genread-step1-v1"
GENREAD_SYSTEM = "You are a helpful assistant."
GENREAD_USER = "Generate a background document from Wikipedia to answer the given question.\n\n{query}\n\n"
GENREAD_MAX_TOKENS = 256  # GenRead documents are ~100-150 words

COMPRESS_VERSION = "002-compress-reconstructed-v1"
COMPRESS_SYSTEM = "You are a helpful assistant."
COMPRESS_USER = (
    "Summarize the following document so that the summary keeps all the information needed to answer the "
    "question, and nothing else.\n\nQuestion: {query}\n\nDocument:\n{document}\n\nSummary:"
)
COMPRESS_MAX_TOKENS = 200
