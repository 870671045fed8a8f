"""Counters for `GET /metrics`, rendered in Prometheus' text exposition format.

Updated only from the server's event loop (one thread), so no locks. Route
labels are limited to the known routes: a scanner probing random paths must not
grow the label set without bound.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable

from localspec.types import GenerationStats

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
KNOWN_ROUTES = frozenset(
    {
        "/health",
        "/metrics",
        "/openapi.json",
        "/v1/models",
        "/v1/chat/completions",
        "/v1/completions",
        "/api/version",
        "/api/tags",
        "/api/show",
        "/api/chat",
        "/api/generate",
    }
)


class Histogram:
    """A cumulative-bucket histogram, as Prometheus expects."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += 1
        self.sum += value

    def lines(self, name: str) -> Iterable[str]:
        running = 0
        for bound, count in zip(self.buckets, self.counts, strict=True):
            running += count
            yield f'{name}_bucket{{le="{bound}"}} {running}'
        yield f'{name}_bucket{{le="+Inf"}} {self.total}'
        yield f"{name}_sum {self.sum:.6f}"
        yield f"{name}_count {self.total}"


class Metrics:
    """Everything `/metrics` reports; `render()` adds the live gauges it is given."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, int]] = Counter()
        self.generations: Counter[str] = Counter()  # by finish: stop, length, cancelled, error
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.generation_seconds = 0.0
        self.last_tokens_per_second = 0.0
        self.drafted = 0
        self.accepted = 0
        self.drafted_by_position: list[int] = []
        self.accepted_by_position: list[int] = []
        self.ttft = Histogram(TTFT_BUCKETS)

    def request(self, path: str, status: int) -> None:
        self.requests[(path if path in KNOWN_ROUTES else "other", status)] += 1

    def failed(self) -> None:
        self.generations["error"] += 1

    def finished(self, finish: str, stats: GenerationStats) -> None:
        self.generations[finish] += 1
        self.prompt_tokens += stats.prompt_tokens
        self.generated_tokens += stats.tokens
        self.generation_seconds += stats.elapsed_s
        self.last_tokens_per_second = stats.tokens_per_second
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        _add(self.drafted_by_position, stats.drafted_by_position)
        _add(self.accepted_by_position, stats.accepted_by_position)
        if stats.tokens:
            self.ttft.observe(stats.ttft_s)

    def render(self, *, queue_depth: int, in_flight: int, ready: bool) -> str:
        out: list[str] = []
        _family(out, "localspec_up", "gauge", "1 when the models are loaded and serving.", [("", int(ready))])
        _family(
            out,
            "localspec_requests_total",
            "counter",
            "HTTP requests answered, by route and status code.",
            [(f'route="{r}",status="{s}"', n) for (r, s), n in sorted(self.requests.items())],
        )
        _family(
            out,
            "localspec_generations_total",
            "counter",
            "Generations ended, by how they ended (stop, length, cancelled, error).",
            [(f'finish="{f}"', n) for f, n in sorted(self.generations.items())],
        )
        self._token_families(out)
        _family(
            out, "localspec_queue_depth", "gauge", "Requests waiting for the engine.", [("", queue_depth)]
        )
        _family(out, "localspec_in_flight", "gauge", "Generations running or waiting.", [("", in_flight)])
        out.append("# HELP localspec_ttft_seconds Time from start of generation to the first token.")
        out.append("# TYPE localspec_ttft_seconds histogram")
        out.extend(self.ttft.lines("localspec_ttft_seconds"))
        return "\n".join(out) + "\n"

    def _token_families(self, out: list[str]) -> None:
        counters = (
            ("localspec_prompt_tokens_total", "Prompt tokens processed.", self.prompt_tokens),
            ("localspec_generated_tokens_total", "Tokens generated.", self.generated_tokens),
            ("localspec_generation_seconds_total", "Seconds spent generating.", self.generation_seconds),
            ("localspec_drafted_tokens_total", "Tokens drafted.", self.drafted),
            ("localspec_accepted_tokens_total", "Drafted tokens the target accepted.", self.accepted),
        )
        for name, why, value in counters:
            _family(out, name, "counter", why, [("", value)])
        _family(
            out,
            "localspec_tokens_per_second",
            "gauge",
            "Decoding speed of the last finished generation.",
            [("", self.last_tokens_per_second)],
        )
        for name, values in (
            ("localspec_drafted_tokens_by_position_total", self.drafted_by_position),
            ("localspec_accepted_tokens_by_position_total", self.accepted_by_position),
        ):
            why = "Drafted tokens by position in the draft (0 = first)."
            if "accepted" in name:
                why = "Accepted drafted tokens by position in the draft (0 = first)."
            _family(out, name, "counter", why, [(f'position="{i}"', v) for i, v in enumerate(values)])


def _add(total: list[int], more: list[int]) -> None:
    total.extend([0] * (len(more) - len(total)))
    for i, v in enumerate(more):
        total[i] += v


def _family(out: list[str], name: str, kind: str, why: str, samples: list[tuple[str, float]]) -> None:
    out.append(f"# HELP {name} {why}")
    out.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        label_text = f"{{{labels}}}" if labels else ""
        number = f"{value:.6f}" if isinstance(value, float) else str(value)
        out.append(f"{name}{label_text} {number}")
