"""The error model (docs/design.md, "Errors"), checked over the source with ``ast``.

* One tree: an exception class of logmq derives from LogMQError (errors.py), which
  carries the Kafka code a client or operator hears, unless it is listed below with the
  reason it stays outside.
* Whole-request failures are raised: no public function of the services or the doors
  answers with a bare ``ErrorCode`` or a ``(ErrorCode, ...)`` tuple (listed exceptions
  below, with reasons).
* Per-entity outcomes are typed results: no annotation makes an exception a value (a
  union of a result and an exception, or a container of exceptions).
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "logmq"

BUILTIN_EXCEPTIONS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}

# (path under src/logmq, class): why it is not a LogMQError
OUTSIDE_THE_TREE = {
    ("errors.py", "LogMQError"): "the root of the tree",
    ("storage/format_upgrade.py", "_Damage"): "control flow inside the module (reported as "
    "FormatUpgradeError)",
    ("storage/log_cleaner.py", "CleaningAborted"): "control flow between the cleaner's "
    "thread and its loop; no one hears of it",
    ("net/zero_copy.py", "ShortFileError"): "an OSError on purpose: the writer closes the "
    "connection as for any failed send, mid-answer, where no code can follow",
    ("replication/raft_transport.py", "FrameError"): "a peer's hello refused, raised and "
    "caught in the same loop of the Raft transport (logged, then reconnect)",
    ("testing/__init__.py", "BrokerStartError"): "the test harness's, not the broker's",
    ("testing/_kafka.py", "KafkaError"): "the test harness's, not the broker's",
    ("testing/s3.py", "MotoStartError"): "the test harness's, not the broker's",
}

# The packages whose public functions must not answer with a bare code
SERVICE_LAYER = ("broker", "kafka", "native", "security")

# (path under src/logmq, function): why it may return an ErrorCode
RETURNS_A_CODE = {
    ("kafka/transactions.py", "client_code"): "translates a code into the one an older "
    "request version knows (PRODUCER_FENCED before v2): a mapping, not an error channel",
    ("security/authorization.py", "denial"): "an ACL verdict per resource, the code that "
    "resource's own entry carries (Kafka answers each resource of such a request)",
}


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        yield rel, ast.parse(path.read_text(), filename=rel)


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    return None


def _classes() -> list[tuple[str, ast.ClassDef]]:
    return [
        (rel, node)
        for rel, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    ]


CLASSES = _classes()
BASES: dict[str, list[list[str]]] = {}
for _rel, _cls in CLASSES:
    BASES.setdefault(_cls.name, []).append([n for b in _cls.bases if (n := _name(b))])


def _in_tree(name: str, seen: frozenset[str] = frozenset()) -> bool:
    if name == "LogMQError":
        return True
    if name in seen:
        return False
    return any(_in_tree(base, seen | {name}) for bases in BASES.get(name, ()) for base in bases)


def _is_exception(name: str, seen: frozenset[str] = frozenset()) -> bool:
    if name in BUILTIN_EXCEPTIONS:
        return True
    if name in seen:
        return False
    return any(
        _is_exception(base, seen | {name}) for bases in BASES.get(name, ()) for base in bases
    )


EXCEPTION_NAMES = {c.name for _, c in CLASSES if _is_exception(c.name)} | BUILTIN_EXCEPTIONS


def test_every_error_is_a_logmq_error_or_says_why_not():
    outside = []
    for rel, cls in CLASSES:
        bases = [n for b in cls.bases if (n := _name(b))]
        if not any(_is_exception(b) for b in bases):
            continue
        if any(_in_tree(b) for b in bases) or (rel, cls.name) in OUTSIDE_THE_TREE:
            continue
        outside.append(f"{rel}:{cls.lineno} class {cls.name}({', '.join(bases)})")
    assert not outside, (
        "exceptions outside the LogMQError tree (give them a LogMQError base with their "
        "Kafka code, or list them in OUTSIDE_THE_TREE with the reason):\n" + "\n".join(outside)
    )


def test_the_allowlists_name_what_exists():
    """A moved or renamed entry must not leave a stale exemption behind."""
    classes = {(rel, c.name) for rel, c in CLASSES}
    assert set(OUTSIDE_THE_TREE) <= classes, set(OUTSIDE_THE_TREE) - classes
    functions = {(rel, f.name) for rel, f, _ in _public_functions()}
    assert set(RETURNS_A_CODE) <= functions, set(RETURNS_A_CODE) - functions


def _public_functions() -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, str]]:
    """Module-level functions and methods of module-level classes, not nested ones."""
    for rel, tree in modules():
        for node in tree.body:
            members = node.body if isinstance(node, ast.ClassDef) else [node]
            for f in members:
                if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and not (
                    f.name.startswith("_")
                ):
                    yield rel, f, ast.unparse(f.returns) if f.returns else ""


def _answers_a_code(returns: ast.expr | None) -> bool:
    """``ErrorCode``, ``ErrorCode | None``, ``tuple[ErrorCode, ...]`` (or a union of them)."""
    if returns is None:
        return False
    if isinstance(returns, ast.Constant) and isinstance(returns.value, str):
        returns = ast.parse(returns.value, mode="eval").body
    if isinstance(returns, ast.BinOp) and isinstance(returns.op, ast.BitOr):
        return _answers_a_code(returns.left) or _answers_a_code(returns.right)
    if _name(returns) == "ErrorCode" and not isinstance(returns, ast.Subscript):
        return True
    if isinstance(returns, ast.Subscript) and _name(returns.value) == "tuple":
        first = returns.slice.elts[0] if isinstance(returns.slice, ast.Tuple) else returns.slice
        return _name(first) == "ErrorCode"
    return False


def test_services_and_doors_raise_instead_of_answering_a_code():
    found = []
    for rel, f, shown in _public_functions():
        if rel.split("/")[0] not in SERVICE_LAYER or (rel, f.name) in RETURNS_A_CODE:
            continue
        if _answers_a_code(f.returns):
            found.append(f"{rel}:{f.lineno} {f.name}() -> {shown}")
    assert not found, (
        "raise a LogMQError for a whole request, return a typed result per entity (or "
        "list the function in RETURNS_A_CODE with the reason):\n" + "\n".join(found)
    )


def _annotations(tree: ast.Module) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.returns is not None:
                yield node.returns
            args = node.args
            for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if a is not None and a.annotation is not None:
                    yield a.annotation
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp):
            yield node.value  # a type alias: Outcome = tuple[...] | Exception


def _unquoted(node: ast.expr) -> ast.expr:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return node
    return node


def _members(node: ast.expr) -> list[ast.expr]:
    node = _unquoted(node)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _members(node.left) + _members(node.right)
    return [node]


def _is_exception_type(node: ast.expr) -> bool:
    node = _unquoted(node)
    return not isinstance(node, ast.Subscript) and _name(node) in EXCEPTION_NAMES


def _exception_as_value(node: ast.expr, containers: bool) -> bool:
    """A union of an exception and a result (None aside), or, with ``containers``, an
    exception as the item of a container; ``type[SomeError]`` is a class, not a value."""
    node = _unquoted(node)
    union = _members(node)
    if len(union) > 1:
        members = [m for m in union if not (isinstance(m, ast.Constant) and m.value is None)]
        exceptions = [m for m in members if _is_exception_type(m)]
        if exceptions and len(exceptions) < len(members):
            return True
        return any(_exception_as_value(m, containers) for m in members)
    if isinstance(node, ast.Subscript) and _name(node.value) != "type":
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return any(
            (containers and _is_exception_type(i)) or _exception_as_value(i, containers)
            for i in items
        )
    return False


def test_no_exception_travels_as_a_value():
    """Unions of a result and an exception anywhere; in the services and the doors also
    containers of exceptions (storage may collect the errors of a shutdown to log them)."""
    found = []
    for rel, tree in modules():
        if rel.startswith(("client/", "testing/")):
            continue  # the clients raise to their callers; the harness is not the broker
        containers = rel.split("/")[0] in SERVICE_LAYER
        for annotation in _annotations(tree):
            if _exception_as_value(annotation, containers):
                found.append(f"{rel}:{annotation.lineno} {ast.unparse(annotation)}")
    assert not found, (
        "an exception as a value: give the entity a typed result with its error code "
        "instead (errors.Outcome and its subclasses):\n" + "\n".join(found)
    )
