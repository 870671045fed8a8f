"""Prompt-lookup drafting over plain token lists."""

from __future__ import annotations

import pytest

from localspec.engine.drafters.ngram import NgramIndex


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


def test_continuation_is_cut_at_the_end_of_the_context() -> None:
    index = NgramIndex(min_n=2, max_n=2)
    index.extend([5, 6, 5, 6])
    assert index.propose(8).tokens == [5, 6]


def test_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        NgramIndex(min_n=3, max_n=2)
