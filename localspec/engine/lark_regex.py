"""A Lark grammar with no recursion as one regular expression, for a grammar held inside a JSON string.

OpenAI's custom tools (the Responses API's `{"type": "custom", "format": {"type": "grammar",
"syntax": "lark"}}`, Codex's apply_patch among them) give the tool's input as a Lark grammar. A
model served here writes its calls as JSON, so that input is a JSON string: escaped (`\\n`, `\\"`),
where the grammar describes the text unescaped. llguidance holds a JSON string to a regular
expression over its unescaped text (a schema's `pattern`) but has no way to put a Lark grammar
there. Tool grammars are almost always regular (lines of a patch, a command, a date): with every
rule inlined into the one that names it, the grammar is one regular expression, and the call's
schema carries it as the input's pattern. A grammar that refers to itself is not regular: refused,
as are the Lark features a regular expression cannot carry (`%ignore`, llguidance's `%json`, its
special tokens and `&`/`~` operators).

The subset read: rules and terminals (`name: ...`, `NAME: ...`, `?name`, `!name`, `name.2`),
alternatives over several lines (`| ...`), strings (`"..."`, `"..."i`), string ranges (`"a".."z"`),
regular expressions (`/.../flags`), groups, `[optional]`, `? * +`, `~ n`, `~ n..m`, `{n}`,
`{n,m}`, aliases (`-> name`, dropped: they name tree nodes), comments (`//`, `#`),
`%import common.NAME` (lark's common.lark, below) and `%llguidance {...}` (ignored).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from localspec.errors import UserInputError

START = "start"
# lark's own common.lark, the terminals grammars import (`%import common.LF`), in the subset read
# here; ESCAPED_STRING without its lookbehind, which llguidance's regular expressions lack.
COMMON = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+"|"-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e"|"E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+"|"-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+"|"-"] NUMBER
ESCAPED_STRING: /"([^"\\\n]|\\.)*"/
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_"|LETTER) ("_"|LETTER|DIGIT)*
WS_INLINE: (" "|/\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: "/*" /(.|\n)*?/ "*/"
SQL_COMMENT: /--[^\n]*/
"""

_TOKEN = re.compile(
    r"""
    (?P<newline>\n)
  | (?P<space>[ \t\r]+)
  | (?P<comment>(//|\#)[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regex>/(?!/)(?:\\.|[^/\\\n])+/[imsux]*)
  | (?P<directive>%[a-z_]+)
  | (?P<arrow>->)
  | (?P<range>\.\.)
  | (?P<number>\d+)
  | (?P<name>[A-Za-z_](?:\w|-(?=\w))*(?:\.-?\d+)?)
  | (?P<special><[^<>\s]+>)
  | (?P<op>[:|()\[\]?*+~{},.!&])
  | (?P<other>.)
    """,
    re.VERBOSE,
)
_UNSUPPORTED = {
    "%ignore": "%ignore (whitespace skipped between tokens) cannot be held inside a JSON string",
    "%json": "%json cannot be nested inside a tool's input",
    "%regex": "%regex is not supported in a tool's grammar",
    "%declare": "%declare is not supported in a tool's grammar",
    "%override": "%override is not supported in a tool's grammar",
    "%extend": "%extend is not supported in a tool's grammar",
}


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    line: int


class _Grammar:
    """Definitions by name, each the regular expression of its body once every name in it is inlined."""

    def __init__(self, bodies: Mapping[str, list[_Tok]], param: str) -> None:
        self._bodies = bodies
        self._param = param
        self._done: dict[str, str] = {}
        self._open: list[str] = []

    def fail(self, message: str) -> UserInputError:
        return _fail(self._param, message)

    def regex(self, name: str) -> str:
        if name in self._done:
            return self._done[name]
        if name in self._open:
            cycle = " -> ".join([*self._open[self._open.index(name) :], name])
            raise self.fail(
                f"the grammar is recursive ({cycle}); a tool's input written inside a JSON call can "
                "be held to a grammar a regular expression can express, with no rule that refers to itself"
            )
        if name not in self._bodies:
            raise self.fail(f"the grammar uses {name!r} but does not define it")
        self._open.append(name)
        body = _Parser(self, self._bodies[name])
        out = body.expansions()
        body.end()
        self._open.pop()
        self._done[name] = out
        return out


