"""The daemon: an ASGI app (`app`) with OpenAI's and Ollama's routes over one engine, run by `daemon`."""
