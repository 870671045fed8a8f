"""Chat templates rendered in a child process, within a time and an output-size budget.

The template comes from the GGUF, so from whoever made the file: `template_child`
explains why it runs in a process of its own. Here is the daemon's side: one child,
started on first use and reused (a render costs a pipe round trip, well under a
millisecond on top of Jinja's own time); a render over budget kills it, and the next
render starts a fresh one. Renders are one at a time; a hostile template holds the
others back by at most its budget. Closing kills the child, so shutdown never waits
on a template.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localspec.engine.harmony import harmony
from localspec.errors import DaemonError, OverloadedError, TemplateError
from localspec.types import ChatMessage, ToolCall, ToolSpec

# Real templates render in milliseconds; a second is three orders of magnitude of slack.
RENDER_BUDGET_S = 2.0
# Far above any prompt a context can hold (a million-token context is ~4M characters).
MAX_OUTPUT_CHARS = 8 << 20
# How long a render waits for the ones before it (each takes at most RENDER_BUDGET_S).
QUEUE_TIMEOUT_S = 10.0
# A cold interpreter importing jinja2 takes ~0.2 s; a loaded 2-core machine, several times that.
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ChatTemplate:
    """What rendering needs from a model: its template, BOS and EOS texts, and its name for errors."""

    source: str
    bos: str
    eos: str
    model: str


class TemplateRenderer:
    """Renders chat templates in a child process; thread-safe, and `close()` ends any render at once."""

    def __init__(self, budget_s: float = RENDER_BUDGET_S, max_chars: int = MAX_OUTPUT_CHARS) -> None:
        self.budget_s = budget_s
        self.max_chars = max_chars
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._closed = False

    def render(
        self,
        template: ChatTemplate,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text; TemplateError (a 400 naming the model) when the template fails or overruns.
        `kwargs`: extra variables the template sees (chat_template_kwargs: `enable_thinking`)."""
        job = {
            "template": template.source,
            "bos": template.bos,
            "eos": template.eos,
            "messages": [_turn(m, harmony(template.source)) for m in messages],
            "tools": [_tool(spec) for spec in tools] or None,
            "kwargs": dict(kwargs or {}),
            "max_chars": self.max_chars,
            "cpu_s": self.budget_s,
        }
        line = (json.dumps(job, ensure_ascii=True) + "\n").encode()
        if not self._lock.acquire(timeout=QUEUE_TIMEOUT_S):
            raise OverloadedError(
                "chat templates are being rendered for other requests; retry in a few seconds"
            )
        try:
            reply = self._ask(line, template.model)
        finally:
            self._lock.release()
        if "text" in reply:
            return str(reply["text"])
        if reply.get("kind") == "budget":
            raise TemplateError(f"{template.model}'s chat template is over its budget: {reply['error']}")
        raise TemplateError(f"{template.model}'s chat template rejected the messages: {reply['error']}")

    def start(self) -> None:
        """Start the child now, so the first request does not wait for it."""
        with self._lock:
            self._child(model="the model")

    def interrupt(self) -> None:
        """Kill the child without waiting (safe from a signal handler); later renders are refused."""
        self._closed = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()  # a render waiting on it sees the pipe close at once

    def close(self) -> None:
        """`interrupt`, then reap the child."""
        self.interrupt()
        if self._lock.acquire(timeout=5.0):
            try:
                self._reset()
            finally:
                self._lock.release()

    def __enter__(self) -> TemplateRenderer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # --- the child --------------------------------------------------------------------

    def _ask(self, line: bytes, model: str) -> dict[str, object]:
        proc = self._child(model)
        assert proc.stdin is not None
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
        except OSError:
            self._reset()
            raise TemplateError(f"{model}'s chat template could not be rendered (renderer gone)") from None
        reply = self._read_line(proc, time.monotonic() + self.budget_s)
        if reply is None:
            self._reset()
            if self._closed:
                raise DaemonError("the daemon is shutting down; the request was not run")
            raise TemplateError(
                f"{model}'s chat template is over its budget: it ran past {self.budget_s:g} s"
            )
        try:
            decoded: dict[str, object] = json.loads(reply)
        except ValueError:  # not the child's protocol: start a fresh one next time
            self._reset()
            raise TemplateError(
                f"{model}'s chat template could not be rendered (bad renderer reply)"
            ) from None
        return decoded

    def _child(self, model: str) -> subprocess.Popen[bytes]:
        if self._closed:
            raise DaemonError("the daemon is shutting down; the request was not run")
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._reset()
        argv = [sys.executable, "-m", "localspec.engine.template_child"]
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0
        )
        if self._read_line(self._proc, time.monotonic() + START_TIMEOUT_S) is None:
            self._reset()
            raise TemplateError(f"{model}'s chat template could not be rendered: the renderer did not start")
        return self._proc

    def _read_line(self, proc: subprocess.Popen[bytes], deadline: float) -> bytes | None:
        """One line from the child by `deadline`; None when it is late, gone or killed."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        chunks = [self._buffer]
        chunk = self._buffer
        while b"\n" not in chunk:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return None
            chunks.append(chunk)
        line, _, self._buffer = b"".join(chunks).partition(b"\n")
        return line

    def _reset(self) -> None:
        if self._proc is not None:
            _kill(self._proc)
        self._proc = None
        self._buffer = b""


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def _turn(message: ChatMessage, talks_harmony: bool = False) -> dict[str, Any]:
    """A message as Transformers passes it to templates: calls with their arguments as a dict.

    gpt-oss's template (`talks_harmony`) refuses a call's turn with both content and reasoning (one
    analysis message shows either): the reasoning is kept, as llama.cpp keeps it."""
    content = message.content
    if talks_harmony and message.tool_calls and message.reasoning:
        content = ""
    turn: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        turn["tool_calls"] = [_call(c) for c in message.tool_calls]
    if message.tool_call_id is not None:
        turn["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        turn["name"] = message.name
    if message.reasoning:
        # Qwen3's and DeepSeek's templates read `reasoning_content`; gpt-oss's reads `thinking`.
        turn["reasoning_content"] = turn["thinking"] = message.reasoning
    return turn


def _call(call: ToolCall) -> dict[str, Any]:
    try:
        arguments: Any = json.loads(call.arguments) if call.arguments else {}
    except ValueError:  # templates `tojson` the arguments: text that is not JSON stays text
        arguments = call.arguments
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def _tool(tool: ToolSpec) -> dict[str, Any]:
    function = {"name": tool.name, "description": tool.description, "parameters": dict(tool.parameters)}
    return {"type": "function", "function": function}
