"""Models behind OpenAI-compatible HTTP servers (vLLM, SGLang, llama.cpp, KServe's OpenAI
runtime, hosted endpoints): chat completions one row per request, completions and embeddings
many rows per request, through a concurrency window sized to the server's slots
(docs/generative.md)."""
