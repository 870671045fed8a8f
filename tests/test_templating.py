"""Chat templates render in a child process within a time, output and memory budget.

A template is code from whoever made the GGUF: these feed the renderer templates that
loop for hours, compute huge numbers in C, print gigabytes or ask for gigabytes, and
check each ends as a TemplateError naming the model, and that the next render works.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from daemonproc import Daemon, start_daemon
from llama_cpp.llama_chat_format import Jinja2ChatFormatter
from tinymodels import CHATML_TEMPLATE, write_tiny_model

from localspec.engine.prompting import FALLBACK_TEMPLATE
from localspec.engine.templating import ChatTemplate, TemplateRenderer
from localspec.errors import DaemonError, LocalspecError, TemplateError
from localspec.models.gguf_info import read_gguf_info, read_tokens
from localspec.types import ChatMessage

MESSAGES = (
    ChatMessage("system", "be brief"),
    ChatMessage("user", "hi <b>&\"'\n\t\u00e9\U0001f600"),
    ChatMessage("assistant", "hello"),
    ChatMessage("user", "again"),
)
# Every tag and filter Transformers' templates lean on: loop controls, tojson, generation, strftime_now.
RICH = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
    "{% generation %}{{ m.role | upper }}={{ m.content | tojson }}{% endgeneration %}\n"
    "{% if loop.index > 10 %}{% break %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'A:' }}{% endif %}{{ eos_token }}"
)
FOREVER = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
C_LEVEL = "{{ (7 ** (7 ** 9)) > 0 }}"  # one C call on big integers: no Python-level check can stop it
HUGE_OUTPUT = "{% for a in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"
HUGE_MEMORY = "{{ 'x' * 4000000000 }}"
REJECTS = "{{ raise_exception('roles must alternate user/assistant') }}"


@pytest.fixture(scope="module")
def renderer() -> Iterator[TemplateRenderer]:
    with TemplateRenderer(budget_s=1.0) as r:
        yield r


def template(source: str) -> ChatTemplate:
    return ChatTemplate(source, "<s>", "</s>", "hostile.gguf")


@pytest.mark.parametrize("source", [CHATML_TEMPLATE, RICH])
def test_renders_as_llama_cpp_python_does(renderer: TemplateRenderer, source: str) -> None:
    turns: list[Any] = [{"role": m.role, "content": m.content} for m in MESSAGES]
    expected = Jinja2ChatFormatter(template=source, eos_token="</s>", bos_token="<s>")(messages=turns).prompt
    assert renderer.render(template(source), MESSAGES) == expected


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (FOREVER, "ran past 1 s"),
        (C_LEVEL, "ran past 1 s"),
        (HUGE_OUTPUT, "output passed"),
        (HUGE_MEMORY, "more memory"),
    ],
)
def test_a_template_over_budget_is_refused_and_the_next_render_works(
    renderer: TemplateRenderer, source: str, why: str
) -> None:
    with pytest.raises(TemplateError) as err:
        renderer.render(template(source), MESSAGES)
    assert err.value.message.startswith("hostile.gguf's chat template is over its budget")
    assert why in err.value.message
    assert err.value.http_status == 400
    assert renderer.render(template(CHATML_TEMPLATE), MESSAGES[1:2]).startswith("<|im_start|>user\nhi")


def test_a_template_error_names_the_model(renderer: TemplateRenderer) -> None:
    with pytest.raises(TemplateError, match=r"hostile\.gguf's chat template rejected the messages: roles"):
        renderer.render(template(REJECTS), MESSAGES)
    with pytest.raises(TemplateError, match=r"hostile\.gguf's chat template rejected"):
        renderer.render(template("{% for %}"), MESSAGES)


def test_close_ends_a_render_in_progress() -> None:
    renderer = TemplateRenderer(budget_s=600.0)  # only close() can end this render early
    renderer.start()
    outcome: list[LocalspecError] = []

    def render() -> None:
        try:
            renderer.render(template(FOREVER), MESSAGES)
        except LocalspecError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=render, daemon=True)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive()  # rendering
    renderer.close()
    thread.join(30)
    assert not thread.is_alive()
    assert isinstance(outcome[0], DaemonError) and "shutting down" in outcome[0].message
    with pytest.raises(DaemonError):
        renderer.render(template(CHATML_TEMPLATE), MESSAGES)


# The daemon serving a model whose template is hostile.


@pytest.fixture
def hostile_daemon(tmp_path: Path) -> Iterator[Daemon]:
    model = write_tiny_model(tmp_path / "looping.gguf", chat_template=FOREVER)
    daemon = start_daemon(tmp_path / "home", model)
    try:
        yield daemon
    finally:
        daemon.stop()


def _chat(http: httpx.Client) -> httpx.Response:
    body = {"model": "looping", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    return http.post("/v1/chat/completions", json=body)


@pytest.mark.timeout(180)
def test_the_daemon_answers_400_naming_the_model_and_keeps_serving(hostile_daemon: Daemon) -> None:
    with hostile_daemon.http() as http:
        reply = _chat(http)
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["code"] == "chat_template"
        assert error["message"].startswith("looping.gguf's chat template is over its budget")
        body = {
            "model": "looping",
            "prompt": "the model is",
            "max_tokens": 4,
            "temperature": 0,
        }  # greedy: no early EOS
        raw = http.post("/v1/completions", json=body)
        assert raw.status_code == 200 and raw.json()["usage"]["completion_tokens"] == 4


@pytest.mark.timeout(180)
def test_sigterm_while_a_template_renders_exits_cleanly(hostile_daemon: Daemon) -> None:
    replies: list[int] = []

    def chat() -> None:
        with hostile_daemon.http() as http:
            replies.append(_chat(http).status_code)

    thread = threading.Thread(target=chat, daemon=True)
    thread.start()
    thread.join(0.5)  # the render has its budget (2 s): it is still running now
    assert hostile_daemon.stop(timeout=30) == 0
    thread.join(30)
    assert replies and replies[0] in (400, 503)
    assert not hostile_daemon.socket_path.exists()
    assert not hostile_daemon.socket_path.with_suffix(".pid").exists()


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["qwen_target", "gemma", "smollm"])
def test_real_templates_render_as_llama_cpp_python_does(
    renderer: TemplateRenderer, fixture: str, request: pytest.FixtureRequest
) -> None:
    info = read_gguf_info(request.getfixturevalue(fixture))
    tokens = read_tokens(info)
    source = info.chat_template or FALLBACK_TEMPLATE  # gemma-3-270m carries none
    bos = tokens[info.bos_id] if info.bos_id is not None else ""
    eos = tokens[info.eos_id] if info.eos_id is not None else ""
    turns = (ChatMessage("user", "hi"), ChatMessage("assistant", "hello"), ChatMessage("user", "sum 2+2"))
    plain: list[Any] = [{"role": m.role, "content": m.content} for m in turns]
    expected = Jinja2ChatFormatter(template=source, eos_token=eos, bos_token=bos)(messages=plain)
    got = renderer.render(ChatTemplate(source, bos, eos, info.path.name), turns)
    assert got == expected.prompt
