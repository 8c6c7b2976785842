"""The ``where`` grammar: how a person says which runs they mean, read the same way by
the server (``GET /api/runs?where=``), the CLI (``troupe ls --where``) and the Python
client, so a mistake is said with the same offset wherever it is typed.

    adam.lr = 0.01 and metric.val_loss < 0.1
    (type = 'torch.TrainingLoop' or tag in ('best', 'keep')) and created >= '2026-01-05'

    expr   := and ("or" and)*
    and    := atom ("and" atom)*
    atom   := "(" expr ")" | KEY OP VALUE | KEY "in" "(" VALUE ("," VALUE)* ")"
    OP     := = | != | < | <= | > | >= | ~
    VALUE  := a number | true | false | 'text' | "text"   (\\ escapes a quote or itself)
    KEY    := PART ("." PART)*, PART: letters, digits and _ : / -, or `any text`

A key is a fixed word (``type status tag name by sweep study created``), ``metric.SERIES``
(its newest value), ``metric.SERIES.best`` (its best, by the series' direction),
``params.NAME`` (a param the run's script logged itself, MLflow's ``log_param``, as
MLflow's own filters name it), or a param as ``--set`` names it (``NODE.PARAM``,
``NODE.vars.NAME``). The words and, or, in, true and false are read in any case. Parsing
knows nothing of a database: whether a param or a series exists is the store's to say
(``WhereUnknownKey``).

Hand-written (a recursive descent over the text), so each fault has one offset and one
list of what could have stood there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from troupe.protocol.errors import WhereInvalid, WhereUnknownKey
from troupe.protocol.events import ALL_STATES

# Characters; a longer filter is refused, never cut short. Bounded so that a request line
# with the list's other parameters at their own bounds, every character percent-encoded
# (12 bytes for one of 4 UTF-8 bytes), stays under the 8,190 bytes a server reads of it.
MAX_WHERE = 300
MAX_KEY = 120  # a key alone (group_by)
MAX_DEPTH = 32  # parentheses within parentheses
MAX_IN = 200  # values in one ``in (...)``

OPS = ("=", "!=", "<", "<=", ">", ">=", "~")
FIXED = ("type", "status", "tag", "name", "by", "sweep", "study", "created")
# What each key kind takes: the operators, and whether a value is text or a number.
TEXT_OPS = ("=", "!=", "~", "in")
_NUMBER_OPS = ("=", "!=", "<", "<=", ">", ">=", "in")
_KIND_OPS = {
    "param": (*OPS, "in"), "logged": (*OPS, "in"), "metric": _NUMBER_OPS, "best": _NUMBER_OPS,
    "type": TEXT_OPS, "status": ("=", "!=", "in"), "tag": TEXT_OPS, "name": TEXT_OPS, "by": TEXT_OPS,
    "sweep": ("=", "!=", "in"), "study": ("=", "!=", "in"), "created": ("=", "!=", "<", "<=", ">", ">="),
}
_NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_BARE = re.compile(r"[A-Za-z0-9_:/\-]+")
_WORD_END = re.compile(r"[A-Za-z0-9_.:/\-`]")

Value = bool | int | float | str


@dataclass(frozen=True)
class Key:
    """``kind``: param, logged (a script's own ``params.NAME``), metric (newest), best, or
    one of ``FIXED``; ``name``: the param as ``node.param``, the logged param's name or
    the series (empty for a fixed key); ``text``: as written."""

    kind: str
    name: str
    text: str
    offset: int


@dataclass(frozen=True)
class Cond:
    """``KEY OP VALUE``; ``in`` has several values. A ``created`` value is a time span
    (``Span``)."""

    key: Key
    op: str
    values: tuple[Value | Span, ...]
    offset: int


@dataclass(frozen=True)
class Span:
    """A ``created`` value: from ``start`` (included) to ``end`` (excluded), both in the
    store's timestamp format. A date is its whole day (UTC); a time is its instant."""

    start: str
    end: str


@dataclass(frozen=True)
class Junction:
    """``and`` / ``or`` of two or more parts."""

    op: str
    parts: tuple[Node, ...]


Node = Cond | Junction


def parse(text: str) -> Node:
    """The expression's tree, or ``WhereInvalid`` (``WhereUnknownKey``) with the offset
    of the fault and what was expected there."""
    if len(text) > MAX_WHERE:
        raise WhereInvalid(f"where is at most {MAX_WHERE} characters, got {len(text)}", offset=MAX_WHERE,
                           expected=("a shorter expression",))
    parser = _Parser(text)
    node = parser.expr(0)
    parser.skip()
    if parser.pos < len(text):
        parser.fail(("and", "or", "the end") if parser.depth == 0 else ("and", "or", ")"))
    return node


def keys_of(node: Node) -> list[Key]:
    """Every key the expression names, in order."""
    if isinstance(node, Cond):
        return [node.key]
    return [key for part in node.parts for key in keys_of(part)]


def key_of(text: str, offset: int = 0) -> Key:
    """One key alone (``group_by``), read as the grammar reads a key."""
    if len(text) > MAX_KEY:
        raise WhereInvalid(f"a key is at most {MAX_KEY} characters, got {len(text)}", offset=MAX_KEY + offset,
                           expected=("a shorter key",))
    parser = _Parser(text)
    parser.skip()
    key = parser.key()
    parser.skip()
    if parser.pos < len(text):
        parser.fail(("the end of the key",))
    return Key(key.kind, key.name, key.text, key.offset + offset)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.depth = 0

    def fail(self, expected: tuple[str, ...], what: str | None = None) -> None:
        found = self.text[self.pos:self.pos + 12]
        said = f"{found!r}" if found else "the end"
        raise WhereInvalid(what or f"at offset {self.pos}: expected {' or '.join(expected)}, found {said}",
                           offset=self.pos, expected=expected)

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def word(self, word: str) -> bool:
        """Whether ``word`` (a keyword, any case) comes next as a whole word; takes it."""
        self.skip()
        end = self.pos + len(word)
        if self.text[self.pos:end].lower() == word and not (end < len(self.text) and
                                                            _WORD_END.match(self.text[end])):
            self.pos = end
            return True
        return False

    def expr(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            self.fail(("fewer parentheses",), f"at offset {self.pos}: parentheses nest deeper than {MAX_DEPTH}")
        parts = [self.conjunction(depth)]
        while self.word("or"):
            parts.append(self.conjunction(depth))
        return parts[0] if len(parts) == 1 else Junction("or", tuple(parts))

    def conjunction(self, depth: int) -> Node:
        parts = [self.atom(depth)]
        while self.word("and"):
            parts.append(self.atom(depth))
        return parts[0] if len(parts) == 1 else Junction("and", tuple(parts))

    def atom(self, depth: int) -> Node:
        self.skip()
        if self.text.startswith("(", self.pos):
            self.pos += 1
            self.depth += 1
            node = self.expr(depth + 1)
            self.skip()
            if not self.text.startswith(")", self.pos):
                self.fail(("and", "or", ")"))
            self.pos += 1
            self.depth -= 1
            return node
        start = self.pos
        key = self.key()
        op = self.operator(key)
        values = self.values(key, op)
        return Cond(key, op, values, start)

    def key(self) -> Key:
        start = self.pos
        parts: list[tuple[str, bool]] = []  # each part, and whether it was quoted
        while True:
            if self.text.startswith("`", self.pos):
                end = self.text.find("`", self.pos + 1)
                if end < 0:
                    self.fail(("a closing `",))
                if end == self.pos + 1:
                    self.fail(("a name between the backquotes",))
                parts.append((self.text[self.pos + 1:end], True))
                self.pos = end + 1
            else:
                found = _BARE.match(self.text, self.pos)
                if not found:
                    self.fail(("a key (NODE.PARAM, metric.SERIES, " + ", ".join(FIXED) + ")",) if not parts
                              else ("a name after the dot",))
                    raise AssertionError  # fail() raised
                parts.append((found.group(), False))
                self.pos = found.end()
            if not self.text.startswith(".", self.pos):
                break
            self.pos += 1
        return _classify(parts, self.text[start:self.pos], start)

    def operator(self, key: Key) -> str:
        self.skip()
        at = self.pos
        op = next((o for o in ("!=", "<=", ">=", "=", "<", ">", "~") if self.text.startswith(o, self.pos)), None)
        if op is not None:
            self.pos += len(op)
        elif self.word("in"):
            op = "in"
        else:
            self.fail(("an operator (= != < <= > >= ~ in)",))
            raise AssertionError
        if op not in _KIND_OPS[key.kind]:
            self.pos = at
            self.fail(_KIND_OPS[key.kind], f"at offset {at}: {key.text} takes {' '.join(_KIND_OPS[key.kind])}, "
                                           f"not {op}")
        return op

    def values(self, key: Key, op: str) -> tuple[Value | Span, ...]:
        if op != "in":
            return (self.value(key, op),)
        self.skip()
        if not self.text.startswith("(", self.pos):
            self.fail(("( after in",))
        self.pos += 1
        found = [self.value(key, op)]
        while True:
            self.skip()
            if self.text.startswith(")", self.pos):
                self.pos += 1
                return tuple(found)
            if not self.text.startswith(",", self.pos):
                self.fail((",", ")"))
            self.pos += 1
            if len(found) >= MAX_IN:
                self.fail((")",), f"at offset {self.pos}: in takes at most {MAX_IN} values")
            found.append(self.value(key, op))

    def value(self, key: Key, op: str) -> Value | Span:
        self.skip()
        at = self.pos
        value = self.literal()
        if key.kind in ("metric", "best") and isinstance(value, str | bool):
            self.pos = at
            self.fail(("a number",), f"at offset {at}: {key.text} is a number; compare it with one")
        if key.kind in FIXED and key.kind != "created" and not isinstance(value, str):
            self.pos = at
            self.fail(("a quoted text",), f"at offset {at}: {key.text} is text; quote the value ('...')")
        if key.kind == "status" and value not in ALL_STATES:
            self.pos = at
            self.fail(tuple(sorted(ALL_STATES)), f"at offset {at}: status is one of {', '.join(sorted(ALL_STATES))}")
        if key.kind == "created":
            span = _span(value)
            if span is None:
                self.pos = at
                self.fail(("an ISO date or time ('2026-01-05', '2026-01-05T10:30:00Z')",))
                raise AssertionError
            return span
        if op == "~" and not isinstance(value, str):
            self.pos = at
            self.fail(("a quoted text",), f"at offset {at}: ~ looks for text in text; quote it ('...')")
        return value

    def literal(self) -> Value:
        text, at = self.text, self.pos
        if at < len(text) and text[at] in "'\"":
            quote, out, i = text[at], [], at + 1
            while i < len(text) and text[i] != quote:
                if text[i] == "\\" and i + 1 < len(text):
                    i += 1
                out.append(text[i])
                i += 1
            if i >= len(text):
                self.fail((f"a closing {quote}",), f"at offset {at}: the text that starts here has no closing {quote}")
            self.pos = i + 1
            return "".join(out)
        number = _NUMBER.match(text, at)
        if number and not (number.end() < len(text) and _WORD_END.match(text[number.end()])):
            self.pos = number.end()
            body = number.group()
            return int(body) if re.fullmatch(r"-?[0-9]+", body) and len(body) <= 18 else float(body)
        for word, meaning in (("true", True), ("false", False)):
            if self.word(word):
                return meaning
        bare = _BARE.match(text, at)
        hint = f"; quote text: '{bare.group()}'" if bare else ""
        self.fail(("a number", "true", "false", "a quoted text"),
                  f"at offset {at}: expected a number, true, false or a quoted text{hint}")
        raise AssertionError


def _classify(parts: list[tuple[str, bool]], text: str, offset: int) -> Key:
    (first, quoted) = parts[0]
    if len(parts) == 1 and not quoted and first.lower() in FIXED:
        return Key(first.lower(), "", text, offset)
    if not quoted and first == "metric":
        if len(parts) == 2:
            return Key("metric", parts[1][0], text, offset)
        if len(parts) == 3 and parts[2] == ("best", False):
            return Key("best", parts[1][0], text, offset)
        raise WhereUnknownKey(f"at offset {offset}: {text} is no key: a metric is metric.SERIES or "
                              "metric.SERIES.best (`...` quotes a series' name)", offset=offset, key=text)
    if not quoted and first == "params":
        if len(parts) >= 2:  # MLflow names may hold dots: params.optim.lr
            return Key("logged", ".".join(part for part, _ in parts[1:]), text, offset)
        raise WhereUnknownKey(f"at offset {offset}: {text} is no key: a param the script logged is params.NAME "
                              "(`...` quotes a name)", offset=offset, key=text)
    if len(parts) == 1 and quoted:  # a whole param as `node id.param`
        return Key("param", first, text, offset)
    if len(parts) == 1:
        raise WhereUnknownKey(f"at offset {offset}: {text} is no key: a key is NODE.PARAM, NODE.vars.NAME, "
                              f"metric.SERIES, metric.SERIES.best, params.NAME or one of {', '.join(FIXED)}",
                              offset=offset, key=text)
    return Key("param", ".".join(part for part, _ in parts), text, offset)


def key_text(kind: str, name: str) -> str:
    """A key as this grammar reads it back: ``adam.lr``, ``metric.val_loss.best``, with
    backquotes round a name that is not letters, digits and _:/- (a param's parts
    between its dots)."""
    series = name if _BARE.fullmatch(name) else f"`{name}`"
    if kind in ("metric", "best"):
        return f"metric.{series}" + (".best" if kind == "best" else "")
    if kind == "logged":
        return "params." + (name if all(_BARE.fullmatch(piece) for piece in name.split(".")) else f"`{name}`")
    if kind == "param":
        bare = all(_BARE.fullmatch(piece) for piece in name.split("."))
        return name if bare and not name.startswith(("metric.", "params.")) and name not in FIXED else f"`{name}`"
    return kind


def _span(value: Value) -> Span | None:
    """A date is its whole UTC day; a time (its offset read, else UTC) its instant."""
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            return Span(stamp(start), stamp(start + timedelta(days=1)))
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return Span(stamp(moment), stamp(moment + timedelta(microseconds=1)))


def stamp(moment: datetime) -> str:
    """The store's timestamp format (``troupe.protocol.events.utc_now``), which sorts as time."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
