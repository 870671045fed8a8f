"""localspec's daemon against llama-server, both measured the same way: from the client, streamed, in turns.

    # llama-server built from the llama.cpp llama-cpp-python vendors (see llama_server_compare.py)
    .venv/bin/python scripts/head_to_head.py --server /tmp/llbuild/bin/llama-server \
        --repeat 2 --json /tmp/h2h.json

`localspec bench` times the engine from inside and llama_server_compare.py reads llama-server's own
timings: two clocks, and two runs minutes apart on a machine whose speed drifts. Here one client
sends every contestant the same streamed greedy chat request (prompt cache off), prompt by prompt,
the contestants taking turns, and times each reply by its chunks' arrival: time to first token is
the first content chunk's arrival after sending; decode tok/s is (completion tokens - 1) over the
time from the first content chunk to the last (llama-server's count less the end-of-generation
token it counts and streams nothing for). Contestants: llama-server plain, ngram-simple and
ngram-mod (one server each, started at once), and one `localspec serve` answering with the method
each request names (`speculative.method`: none and auto). The n-gram memory across requests is
off in localspec's daemon here (LOCALSPEC_NGRAM_MEMORY=0): every request sees only its
own prompt, as llama-server's ngram-simple does. Its ngram-mod keeps a pool across requests, so
with --repeat its second round drafts the reply its first wrote: only its first round counts.
localspec restarts itself with huge pages for llama.cpp's buffers where the kernel
gives them on request (localspec.process.hugepages); llama-server runs as its users start it, or,
with --server-huge-pages, started the same way (the settings record both).
Each other contestant's fastest round counts (the least disturbed), and beside those ratios the
median of the ratios round by round (paired: the two contestants ran minutes apart at most); the
JSON keeps every round. `--merge A.json B.json` reports several runs' rounds together.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_runs import PLAIN, SPEC_TYPES, ServerProcess, request_body, streamed_tokens

from localspec.engine.benchset import BenchPrompt, load_selected
from localspec.errors import UserInputError
from localspec.process.hugepages import asking_for_huge_pages

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "models"
SERVER_MODES = (PLAIN, "ngram-simple", "ngram-mod")
LOCALSPEC_METHODS = ("none", "auto")


@dataclass(frozen=True)
class Timed:
    """One streamed reply as the client saw it."""

    text: str
    tokens: int
    ttft_s: float
    decode_tps: float
    # localspec's own account of the reply (its finish chunk's stats): target steps, tokens drafted
    # and accepted; None for llama-server, and in runs written before they were kept.
    steps: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    # ...and where its time went, in seconds: `llama_s` the target's llama.cpp decodes after the
    # first token (runs written by 1ac7429 held the draft model's there too), `draft_s` the draft
    # model's (the prompt fed to it included), `python_s` localspec's own Python (the whole
    # request's, the prompt-side lookups included). A slow reading of one round (session 34's
    # bisect at 0.54x of none) then tells a slow machine, whose llama.cpp time per step is up, from
    # a policy that took more or dearer steps.
    llama_s: float | None = None
    draft_s: float | None = None
    python_s: float | None = None


class Contestant:
    """Something that answers a streamed chat request: a llama-server, or localspec with a method."""

    def __init__(
        self, name: str, client: httpx.Client, extra: Mapping[str, Any], *, counts_end: bool = False
    ) -> None:
        self.name, self.client, self.extra = name, client, dict(extra)
        # llama-server counts the end-of-generation token it stopped on (server_runs.streamed_tokens):
        # uncorrected, a 17-token reply read as 18, its decode 17/16 of what it was.
        self.counts_end = counts_end

    def ask(self, body: Mapping[str, Any]) -> Timed:
        payload = {**body, **self.extra, "stream": True, "stream_options": {"include_usage": True}}
        sent = time.perf_counter()
        arrivals: list[float] = []
        parts: list[str] = []
        tokens, finish = 0, None
        stats: Mapping[str, Any] = {}
        with self.client.stream("POST", "/v1/chat/completions", json=payload, timeout=600) as reply:
            if reply.status_code != 200:
                sys.exit(f"{self.name} answered {reply.status_code}: {reply.read()[:300]!r}")
            for data in _events(reply.iter_lines()):
                for choice in data.get("choices") or ():
                    finish = choice.get("finish_reason") or finish
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        arrivals.append(time.perf_counter())
                        parts.append(text)
                own = data.get("localspec")
                if isinstance(own, dict) and "steps" in own:  # not a token chunk's ids
                    stats = own
                usage = data.get("usage")
                if usage:
                    tokens = int(usage["completion_tokens"])
        if not arrivals or not tokens:
            sys.exit(f"{self.name} streamed no text or no usage")
        if self.counts_end:
            tokens = streamed_tokens(tokens, finish)
        decode = arrivals[-1] - arrivals[0]
        return Timed(
            "".join(parts),
            tokens,
            round(arrivals[0] - sent, 4),
            round((tokens - 1) / decode, 2) if tokens > 1 and decode > 0 else 0.0,
            stats.get("steps"),
            stats.get("drafted"),
            stats.get("accepted"),
            *_time_split(stats),
        )


def _time_split(stats: Mapping[str, Any]) -> tuple[float | None, float | None, float | None]:
    """(the target's llama.cpp seconds after the first token, the draft model's, Python's), from
    localspec's finish stats.

    Its target time includes reading the prompt, all of it before the first token: taking its
    own time to first token off leaves the decode phase's (the first token's pick, under a
    millisecond, goes with it)."""
    try:
        target, draft, python = float(stats["target_s"]), float(stats["draft_s"]), float(stats["python_s"])
        first = float(stats["ttft_s"])
    except (KeyError, TypeError, ValueError):
        return None, None, None
    return round(max(0.0, target - first), 4), round(draft, 4), round(python, 4)


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            yield json.loads(line[6:])


def start_localspec(args: argparse.Namespace, home: Path) -> tuple[subprocess.Popen[bytes], httpx.Client]:
    """`localspec serve` on a private socket, in a private home: its calibration is measured afresh here."""
    sock = home / "localspec.sock"
    env = {**os.environ, "LOCALSPEC_HOME": str(home), "LOCALSPEC_NGRAM_MEMORY": "0"}
    cmd = [
        str(Path(sys.executable).parent / "localspec"),
        "serve",
        "--target",
        str(args.target),
        "--draft",
        str(args.draft),
        "--ctx",
        str(args.ctx),
        "--socket",
        str(sock),
        "--no-access-log",
    ]
    log = (args.logs / "localspec-serve.log").open("wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    client = httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://localhost")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(
                f"localspec serve exited with {proc.returncode}; see {args.logs / 'localspec-serve.log'}"
            )
        try:
            if client.get("/health", timeout=2).status_code == 200:
                return proc, client
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("localspec serve did not become ready in 300 s")


def server_env(huge_pages: bool) -> dict[str, str] | None:
    """llama-server's environment: this one's, with huge pages for its large allocations if asked."""
    if not huge_pages:
        return None
    return {**os.environ, "GLIBC_TUNABLES": asking_for_huge_pages(os.environ.get("GLIBC_TUNABLES", ""))}


def served_name(client: httpx.Client, target: Path) -> str:
    """The name the daemon lists the target under (it serves every model it finds)."""
    listed = client.get("/v1/models").json()["data"]
    for entry in listed:
        if entry.get("id") in (target.name, target.stem) or target.stem in str(entry.get("id")):
            return str(entry["id"])
    sys.exit(f"the daemon does not list {target.name}: {[e.get('id') for e in listed]}")


def warm_up(contestants: Sequence[Contestant], prompt: BenchPrompt) -> None:
    """One short request each, untimed: a server's first reply pays for paging its weights in."""
    for c in contestants:
        c.ask(request_body(prompt, 8))


