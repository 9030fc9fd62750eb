"""Each database's SQL as named statements, read once from ``sql/<vendor>.sql``.

A file is a list of blocks, each opened by a comment line::

    -- fragment: due            a piece other blocks include as {due}
    -- name: renew              a statement the backend runs by its name

``common.sql`` holds what every database writes the same way, and each
vendor's file adds its own blocks or replaces common ones of the same name,
so that a verb has one name on every database. Blocks are expanded once, when
a backend is built: ``{name}`` takes a fragment, or a value the backend gives
(the quoted table names from the model's ``_meta``, the claim order from
``rules.states``). Comment lines inside a block are dropped and whitespace is
folded, so each statement is one line of text that never changes.

What stays in a statement after loading are its parameters, ``%(name)s``
(or ``%s`` in the few bulk statements whose rows go as one flat list), and
its lists, ``[name]``. ``bind`` gives the statement as drivers take it, with
``%s`` placeholders and the values in their order, each list expanded to as
many placeholders as it has values: ``[ids]`` to ``%s, %s``;
``[pairs:(%s, %s)]`` to a group per item, joined by commas (a group in
parentheses) or spaces (a ``WHEN %s THEN %s``); ``spread`` does the same for
the bulk statements. An empty list expands to one group of NULLs, which no
row matches: membership tests are spelled so that NULL means "no"
(``... IS NOT TRUE``, ``... OR ...``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

SQL = Path(__file__).parent / "sql"
BLOCK = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
INCLUDE = re.compile(r"\{(\w+)\}")
LIST = re.compile(r"\[(\w+)(?::([^\]]+))?\]")
NAMED = re.compile(r"%\((\w+)\)s")
SLOT = re.compile(r"%s|%\((\w+)\)s")
PIECE = re.compile(r"%\((?P<param>\w+)\)s|\[(?P<list>\w+)(?::(?P<group>[^\]]+))?\]")
PARAMETER = "%s"


class Statements(Mapping[str, str]):
    """One backend's named statements, expanded: ``statements.renew`` or ``statements["renew"]``."""

    def __init__(self, texts: dict[str, str], fragments: dict[str, str]) -> None:
        self._texts = texts
        self._fragments = fragments

    def fragment(self, name: str) -> str:
        """The fragment ``name``, expanded: what a test ``EXPLAIN``s of a rule alone."""
        return self._fragments[name]

    def __getitem__(self, name: str) -> str:
        return self._texts[name]

    def __getattr__(self, name: str) -> str:
        try:
            return self._texts[name]
        except KeyError:
            raise AttributeError(name) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._texts)

    def __len__(self) -> int:
        return len(self._texts)


