"""Prompt-lookup drafting over plain token lists."""

from __future__ import annotations

import random

import pytest

from localspec.engine.drafters.ngram import LONG_MATCH, NgramDrafter, NgramIndex, NgramMemory
from localspec.engine.drafters.views import PromptView, json_string_text


def test_proposes_what_followed_the_latest_match() -> None:
    index = NgramIndex(min_n=2, max_n=3)
    index.extend([1, 2, 3, 4, 5, 9, 1, 2, 3])
    match = index.propose(3)
    assert match.tokens == [4, 5, 9]
    assert match.match_len == 3


def test_prefers_the_longest_match_and_the_latest_occurrence() -> None:
    index = NgramIndex(min_n=1, max_n=3)
    index.extend([7, 8, 1, 6, 2, 8, 1, 5, 0, 8, 1])
    # [8, 1] occurs twice before; the latest is followed by 5.
    assert index.propose(2).tokens == [5, 0]


def test_a_match_longer_than_the_indexed_ngrams_reports_its_real_length() -> None:
    block = list(range(100, 140))
    index = NgramIndex(min_n=2, max_n=3)
    index.extend([7, *block, 8, *block[:20]])
    match = index.propose(4)
    assert match.tokens == block[20:24]
    assert match.match_len == 20  # the whole copy so far, not just the 3-gram that found it
    index.extend(block[20:])
    assert index.propose(4).match_len == LONG_MATCH  # followed back no further than that


