"""The engine: llama.cpp models owned by one worker thread, and the speculative loop it runs.

`config` (what to load, how) imports no llama.cpp; `worker.Engine` runs requests;
`llama` wraps llama.cpp's low-level API; `speculative` is the draft-verify loop,
`sampling` its pure acceptance rules; `drafters/` holds what proposes tokens.
Nothing here is imported eagerly, so importing this package loads no model code.
"""
