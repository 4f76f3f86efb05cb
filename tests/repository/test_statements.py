"""The stores' statements: each written once, readable as SQL where it lives (issue 31 item 2)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

STORE = Path(__file__).resolve().parents[2] / "django_taskclaim" / "store"


def methods(module: str) -> dict[str, set[str]]:
    """Each class of ``store/<module>.py`` and the methods it defines."""
    tree = ast.parse((STORE / f"{module}.py").read_text())
    return {node.name: {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
            for node in tree.body if isinstance(node, ast.ClassDef)}


def test_complete_and_claim_next_is_written_once_for_the_vendors_that_share_it() -> None:
    """The portable store's ``complete_and_claim_next`` (a completion, then the queue claim, in the
    lifecycle's one transaction) serves SQLite and MySQL alike; only PostgreSQL, whose one fused
    statement differs, writes its own. MySQL had a copy that differed only by excluding the task it
    completed from the claim, which the portable claim now does for every vendor."""
    defined = {module: [cls for cls, names in methods(module).items() if "complete_and_claim_next" in names]
               for module in ("sql", "sqlite", "mysql", "postgresql")}
    assert defined == {"sql": ["SQLStore"], "sqlite": [], "mysql": [], "postgresql": ["PostgreSQLStore"]}, defined


QUERIES = STORE / "queries"
#: Each store module, its class, and the vendor it serves (the portable one serves those that inherit).
MODULES = {"sql": ("SQLStore", None), "postgresql": ("PostgreSQLStore", "postgresql"),
           "mysql": ("MySQLStore", "mysql"), "sqlite": ("SQLiteStore", "sqlite")}


def store_class(module: str) -> tuple[dict[str, ast.FunctionDef], dict[str, set[str]]]:
    """The methods of the module's store class by name, and the strings each module-level constant holds."""
    tree = ast.parse((STORE / f"{module}.py").read_text())
    [cls] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == MODULES[module][0]]
    constants = {node.targets[0].id: strings(node.value) for node in tree.body
                 if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    return {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}, constants


def strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def needed(vendor: str) -> set[str]:
    """The statements the vendor's store may run: the names written (as strings, in the method or
    in a module constant it reads) in each method reachable from the ``Store`` protocol's, its own
    or the portable store's it inherits, through ``self.<method>`` and ``super().<method>``."""
    from django_taskclaim.store.queries import FILES

    known = {name for statements in FILES.values() for name in statements}
    tree = ast.parse((STORE / "protocol.py").read_text())
    [protocol] = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Store"]
    classes = {module: store_class(module) for module in {vendor, "sql"}}

    def find(name: str, portable_only: bool) -> tuple[str, ast.FunctionDef] | None:
        for module in (("sql",) if portable_only else (vendor, "sql")):
            if name in classes[module][0]:
                return module, classes[module][0][name]
        return None

    todo = [found for f in protocol.body if isinstance(f, ast.FunctionDef) if (found := find(f.name, False))]
    seen: set[tuple[str, str]] = set()
    wanted: set[str] = set()
    asked: set[str] = set()
    while todo:
        module, method = todo.pop()
        if (module, method.name) in seen:
            continue
        seen.add((module, method.name))
        constants = classes[module][1]
        # What it asks self.sql() for by a name written there, always; other strings that name a
        # statement (passed on to another method, or in a table of names).
        asked |= {node.args[0].value for node in ast.walk(method)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sql"
                  and node.args and isinstance(node.args[0], ast.Constant)}
        wanted |= strings(method)
        wanted |= {v for n in ast.walk(method) if isinstance(n, ast.Name) for v in constants.get(n.id, ())}
        for node in ast.walk(method):
            if not isinstance(node, ast.Attribute):
                continue
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                found = find(node.attr, False)
            elif (isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                  and node.value.func.id == "super"):
                found = find(node.attr, True)
            else:
                continue
            if found:
                todo.append(found)
    from django_taskclaim.store.queries import STATEMENTS, slots_of

    # A part a statement includes ({{name}}, filled or included as written) is used where the statement is.
    used = asked | (wanted & known)
    todo_names = list(used)
    while todo_names:
        for name in slots_of(STATEMENTS[vendor].get(todo_names.pop(), "")) & known - used:
            used.add(name)
            todo_names.append(name)
    return used


def test_every_statement_named_in_the_code_is_in_the_files_and_every_one_in_the_files_is_used() -> None:
    """What a vendor's store asks for (its own methods, and the portable ones it inherits) is in
    what that vendor runs; no vendor file holds a statement its store never asks for, and no
    common statement is left that every vendor either never asks for or writes its own of."""
    from django_taskclaim.store.queries import FILES, STATEMENTS, VENDOR_FILES

    run_as_common: set[str] = set()
    for vendor in VENDOR_FILES:
        wanted = needed(vendor)
        assert wanted <= set(STATEMENTS[vendor]), (vendor, "missing", wanted - set(STATEMENTS[vendor]))
        assert set(FILES[vendor]) <= wanted, (vendor, "unused", set(FILES[vendor]) - wanted)
        run_as_common |= wanted - set(FILES[vendor])
    assert set(FILES["common"]) <= run_as_common, ("common", "unused", set(FILES["common"]) - run_as_common)


def test_no_statement_is_written_twice() -> None:
    """No two names, in one file or across files, hold the same SQL: a vendor's file holds a
    statement only where its SQL differs from common.sql's."""
    from django_taskclaim.store.queries import FILES, INCLUDED

    seen: dict[str, str] = {}
    for stem, statements in FILES.items():
        for name, text in statements.items():
            # As run: a part a vendor's statement includes is that vendor's (its task_columns, say).
            text = INCLUDED[stem][name] if stem in INCLUDED else text
            where = f"{stem}.sql: {name}"
            assert text not in seen, f"{where} repeats {seen[text]}"
            seen[text] = where


def test_a_part_is_included_where_it_stands_never_written_out_again() -> None:
    """A part a statement includes (``{{name}}``) stands nowhere else written out in full, in its
    vendor's statements as written: the forms of one statement share their SQL by including it."""
    from django_taskclaim.store.queries import STATEMENTS, slots_of

    for vendor, statements in STATEMENTS.items():
        parts = {part for text in statements.values() for part in slots_of(text)} & set(statements)
        for part in parts:
            for name, text in statements.items():
                assert name == part or statements[part] not in text, f"{vendor}: {name} writes out {part}"


def test_the_files_are_the_ones_the_loader_reads_and_ship_in_the_package_data() -> None:
    import tomllib

    from django_taskclaim.store import VENDORS
    from django_taskclaim.store.queries import COMMON, VENDOR_FILES

    assert {p.stem for p in QUERIES.glob("*.sql")} == {COMMON, *VENDOR_FILES}
    assert set(VENDOR_FILES) == set(VENDORS), "a file of statements per store in store.VENDORS"
    with (STORE.parents[1] / "pyproject.toml").open("rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]["django_taskclaim"]
    assert "store/queries/*.sql" in data, data


@pytest.mark.parametrize(("text", "problem"), [
    ("SELECT 1\n-- name: x\nSELECT 2", "file.sql:1: SQL before the first '-- name: ...' header"),
    ("-- name: x\nSELECT 1\n-- name: x\nSELECT 2", "file.sql:3: statement 'x' is named twice"),
    ("-- name: x\n-- only a comment\n-- name: y\nSELECT 1", "file.sql:1: statement 'x' has no SQL under its header"),
    ("-- name: Bad-Name\nSELECT 1", "file.sql:1: statement name 'Bad-Name' is not lower_snake_case"),
    ("-- name: x\nSELECT 1 -- one\nFROM t", "file.sql:2: a comment after SQL; put it on a line of its own"),
])
def test_the_loader_names_what_is_wrong_in_a_file(text: str, problem: str) -> None:
    from django_taskclaim.store.queries import parse

    with pytest.raises(ValueError, match=re.escape(problem)):
        parse(text, "file.sql")


def test_the_loader_reads_a_statement_as_written() -> None:
    from django_taskclaim.store.queries import parse

    text = "-- name: two\n-- what it does\nSELECT 1\n  FROM t\n\n  -- why\nWHERE a = %s\n-- name: one\nSELECT 2"
    assert parse(text, "f.sql") == {"two": "SELECT 1 FROM t WHERE a = %s", "one": "SELECT 2"}


def test_a_list_written_item_then_ellipsis_is_repeated_for_a_call() -> None:
    """Where a database has no arrays, a list is written once in the file (``%s, ...``, a group
    ``OR ...``) and repeated for the call's length; nothing else in the text changes."""
    from django_taskclaim.store.queries import repeat

    text = "UPDATE t SET a = %s WHERE id IN (%s, ...) AND ((id = %s AND token = %s) OR ...)"
    assert repeat(text, 2) == ("UPDATE t SET a = %s WHERE id IN (%s, %s) "
                               "AND ((id = %s AND token = %s) OR (id = %s AND token = %s))")
    assert repeat("x IN (VALUES (%s, %s), ...)", 3) == "x IN (VALUES (%s, %s), (%s, %s), (%s, %s))"
    # A row of values may call a function inside parentheses (SQLite's clock): two levels of nesting.
    assert repeat("VALUES (%s, (strftime('%%f', 'now') || '000')), ... RETURNING id", 2) == (
        "VALUES (%s, (strftime('%%f', 'now') || '000')), (%s, (strftime('%%f', 'now') || '000')) RETURNING id")
    with pytest.raises(ValueError, match="no list written"):
        repeat("SELECT 1", 2)
    with pytest.raises(ValueError, match="one item at least"):
        repeat(text, 0)


def test_a_statement_is_filled_from_named_parts_and_a_slot_left_empty_leaves_no_gap() -> None:
    """``{{slot}}`` takes the part the call names (parts fill their own slots from the same names),
    ``None`` leaves nothing (nor the space before it); ``{{name}}`` of a part no slot names is that
    part; a slot no part fills, or a part that includes itself, is an error naming it."""
    from django_taskclaim.store.queries import fill

    statements = {"claim": "SELECT id FROM t WHERE {{queues}} {{tenant}} AND {{due}} LIMIT %s",
                  "one": "t.queue = %s", "many": "t.queue = ANY(%s)", "of_tenant": "AND t.tenant = %s",
                  "due": "t.run_after <= now() {{tenant}}", "loop": "x {{loop}}"}
    assert fill(statements, "claim", {"queues": "one", "tenant": None}) == (
        "SELECT id FROM t WHERE t.queue = %s AND t.run_after <= now() LIMIT %s")
    assert fill(statements, "claim", {"queues": "many", "tenant": "of_tenant"}) == (
        "SELECT id FROM t WHERE t.queue = ANY(%s) AND t.tenant = %s AND t.run_after <= now() AND t.tenant = %s "
        "LIMIT %s")
    with pytest.raises(KeyError, match="no part 'queues'"):
        fill(statements, "claim", {"tenant": None})
    with pytest.raises(ValueError, match="includes itself"):
        fill(statements, "loop", {})


def test_a_statement_that_only_includes_parts_is_put_together_once_at_load() -> None:
    """``{{name}}`` of a statement, in a statement with no slot a call fills, is that statement put in
    when the files are read: ``SQLStore.sql(name)`` is the whole text; a statement still holding a
    ``{{`` is a form a call fills, left as written for :func:`fill`."""
    from django_taskclaim.store.queries import INCLUDED, STATEMENTS, include

    statements = {"both": "SELECT {{cols}} FROM t", "cols": "a, {{more}}", "more": "b",
                  "claim": "SELECT {{cols}} FROM t WHERE 1 = 1 {{tenant}}"}
    assert include(statements) == {**statements, "both": "SELECT a, b FROM t", "cols": "a, b"}
    included = 0
    for vendor, texts in INCLUDED.items():
        for name, text in texts.items():
            # Put together, or left as written for fill(): a form whose slots a call fills.
            assert "{{" not in text or text == STATEMENTS[vendor][name], (vendor, name)
            included += text != STATEMENTS[vendor][name]
    assert included, "no statement includes a part: the check reads nothing"


#: Each vendor's queue-claim statements and the store method that names the parts of their slots.
QUEUE_FORMS = {"postgresql": ["queue_claim"], "sqlite": ["queue_claim", "fail_exhausted_queued"],
               "mysql": ["lock_expired_queued", "lock_pending_queued"]}


@pytest.mark.parametrize("vendor", sorted(QUEUE_FORMS))
def test_every_form_of_the_queue_claim_is_filled_from_the_files_alone(vendor: str) -> None:
    """Every form a store asks for (each choice of its parts) fills every slot of its statements
    from the files, and leaves no ``{{`` in the text it sends; PostgreSQL's 64 forms are distinct."""
    import itertools

    from django_taskclaim.store import postgresql, sql
    from django_taskclaim.store.queries import STATEMENTS, fill

    texts = set()
    store = postgresql.store if vendor == "postgresql" else sql.SQLStore()
    for several, path, tenant, done, reserve, audit in itertools.product(
            (False, True), ("", "*"), (False, True), (False, True), (False, True), (False, True)):
        if vendor == "postgresql":
            parts = postgresql.store.queue_claim_parts(several=several, path=path, tenant=tenant, done=done,
                                                       exclude=done, reserve=reserve, audit=audit)
        else:
            parts = store.queue_parts(["a", "b"] if several else ["a"], path, "t" if tenant else None,
                                      1 if done else None)[1]
        for name in QUEUE_FORMS[vendor]:
            text = fill(STATEMENTS[vendor], name, parts)
            assert "{{" not in text and "}}" not in text, (vendor, name, text)
            texts.add(text)
    if vendor == "postgresql":
        assert len(texts) == 64


def test_every_task_column_list_written_out_is_the_rows_columns_in_order() -> None:
    """A statement that reads or writes whole task rows names their columns in ``TASK_COLUMNS``
    order (``decode`` reads them by position): a column added to the model and forgotten in one
    file, or two swapped, fails here rather than as a wrong field at run time."""
    from django_taskclaim.store.queries import INCLUDED
    from django_taskclaim.store.rows import TASK_COLUMNS

    def bare(column: str) -> str:
        # A column as named: without its cast (payload::text AS payload), its table's alias (t.id), quotes.
        column = column.strip().split("::")[0]
        return re.sub(r"^\w+\.", "", column).strip('`"')

    checked = 0
    # As each vendor runs them: the parts put in (a queue claim's slots left out: its parts are checked too).
    for stem, statements in INCLUDED.items():
        for name, text in statements.items():
            text = re.sub(r"\{\{(\w+)\}\}", lambda m, parts=statements: parts.get(m[1], m[0]), text)
            for clause in re.findall(r"(?:RETURNING|SELECT)\s+(.*?)(?:\s+(?:FROM|ON CONFLICT|WHERE)\b|$)", text):
                columns = [bare(c) for c in clause.split(",")]
                # Not a task row: a few columns (a moved task's id, key, tenant, token, status; what a
                # multi-row insert returns), none of them, or the values an insert selects ('pending', %s).
                values = any(c.startswith(("'", "%")) for c in columns)
                if len(columns) < 10 or "tenant" not in columns or values:
                    continue
                # The row's columns first; a statement may read more after them (a claim's time,
                # whether the lease expired), which decode() leaves to its caller.
                assert tuple(columns[:len(TASK_COLUMNS)]) == TASK_COLUMNS, f"{stem}.sql: {name}: {columns}"
                checked += 1
            inserted = re.search(r"INSERT INTO django_taskclaim_task \((.*?)\)", text)
            if inserted:
                assert tuple(bare(c) for c in inserted[1].split(",")) == TASK_COLUMNS[1:], f"{stem}.sql: {name}"
                checked += 1
    assert checked, "no statement names the task columns: the check reads nothing"


# -- no SQL put together in f-strings outside the allow-list ------------------------------------
#: Text that reads as SQL in an f-string's fixed parts (case-sensitive: SQL's keywords are written
#: in capitals in this package, its messages in prose).
SQLISH = re.compile(r"\b(WHERE|FROM|SET|VALUES|ORDER BY|LIMIT|JOIN|THEN|AND|OR|CASE|IN)\s|\bRETURNING\s"
                    r"|^\s*(SELECT|UPDATE|INSERT|DELETE|WITH)\s")

#: Where a store module may still build SQL in an f-string ("module.function", or a module
#: constant), and why: none now. The queue claim, the last, is written in store/queries/ with named
#: slots filled by named parts (queries.fill); an entry added here must say why it cannot be.
ALLOWED: dict[str, str] = {}


def sql_in_fstrings(source: str) -> set[str]:
    """Where ``source`` (a store module) builds SQL in an f-string: each function, method or
    module constant (by name; a method by its own name) holding one."""
    found: set[str] = set()

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            at = where
            # A function's own name, a method's (inside a class), a class's; a nested def stays its owner's.
            named = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and (where == "" or where[0].isupper())
            if named or isinstance(child, ast.ClassDef):
                at = child.name  # type: ignore[union-attr]
            elif (isinstance(child, ast.Assign) and isinstance(node, ast.Module | ast.ClassDef)
                  and isinstance(child.targets[0], ast.Name)):
                at = child.targets[0].id
            if isinstance(child, ast.JoinedStr):
                fixed = "".join(part.value for part in child.values if isinstance(part, ast.Constant))
                if SQLISH.search(fixed):
                    found.add(at)
            visit(child, at)

    visit(ast.parse(source), "")
    return found


def test_a_store_module_builds_sql_in_an_f_string_only_where_the_allow_list_says_why() -> None:
    """Statements are read as SQL in store/queries/: a store module that builds one in an f-string
    fails here unless the allow-list names it with its reason; an entry whose code no longer
    builds SQL fails too, so the list only shrinks."""
    found = {f"{module}.{name}" for module in MODULES
             for name in sql_in_fstrings((STORE / f"{module}.py").read_text())}
    assert all(ALLOWED.values())
    assert found - set(ALLOWED) == set(), "SQL built in an f-string: write it in store/queries/"
    assert set(ALLOWED) - found == set(), "no longer builds SQL: take it off ALLOWED"


def test_the_f_string_check_sees_sql_and_not_prose() -> None:
    source = '''
RELEASE = f"status = {P}, owner = ''"
X = f"attempts = CASE WHEN a THEN {b} END"
def messages(v):
    return f"SQLite {v} is too old: claims need (UPDATE … RETURNING)"
class Store:
    def heartbeat_many(self, n):
        return f"UPDATE {T} SET a = 1 WHERE id IN ({n})"
    def fine(self):
        return self.sql("heartbeat")
'''
    assert sql_in_fstrings(source) == {"X", "heartbeat_many"}
