"""UTF-8 safe streaming and stop strings."""

from __future__ import annotations

from localspec.engine.textstream import TextStream


def test_multibyte_characters_are_never_split() -> None:
    stream = TextStream()
    data = "héllo 世界".encode()
    out = [stream.push(data[i : i + 1]) for i in range(len(data))]
    assert "".join(out) + stream.finish() == "héllo 世界"
    assert all(o.encode("utf-8").decode("utf-8") == o for o in out)
    assert "\ufffd" not in "".join(out)


def test_stop_string_cuts_text_even_across_pieces() -> None:
    stream = TextStream(stop=["</end>"])
    out = "".join(stream.push(p.encode()) for p in ["abc</", "en", "d>tail"])
    assert out == "abc"
    assert stream.stopped
    assert stream.push(b"more") == "" and stream.finish() == ""


def test_text_that_only_looks_like_a_stop_prefix_is_released() -> None:
    stream = TextStream(stop=["STOP"])
    assert stream.push(b"ab ST") == "ab "
    assert stream.push(b"ART") == "START"
    assert stream.finish() == ""
    assert stream.text == "ab START"


def test_earliest_stop_string_wins() -> None:
    stream = TextStream(stop=["xyz", "b"])
    assert stream.push(b"abcxyz") == "a"


def test_incomplete_character_at_the_end_becomes_a_replacement() -> None:
    stream = TextStream()
    assert stream.push("é".encode()[:1]) == ""
    assert stream.finish() == "\ufffd"
