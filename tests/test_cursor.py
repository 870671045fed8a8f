"""The copy cursor: following a reply that copies earlier text through the edits it makes."""

from __future__ import annotations

from localspec.auto.costmodel import Curve
from localspec.auto.replay import Machine, Trace, replay
from localspec.engine.drafters.cursor import GIVE_UP, RESYNC, CopyCursor, TokenText
from localspec.engine.drafters.ngram import NgramDrafter
from localspec.engine.drafters.views import PromptView
from localspec.engine.speculative import FixedPolicy

LO, LOW, HI, HIGH = 900, 901, 902, 903


def source(n_lines: int = 12) -> list[int]:
    """Code-like tokens: every line mentions LO and HI between tokens of its own."""
    out: list[int] = []
    for line in range(n_lines):
        base = 10 * line + 100
        out += [base, LO, base + 1, base + 2, HI, base + 3, base + 4, 1]
    return out


def renamed(tokens: list[int]) -> list[int]:
    return [{LO: LOW, HI: HIGH}.get(t, t) for t in tokens]


def follow(
    prompt: list[int], reply: list[int], anchor: int = 0, text: TokenText | None = None
) -> tuple[CopyCursor, list[int]]:
    cursor = CopyCursor(text)
    cursor.start(len(prompt))
    cursor.anchor(anchor, 8)
    tokens = [*prompt, *reply]
    cursor.feed(tokens)
    return cursor, tokens


def texts(names: dict[int, str]) -> TokenText:
    """Tokens' text: `names` for the named ones, every other token another name."""
    return lambda token: names.get(token, f" t{token}")


def test_a_rename_made_twice_is_drafted_from_then_on() -> None:
    src = source()
    # The first line renamed, then the second line's first token.
    cursor, tokens = follow(src, [*renamed(src[:8]), src[8]])
    assert cursor.edits == {(LO,): (LOW,), (HI,): (HIGH,)}
    assert cursor.following
    # Made once: the second line is drafted as the lookup would, the old names copied.
    assert cursor.draft(tokens, 7) == src[9:16]
    # The reply renames the second line too: the third line is drafted renamed.
    cursor, tokens = follow(src, [*renamed(src[:16]), src[16]])
    assert cursor.confirmed == {(LO,), (HI,)}
    assert cursor.draft(tokens, 7) == renamed(src[17:24])


def test_an_edit_the_reply_does_not_repeat_is_not_drafted_and_the_copy_is_followed_through_it() -> None:
    src = source()
    # A one-off fix: LO becomes LOW on the first line only; the next lines copy LO unchanged.
    reply = [*renamed(src[:2]), *src[2:16]]
    cursor = CopyCursor()
    cursor.start(len(src))
    cursor.anchor(0, 8)
    for end in range(len(src) + 1, len(src) + len(reply) + 1):  # token by token, as a reply comes
        cursor.feed([*src, *reply][:end])
        if end >= len(src) + 2 + RESYNC:  # back on the copy after the fix, the edit learned
            assert cursor.following  # and never lost again at an old LO
    assert (LO,) not in cursor.confirmed
    assert cursor.draft([*src, *reply], 3) == src[16:19]


def test_a_rename_left_undone_once_is_drafted_again_once_the_reply_makes_it_again() -> None:
    src = source()
    # LO renamed on the first line, left as it was on the second (a model's slip), renamed on the
    # third and fourth: the cursor stays on the copy, and the fourth line's LO is drafted renamed
    # after the third confirmed it again.
    reply = [*renamed(src[:8]), *src[8:16], *renamed(src[16:24]), *renamed(src[24:25])]
    cursor, tokens = follow(src, reply)
    assert cursor.following and (LO,) in cursor.confirmed
    assert cursor.draft(tokens, 4) == renamed(src[25:29])