def test_a_remembered_match_stops_at_the_edge_of_its_request() -> None:
    memory = NgramMemory(min_n=4, max_n=6)
    memory.remember([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    memory.remember([11, 12, 13, 14, 15, 16, 17])
    match = memory.lookup([9, 10, 11, 12, 13, 14, 15, 16], 2)
    # [11..16] matches six tokens; 10 before it belongs to the other request, behind a separator.
    assert (match.tokens, match.match_len) == ([17], 6)


def test_no_match_proposes_nothing() -> None:
    index = NgramIndex(min_n=2, max_n=4)
    index.extend([1, 2, 3, 4])
    assert index.propose(4).tokens == []
    assert index.propose(4).match_len == 0


def test_extend_and_truncate_keep_the_index_consistent() -> None:
    index = NgramIndex(min_n=2, max_n=2)
    index.extend([1, 2, 3, 1, 2])
    assert index.propose(1).tokens == [3]
    index.truncate(3)
    index.extend([4, 1, 2])
    assert index.propose(2).tokens == [3, 4]


def test_a_long_stretch_indexed_at_once_maps_every_ngram_as_one_token_at_a_time() -> None:
    rng = random.Random(7)
    for _ in range(50):
        # A small alphabet: the same n-grams recur, so which occurrence is kept is tested too.
        tokens = [rng.randrange(5) for _ in range(rng.randrange(0, 200))]
        whole, stepwise = NgramIndex(2, 8), NgramIndex(2, 8)
        cut = rng.randrange(0, len(tokens) + 1)
        whole.extend(tokens[:cut])
        whole.propose(4)  # a prompt, indexed at once
        whole.extend(tokens[cut:])
        whole.index_all()  # and a long stretch after it
        for token in tokens:
            stepwise.extend([token])
            stepwise.propose(4)
        stepwise.index_all()
        assert whole._next == stepwise._next


def test_continuation_is_cut_at_the_end_of_the_context() -> None:
    index = NgramIndex(min_n=2, max_n=2)
    index.extend([5, 6, 5, 6])
    assert index.propose(8).tokens == [5, 6]


def test_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        NgramIndex(min_n=3, max_n=2)


def test_memory_finds_what_an_earlier_request_wrote_and_never_crosses_requests() -> None:
    memory = NgramMemory(capacity=100, min_n=4, max_n=8)
    memory.remember([1, 2, 3, 4, 5, 6, 7])
    memory.remember([20, 21, 22, 23, 24, 25])
    match = memory.lookup([9, 9, 2, 3, 4, 5], 4)
    assert (match.tokens, match.match_len) == ([6, 7], 4)  # cut where that request ended
    assert memory.lookup([9, 9, 9, 3, 4, 5], 4).tokens == []  # three tokens: too little evidence
    assert memory.lookup([20, 21, 22, 23], 8).tokens == [24, 25]


def test_memory_is_bounded_and_keeps_the_newest() -> None:
    memory = NgramMemory(capacity=20, min_n=4, max_n=4)
    for start in range(0, 100, 10):
        memory.remember(list(range(start, start + 10)))
    assert memory.size <= 2 * 20 + 2  # separators included
    assert memory.lookup([90, 91, 92, 93], 2).tokens == [94, 95]
    assert memory.lookup([0, 1, 2, 3], 2).tokens == []  # the oldest request is forgotten
    off = NgramMemory(capacity=0)
    off.remember(list(range(50)))
    assert off.size == 0


def test_drafter_uses_earlier_requests_only_after_its_own_reply_began() -> None:
    memory = NgramMemory(capacity=1000, min_n=4, max_n=8)
    template = [100, 101, 102, 103, 104]
    memory.remember([7, *template, 50, 51, 52, 53, 54, 55])
    drafter = NgramDrafter(min_n=4, max_n=8, memory=memory)
    prompt = [8, *template]
    drafter.start(prompt)
    # The prompt's template tail matches the earlier request's, but nothing of this reply yet.
    assert drafter.peek(prompt, 4).tokens == []
    assert drafter.peek([*prompt, 50], 4).tokens == []
    # Two tokens into the reply, the earlier reply is the best evidence there is.
    match = drafter.peek([*prompt, 50, 51], 3)
    assert (match.tokens, match.match_len) == ([52, 53, 54], 7)
    # The context's own longer match wins over memory.
    own = [*prompt, 50, 51, 60, 61, 62, 63, 64, 65, 66, 67, 68, 60, 61, 62, 63, 64, 65, 66, 67]
    assert drafter.peek(own, 2).tokens == [68, 60]


@pytest.mark.parametrize("auto", [False, True])
def test_a_draft_ends_at_the_first_end_of_generation_token(auto: bool) -> None:
    # The user's turn ends in 90 (end of turn), then the template's tokens and the reply; a reply
    # that restates the question copies up to the turn's end and never past it.
    end, question = 90, [10, 11, 12, 13, 14, 15, 16, 17, 18]
    prompt = [1, 2, *question, end, 91, 92, 93]
    reply = question[:6]
    drafter = NgramDrafter.for_auto(ends=(end,)) if auto else NgramDrafter(ends=(end,))
    drafter.start(prompt)
    assert drafter.peek([*prompt, *reply], 16).tokens == [16, 17, 18, end]
    # Without the end tokens known, the copy runs on into the template and the reply itself.
    plain = NgramDrafter.for_auto() if auto else NgramDrafter()
    plain.start(prompt)
    assert plain.peek([*prompt, *reply], 16).tokens[:6] == [16, 17, 18, end, 91, 92]


def _chars(text: str) -> list[int]:
    return [ord(c) for c in text]


@pytest.mark.parametrize("auto", [False, True])
def test_a_json_reply_copies_the_prompt_across_its_escaped_line_breaks(auto: bool) -> None:
    # A reply that puts the prompt's code in a JSON string writes `\n` where the code breaks its
    # lines: the context's own lookup matches back only to the last `\n`; the escaped text's
    # matches across them and drafts the copy's next lines as the JSON string holds them.
    code = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
    prompt = _chars(f"Put this in JSON:\n{code}")
    escaped = json_string_text(code)
    assert escaped is not None
    copied = escaped.index("h):\\n    return 2")
    reply = _chars('{"source": "' + escaped[:copied])
    make = NgramDrafter.for_auto if auto else NgramDrafter
    drafter = make(views=[PromptView(_chars(f"Put this in JSON:\\n{escaped}"), escaped=True)])
    drafter.start(prompt)
    match = drafter.peek([*prompt, *reply], 16)
    assert "".join(map(chr, match.tokens)) == escaped[copied : copied + 16]
    assert match.match_len > 8
    # Without it, the lookup copies the prompt's own line break, which a JSON string never holds.
    plain = make()
    plain.start(prompt)
    assert "\n" in "".join(map(chr, plain.peek([*prompt, *reply], 16).tokens))


def test_the_escaped_text_is_looked_up_once_the_reply_escapes_a_character() -> None:
    # With tools offered, most replies are prose or a call with no escapes: the escaped text (as
    # large as the prompt) is indexed only once the reply has written a backslash.
    code = 'x = "a"\ny = x * 2\nprint(y)\n'
    prompt = _chars(f"Run this with the tool.\n{code}")
    escaped = json_string_text(code)
    assert escaped is not None
    view = PromptView(_chars(f"Run this with the tool.\\n{escaped}"), escaped=True)
    drafter = NgramDrafter.for_auto(text=chr, views=[view])
    drafter.prepare(prompt)  # the prompt phase leaves it alone too
    call = _chars('{"name": "run", "arguments": {"code": "x = ')
    tokens = [*prompt, *call]
    for end in range(len(prompt) + 1, len(tokens) + 1):
        drafter.peek(tokens[:end], 8)
    assert drafter._views[0].index._indexed == 0
    # Its first escape: from then on the copy is drafted as the JSON string holds it.
    tokens += _chars('\\"a\\"\\ny = x')
    assert "".join(map(chr, drafter.peek(tokens, 8).tokens)) == " * 2\\npr"


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([], [], 0),
        ([1, 2, 3], [1, 2, 3, 4], 3),  # one extends the other: the usual case
        ([1, 2, 3, 4], [1, 2, 3], 3),
        ([1, 2, 3], (1, 2, 3, 4), 3),  # a list against a tuple compares by value
        ([1, 2, 9, 4], [1, 2, 3, 4], 2),
        ([7, 2, 3], [1, 2, 3], 0),
        ([1] * 1000 + [2], [1] * 1000 + [3], 1000),
        (list(range(1025)), [*range(517), -1, *range(518, 1025)], 517),
    ],
)
def test_common_prefix(a: list[int], b: list[int], expected: int) -> None:
    from localspec.engine.drafters.base import common_prefix

    assert common_prefix(a, b) == expected == common_prefix(b, a)