# localspec applies the temperature first, then top-k, top-p and min-p (as transformers, vLLM and
# Ollama's own sampler do); llama.cpp's default chain applies it last. Sent to llama-server so both
# sample from one distribution.
LOCALSPEC_SAMPLER_ORDER = ["temperature", "top_k", "top_p", "min_p"]


def sampling_of(args: argparse.Namespace) -> dict[str, Any]:
    """The request's sampling settings: greedy unless --temperature is above 0."""
    if args.temperature <= 0:
        return {}
    return {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p}


def run(
    contestants: Sequence[Contestant],
    prompts: Sequence[BenchPrompt],
    max_tokens: int,
    repeat: int,
    sampling: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, list[Timed]]]:
    """{prompt: {contestant: samples}}: on each prompt, every contestant in turn, `repeat` rounds."""
    runs: dict[str, dict[str, list[Timed]]] = {}
    for prompt in prompts:
        body = request_body(prompt, max_tokens, sampling)
        samples: dict[str, list[Timed]] = {c.name: [] for c in contestants}
        for _ in range(repeat):
            for c in contestants:
                sample = c.ask(body)
                samples[c.name].append(sample)
                print(
                    f"{prompt.name[:28]:<28} {c.name:<18} {sample.tokens:>4} tok  decode "
                    f"{sample.decode_tps:>6.2f} tok/s  ttft {sample.ttft_s:>6.3f} s{_steps(sample)}",
                    flush=True,
                )
        runs[prompt.name] = samples
    return runs