def test_a_confirmed_rename_left_undone_ends_drafts_where_it_applies_until_made_again() -> None:
    src = source()
    # Both names renamed on two lines (confirmed), left as they were on the third (a model's slip):
    # on the fourth line it may go either way, so the draft ends before each name, where the target
    # decides; renamed again, each name is drafted renamed again.
    slipped = [*renamed(src[:16]), *src[16:24], src[24]]
    cursor, tokens = follow(src, slipped)
    assert cursor.following and cursor.doubtful == {(LO,), (HI,)} and not cursor.confirmed
    assert cursor.draft(tokens, 7) == [] and cursor.held
    cursor, tokens = follow(src, [*slipped, LOW, src[26], src[27]])
    assert cursor.draft(tokens, 7) == [] and cursor.held  # HI next: still in doubt
    cursor, tokens = follow(src, [*slipped, *renamed(src[25:29])])
    assert cursor.draft(tokens, 10) == renamed(src[29:39]) and not cursor.held
    # A slip of an edit made only once (a one-off fix, test above) puts nothing in doubt.
    once, _ = follow(src, [*renamed(src[:8]), *src[8:16]])
    assert not once.doubtful


def test_the_ngram_drafter_drafts_nothing_at_a_rename_in_doubt() -> None:
    # The lookup alone would draft the old name there (the copy's next tokens): a verify lost at
    # its first token, and every position past it.
    header = list(range(50, 60))
    src = [*header, *source(6)]
    prompt = [7, 7, *src, 8]
    reply = [*header, *renamed(src[10:26]), *src[26:34], src[34]]
    drafter = NgramDrafter()
    drafter.start(prompt)
    tokens = [*prompt, *reply]
    for end in range(len(prompt) + 1, len(tokens) + 1):  # as the reply comes, token by token
        drafter.peek(tokens[:end], 8)
    assert src[35] == LO and drafter.peek(tokens, 8).tokens == []
    # Renamed there: followed on, up to HI, in doubt too.
    assert drafter.peek([*tokens, LOW], 8).tokens == src[36:38]


def test_a_renamed_name_in_another_token_form_ends_drafts_until_the_reply_writes_that_form() -> None:
    # ` lo` is renamed everywhere (confirmed); `(lo` is another token for the same name, which the
    # model renames too, as `(` + ` low` or otherwise: unseen, a draft would copy `(lo` and lose
    # every position past it. Knowing the tokens' text, the cursor ends the draft before it.
    plo, paren = 904, 905
    text = texts({LO: " lo", LOW: " low", HI: " hi", HIGH: " high", plo: "(lo", paren: "("})
    src = [*source(2), 300, plo, 301, 302, 1, 310, LO, 311, 312, 1]
    reply = [*renamed(src[:16]), 300]

    def drafted(reply: list[int], text: TokenText | None) -> tuple[list[int], bool]:
        cursor, tokens = follow(src, reply, 0, text)
        return cursor.draft(tokens, 8), cursor.held

    assert drafted(reply, None) == ([plo, 301, 302, 1, 310, LOW, 311, 312], False)  # blind to the text
    assert drafted(reply, text) == ([], True)
    # The reply wrote `(lo` as it was: that form is not renamed, drafts go through it from then on.
    # (Past the text's end the copy goes on into the reply itself.)
    assert drafted([*reply, plo, 301], text) == ([302, 1, 310, LOW, 311, 312, 1, reply[0]], False)
    # An edit made only once puts no other form in doubt.
    assert drafted([*renamed(src[:8]), src[8]], text) == (src[9:17], False)