def _reply_peeks(drafter: NgramDrafter, prompt: list[int], reply: list[int]) -> list[tuple[list[int], int]]:
    tokens = list(prompt)
    out = []
    for token in reply:
        tokens.append(token)
        match = drafter.peek(tokens, 12)
        out.append((match.tokens, match.match_len))
    return out


def test_a_prepared_drafter_proposes_as_one_that_indexes_at_its_first_lookups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # prepare() does the prompt's work (its index, its other forms', the fence scan, earlier
    # requests' text) while the target reads the prompt; the reply's lookups then only add its own
    # tokens, one at a time, and propose what they proposed when they did it all themselves.
    rng = random.Random(7)
    prompt = [rng.randrange(40) for _ in range(400)]
    view = PromptView([t + 100 for t in prompt], escaped=False)
    reply = [*prompt[50:90], *(rng.randrange(40) for _ in range(20)), *prompt[200:240]]

    def drafter(memory: NgramMemory) -> NgramDrafter:
        return NgramDrafter.for_auto(memory, text=lambda t: "```\n" if t == 7 else "x", views=[view])

    earlier = [rng.randrange(40) for _ in range(300)] + prompt[300:380]
    lazy_memory, ready_memory = NgramMemory(), NgramMemory()
    for memory in (lazy_memory, ready_memory):
        memory.remember(earlier)
    lazy, ready = drafter(lazy_memory), drafter(ready_memory)
    lazy.start(prompt)
    ready.prepare(prompt)
    assert ready._memory is not None and ready._memory._index._indexed == ready_memory.size
    assert ready._cursor._fenced_to == len(prompt)  # the prompt's fences scanned
    # Nothing is indexed in bulk once the reply begins: every stretch was indexed before it.
    bulk = NgramIndex._index_bulk
    monkeypatch.setattr(NgramIndex, "_index_bulk", lambda *a: pytest.fail("indexed in bulk mid-reply"))
    prepared = _reply_peeks(ready, prompt, reply)
    monkeypatch.setattr(NgramIndex, "_index_bulk", bulk)
    assert prepared == _reply_peeks(lazy, prompt, reply)
    assert sum(bool(tokens) for tokens, _ in prepared) > len(reply) // 2
    assert ready.in_prose([*prompt, *reply]) == lazy.in_prose([*prompt, *reply])


def test_memory_indexes_what_it_remembered_when_asked() -> None:
    memory = NgramMemory(min_n=2, max_n=3)
    memory.remember([1, 2, 3, 4, 5, 6])
    assert memory._index._indexed == 0  # remembering only appends
    memory.index()
    assert memory._index._indexed == memory.size
    assert memory.lookup([9, 2, 3], 2).tokens == [4, 5]