def _steps(sample: Timed) -> str:
    """localspec's steps and drafts for the progress line; nothing for llama-server."""
    if sample.steps is None:
        return ""
    line = f"  steps {sample.steps}, {sample.accepted}/{sample.drafted} drafted right"
    if sample.llama_s is not None and sample.steps:
        per_step = sample.llama_s * 1e3 / sample.steps
        line += f", target {per_step:.0f} ms a step, draft model {sample.draft_s:.2f} s"
        line += f", Python {sample.python_s:.2f} s"
    return line


# Contestants whose state carries from one request to the next: llama-server's ngram-mod keeps a
# pool of n-grams across requests, so from the second round on it drafts the reply it wrote in the
# first. Only their first round counts (localspec's own memory is off here for the same reason).
FIRST_ROUND_ONLY = ("server-ngram-mod",)

Runs = Mapping[str, Mapping[str, Sequence[Timed]]]  # {prompt: {contestant: rounds}}


def counted(name: str, samples: Sequence[Timed]) -> list[Timed]:
    """The rounds of a contestant that measure it: all but a pool's repeats of its own replies."""
    return list(samples[:1] if name in FIRST_ROUND_ONLY else samples)


def paired(num: Sequence[Timed], den: Sequence[Timed]) -> float:
    """The median over rounds of num's decode speed over den's in the same round.

    The two ran one after the other, so a drift of the machine's speed over minutes (this 2-vCPU
    machine's identical runs differ by up to 20%) touches both; the best rounds of each may come
    from different minutes.
    """
    return statistics.median(n.decode_tps / d.decode_tps for n, d in zip(num, den, strict=False))


def held_out_best(rounds: Mapping[str, Sequence[Timed]]) -> float | None:
    """`auto` against llama-server's best mode chosen without the round it is compared in: in each
    round, the mode with the fastest median over the other rounds; the median over rounds of auto's
    speed over that mode's in the same round. None with fewer than two rounds of each.

    The best of three modes, each sampled in the same rounds, picked on the rounds that are compared,
    is the largest of more samples: where no mode drafts, it beats any one contestant's speed by the
    spread of the machine's noise alone (winner's curse). Picked on other rounds, it is not.
    """
    auto = rounds["localspec-auto"]
    n = len(auto)
    modes = [c for c, s in rounds.items() if c.startswith("server-") and len(s) >= n]
    if n < 2 or not modes:
        return None

    def speed_elsewhere(mode: str, r: int) -> float:
        return statistics.median(t.decode_tps for i, t in enumerate(rounds[mode][:n]) if i != r)

    ratios = []
    for r in range(n):
        best = max(modes, key=lambda m: speed_elsewhere(m, r))
        ratios.append(auto[r].decode_tps / rounds[best][r].decode_tps)
    return statistics.median(ratios)