def test_a_rename_made_once_in_fenced_code_ends_drafts_at_the_old_name_until_made_again() -> None:
    # In code a renamed name is mostly renamed everywhere: after the first line's renames, the old
    # name is where a draft copying it would likely lose every position past it. In prose a word
    # swapped once mostly is not swapped again, and the draft copies on, as before.
    fence, inline, nl = 906, 907, 1
    text = texts({LO: " lo", LOW: " low", HI: " hi", HIGH: " high", fence: "```", inline: " ```", nl: "\n"})
    src = source()
    reply = [*renamed(src[:10])]  # the first line's names renamed, and the second line's LO

    def drafted(prompt: list[int], text: TokenText | None) -> tuple[list[int], bool]:
        cursor, tokens = follow(prompt, reply, prompt.index(src[0]), text)
        assert (LO,) in cursor.confirmed  # made twice
        return cursor.draft(tokens, 7), cursor.held

    # "... in one ```python block:" then the code between fence lines.
    instruction = [60, inline, 61, nl]
    fenced = [*instruction, fence, 62, nl, *src, fence]
    assert drafted(fenced, text) == (src[10:12], True)  # LO renamed, HI (made once) held
    # Made once, HI is copied as it was (as the lookup would) in prose, after a ``` in a line (no
    # fence), and blind to the text.
    assert drafted(instruction + src, text) == (src[10:17], False)
    assert drafted([60, fence, 61, nl, *src], text) == (src[10:17], False)
    assert drafted(fenced, None) == (src[10:17], False)
    # Renamed a second time, HI is drafted renamed from then on.
    reply = [*renamed(src[:13])]
    assert drafted(fenced, text) == (renamed(src[13:20]), False)


def test_a_rename_in_code_the_reply_then_copies_the_old_name_of_twice_was_a_one_off() -> None:
    fence, nl = 906, 1
    text = texts({LO: " lo", LOW: " low", HI: " hi", fence: "```", nl: "\n"})
    src = source()
    prompt = [60, nl, fence, 62, nl, *src, fence]

    def drafted(reply: list[int]) -> tuple[list[int], bool]:
        cursor, tokens = follow(prompt, reply, prompt.index(src[0]), text)
        return cursor.draft(tokens, 7), cursor.held

    fixed = [src[0], LOW, *src[2:8]]  # LO renamed on the first line only: a fix, or the start of a rename
    assert drafted([*fixed, *src[8:17]]) == ([], True)  # copied once since: still in doubt at the next LO
    assert drafted([*fixed, *src[8:25]]) == (src[25:32], False)  # twice: a one-off, LO copied on


def test_the_reply_is_in_prose_outside_the_code_blocks_it_fences_whatever_the_prompt_left_open() -> None:
    fence, nl = 906, 1
    text = texts({fence: "```", nl: "\n"})
    prompt = [60, nl, fence, 62, nl, 63, 64, nl]  # a pasted file's opening fence, never closed
    reply = [70, 71, nl, fence, 72, nl, 73, 74, nl, fence, nl, 75]

    def in_prose(reply: list[int], text: TokenText | None = text, markdown: bool = True) -> list[bool]:
        drafter = NgramDrafter.for_auto(text=text, markdown=markdown)
        drafter.start(prompt)
        tokens = [*prompt, *reply]
        return [drafter.in_prose(tokens[:end]) for end in range(len(prompt) + 1, len(tokens) + 1)]

    # Prose, then from the opening fence to the closing one code, then prose again.
    assert in_prose(reply) == [True] * 3 + [False] * 6 + [True] * 3
    # Not told: no text, or a completion's raw text (not Markdown).
    assert in_prose(reply, text=None) == [False] * len(reply)
    assert in_prose(reply, markdown=False) == [False] * len(reply)
    # A tokenizer that splits the backticks: the fence is the line's, not a token's.
    tick, ticks, indent = 908, 909, 910
    split = texts({nl: "\n", tick: "`", ticks: "``", indent: "  "})
    reply = [70, nl, indent, tick, ticks, 72, nl, 73, tick, ticks, nl, tick, ticks, nl, 75]
    assert in_prose(reply, split) == [True] * 4 + [False] * 8 + [True] * 3  # "73```" is no fence