class _Parser:
    """One definition's body, read into a regular expression as it goes."""

    def __init__(self, grammar: _Grammar, tokens: list[_Tok]) -> None:
        self._g = grammar
        self._toks = tokens
        self._at = 0

    def _peek(self) -> _Tok | None:
        return self._toks[self._at] if self._at < len(self._toks) else None

    def _take(self) -> _Tok:
        tok = self._peek()
        if tok is None:
            raise self._g.fail("the grammar ends in the middle of a rule")
        self._at += 1
        return tok

    def _expect(self, text: str) -> None:
        tok = self._take()
        if tok.text != text:
            raise self._g.fail(f"line {tok.line}: expected {text!r}, found {tok.text!r}")

    def end(self) -> None:
        tok = self._peek()
        if tok is not None:
            raise self._g.fail(f"line {tok.line}: unexpected {tok.text!r}")

    def expansions(self) -> str:
        alternatives = [self._alias_expansion()]
        while (tok := self._peek()) is not None and tok.text == "|":
            self._take()
            alternatives.append(self._alias_expansion())
        return alternatives[0] if len(alternatives) == 1 else "(?:" + "|".join(alternatives) + ")"

    def _alias_expansion(self) -> str:
        out = self._expansion()
        if (tok := self._peek()) is not None and tok.kind == "arrow":
            self._take()
            if self._take().kind != "name":
                raise self._g.fail(f"line {tok.line}: an alias (->) needs a name")
        return out

    def _expansion(self) -> str:
        parts: list[str] = []
        while (tok := self._peek()) is not None and tok.text not in ("|", ")", "]") and tok.kind != "arrow":
            parts.append(self._expr())
        return "".join(parts)

    def _expr(self) -> str:
        atom = self._atom()
        tok = self._peek()
        if tok is None:
            return atom
        if tok.text in ("?", "*", "+"):
            self._take()
            return f"(?:{atom}){tok.text}"
        if tok.text == "~":
            self._take()
            return f"(?:{atom}){{{self._tilde_bounds()}}}"
        if tok.text == "{":
            self._take()
            return f"(?:{atom}){{{self._brace_bounds()}}}"
        return atom

    def _tilde_bounds(self) -> str:
        """`~ n` (n times) or `~ n..m`, as a regular expression's bounds."""
        low = self._number()
        if self._peek_kind() != "range":
            return f"{low},{low}"
        self._take()
        return f"{low},{self._number()}"

    def _brace_bounds(self) -> str:
        """llguidance's `{n}`, `{n,}`, `{,m}`, `{n,m}` (after the `{`), as a regular expression's."""
        low = self._number() if self._peek_kind() == "number" else ""
        if self._peek_text() != ",":
            self._expect("}")
            return low
        self._take()
        high = self._number() if self._peek_kind() == "number" else ""
        self._expect("}")
        return f"{low or 0},{high}"

    def _peek_kind(self) -> str | None:
        tok = self._peek()
        return tok.kind if tok is not None else None

    def _peek_text(self) -> str | None:
        tok = self._peek()
        return tok.text if tok is not None else None

    def _number(self) -> str:
        tok = self._take()
        if tok.kind != "number":
            raise self._g.fail(f"line {tok.line}: expected a number, found {tok.text!r}")
        return tok.text

    def _atom(self) -> str:
        tok = self._take()
        if tok.text in ("(", "["):
            inner = self.expansions()
            self._expect(")" if tok.text == "(" else "]")
            return f"(?:{inner})" if tok.text == "(" else f"(?:{inner})?"
        if tok.kind == "string":
            text, fold = _string(tok)
            if self._peek_kind() == "range":
                self._take()
                end = self._take()
                last, _ = _string(end) if end.kind == "string" else ("", False)
                if len(text) != 1 or len(last) != 1:
                    raise self._g.fail(f"line {tok.line}: a range (..) goes from one character to another")
                return f"[{_in_class(text)}-{_in_class(last)}]"
            literal = "".join(_literal(c) for c in text)
            return f"(?i:{literal})" if fold else literal
        if tok.kind == "regex":
            pattern, flags = tok.text[1:].rsplit("/", 1)
            flags = flags.replace("u", "").replace("l", "")
            return f"(?{flags}:{pattern})" if flags else f"(?:{pattern})"
        if tok.kind == "name":
            return self._g.regex(tok.text)
        if tok.kind == "raw":
            return f"(?:{tok.text})"
        if tok.kind == "directive":
            raise self._g.fail(f"line {tok.line}: {_unsupported(tok.text)}")
        if tok.kind == "special" or tok.text == "&":
            raise self._g.fail(
                f"line {tok.line}: {tok.text!r} (llguidance's special tokens and operators) is not "
                "supported in a tool's grammar"
            )
        raise self._g.fail(f"line {tok.line}: unexpected {tok.text!r}")


def _string(tok: _Tok) -> tuple[str, bool]:
    fold = tok.text.endswith("i")
    body = tok.text[:-1] if fold else tok.text
    return ast.literal_eval(body), fold


# What a regular expression gives a meaning to outside a class, and inside one.
_META = set("\\.+*?()|[]{}^$#&-~")
_CLASS_META = set("\\]^-[&~")


