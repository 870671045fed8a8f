"""A thin owner of one llama.cpp model and its context, over llama-cpp-python's low-level API.

Only the calls the speculative loop needs, with the hot ones kept cheap: one
batch allocated at load and refilled in place, logits read as zero-copy numpy
views of llama.cpp's buffer (valid until the next decode), token pieces cached.
Not thread-safe: one engine thread owns each instance.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt
from llama_cpp import _logger as llama_logger

from localspec.engine.config import (
    EXACT_POSITIONS,
    EXACT_VERIFY_BATCH,
    EXACT_VERIFY_BATCH_GPU,
    KV_BYTES_PER_ELEMENT,
    LoadOptions,
    default_threads,
    flash_attention,
    padded_ctx,
    threads_warning,
)
from localspec.errors import (
    ContextOverflowError,
    LocalspecError,
    ModelFileError,
    RequestCancelledError,
    UnsupportedModelError,
)
from localspec.process.memory import room_for

KV_TYPES = {
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
}
GGUF_MAGIC = b"GGUF"
# Inputs this long or longer go to the plain prefill copy, when one is attached. Measured on the
# 2-core AVX-512 machine (Qwen2.5-Coder-1.5B, after 300 cached tokens): the plain layout reads 16
# tokens 1.04x as fast as the repacked one, 32 1.09x, 48 1.26x, 128 1.55x. Verifies of up to 33
# positions always run on the repacked weights; auto's widest (48 and 64, n-gram copies) go to the
# plain copy where the cache is small enough to hand over (PREFILL_PER_CACHED), and calibration
# measures them that way (its cache key says so).
PREFILL_MIN = 40
# Handing the cache over copies every cached position (~16 us each there, one way) against ~2.4 ms
# saved per token read: an input must be at least 1/PREFILL_PER_CACHED of what is cached to pay.
PREFILL_PER_CACHED = 50
LLAMA_DECODE_ABORTED = 2  # llama_decode's return code when the abort callback said stop

ProgressFn = Callable[[float], None]
log = logging.getLogger("localspec.engine")
_NO_ABORT = llama_cpp.ggml_abort_callback()  # a NULL callback: llama.cpp never asks

_backend_ready = False


@llama_cpp.llama_log_callback
def _quiet_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    # llama.cpp logs loader chatter (and model quirks it fixes itself) at every level; people see
    # errors through localspec's own messages instead. LOCALSPEC_LLAMA_VERBOSE=1 shows the log.
    return None


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        if os.environ.get("LOCALSPEC_LLAMA_VERBOSE"):
            llama_logger.set_verbose(True)
        else:
            llama_cpp.llama_log_set(_quiet_log, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        from localspec.engine.ggml_backend import drop_extra_buffer_types

        dropped = drop_extra_buffer_types()
        if dropped:
            log.info("not loading weights into %s buffers (they crash llama.cpp here)", ", ".join(dropped))
        _backend_ready = True


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build can put layers on a GPU (CUDA, Metal, ...) of this machine.

    Not llama_supports_gpu_offload: it also says yes for any build with RPC, GPU or not.
    """
    _init_backend()
    if not llama_cpp.llama_supports_rpc():
        return bool(llama_cpp.llama_supports_gpu_offload())
    from localspec.engine.ggml_backend import has_local_gpu

    return has_local_gpu()


def default_gpu_layers(gpu: int | None) -> int:
    """n_gpu_layers for LoadOptions.gpu_layers: None means every layer where offload is supported."""
    return (-1 if gpu_offload_supported() else 0) if gpu is None else gpu


@functools.cache
def _warn_threads(threads: int) -> None:
    """Once a process for each count: every context (target, draft, plain copy) is made with it."""
    warning = threads_warning(threads)
    if warning:
        log.warning("%s", warning)


def offloads(n_gpu_layers: int, options: LoadOptions) -> bool:
    """Whether a model loaded with `n_gpu_layers` runs layers on a local GPU (RPC workers do not
    count: their verifies are measured as a CPU's)."""
    return n_gpu_layers != 0 and not options.rpc and gpu_offload_supported()