def test_a_drafter_started_after_it_followed_the_reply_keeps_what_it_learned() -> None:
    # auto peeks from the reply's first step; the engine starts the drafter at its first draft.
    src, header = source(), list(range(50, 60))
    prompt = [7, *header, *src, 8]
    tokens = [*prompt, *header, *renamed(src[:17])]
    drafter = NgramDrafter.for_auto()
    for end in range(len(prompt) + 1, len(tokens) + 1):
        drafter.peek(tokens[:end], 7)
    drafter.start(prompt)
    assert drafter.peek(tokens, 7).tokens == renamed(src[17:24])  # the renames made twice, applied


def test_the_copy_goes_on_where_the_cursor_is_when_the_lookup_matches_as_long_elsewhere() -> None:
    # Two functions with one signature: the reply renames LO in the first's, and past the rename
    # the last tokens match both. The lookup drafts the later function's body (its latest
    # occurrence); the cursor knows the reply is copying the first.
    header = list(range(50, 60))
    sig = [20, 21, LO, 22, HI, 23, 24]  # `(x, lo, hi):` and a line end, say
    first, second = [30, 31, 32, 33], [40, 41, 42, 43]
    prompt = [7, *header, 10, *sig, *first, 11, *sig, *second, 8]
    reply = [*header, 10, *[LOW if t == LO else t for t in sig]]
    drafter = NgramDrafter.for_auto()
    drafter.start(prompt)
    tokens = [*prompt, *reply]
    for end in range(len(prompt) + 1, len(tokens) + 1):
        match = drafter.peek(tokens[:end], 4)
    assert match.match_len == 4 and match.tokens == first


def test_a_short_match_elsewhere_while_the_reply_writes_an_edit_is_astray() -> None:
    # The reply leaves its copy to write a new name the instruction spells out: the name's last two
    # tokens match there, and the instruction's words follow. That match is astray; once the reply
    # copies on where it left, the match there is the copy's own again.
    header, src = list(range(50, 60)), source()
    new_name, words = [700, 701], list(range(800, 820))
    prompt = [7, *header, *src, 8, *words[:5], *new_name, *words[5:], 9]
    tokens = [*prompt, *header, *src[:9], *new_name]  # LO on the second line renamed
    drafter = NgramDrafter.for_auto()
    drafter.start(prompt)
    for end in range(len(prompt) + 1, len(tokens) + 1):
        match = drafter.peek(tokens[:end], 8)
    assert match.match_len == 2 and match.tokens == words[5:13] and match.astray
    tokens += src[10:12]  # back on the copy past the old name
    match = drafter.peek(tokens, 8)
    assert match.tokens[:4] == src[12:16] and not match.astray
    # While the reply follows its copy, nothing is astray.
    following = NgramDrafter.for_auto()
    following.start(prompt)
    tokens = [*prompt, *header, *src[:9]]
    assert not any(following.peek(tokens[:end], 8).astray for end in range(len(prompt) + 1, len(tokens) + 1))


def test_a_long_insertion_is_followed_past_but_not_learned() -> None:
    src = source()
    inserted = list(range(500, 520))  # a new docstring, say
    reply = [*src[:4], *inserted, *src[4 : 4 + RESYNC]]
    cursor, tokens = follow(src, reply)
    assert cursor.following and cursor.edits == {}
    assert cursor.draft(tokens, 4) == src[4 + RESYNC : 8 + RESYNC]


def test_a_deletion_is_learned_and_skipped() -> None:
    src = source()
    # Two lines and a half, HI dropped from each.
    cursor, tokens = follow(src, [t for t in src[:20] if t != HI])
    assert cursor.edits == {(HI,): ()} and cursor.confirmed == {(HI,)}
    # The third line's HI is skipped in the draft.
    assert cursor.draft(tokens, 4) == src[21:25]


