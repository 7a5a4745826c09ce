"""Prefect tasks, one module per stage (retrieve, generate, vote, evaluate), plus the pure
reader strategies (`tasks.readers`) and retrievers (`tasks.retrievers`) they run."""