def _sequence_state(ctx: llama_cpp.llama_context_p) -> Any:
    """Sequence 0 of `ctx`'s cache as llama.cpp writes it (a ctypes byte array); None where it
    wrote nothing."""
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
    return buf if written and written == size else None


def _set_sequence(ctx: llama_cpp.llama_context_p, memory: Any, state: Any) -> bool:
    """Replace sequence 0 of `ctx`'s cache with `state` (None: empty it); False where llama.cpp
    refuses the state, the sequence then empty."""
    llama_cpp.llama_memory_seq_rm(memory, 0, -1, -1)
    return state is None or bool(llama_cpp.llama_state_seq_set_data(ctx, state, len(state), 0))


def _copy_sequence(src: llama_cpp.llama_context_p, dst: llama_cpp.llama_context_p, dst_memory: Any) -> None:
    """Replace sequence 0 of `dst`'s cache with `src`'s (two contexts of one model file)."""
    if not _set_sequence(dst, dst_memory, _sequence_state(src)):
        raise LocalspecError("llama.cpp could not take over the prompt's cache from the prefill copy")


class ReadPaused(Exception):
    """A decode stopped between two chunks because `between` said so (not an error): n_past ends
    after the chunks read, which stay cached; `seconds` were spent in llama.cpp on them."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"paused after {seconds:.3f} s")
        self.seconds = seconds


def _always(_extra: int) -> bool:
    return True


def _cancelled(done: int, total: int) -> RequestCancelledError:
    return RequestCancelledError(f"cancelled after {done} of {total} tokens were decoded")


def check_gguf_file(path: Path) -> None:
    """Fail with one clear line before llama.cpp sees a path that is not a GGUF file."""
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}; check the path or run `localspec models`")
    if not path.is_file():
        raise ModelFileError(f"{path} is a directory, not a GGUF file; give the .gguf file inside it")
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelFileError(f"{path} is not a GGUF file (bad magic); convert it or pick a .gguf file")


def _rpc_devices(endpoints: Sequence[str]) -> ctypes.Array[ctypes.c_void_p]:
    """The workers' devices as the NULL-terminated array llama_model_params.devices takes."""
    from localspec.engine import ggml_backend
    from localspec.engine.rpc import unsupported
    from localspec.engine.rpc_probe import probe_memory

    if not ggml_backend.rpc_supported():
        raise unsupported()
    # In a child with a timeout, before this process's own connect: ggml-rpc aborts the process when
    # a worker refuses, and waits forever on one that is serving another client.
    free = [f for f, _ in probe_memory(endpoints)]
    devices = ggml_backend.add_workers(endpoints)
    log.info("RPC workers %s, free %s GiB", ", ".join(endpoints), [round(f / 2**30, 1) for f in free])
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None)


