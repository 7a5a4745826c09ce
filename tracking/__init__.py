"""Event store, LLM-call cache, MLflow logging, query layer and analyses."""