def _literal(c: str) -> str:
    return _escaped(c, _META)


def _in_class(c: str) -> str:
    return _escaped(c, _CLASS_META)


def _escaped(c: str, meta: set[str]) -> str:
    if c in meta:
        return "\\" + c
    return c if c.isprintable() else f"\\x{{{ord(c):x}}}"


def _fail(param: str, message: str) -> UserInputError:
    return UserInputError(f"{param}: {message}", param=param)


def _unsupported(directive: str) -> str:
    return _UNSUPPORTED.get(directive, f"{directive} is not supported")


def _tokens(text: str, param: str) -> Iterator[_Tok]:
    line = 1
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup or "other"
        value = match.group()
        if kind == "newline":
            yield _Tok("newline", value, line)
            line += 1
        elif kind == "other":
            raise _fail(param, f"line {line}: unexpected {value!r} in the grammar")
        elif kind not in ("space", "comment"):
            yield _Tok(kind, value, line)


def _statements(tokens: list[_Tok]) -> Iterator[list[_Tok]]:
    """The grammar's statements: a line and the lines after it that go on with `|`, or that are
    inside brackets it opened."""
    current: list[_Tok] = []
    depth = 0
    for i, tok in enumerate(tokens):
        if tok.kind == "newline":
            if depth == 0 and not _goes_on(tokens, i + 1):
                if current:
                    yield current
                current = []
            continue
        if tok.text in ("(", "[", "{"):
            depth += 1
        elif tok.text in (")", "]", "}"):
            depth = max(0, depth - 1)
        current.append(tok)
    if current:
        yield current


def _goes_on(tokens: list[_Tok], at: int) -> bool:
    """Whether the first token from `at` past blank lines is `|` (the statement goes on)."""
    while at < len(tokens) and tokens[at].kind == "newline":
        at += 1
    return at < len(tokens) and tokens[at].text == "|"


def _definitions(text: str, param: str, bodies: dict[str, list[_Tok]]) -> None:
    for statement in _statements(list(_tokens(text, param))):
        if len(statement) > 1 and statement[0].text in ("?", "!") and statement[1].kind == "name":
            statement = statement[1:]  # ?rule (inlined in the tree) and !rule (keeps its tokens)
        head = statement[0]
        if head.kind == "directive":
            _directive(head, statement[1:], param, bodies)
            continue
        if head.kind != "name" or len(statement) < 2 or statement[1].text != ":":
            raise _fail(param, f"line {head.line}: expected a definition (`name: ...`), found {head.text!r}")
        name = head.text.split(".")[0]
        if name in bodies:
            raise _fail(param, f"line {head.line}: {name!r} is defined twice")
        bodies[name] = statement[2:]


def _directive(head: _Tok, rest: list[_Tok], param: str, bodies: dict[str, list[_Tok]]) -> None:
    if head.text == "%llguidance":  # options for llguidance's own parser: nothing to hold here
        return
    if head.text != "%import":
        raise _fail(param, f"line {head.line}: {_unsupported(head.text)}")
    names = _imported(rest)
    if names is None:
        raise _fail(
            param,
            f"line {head.line}: only lark's common terminals can be imported "
            "(`%import common.LF`, `%import common (LF, WS)`)",
        )
    common: dict[str, list[_Tok]] = {}
    _definitions(COMMON, param, common)
    resolved = _Grammar(common, param)  # common's own names stay its own, as lark keeps them apart
    for name, alias in names:
        if name not in common:
            raise _fail(param, f"line {head.line}: common has no {name!r}")
        bodies[alias] = [_Tok("raw", resolved.regex(name), head.line)]


_IMPORT = re.compile(r"common\.(\w+)(?:->(\w+))?|common\(((?:\w+,)*\w+)\)")


def _imported(rest: list[_Tok]) -> list[tuple[str, str]] | None:
    """`common.NAME [-> ALIAS]` or `common (A, B)`: (name, the name it goes by) each."""
    match = _IMPORT.fullmatch("".join(t.text for t in rest))
    if match is None:
        return None
    if match.group(1):
        return [(match.group(1), match.group(2) or match.group(1))]
    return [(n, n) for n in match.group(3).split(",")]


def lark_regex(definition: str, param: str) -> str:
    """The regular expression of the Lark grammar `definition` (its `start` rule), anchored at both
    ends; UserInputError naming `param` where it is not regular or uses what cannot be carried."""
    bodies: dict[str, list[_Tok]] = {}
    _definitions(definition, param, bodies)
    if START not in bodies:
        raise _fail(param, "the grammar has no `start` rule")
    return f"^(?:{_Grammar(bodies, param).regex(START)})$"