def summarize(kinds: Mapping[str, str], runs: Runs, not_counted: Runs | None = None) -> dict[str, Any]:
    """Per prompt: each contestant's best round, and the ratios the goals are stated in: of the
    best rounds (the least disturbed, as `localspec bench` keeps), and paired round by round."""
    rows: dict[str, Any] = {}
    for name, kind in kinds.items():
        rounds = runs[name]
        got = {c: max(s, key=lambda t: t.decode_tps) for c, s in rounds.items()}
        plain = got[f"server-{PLAIN}"]
        # The goal names llama-server's best *speculative* mode; where nothing is copied its
        # modes are samples of one speed, and the best of all three is the larger of more samples.
        spec = max(
            (t for c, t in got.items() if c.startswith("server-") and c != f"server-{PLAIN}"),
            key=lambda t: t.decode_tps,
        )
        top = max(plain, spec, key=lambda t: t.decode_tps)
        none, auto = got["localspec-none"], got["localspec-auto"]
        rows[name] = {
            "kind": kind,
            "contestants": {c: asdict(t) for c, t in got.items()},
            "rounds": {c: [asdict(t) for t in s] for c, s in rounds.items()},
            "not_counted": {c: [asdict(t) for t in s] for c, s in (not_counted or {}).get(name, {}).items()},
            "none_vs_server_plain": round(none.decode_tps / plain.decode_tps, 3),
            "ttft_none_vs_server_plain": round(
                min(s.ttft_s for s in rounds["localspec-none"])
                / min(s.ttft_s for s in rounds[f"server-{PLAIN}"]),
                3,
            ),
            "auto_vs_none": round(auto.decode_tps / none.decode_tps, 3),
            "auto_vs_best_server": round(auto.decode_tps / top.decode_tps, 3),
            "auto_vs_best_server_spec": round(auto.decode_tps / spec.decode_tps, 3),
            "none_vs_server_plain_paired": round(
                paired(rounds["localspec-none"], rounds[f"server-{PLAIN}"]), 3
            ),
            "auto_vs_none_paired": round(paired(rounds["localspec-auto"], rounds["localspec-none"]), 3),
            "auto_vs_best_server_held_out": _rounded(held_out_best(rounds)),
            "none_same_text_as_server_plain": none.text == plain.text,
        }
    return rows


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def split_rounds(runs: Runs) -> tuple[Runs, Runs]:
    """(the counted rounds, the rest) of every contestant on every prompt."""
    kept = {p: {c: counted(c, s) for c, s in by.items()} for p, by in runs.items()}
    rest = {p: {c: list(s[len(kept[p][c]) :]) for c, s in by.items()} for p, by in runs.items()}
    return kept, rest


def merge(paths: Sequence[Path]) -> tuple[dict[str, str], Runs]:
    """The counted rounds of earlier runs' JSON, joined (same prompts, same contestants)."""
    kinds: dict[str, str] = {}
    joined: dict[str, dict[str, list[Timed]]] = {}
    for path in paths:
        try:
            prompts = json.loads(path.read_text(encoding="utf-8"))["prompts"]
        except (OSError, ValueError, KeyError) as exc:
            raise UserInputError(f"cannot read {path} as head_to_head JSON: {exc}") from exc
        if joined and set(prompts) != set(joined):
            raise UserInputError(f"{path} ran other prompts than {paths[0]}: merge runs of one set")
        for name, row in prompts.items():
            kinds[name] = row["kind"]
            by = joined.setdefault(name, {})
            # Rows written since rounds were split keep only counted rounds (merged ones hold a
            # first ngram-mod round per run); older rows kept every round.
            done = "not_counted" in row
            for c, samples in row["rounds"].items():
                timed = [Timed(**t) for t in samples]
                by.setdefault(c, []).extend(timed if done else counted(c, timed))
    return kinds, joined


RATIOS = (
    "none_vs_server_plain",
    "ttft_none_vs_server_plain",
    "auto_vs_none",
    "auto_vs_best_server",
    "auto_vs_best_server_spec",
    "none_vs_server_plain_paired",
    "auto_vs_none_paired",
)


