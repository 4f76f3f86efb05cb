"""The stores' named statements, read as SQL from the files beside this module.

``common.sql`` holds the statements every database runs as written; ``postgresql.sql``,
``mysql.sql`` and ``sqlite.sql`` hold only those whose SQL differs on that database (or that
only it runs). Each statement follows a ``-- name: <name>`` header, as in procrastinate's
``queries.sql``; comment lines (``--``) after the header say what it does and are not sent.
The files are parsed once, at import, into :data:`STATEMENTS` (vendor → name → text), and the
parts each includes put in, into :data:`INCLUDED`; a store asks for one with
``SQLStore.sql(name)``, its vendor's text or else the common one.

The rules that keep the files readable as they run:

- Parameters are the driver's, ``%s`` in order; a literal ``%`` is written ``%%``. Nothing is
  ever put into a statement's text from a value, and the tables are named as the models name
  them (``django_taskclaim_task``, ``django_taskclaim_attempt``): no substitution at all.
- A statement whose shape would vary per call takes the variation as a parameter instead: a
  list of ids is one array on PostgreSQL (``id = ANY(%s::bigint[])``). Where a database has no
  arrays, the file writes the list once, as read: ``IN (%s, ...)`` or
  ``((id = %s AND fencing_token = %s) OR ...)``, the item then its separator (``, `` or `` OR ``)
  and ``...``; :func:`repeat` writes the item ``n`` times for a call (``SQLStore.sql(name, n)``),
  the one part added in code, and never from a value.
- A statement with forms (audited or not, a reserved claim to start in the same commit…) is a
  statement per form, named for what it adds (``claim_key_unaudited``,
  ``complete_audited_then_start``); an optional value is a parameter that may be NULL.
- A statement with too many forms to write each out (the queue claim: a tenant or none, one queue
  or several, handler work or task paths, reserving, audited, after a completion: 64 on
  PostgreSQL) is written once with named slots, ``{{slot}}``, and named parts (``-- name:``
  blocks like any statement) that fill them: :func:`fill` puts a form together from the parts the
  call names for each slot (or nothing), and a ``{{name}}`` of a part no slot names is that part,
  always. Code chooses parts by name only; it never writes SQL. A statement that only includes
  parts (``{{name}}`` of a statement; no slot a call fills) is put together once, at import: the
  forms of one statement write the SQL they share once, as a named part each includes, and the
  store sends the whole text. Optional filters stay slots, not
  NULL-able parameters: each form keeps its own plan (an ``(%s IS NULL OR …)`` filter can make
  PostgreSQL's generic plan pass over the queued index).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib.resources import files
from types import MappingProxyType

#: The files of statements: the common one, then one per vendor (Django's ``connection.vendor``).
COMMON = "common"
VENDOR_FILES = ("postgresql", "mysql", "sqlite")

_HEADER = re.compile(r"--\s*name:\s*(?P<name>\S*)\s*$")
_NAME = re.compile(r"[a-z][a-z0-9_]*")


def parse(text: str, source: str) -> dict[str, str]:
    """The statements of one file, name → text (its lines stripped and joined by one space).

    ``ValueError`` names the file and line of what is wrong: SQL before the first header, a
    name that is not lower_snake_case, a name given twice, a header with no SQL under it, a
    comment after SQL on its line (joined, it would swallow the rest of the statement).
    """
    found: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    at = 0

    def close() -> None:
        if name is not None:
            if not lines:
                raise ValueError(f"{source}:{at}: statement {name!r} has no SQL under its header")
            found[name] = " ".join(lines)

    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER.fullmatch(line.strip())
        if header:
            close()
            name, lines, at = header["name"], [], number
            if not _NAME.fullmatch(name):
                raise ValueError(f"{source}:{number}: statement name {name!r} is not lower_snake_case")
            if name in found:
                raise ValueError(f"{source}:{number}: statement {name!r} is named twice")
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("--"):
            continue
        if name is None:
            raise ValueError(f"{source}:{number}: SQL before the first '-- name: ...' header")
        if "--" in stripped:
            # The lines are joined into one: a comment after SQL would swallow the rest of it.
            raise ValueError(f"{source}:{number}: a comment after SQL; put it on a line of its own")
        lines.append(stripped)
    close()
    return found


_SLOT = re.compile(r"( ?)\{\{([a-z][a-z0-9_]*)\}\}")


def slots_of(text: str) -> set[str]:
    """The names written ``{{name}}`` in ``text``: slots, or parts included as they are."""
    return {m[2] for m in _SLOT.finditer(text)}


def fill(statements: Mapping[str, str], name: str, parts: Mapping[str, str | None]) -> str:
    """The statement ``name`` with each ``{{slot}}`` replaced by the part ``parts`` names for it
    (``None``: nothing), and each other ``{{name}}`` by the statement of that name; parts are
    filled the same way. ``KeyError`` names a slot neither ``parts`` nor the statements know."""

    def expand(text: str, seen: tuple[str, ...]) -> str:
        def one(m: re.Match[str]) -> str:
            slot = m[2]
            chosen = parts.get(slot, slot)
            if chosen is None:
                return ""
            if chosen in seen:
                raise ValueError(f"{name}: part {chosen!r} includes itself")
            if chosen not in statements:
                raise KeyError(f"{name}: no part {chosen!r} for {{{{{slot}}}}}")
            return m[1] + expand(statements[chosen], (*seen, chosen))

        return _SLOT.sub(one, text)

    return expand(statements[name], (name,))


#: An item written once then "...": ``%s`` or a parenthesised group (two levels of nesting: a row of
#: values may call a function inside parentheses), its separator.
_REPEATED = re.compile(r"(%s|\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\))(, | OR )\.\.\.")


def repeat(text: str, n: int) -> str:
    """``text`` with each item written ``X, ...`` (or ``X OR ...``) written ``n`` times: the list of a
    call of ``n`` (``n`` ≥ 1). ``ValueError`` if the statement has no such list, or ``n`` < 1."""
    if n < 1:
        raise ValueError(f"a list of {n} items: a statement's list has one item at least")
    expanded, found = _REPEATED.subn(lambda m: m[2].join([m[1]] * n), text)
    if not found:
        raise ValueError(f"no list written 'item, ...' to repeat in {text!r}")
    return expanded


def _read(stem: str) -> dict[str, str]:
    return parse((files(__package__) / f"{stem}.sql").read_text(encoding="utf-8"), f"{stem}.sql")


#: Each file's own statements, as written (the repository tests read these).
FILES: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {stem: MappingProxyType(_read(stem)) for stem in (COMMON, *VENDOR_FILES)})

def include(statements: Mapping[str, str]) -> dict[str, str]:
    """Each statement whose every ``{{name}}`` (and its parts', in turn) names a statement, with
    those parts included as :func:`fill` would (so a plain ``SQLStore.sql(name)`` is the whole
    text, put together once); a statement with a slot only a call fills stays as written."""
    included: dict[str, str] = {}
    for name, text in statements.items():
        try:
            included[name] = fill(statements, name, {}) if slots_of(text) else text
        except KeyError:
            included[name] = text
    return included


#: What each vendor runs: the common statements, with its own file's over them, as written
#: (:func:`fill` puts a form of one together from these).
STATEMENTS: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {vendor: MappingProxyType({**FILES[COMMON], **FILES[vendor]}) for vendor in VENDOR_FILES})

#: :data:`STATEMENTS` with the parts each statement includes put in (:func:`include`): the text
#: ``SQLStore.sql(name)`` sends.
INCLUDED: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {vendor: MappingProxyType(include(STATEMENTS[vendor])) for vendor in VENDOR_FILES})
