"""A GGUF loaded to embed text: one pooled, L2-normalised vector per input.

Apart from the generating engine: its own model and context, behind its own
lock, so embedding never touches the KV cache generation reuses. The model's
own pooling (an embedding GGUF says CLS, mean or last) is used; a model that
names none is mean-pooled, as llama-server does with `--pooling mean`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from localspec.engine.config import LoadOptions
from localspec.engine.llama import LlamaModel
from localspec.errors import LocalspecError, UserInputError

# Each input is read in one batch (pooling needs the whole sequence at once), so the context is
# also the longest input; 2048 covers the chunks editors index (Continue splits at 512 tokens).
EMBED_CTX = 2048


class EmbeddingModel(LlamaModel):
    """Embeds texts; safe to call from any thread (one at a time)."""

    def __init__(self, path: Path, n_ctx: int = EMBED_CTX, n_threads: int | None = None) -> None:
        self._lock = threading.Lock()
        options = LoadOptions(n_ctx=n_ctx, n_batch=n_ctx, n_threads=n_threads, batch_invariant=False)
        super().__init__(path, options)
        self.n_embd = int(llama_cpp.llama_model_n_embd(self._model))

    def _context_params(self) -> llama_cpp.llama_context_params:
        params = super()._context_params()
        params.embeddings = True
        params.pooling_type = self._pooling()
        return params

    def _pooling(self) -> int:
        arch = self.meta("general.architecture") or ""
        named = self.meta(f"{arch}.pooling_type")
        if named is not None and named.isdigit() and int(named) != llama_cpp.LLAMA_POOLING_TYPE_NONE:
            return int(named)
        return int(llama_cpp.LLAMA_POOLING_TYPE_MEAN)

    def embed(self, texts: Sequence[str]) -> tuple[list[list[float]], int]:
        """One unit vector per text, in order, and the tokens read in all."""
        token_lists = [self.tokenize(text, add_special=True, parse_special=False) for text in texts]
        for i, (text, tokens) in enumerate(zip(texts, token_lists, strict=True)):
            if not text or not tokens:
                raise UserInputError(f"input {i} is empty; there is nothing to embed", param="input")
            if len(tokens) > self.n_ctx:
                raise UserInputError(
                    f"input {i} is {len(tokens)} tokens; the embedding model reads at most {self.n_ctx}",
                    param="input",
                )
        with self._lock:
            vectors = [self._one(tokens) for tokens in token_lists]
        return vectors, sum(len(t) for t in token_lists)

    def _one(self, tokens: list[int]) -> list[float]:
        self.reset()
        self.decode(tokens, n_logits=len(tokens))
        ptr = llama_cpp.llama_get_embeddings_seq(self._ctx, 0)
        if not ptr:
            raise LocalspecError(f"llama.cpp returned no pooled embedding for {self.path.name}")
        vector = np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).astype(np.float64)
        norm = float(np.linalg.norm(vector))
        return (vector / norm if norm > 0 else vector).tolist()