class LlamaModel:
    """One loaded model with one context (sequence 0)."""

    def __init__(
        self,
        path: Path,
        options: LoadOptions = LoadOptions(),
        progress: ProgressFn | None = None,
        *,
        repack: bool | None = None,
    ) -> None:
        _init_backend()
        self.path = Path(path)
        check_gguf_file(self.path)
        # llama.cpp takes at most n_ctx tokens a batch (it lowers n_batch to a smaller context), and
        # aborts the process on a larger one: chunks are cut to what it takes.
        if options.n_batch > options.n_ctx:
            options = dataclasses.replace(options, n_batch=options.n_ctx)
        self.options = options
        # Whether llama.cpp may repack the weights for its CPU kernels (None: unless batch_invariant).
        self.repack = not options.batch_invariant if repack is None else repack
        self._model = self._load_model(progress)
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        try:
            self._ctx = self._new_context()
        except LocalspecError:
            llama_cpp.llama_model_free(self._model)
            # Freed: close(), which __del__ calls, must not free it a second time (a crash).
            self._model = None  # type: ignore[assignment]
            raise
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.n_ctx = int(llama_cpp.llama_n_ctx(self._ctx))
        self.n_layers = int(llama_cpp.llama_model_n_layer(self._model))
        self.size_bytes = int(llama_cpp.llama_model_size(self._model))
        self._batch = llama_cpp.llama_batch_init(options.n_batch, 0, 1)
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._eog_all: tuple[int, ...] | None = None  # every end-of-generation token (eog_tokens)
        self._piece_buf = ctypes.create_string_buffer(256)
        self.n_past = 0
        # A second copy reading long inputs for this one (attach_prefill), and the context whose
        # outputs the last decode left: this one's, or the prefill copy's.
        self._prefill: LlamaModel | None = None
        self._prefill_valid = 0  # positions the prefill copy's cache holds as this one's does
        self._prefill_refused = 0  # the copy's context llama.cpp could not make (0: none refused)
        self._prefill_loaded_ctx = 0  # the copy's context as it was attached
        self._prefill_short = False  # whether a growth the memory had no room for was logged
        # Whether the copy may take `extra` bytes more beside the machine's room: a bound its owner
        # sets (the daemon's max_resident over every loaded model), asked at each growth.
        self.may_grow: Callable[[int], bool] = _always
        self._out_ctx = self._ctx
        # Verify batches larger than this would not round as the target alone does (see above); with
        # repacked weights no batch size is exact, and speculation there is lossless up to rounding.
        exact_batch = EXACT_VERIFY_BATCH_GPU if self.on_gpu else EXACT_VERIFY_BATCH
        self.max_verify_batch = exact_batch if options.batch_invariant else options.n_batch

    @property
    def exact(self) -> bool:
        """Whether verifies are made to round as one-token decoding does (LoadOptions.batch_invariant)."""
        return self.options.batch_invariant

    def verify_limit(self, at: int | None = None) -> int:
        """The most positions a verify from `at` (default n_past) on may decode and still round as
        one-token decoding (exact loading on the CPU: none past EXACT_POSITIONS; 1: decode plainly)."""
        if not self.exact or self.on_gpu:
            return self.max_verify_batch
        start = self.n_past if at is None else at
        return max(1, min(self.max_verify_batch, EXACT_POSITIONS - start))

    def _load_model(self, progress: ProgressFn | None) -> llama_cpp.llama_model_p:
        params = llama_cpp.llama_model_default_params()
        gpu = self.options.gpu_layers
        params.n_gpu_layers = default_gpu_layers(gpu)
        if self.options.rpc:
            self._devices = _rpc_devices(self.options.rpc)  # kept: llama.cpp reads the array at load
            params.devices = ctypes.cast(self._devices, ctypes.c_void_p)
            params.n_gpu_layers = -1 if gpu is None else gpu
        params.use_extra_bufts = self.repack
        self.on_gpu = offloads(params.n_gpu_layers, self.options)
        callback = None
        if progress is not None:
            progress(0.0)

            def on_progress(value: float, _user: ctypes.c_void_p) -> bool:
                progress(float(value))
                return True

            callback = llama_cpp.llama_progress_callback(on_progress)
            params.progress_callback = callback
        model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not model:
            raise UnsupportedModelError(
                f"llama.cpp could not load {self.path.name}; the file may be truncated or its architecture "
                "unsupported by this llama.cpp build (set LOCALSPEC_LLAMA_VERBOSE=1 for its log)"
            )
        return model

    def _context_params(self) -> llama_cpp.llama_context_params:
        """The context's parameters; a subclass (the embedding model) adjusts them."""
        opts = self.options
        if opts.kv_type not in KV_TYPES:
            raise UnsupportedModelError(
                f"unknown KV cache type {opts.kv_type!r}; use one of {', '.join(KV_TYPES)}"
            )
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = opts.n_ctx
        params.n_batch = opts.n_batch
        params.n_ubatch = opts.n_batch
        params.n_seq_max = 1
        threads = opts.n_threads or default_threads()
        _warn_threads(threads)
        params.n_threads = threads
        params.n_threads_batch = threads
        params.type_k = params.type_v = KV_TYPES[opts.kv_type]
        if opts.flash_attn is False and opts.kv_type != "f16" and not opts.batch_invariant:
            raise UnsupportedModelError(
                f"a {opts.kv_type} KV cache needs flash attention; set flash_attn on or use an f16 cache"
            )
        params.no_perf = True
        if self.options.batch_invariant:
            params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        elif not flash_attention(opts, self.on_gpu):
            params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        return params

    def _new_context(self) -> llama_cpp.llama_context_p:
        opts = self.options
        ctx = llama_cpp.llama_init_from_model(self._model, self._context_params())
        if not ctx:
            raise UnsupportedModelError(
                f"llama.cpp could not create a context of {opts.n_ctx} tokens for "
                f"{self.path.name}; try a smaller --ctx"
            )
        return ctx

    # --- vocabulary -------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 16
        buf = (llama_cpp.llama_token * capacity)()
        n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special, parse_special)
        if n < 0:
            capacity = -n
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), buf, capacity, add_special, parse_special
            )
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes a token stands for (special tokens render as nothing)."""
        cached = self._pieces.get(token)
        if cached is None:
            n = llama_cpp.llama_token_to_piece(self._vocab, token, self._piece_buf, 256, 0, False)
            cached = self._piece_buf.raw[: max(n, 0)]
            self._pieces[token] = cached
        return cached

    def shown_piece(self, token: int) -> bytes:
        """What a list of tokens shows for one (log-probabilities, /tokenize): its bytes, or a
        special token's own text (`<|im_end|>`) where those are nothing."""
        return self.piece(token) or self.token_text(token).encode()

    def piece_text(self, token: int) -> str:
        """A token's bytes as text (a piece of a multi-byte character reads as U+FFFD)."""
        return self.piece(token).decode("utf-8", errors="replace")

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        """End of generation: EOS, EOT and the like."""
        cached = self._eog.get(token)
        if cached is None:
            cached = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
        return cached

    def eog_tokens(self) -> list[int]:
        """Every end-of-generation token of the vocabulary (scanned once, ~60 ms for 152k tokens: the
        engine's n-gram drafts and the grammar's tokenizer both ask)."""
        if self._eog_all is None:
            self._eog_all = tuple(
                t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, t)
            )
        return list(self._eog_all)

    @property
    def vocab_handle(self) -> llama_cpp.llama_vocab_p:
        """llama.cpp's vocabulary, for libraries that read it themselves (llguidance's tokenizer)."""
        return self._vocab

    def token_text(self, token: int) -> str:
        if not 0 <= token < self.n_vocab:
            return ""
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    @property
    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """(prefix, suffix, middle) token ids when the model knows fill-in-the-middle."""
        ids = (
            llama_cpp.llama_vocab_fim_pre(self._vocab),
            llama_cpp.llama_vocab_fim_suf(self._vocab),
            llama_cpp.llama_vocab_fim_mid(self._vocab),
        )
        return None if min(ids) < 0 else (int(ids[0]), int(ids[1]), int(ids[2]))

    def fim_repo_tokens(self) -> tuple[int | None, int | None]:
        """(repository name, file separator) token ids, each None when the model has none."""
        rep = llama_cpp.llama_vocab_fim_rep(self._vocab)
        sep = llama_cpp.llama_vocab_fim_sep(self._vocab)
        return (int(rep) if rep >= 0 else None, int(sep) if sep >= 0 else None)

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    # --- decoding ---------------------------------------------------------

    def decode(
        self,
        tokens: Sequence[int],
        n_logits: int = 1,
        cancel: threading.Event | None = None,
        meanwhile: Callable[[], None] | None = None,
        between: Callable[[int], bool] | None = None,
    ) -> float:
        """Append `tokens` at position n_past; keep logits for the last `n_logits` of them.

        Returns the seconds spent in llama.cpp (decode plus synchronise). Long inputs are
        split into n_batch chunks; logits are only asked for where they will be read.
        With `cancel`, setting it stops the decode between chunks or inside one (llama.cpp's
        abort callback, checked during the CPU graph compute): the chunks already decoded
        stay cached, n_past ends after them, and RequestCancelledError is raised.
        `meanwhile` runs once, after the last chunk is handed to llama.cpp and before it is
        waited for: where llama.cpp computes asynchronously (CUDA, Metal) the two overlap; on the
        CPU it runs after. Its own time is not counted in the seconds returned.
        `between` hears, between two chunks, how many of `tokens` are decoded, and says whether to
        stop there: True raises ReadPaused, with n_past after the chunks read and this model holding
        them (also where the plain copy read them), so another request may use the model before the
        rest is decoded.
        """
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextOverflowError(self.n_past + len(tokens), self.n_ctx)
        plain = self._prefill
        if (
            plain is not None
            and len(tokens) >= max(PREFILL_MIN, self.n_past / PREFILL_PER_CACHED)
            and self._prefill_holds(plain, self.n_past + len(tokens))
        ):
            return self._decode_by_prefill(plain, tokens, n_logits, cancel, meanwhile, between)
        self._out_ctx = self._ctx
        if cancel is None:
            return self._decode(tokens, n_logits, None, meanwhile, between)
        # Installed only for this call: the callback runs once per graph node and takes the GIL
        # each time, which costs nothing next to a prompt chunk but would slow one-token steps.
        # The local `abort` keeps the ctypes callback alive until it is uninstalled.
        abort = llama_cpp.ggml_abort_callback(lambda _data: cancel.is_set())
        llama_cpp.llama_set_abort_callback(self._ctx, abort, None)
        try:
            return self._decode(tokens, n_logits, cancel, meanwhile, between)
        finally:
            llama_cpp.llama_set_abort_callback(self._ctx, _NO_ABORT, None)

    def _decode(
        self,
        tokens: Sequence[int],
        n_logits: int,
        cancel: threading.Event | None,
        meanwhile: Callable[[], None] | None = None,
        between: Callable[[int], bool] | None = None,
    ) -> float:
        spent = 0.0
        size = self.options.n_batch
        first_logit = len(tokens) - n_logits
        for start in range(0, len(tokens), size):
            if cancel is not None and cancel.is_set():
                raise _cancelled(start, len(tokens))
            if start and between is not None and between(start):
                raise ReadPaused(spent)
            chunk = tokens[start : start + size]
            self._fill_batch(chunk, start, first_logit)
            t0 = time.perf_counter()
            rc = llama_cpp.llama_decode(self._ctx, self._batch)
            aside = 0.0  # meanwhile's seconds, not llama.cpp's
            try:
                if meanwhile is not None and start + size >= len(tokens):
                    started = time.perf_counter()
                    meanwhile()
                    aside = time.perf_counter() - started
            finally:
                llama_cpp.llama_synchronize(self._ctx)
            spent += time.perf_counter() - t0 - aside
            if rc != 0:
                # An aborted or failed chunk may leave some of its positions cached: drop them, so the
                # cache holds exactly the n_past positions before it.
                llama_cpp.llama_memory_seq_rm(self._memory, 0, self.n_past, -1)
                if rc == LLAMA_DECODE_ABORTED and cancel is not None:  # only our callback aborts
                    raise _cancelled(start, len(tokens))
                raise LocalspecError(f"llama_decode failed with code {rc} at position {self.n_past}")
            self.n_past += len(chunk)
        return spent

    def _fill_batch(self, chunk: Sequence[int], offset: int, first_logit: int) -> None:
        batch = self._batch
        base = self.n_past
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = base + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = offset + i >= first_logit
        batch.n_tokens = len(chunk)

    def logits(self, index: int) -> npt.NDArray[np.float32]:
        """Logits of the index-th output of the last decode (negative counts from the end).

        A view into llama.cpp's buffer: read or copy it before the next decode.
        """
        ptr = llama_cpp.llama_get_logits_ith(self._out_ctx, index)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def truncate(self, n_keep: int) -> None:
        """Drop every cached position from n_keep on (exact KV rollback)."""
        if n_keep < self.n_past:
            llama_cpp.llama_memory_seq_rm(self._memory, 0, n_keep, -1)
            self.n_past = n_keep
            self._prefill_valid = min(self._prefill_valid, n_keep)

    def reset(self) -> None:
        llama_cpp.llama_memory_clear(self._memory, True)
        self.n_past = 0
        self._prefill_valid = 0

    def state_size(self) -> int:
        """Bytes `save_state` would copy now (llama.cpp sizes it without writing it)."""
        return int(llama_cpp.llama_state_seq_get_size(self._ctx, 0))

    def save_state(self) -> Any:
        """The cache's n_past positions as llama.cpp writes them (a ctypes byte array), for
        `load_state`; None where it wrote nothing."""
        return _sequence_state(self._ctx)

    def load_state(self, state: Any, n_past: int) -> None:
        """Replace the cache with one `save_state` wrote when it held `n_past` positions."""
        self.n_past = self._prefill_valid = 0
        if not _set_sequence(self._ctx, self._memory, state):
            raise LocalspecError("llama.cpp could not load a saved prompt cache; the prompt is read again")
        self.n_past = n_past

    # --- reading long inputs with a plain copy of the weights -------------

    def attach_prefill(self, plain: LlamaModel | None) -> None:
        """Have `plain` (the same file, loaded without repacking) decode inputs of PREFILL_MIN tokens
        or more; None detaches it. This model keeps ownership of it and closes it."""
        if self._prefill is not None and self._prefill is not plain:
            self._prefill.close()
        self._prefill, self._prefill_valid, self._prefill_refused = plain, 0, 0
        self._prefill_loaded_ctx = plain.n_ctx if plain is not None else 0

    @property
    def plain_prefill(self) -> bool:
        return self._prefill is not None

    @property
    def prefill_grown_bytes(self) -> int:
        """What the plain copy's context took past the one it was attached with (0 without one):
        the memory plan counts the copy as it loads (pickdraft.memplan.prefill_copy_bytes)."""
        plain = self._prefill
        if plain is None:
            return 0
        return plain.context_bytes(plain.n_ctx) - plain.context_bytes(self._prefill_loaded_ctx)

    def context_bytes(self, n_ctx: int) -> int:
        """What a context of `n_ctx` tokens takes, as far as it grows with the context: its KV cache
        and, without flash attention, the attention scores a prompt read touches (a micro-batch's
        rows by the context, for each head and the mask). pickdraft.memplan counts the same from
        the file's header; a test holds the two equal."""
        n = padded_ctx(n_ctx)
        kv = n * self.n_layers * self._kv_width * KV_BYTES_PER_ELEMENT[self.options.kv_type]
        if flash_attention(self.options, self.on_gpu):
            return int(kv)
        heads = int(llama_cpp.llama_model_n_head(self._model))
        return int(kv + self.options.n_batch * 4 * (heads + 1) * n)

    @functools.cached_property
    def _kv_width(self) -> int:
        """Values a KV cache holds per position and layer: the KV heads' key and value lengths."""
        heads = int(llama_cpp.llama_model_n_head(self._model))
        default = int(llama_cpp.llama_model_n_embd(self._model)) // max(1, heads)
        arch = self.meta("general.architecture") or ""
        lengths = [self.meta(f"{arch}.attention.{part}_length") for part in ("key", "value")]
        key, value = (int(x) if x and x.isdigit() else default for x in lengths)
        return int(llama_cpp.llama_model_n_head_kv(self._model)) * (key + value)

    def _prefill_holds(self, plain: LlamaModel, positions: int) -> bool:
        """Whether the plain copy can hold `positions`: its context starts small (prefill.PLAIN_CONTEXT:
        its cache is a second one beside this model's) and grows to what a read needs, doubling,
        up to this model's. False where the machine has no room for the larger one now, or llama.cpp
        cannot make it: this model reads."""
        if positions <= plain.n_ctx:
            return True
        size = min(self.n_ctx, max(positions, 2 * plain.n_ctx))
        if self._prefill_refused and size >= self._prefill_refused:
            return False  # asked once: each try costs a context's making
        if not self._room_to_grow(plain, size):
            return False
        if not plain.resize_context(size):
            self._prefill_refused = size
            log.warning(
                "no memory for a %d-token plain copy's cache: the repacked model reads past %d tokens",
                size,
                plain.n_ctx,
            )
            return False
        self._prefill_valid = 0  # its cache is empty: this model's positions go over first
        return True

    def _room_to_grow(self, plain: LlamaModel, size: int) -> bool:
        """Whether there is room now for the copy's context at `size` tokens: on the machine, for
        the whole new context (made while the old one is still there), and within its owner's
        bound (`may_grow`), for what it adds. The plan counted the copy as it loaded, and the
        memory its growth takes must not be the models' or the machine's (asked again at each
        longer read: memory frees up)."""
        need = plain.context_bytes(size)
        short = ""
        if not room_for(need):
            short = "the machine's memory is short"
        elif not self.may_grow(need - plain.context_bytes(plain.n_ctx)):
            short = "the loaded models are at their memory bound (max_resident)"
        if not short:
            return True
        if not self._prefill_short:
            self._prefill_short = True
            log.warning(
                "no room for a %d-token plain copy's cache (%.1f MiB): the repacked model reads past %d"
                " tokens (more slowly) while %s",
                size,
                need / (1 << 20),
                plain.n_ctx,
                short,
            )
        return False

    def resize_context(self, n_ctx: int) -> bool:
        """Replace the context with one of `n_ctx` tokens, its cache empty; False (the old one kept)
        where llama.cpp cannot make it. For a plain prefill copy, which holds no state of its own."""
        old = self.options
        self.options = dataclasses.replace(old, n_ctx=n_ctx)
        try:
            ctx = self._new_context()
        except LocalspecError:
            self.options = old
            return False
        llama_cpp.llama_free(self._ctx)
        self._ctx = self._out_ctx = ctx
        self._memory = llama_cpp.llama_get_memory(ctx)
        self.n_ctx = int(llama_cpp.llama_n_ctx(ctx))
        self.n_past = 0
        return True

    def _decode_by_prefill(
        self,
        plain: LlamaModel,
        tokens: Sequence[int],
        n_logits: int,
        cancel: threading.Event | None,
        meanwhile: Callable[[], None] | None,
        between: Callable[[int], bool] | None,
    ) -> float:
        """Decode `tokens` on the plain copy, then take its cache over: the same positions, the
        values up to float rounding (as any other batch size's). Cancelled or paused, the chunks it
        read are taken over too, as decode() keeps them."""
        t0 = time.perf_counter()
        aside = 0.0

        def timed() -> None:  # meanwhile's time is not llama.cpp's
            nonlocal aside
            started = time.perf_counter()
            try:
                if meanwhile is not None:
                    meanwhile()
            finally:
                aside = time.perf_counter() - started

        if self._prefill_valid < self.n_past:  # it lacks what this model decoded since: copy it over
            _copy_sequence(self._ctx, plain._ctx, plain._memory)
        else:  # it holds this model's positions, and perhaps more that this model has dropped
            llama_cpp.llama_memory_seq_rm(plain._memory, 0, self.n_past, -1)
        plain.n_past = self.n_past
        try:
            plain.decode(tokens, n_logits, cancel, timed, between)
        finally:
            _copy_sequence(plain._ctx, self._ctx, self._memory)
            self.n_past = self._prefill_valid = plain.n_past
            self._out_ctx = plain._ctx
        return time.perf_counter() - t0 - aside

    def close(self) -> None:
        if getattr(self, "_prefill", None) is not None:
            self._prefill.close()  # type: ignore[union-attr]
            self._prefill = None
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            llama_cpp.llama_free(self._ctx)
            self._ctx = None  # type: ignore[assignment]
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None  # type: ignore[assignment]

    def __del__(self) -> None:
        self.close()