def print_table(rows: Mapping[str, Any]) -> None:
    heads = [r.replace("_vs_", "/").replace("server_plain", "plain") for r in RATIOS]
    print(f"\n{'prompt':<28} {'kind':<10} " + " ".join(f"{h:>16}" for h in heads) + "  same")
    for name, row in rows.items():
        print(
            f"{name[:28]:<28} {row['kind'][:10]:<10} "
            + " ".join(f"{row[r]:>15.3f}x" for r in RATIOS)
            + f"  {'yes' if row['none_same_text_as_server_plain'] else 'no'}"
        )
    kinds = list(dict.fromkeys(row["kind"] for row in rows.values()))
    print(f"\n{'median':<39} " + " ".join(f"{h:>16}" for h in heads))
    for kind in [*kinds, "all"]:
        sel = [row for row in rows.values() if kind in ("all", row["kind"])]
        print(f"{kind:<39} " + " ".join(f"{statistics.median(r[x] for r in sel):>15.3f}x" for x in RATIOS))
    goals = ("none_vs_server_plain", "none_vs_server_plain_paired", "auto_vs_none", "auto_vs_none_paired")
    for ratio in goals:
        under = [f"{n} {row[ratio]:.3f}x" for n, row in rows.items() if row[ratio] < 0.97]
        print(f"{ratio} < 0.97x on {len(under)} of {len(rows)}: {', '.join(under) or '-'}")
    for ratio in ("auto_vs_best_server", "auto_vs_best_server_spec"):
        under = [f"{n} {row[ratio]:.3f}x" for n, row in rows.items() if row[ratio] < 1.0]
        print(f"{ratio} < 1.0x on {len(under)} of {len(rows)}: {', '.join(under) or '-'}")
    held = {n: row["auto_vs_best_server_held_out"] for n, row in rows.items()}
    if all(v is not None for v in held.values()):
        under = [f"{n} {v:.3f}x" for n, v in held.items() if v < 1.0]
        median = statistics.median(v for v in held.values() if v is not None)
        print(
            f"auto_vs_best_server_held_out (the best mode picked on the other rounds; median {median:.3f}x) "
            f"< 1.0x on {len(under)} of {len(rows)}: {', '.join(under) or '-'}"
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", type=Path, help="llama-server binary (needed unless --merge)")
    ap.add_argument("--target", type=Path, default=MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--draft", type=Path, default=MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    ap.add_argument("--prompts", type=Path, default=ROOT / "scripts" / "bench_set.json")
    ap.add_argument("--kinds", default="", help="comma-separated kinds (default: all)")
    ap.add_argument("--limit", type=int, default=0, help="only the first N prompts (a smoke run)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--port", type=int, default=8990)
    ap.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--temperature", type=float, default=0.0, help="sample instead of greedy (seed 0)")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument(
        "--server-huge-pages",
        action="store_true",
        help="start llama-server with glibc.malloc.hugetlb=1, as localspec starts itself (process.hugepages)",
    )
    ap.add_argument(
        "--merge", type=Path, nargs="+", help="report the rounds of earlier runs' JSON together; run nothing"
    )
    args = ap.parse_args(argv)
    if not args.merge and args.server is None:
        ap.error("--server is required (or --merge earlier runs)")
    if not args.merge:
        args.logs.mkdir(parents=True, exist_ok=True)  # a folder of this run's own, made as it starts
    return args


def main() -> None:
    args = parse_args()
    try:
        if args.merge:
            kinds, runs = merge(args.merge)
            report(summarize(kinds, runs), args.json, {"merged": [str(p) for p in args.merge]})
            return
        prompts = load_selected(args.prompts, args.kinds)
    except UserInputError as exc:
        sys.exit(str(exc))
    if args.limit:
        prompts = prompts[: args.limit]
    base = ["-m", str(args.target), "-c", str(args.ctx), "-t", str(args.threads), "-np", "1", "--no-webui"]
    servers: list[ServerProcess] = []
    contestants: list[Contestant] = []
    sampling = sampling_of(args)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with tempfile.TemporaryDirectory(prefix="h2h-home-") as home:
        proc, client = start_localspec(args, Path(home))
        try:
            for i, mode in enumerate(SERVER_MODES):
                log = args.logs / f"llama-server-{mode}.log"
                argv, env = [*base, *SPEC_TYPES[mode]], server_env(args.server_huge_pages)
                server = ServerProcess.start(args.server, argv, args.port + i, log, env)
                servers.append(server)
                http = httpx.Client(base_url=f"http://127.0.0.1:{server.port}")
                order = {"samplers": LOCALSPEC_SAMPLER_ORDER} if sampling else {}
                contestants.append(Contestant(f"server-{mode}", http, order, counts_end=True))
            model = served_name(client, args.target)
            huge_pages = bool(client.get("/health").json().get("huge_pages"))
            for method in LOCALSPEC_METHODS:
                contestants.append(
                    Contestant(
                        f"localspec-{method}", client, {"model": model, "speculative": {"method": method}}
                    )
                )
            warm_up(contestants, prompts[0])
            runs = run(contestants, prompts, args.max_tokens, max(1, args.repeat), sampling)
        finally:
            for server in servers:
                server.stop()
            proc.terminate()
            proc.wait(30)
    kept, rest = split_rounds(runs)
    settings = {
        "server": str(args.server),
        "server_args": base,
        "target": str(args.target),
        "draft": str(args.draft),
        "max_tokens": args.max_tokens,
        "sampling": sampling or "greedy",
        "repeat": args.repeat,
        # Whether each side's weights sat in huge pages: 12% of plain decoding on a 2-vCPU Xeon.
        "localspec_huge_pages": huge_pages,
        "server_huge_pages": args.server_huge_pages,
        "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    report(summarize({p.name: p.kind for p in prompts}, kept, rest), args.json, settings)


def report(rows: Mapping[str, Any], out: Path | None, settings: Mapping[str, Any]) -> None:
    print_table(rows)
    if out is not None:
        out.write_text(json.dumps({"settings": settings, "prompts": rows}, indent=1), encoding="utf-8")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
