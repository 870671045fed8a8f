"""An editor's completion while a chat streams, on the real 1.5B through the real openai package.

What a person meets with one model for both: the agent (or chat) writes a long reply, or sends a
long prompt, and the editor asks for a fill-in-the-middle completion meanwhile. The completion must
come back while the reply is still streaming, or before its prompt is read, and the reply must be
the one written without it (greedy, `none`: one-token steps, so no learnt cost can change its batch
widths; each prompt read whole).
"""

from __future__ import annotations

import sysconfig
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemonproc import Daemon, start_real_daemon
from openai import OpenAI

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m"
ASK = "Write a Python module of eight small string helpers, each with a docstring."
CHAT = [{"role": "user", "content": ASK}]
# Each reply reads its prompt whole, as the other did: a prompt read again from the cache decodes
# its last token alone, which rounds otherwise than the batch that read it the first time.
PLAIN = {"speculative": {"method": "none"}, "cache_prompt": False}


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> Iterator[OpenAI]:
    with daemon.openai() as c:
        yield c


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, qwen_target: Path, daemon_curves: Path
) -> Iterator[Daemon]:
    d = start_real_daemon(tmp_path_factory.mktemp("interleave-real-home"), qwen_target, curves=daemon_curves)
    yield d
    assert d.stop() == 0, d.log()


def fim(client: OpenAI, when: dict[str, float], completion: list[str]) -> None:
    """The editor's completion, as llama.vim or Continue asks for it; its text and when it came back."""
    out = client.completions.create(
        model=MODEL,
        prompt="def add(a, b):\n    ",
        suffix="\n\nprint(add(1, 2))\n",
        max_tokens=24,
        temperature=0,
    )
    completion.append(out.choices[0].text)
    when["completion"] = time.monotonic()


def test_a_completion_while_a_chat_streams(daemon: Daemon, client: OpenAI) -> None:
    ask = {"model": MODEL, "messages": CHAT, "max_tokens": 320, "temperature": 0, "extra_body": PLAIN}
    alone = client.chat.completions.create(**ask).choices[0].message.content  # type: ignore[call-overload]

    when: dict[str, float] = {}
    completion: list[str] = []
    parts: list[str] = []
    editor = threading.Thread(target=fim, args=(client, when, completion))
    for chunk in client.chat.completions.create(**ask, stream=True):  # type: ignore[call-overload]
        text = chunk.choices[0].delta.content if chunk.choices else None
        if text:
            parts.append(text)
            if not editor.is_alive() and "completion" not in when and len(parts) == 1:
                editor.start()
    when["chat"] = time.monotonic()
    editor.join(120)
    assert completion and completion[0].strip(), daemon.log()
    assert when["completion"] < when["chat"]  # served while the chat's reply paused, not after it
    assert "".join(parts) == alone


def test_a_completion_while_an_agents_long_prompt_is_read(daemon: Daemon, client: OpenAI) -> None:
    """shlex.py's first 6,000 characters, ~1,600 tokens (the test daemon's context is 2,048): 5 s
    and more to read on a 2-core CPU. The completion, sent a second in, runs between two of the
    read's chunks, and the agent's reply is the one it has alone."""
    source = (Path(sysconfig.get_paths()["stdlib"]) / "shlex.py").read_text()[:6000]
    task = f"Rename the class `shlex` to `Lexer` in this module.\n\n```python\n{source}```"
    ask = {
        "model": MODEL,
        "messages": [{"role": "user", "content": task}],
        "max_tokens": 16,
        "temperature": 0,
        "extra_body": PLAIN,
    }
    alone = client.chat.completions.create(**ask).choices[0].message.content  # type: ignore[call-overload]
    assert alone

    when: dict[str, float] = {}
    completion: list[str] = []
    parts: list[str] = []
    editor = threading.Timer(1.0, fim, args=(client, when, completion))
    editor.start()
    for chunk in client.chat.completions.create(**ask, stream=True):  # type: ignore[call-overload]
        text = chunk.choices[0].delta.content if chunk.choices else None
        if text:
            if not parts:
                when["first token"] = time.monotonic()
            parts.append(text)
    editor.join(120)
    assert completion and completion[0].strip(), daemon.log()
    assert when["completion"] < when["first token"]  # served during the read, not after it
    assert "".join(parts) == alone


def test_two_chats_take_turns_and_each_writes_what_it_writes_alone(client: OpenAI) -> None:
    """An agent's reply and a person's chat to one model: the second streams before the first ends
    (turns of a few seconds each, their caches saved and loaded back between them), and each text is
    the one its model writes with the other absent."""
    asks = [
        {"model": MODEL, "messages": CHAT, "max_tokens": 320, "temperature": 0, "extra_body": PLAIN},
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Explain how a hash map handles collisions."}],
            "max_tokens": 300,
            "temperature": 0,
            "extra_body": PLAIN,
        },
    ]
    alone = [client.chat.completions.create(**ask).choices[0].message.content for ask in asks]  # type: ignore[call-overload]
    when: dict[str, float] = {}
    texts: list[list[str]] = [[], []]

    def stream(i: int) -> None:
        for chunk in client.chat.completions.create(**asks[i], stream=True):  # type: ignore[call-overload]
            text = chunk.choices[0].delta.content if chunk.choices else None
            if text:
                when.setdefault(f"first {i}", time.monotonic())
                texts[i].append(text)
        when[f"end {i}"] = time.monotonic()

    first = threading.Thread(target=stream, args=(0,))
    first.start()
    while "first 0" not in when and first.is_alive():
        time.sleep(0.01)
    stream(1)
    first.join(300)

    assert when["first 1"] < when["end 0"]  # it did not wait for the whole first reply
    assert ["".join(t) for t in texts] == alone