def test_an_edit_into_several_tokens_is_drafted_whole() -> None:
    src = source()
    # LO becomes two tokens, on two lines.
    reply = [src[0], 42, 43, *src[2:9], 42, 43, *src[10:16], src[16]]
    cursor, tokens = follow(src, reply)
    assert cursor.edits == {(LO,): (42, 43)} and cursor.confirmed == {(LO,)}
    assert cursor.draft(tokens, 4) == [42, 43, src[18], src[19]]
    # Fed one token at a time, the reply writing the edit stays on the copy.
    cursor.feed([*tokens, 42])
    assert cursor.following and cursor.draft([*tokens, 42], 3) == [43, src[18], src[19]]


def test_a_reply_that_leaves_the_copy_is_let_go() -> None:
    src = source()
    cursor, _ = follow(src, [*src[:4], *range(2000, 2000 + GIVE_UP + RESYNC + 2)])
    assert cursor.pos is None and not cursor.following


def test_nothing_is_drafted_past_the_end_of_the_text() -> None:
    src = source(2)
    cursor, tokens = follow(src, src[:12], anchor=0)
    assert cursor.draft(tokens, 100) == src[12:] + src[:12]  # the reply itself is text to copy


def test_the_ngram_drafter_drafts_renamed_names_the_lookup_alone_cannot() -> None:
    """A whole-file rename replayed with a fixed n-gram method: most of it is drafted and accepted.

    Between two renamed names there are at most four tokens, too few for a 5-token lookup to match
    again: without the cursor every step after the header would decode a single token.
    """
    header = list(range(50, 60))  # the file's first lines, copied unchanged: the lookup anchors there
    src = [*header, *source(40)]
    prompt = [7, 7, *src, 8]
    trace = Trace("rename", tuple(prompt), tuple(renamed(src)))
    flat = Curve(tuple(0.01 * (1 + 0.02 * n) for n in range(1, 17)))
    result = replay(trace, FixedPolicy(NgramDrafter(), 8), Machine(flat), charge_policy=False)
    assert result.accepted >= 0.8 * len(trace.output)
    assert result.steps < 0.25 * len(trace.output)


def test_a_json_copy_s_renames_are_learned_and_drafted_through_its_escaped_line_breaks() -> None:
    # The reply copies the source inside a JSON string, renaming LO and HI: its line breaks are the
    # escaped text's (2, for `\n`), not the prompt's (1). The escaped text has its own copy cursor,
    # which learns the renames there and drafts the next line renamed, escaped line break included.
    header = list(range(50, 60))
    src = [*header, *source(6)]
    escaped = [2 if t == 1 else t for t in src]
    prompt = [7, 7, *src, 8]
    reply = [5, 6, *header, *renamed(escaped[10:26]), escaped[26]]
    drafter = NgramDrafter(views=[PromptView([7, 7, *escaped, 8], escaped=True)])
    drafter.start(prompt)
    tokens = [*prompt, *reply]
    for end in range(len(prompt) + 1, len(tokens) + 1):  # as the reply comes, token by token
        drafter.peek(tokens[:end], 8)
    assert drafter.peek(tokens, 7).tokens == renamed(escaped[27:34])
    # The context's own lookup alone copies the old names, up to the prompt's own line break.
    plain = NgramDrafter()
    plain.start(prompt)
    for end in range(len(prompt) + 1, len(tokens) + 1):
        plain.peek(tokens[:end], 8)
    assert plain.peek(tokens, 7).tokens != renamed(escaped[27:34])


def test_a_copy_left_for_another_place_counts_as_ended_and_an_edit_come_back_from_does_not() -> None:
    src = source()
    # A rename on every line: the reply leaves the copy at each, and comes back to it.
    cursor, _ = follow(src, renamed(src[:40]))
    assert cursor.following and cursor.ended == 0
    # Away from the copy (new tokens), then anchored elsewhere by a lookup: that copy ended.
    cursor, _ = follow(src, [*src[:12], 700, 701, 702])
    assert not cursor.following and cursor.ended == 0
    cursor.anchor(40, 5)
    assert cursor.ended == 1
    # Re-anchored while following (a longer match elsewhere): nothing was left.
    cursor.anchor(60, 6)
    assert cursor.ended == 1
