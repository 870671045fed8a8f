"""The process that renders chat templates: `python -m localspec.engine.template_child`.

A GGUF's chat template is a program from whoever made the file. Jinja's sandbox keeps
it from reaching files or attributes, not from looping for hours or building a string
of gigabytes, and no thread can stop a Python loop or a C-level `**` midway. So the
template runs here, in a child the daemon kills when it is over its time budget, with
an address-space limit and a CPU-time limit per render that the kernel enforces even
when the daemon is gone.

Protocol: one JSON object per line each way. The child says {"ready": true} once,
then answers each {"template", "bos", "eos", "messages", "tools", "kwargs", "max_chars", "cpu_s"} with
{"text": ...} or {"error": ..., "kind": "template" | "budget"}. It imports only
jinja2 and the standard library, so it starts in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import json
import math
import resource
import sys
from datetime import datetime
from typing import Any

# Enough for any real prompt rendering (the interpreter, jinja2 and a few MB of text) and far from
# what a machine running a model can spare.
ADDRESS_SPACE_BYTES = 1 << 30


def _environment() -> Any:
    """The environment llama-cpp-python's Jinja2ChatFormatter builds (Transformers' chat-template rules)."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class IgnoreGenerationTags(jinja2.ext.Extension):
        tags = {"generation"}  # noqa: RUF012 (jinja2's own API: a class attribute)

        def parse(self, parser: Any) -> Any:
            parser.stream.skip(1)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    env = ImmutableSandboxedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[IgnoreGenerationTags, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    return env


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise ValueError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _OverBudget(Exception):
    pass


def render(env: Any, cache: dict[str, Any], job: dict[str, Any]) -> str:
    """The template's output, streamed so that output past `max_chars` stops it."""
    source = job["template"]
    if source not in cache:
        cache.clear()  # one model's template at a time, in practice
        cache[source] = env.from_string(source)
    # The request's own variables first: the ones every template relies on are not theirs to replace.
    context = {
        **(job.get("kwargs") or {}),
        "messages": job["messages"],
        "bos_token": job["bos"],
        "eos_token": job["eos"],
        "add_generation_prompt": True,
        "raise_exception": _raise_exception,
        "strftime_now": _strftime_now,
        "functions": None,
        "function_call": None,
        "tools": job.get("tools"),
        "tool_choice": None,
    }
    parts: list[str] = []
    size, limit = 0, int(job["max_chars"])
    for piece in cache[source].generate(**context):
        size += len(piece)
        if size > limit:
            raise _OverBudget(f"its output passed {limit:,} characters")
        parts.append(piece)
    return "".join(parts)


def _limit_cpu(seconds: float) -> None:
    """SIGXCPU (which ends the process) once this render has used `seconds` more CPU time."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    spent = used.ru_utime + used.ru_stime
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(spent + seconds) + 1
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def answer(env: Any, cache: dict[str, Any], line: str) -> dict[str, Any]:
    job = json.loads(line)
    _limit_cpu(float(job["cpu_s"]))
    try:
        return {"text": render(env, cache, job)}
    except _OverBudget as exc:
        return {"error": str(exc), "kind": "budget"}
    except MemoryError:
        return {"error": "it needed more memory than a prompt may take", "kind": "budget"}
    except RecursionError:
        return {"error": "it recursed too deeply", "kind": "budget"}
    except Exception as exc:  # a template's own error ("roles must alternate") or a syntax error
        return {"error": f"{type(exc).__name__}: {exc}" if not str(exc) else str(exc), "kind": "template"}


def main() -> None:
    with contextlib.suppress(ValueError, OSError):  # a lower limit is already set: keep it
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))
    env = _environment()
    cache: dict[str, Any] = {}
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:  # ends when the daemon closes the pipe (or dies)
        reply = answer(env, cache, line)
        out.write(json.dumps(reply, ensure_ascii=True) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
