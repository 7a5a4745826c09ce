"""The engines layer, above core: what a run computes with. The model-call layer: the call's types and the model's
identity (`llm_types`), the client a stage calls (`llm`), the transport that carries its calls to model-call processes
(`call_processes`, the parent's end; `model_call_process`, the child), one call over HTTP to an OpenAI-compatible
server (`llm_http`), the order of calls at the server (`call_gate`), how the bound on calls in flight is divided
(`concurrency`: its one owner) and the call cache (`llm_cache`). And the engines:
the embedded llama.cpp server and its bundled models, the JVM that runs Anserini, the ONNX sentence encoder (semantic
match, dense retrieval)."""