def load(vendor: str, values: Mapping[str, str]) -> Statements:
    """``vendor``'s statements (``common.sql`` overlaid with its own file), expanded
    with its fragments and ``values``."""
    fragments, names = blocks(vendor)

    def expanded(text: str, seen: tuple[str, ...] = ()) -> str:
        def include(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in seen:
                raise ValueError(f"{vendor}.sql: fragment {name!r} includes itself")
            if name in values:
                return values[name]
            if name not in fragments:
                raise KeyError(f"{vendor}.sql: no fragment or value {name!r}")
            return expanded(fragments[name], (*seen, name))

        return " ".join(INCLUDE.sub(include, text).split())

    return Statements(
        {name: expanded(text) for name, text in names.items()},
        {name: expanded(text, (name,)) for name, text in fragments.items()},
    )


@functools.cache
def blocks(vendor: str) -> tuple[dict[str, str], dict[str, str]]:
    """The fragments and the statements of ``vendor``, unexpanded: the files are read once."""
    fragments: dict[str, str] = {}
    names: dict[str, str] = {}
    for path in (SQL / "common.sql", SQL / f"{vendor}.sql"):
        for kind, name, text in parse(path.read_text()):
            (fragments if kind == "fragment" else names)[name] = text
    return fragments, names


def parse(source: str) -> list[tuple[str, str, str]]:
    """The ``(kind, name, text)`` of each block of ``source``, comment lines left out."""
    parts = BLOCK.split(source)
    found = []
    for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        found.append((kind, name, "\n".join(lines).strip()))
    return found


def standalone(vendor: str, name: str) -> str | None:
    """The statement ``name`` of ``vendor`` that needs no table (the clock), if it has one."""
    text = blocks(vendor)[1].get(name)
    return None if text is None else " ".join(text.split())


def vendor_names(vendor: str) -> set[str]:
    """The names of the statements ``vendor`` defines (with the common ones)."""
    return set(blocks(vendor)[1])


def bind(statement: str, params: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """``statement`` as drivers take it, with ``%s`` placeholders, and its values in order.

    Each ``%(name)s`` takes ``params[name]``, each ``[name]`` list a group per
    item of ``params[name]``; other parameters, arrays among them where a
    database takes arrays, go as they are. Positional placeholders keep the
    text as short as it can be: psycopg converts a statement's placeholders
    again on every call once it is longer than 4,096 bytes.
    """
    text: list[str] = []
    values: list[Any] = []
    for kind, piece, group in pieces(statement):
        if kind == "text":
            text.append(piece)
        elif kind == "param":
            text.append(PARAMETER)
            values.append(params[piece])
        else:
            text.append(expand_list(group, params[piece], params, values))
    return "".join(text), values


@functools.cache
def pieces(statement: str) -> tuple[tuple[str, str, str], ...]:
    """``statement`` cut into text, ``%(name)s`` parameters and ``[name]`` lists."""
    found: list[tuple[str, str, str]] = []
    at = 0
    for match in PIECE.finditer(statement):
        found.append(("text", statement[at : match.start()], ""))
        if match.group("param"):
            found.append(("param", match.group("param"), ""))
        else:
            found.append(("list", match.group("list"), match.group("group") or PARAMETER))
        at = match.end()
    found.append(("text", statement[at:], ""))
    return tuple(found)


def expand_list(
    group: str, items: Sequence[Any], params: Mapping[str, Any], values: list[Any]
) -> str:
    """``group`` once per item, its ``%s`` taking the item's values (and its
    ``%(name)s``, if any, the statement's); an empty list gives one group of NULLs."""
    if not items:
        return NAMED.sub("NULL", group).replace(PARAMETER, "NULL")
    slots = group_slots(group)
    width = slots.count(None)
    if width == len(slots):  # only the items' own values: no statement parameter inside
        if width == 1:
            values.extend(items)
        else:
            for item in items:
                values.extend(item)
    else:
        for item in items:
            own = iter(item if width > 1 else (item,))
            values.extend(next(own) if name is None else params[name] for name in slots)
    return joiner(group).join([NAMED.sub(PARAMETER, group)] * len(items))


@functools.cache
def group_slots(group: str) -> tuple[str | None, ...]:
    """The placeholders of a list's group in order: ``None`` for an item's own
    value, the name of a statement parameter otherwise. Read once per group: a
    pool binds lists of hundreds of items on every turn."""
    return tuple(None if m.group(0) == PARAMETER else m.group(1) for m in SLOT.finditer(group))


def spread(statement: str, **counts: int) -> str:
    """``statement`` (of ``%s`` parameters) with each ``[name]`` list expanded to
    ``counts[name]`` groups of positional placeholders."""

    def expand(match: re.Match[str]) -> str:
        group = match.group(2) or PARAMETER
        count = counts[match.group(1)]
        if not count:
            return group.replace(PARAMETER, "NULL")
        return joiner(group).join([group] * count)

    return LIST.sub(expand, statement)


def joiner(group: str) -> str:
    """Values and parenthesized groups go in a comma list; clauses (``WHEN ...``) side by side."""
    return ", " if group == PARAMETER or group.startswith("(") else " "
