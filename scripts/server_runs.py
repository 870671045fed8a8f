"""llama-server for the comparison: its modes' flags, one request and its reply, the report's JSON.

Used by llama_server_compare.py. Everything but ServerProcess is pure, so the tests need no server.
The flags are those of the llama.cpp that llama-cpp-python 0.3.36 vendors (common/arg.cpp):
`--spec-type` takes ngram-mod, ngram-simple or draft-simple; `--spec-draft-n-max` is the draft's k.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from localspec.engine.benchset import BenchPrompt

PLAIN = "plain"
SPEC_TYPES = {
    PLAIN: [],
    "ngram-mod": ["--spec-type", "ngram-mod"],
    "ngram-simple": ["--spec-type", "ngram-simple"],
}
DRAFT = "draft"
READY_S = 180


@dataclass(frozen=True)
class Sample:
    """One request's result, in the numbers `localspec bench` reports."""

    text: str
    tokens: int
    decode_tps: float
    e2e_tps: float
    ttft_s: float
    drafted: int
    accepted: int


class ServerReplyError(ValueError):
    """llama-server answered with an error or without the fields the comparison needs."""


def mode_args(
    names: Sequence[str], draft: Path, draft_max: Sequence[int], threads: int
) -> dict[str, list[str]]:
    """{mode: extra server flags}, plain first; `draft` becomes one `draft-kN` mode per draft_max."""
    unknown = [n for n in names if n not in SPEC_TYPES and n != DRAFT]
    if unknown:
        raise ValueError(
            f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join([*SPEC_TYPES, DRAFT])}"
        )
    modes: dict[str, list[str]] = {PLAIN: []}
    for name in names:
        if name == DRAFT:
            for n in draft_max:
                modes[f"draft-k{n}"] = [
                    *["-md", str(draft), "--spec-type", "draft-simple"],
                    *["--spec-draft-n-max", str(n), "-td", str(threads)],
                ]
        else:
            modes[name] = list(SPEC_TYPES[name])
    return modes


def request_body(
    prompt: BenchPrompt, max_tokens: int, sampling: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A chat request evaluated from scratch (no prompt cache), as `localspec bench` runs it: greedy,
    unless `sampling` sets temperature, top_k, top_p or min_p (seed 0 either way)."""
    return {
        "messages": [{"role": m.role, "content": m.content} for m in prompt.messages],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "cache_prompt": False,
        "seed": 0,
        **(sampling or {}),
    }


def streamed_tokens(completion_tokens: int, finish_reason: str | None) -> int:
    """The tokens of a llama-server reply's text, as localspec counts its own.

    Its completion_tokens counts the end-of-generation token it stopped on (server-context.cpp:
    n_gen grows before the EOS check), which has no text: a 17-token reply reads as 18. The
    requests here send no stop strings, so "stop" means it stopped on that token.
    """
    return completion_tokens - 1 if finish_reason == "stop" else completion_tokens


def parse_reply(reply: Mapping[str, Any], wall_s: float) -> Sample:
    """A chat completion's text, tokens and the server's own timings; ServerReplyError otherwise."""
    if "error" in reply:
        error = reply["error"]
        message = error.get("message", error) if isinstance(error, Mapping) else error
        raise ServerReplyError(f"llama-server answered with an error: {message}")
    try:
        text = reply["choices"][0]["message"]["content"]
        tokens = streamed_tokens(
            int(reply["usage"]["completion_tokens"]), reply["choices"][0].get("finish_reason")
        )
        timings = reply["timings"]
        decode = float(timings["predicted_per_second"])
        prompt_ms = float(timings["prompt_ms"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ServerReplyError(
            f"llama-server's reply lacks {exc}: is this the vendored llama-server?"
        ) from None
    return Sample(
        text=text if isinstance(text, str) else "",
        tokens=tokens,
        decode_tps=round(decode, 2),
        e2e_tps=round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
        ttft_s=round(prompt_ms / 1000, 4),
        drafted=int(timings.get("draft_n", 0)),
        accepted=int(timings.get("draft_n_accepted", 0)),
    )


def fastest(samples: Sequence[Sample]) -> tuple[Sample, float]:
    """The sample with the best decode tok/s, and the spread (fastest - slowest) / fastest."""
    best = max(samples, key=lambda s: s.decode_tps)
    slowest = min(s.decode_tps for s in samples)
    return best, round(1 - slowest / best.decode_tps, 3) if best.decode_tps else 0.0


def mode_row(samples: Sequence[Sample], plain: Sample) -> dict[str, Any]:
    best, spread = fastest(samples)
    return {
        **asdict(best),
        "spread": spread,
        "acceptance_rate": round(best.accepted / best.drafted, 3) if best.drafted else 0.0,
        "identical_to_plain": best.text == plain.text,
    }


def report_json(
    prompts: Sequence[BenchPrompt],
    runs: Mapping[str, Mapping[str, Sequence[Sample]]],
    settings: Mapping[str, Any],
) -> dict[str, Any]:
    """Shaped like `localspec bench --json`, with `modes` where it has `methods`."""
    rows: dict[str, Any] = {}
    for p in prompts:
        if p.name not in runs:
            continue
        plain, _ = fastest(runs[p.name][PLAIN])
        modes = {mode: mode_row(samples, plain) for mode, samples in runs[p.name].items()}
        rows[p.name] = {"kind": p.kind, "source": p.source, "modes": modes}
    return {"settings": dict(settings), "prompts": rows, "kinds": kind_medians(rows)}


def kind_medians(rows: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """{kind (and `all`): {mode: medians of decode/e2e tok/s and TTFT}}."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for entry in rows.values():
        groups.setdefault(entry["kind"], []).append(entry["modes"])
    groups["all"] = [entry["modes"] for entry in rows.values()]
    medians: dict[str, dict[str, dict[str, float]]] = {}
    for kind, entries in groups.items():
        medians[kind] = {}
        for mode in dict.fromkeys(m for e in entries for m in e):
            found = [e[mode] for e in entries if mode in e]
            medians[kind][mode] = {"prompts": len(found)} | {
                f: round(statistics.median(r[f] for r in found), 4)
                for f in ("decode_tps", "e2e_tps", "ttft_s")
            }
    return medians


class ServerProcess:
    """One llama-server on a loopback port."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log

    @classmethod
    def start(
        cls, server: Path, argv: list[str], port: int, log: Path, env: Mapping[str, str] | None = None
    ) -> ServerProcess:
        """Start it (with `env`, else this process's environment) and wait until /health answers; exit
        with its log's name if it does not."""
        cmd = [str(server), "--host", "127.0.0.1", "--port", str(port), *argv]
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                sys.exit(f"llama-server exited with {proc.returncode}; see {log}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    return cls(proc, port, log)
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        proc.kill()
        sys.exit(f"llama-server did not become ready in {READY_S} s; see {log}")

    def chat(self, body: Mapping[str, Any]) -> dict[str, Any]:
        reply = httpx.post(f"http://127.0.0.1:{self.port}/v1/chat/completions", json=body, timeout=600)
        data: dict[str, Any] = reply.json()
        return data

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
