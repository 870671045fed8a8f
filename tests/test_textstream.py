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


def test_stream_says_which_stop_string_ended_it() -> None:
    stream = TextStream(stop=["xyz", "b"])
    stream.push(b"aaxyzb")
    assert stream.matched == "xyz"
    assert TextStream(stop=["q"]).matched is None


def _pieces(stream: TextStream, pieces: list[str]) -> list[str]:
    return [stream.push(p.encode()) for p in pieces]


def test_min_indent_ends_before_a_line_indented_less() -> None:
    # llama-server's n_indent: the first line is free; each later one must keep the indentation.
    # The line indented less is dropped whole (llama-server keeps its leading whitespace).
    stream = TextStream(min_indent=4)
    out = _pieces(stream, ["x = 1", "\n", "    ", "    y = 2\n", "  ", "z", " = 3\n"])
    assert out == ["x = 1", "\n", "", "        y = 2\n", "", "", ""]
    assert stream.stopped and stream.text == "x = 1\n        y = 2\n" and stream.matched is None
    assert stream.push(b"more") == ""


def test_min_indent_holds_a_new_line_until_its_indentation_shows() -> None:
    stream = TextStream(min_indent=2)
    assert _pieces(stream, ["a\n", " ", " ", "b"]) == ["a\n", "", "", "  b"]
    assert stream.finish() == "" and not stream.stopped
    tabs = TextStream(min_indent=1)
    assert _pieces(tabs, ["a\n\tb\n\n"]) == ["a\n\tb\n"]  # an empty line is indented by 0
    assert tabs.stopped


def test_min_indent_with_stop_strings_the_earlier_cut_wins() -> None:
    stream = TextStream(stop=["END"], min_indent=4)
    assert _pieces(stream, ["a\n    b END\nc"]) == ["a\n    b "]
    assert stream.matched == "END"
    other = TextStream(stop=["END"], min_indent=4)
    assert _pieces(other, ["a\nc END"]) == ["a\n"]
    assert other.stopped and other.matched is None
    final = TextStream(min_indent=4)
    assert _pieces(final, ["a\n  "]) == ["a\n"] and final.finish() == "  "
