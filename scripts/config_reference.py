"""The consumer's configuration reference (docs site page ``configuration-reference.md``),
generated from the pydantic settings models so it cannot drift from the code.

The docs build makes the page each time (``scripts/mkdocs_hooks.py``); nothing generated is
committed. ``python scripts/config_reference.py`` prints it, ``... -o FILE`` writes it.

The walk starts at ``ConsumerConfig`` and follows every field whose type holds a ``Section``
(the base of every settings class): a discriminated union (``[source]``, ``[sink]``) gives one
table per ``kind``, a list of sections an array of tables (``[[model.inputs]]``). Per field:
its TOML key (the alias where it has one), type, default (never a secret's), constraints
(``Field(gt=..., ge=..., pattern=...)``) and description: the field's ``description``, else its
attribute docstring (read from the source, as pydantic's ``use_attribute_docstrings`` would).
"""

from __future__ import annotations

import argparse
import ast
import enum
import inspect
import re
import sys
import textwrap
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from rowbatch.consumer.section import MiB, Section
from rowbatch.consumer.service.config import ConsumerConfig

PAGE = "configuration-reference.md"
"""The page's path in the docs site (under ``docs_dir``)."""
ENV_PREFIX = "ROWBATCH_"
ENV_DELIMITER = "__"


@dataclass(frozen=True)
class Table:
    """One TOML table of the configuration: ``[model]``, ``[source]`` with ``kind = "kafka"``,
    ``[[model.inputs]]``, or the top level (``path == ()``)."""

    path: tuple[str, ...]
    """The keys from the top level, aliases applied."""
    model: type[BaseModel]
    kind: str | None
    """The ``kind`` tag of a member of a discriminated union."""
    array: bool
    """An array of tables (``[[...]]``)."""

    @property
    def header(self) -> str:
        if not self.path:
            return "Top level"
        name = ".".join(self.path)
        text = f"[[{name}]]" if self.array else f"[{name}]"
        return f'{text} kind = "{self.kind}"' if self.kind else text

    @property
    def anchor(self) -> str:
        """The heading's id, set explicitly (attr_list) so links do not depend on a slugifier."""
        parts = ["top-level"] if not self.path else ["config", *self.path]
        if self.kind:
            parts.append(self.kind)
        return "-".join(p.replace("_", "-") for p in parts)

    def own_fields(self) -> dict[str, FieldInfo]:
        """The fields listed in this table: all but those that are tables of their own."""
        return {
            name: info
            for name, info in self.model.model_fields.items()
            if not _sections_in(info.annotation)
        }


def tables(root: type[BaseModel] = ConsumerConfig) -> list[Table]:
    """Every table under ``root``, depth first in field order."""
    found: list[Table] = []

    def visit(table: Table) -> None:
        found.append(table)
        for name, info in table.model.model_fields.items():
            members = _sections_in(info.annotation)
            if not members:
                continue
            path = (*table.path, info.alias or name)
            array = _is_sequence(info.annotation)
            tagged = len(members) > 1 or info.discriminator is not None
            for member in members:
                kind = _kind_of(member) if tagged else None
                visit(Table(path, member, kind, array))

    visit(Table((), root, None, False))
    return found


def render(root: type[BaseModel] = ConsumerConfig) -> str:
    """The page, Markdown."""
    all_tables = tables(root)
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from the settings models by scripts/config_reference.py at each docs "
        "build: edit the models' docstrings and Field()s, not this page. -->",
        "",
        "The consumer reads a TOML file (`rowbatch-consumer --config FILE`; a commented example "
        "with the defaults: `deploy/consumer.example.toml` in the repository) and `ROWBATCH_*` "
        "environment variables, which win: a nested key joins its tables with `__`, e.g. "
        "`ROWBATCH_MODEL__URL` for `[model] url`, `ROWBATCH_SINK__DSN` for `[sink] dsn`. "
        "Values are validated at start; an unknown key is an error. This page is generated "
        "from the settings models (`rowbatch/consumer/**/settings.py`, "
        "`rowbatch/consumer/service/config.py`).",
        "",
        "Tables:",
        "",
    ]
    lines += [f"- [{_code(t.header)}](#{t.anchor})" for t in all_tables]
    for table in all_tables:
        lines += ["", *_render_table(table)]
    return "\n".join(lines) + "\n"


def field_keys(root: type[BaseModel] = ConsumerConfig) -> Iterator[tuple[Table, str]]:
    """Each (table, TOML key) the page lists: every field of every settings model reached."""
    for table in tables(root):
        for name, info in table.own_fields().items():
            yield table, info.alias or name


# --- one table -------------------------------------------------------------------------------


def _render_table(table: Table) -> list[str]:
    lines = [f"## {_code(table.header)} {{#{table.anchor}}}", ""]
    doc = _class_doc(table.model)
    if doc:
        lines += [_one_line(doc), ""]
    if table.path:
        env = ENV_PREFIX + ENV_DELIMITER.join(p.upper() for p in table.path)
        if table.array:
            lines += [f"Environment: `{env}`, a JSON list of these tables.", ""]
        else:
            lines += [f"Environment: `{env}{ENV_DELIMITER}<KEY>`.", ""]
    subtables = [
        (name, info)
        for name, info in table.model.model_fields.items()
        if _sections_in(info.annotation)
    ]
    if subtables:
        links = ", ".join(
            f"[`{info.alias or name}`](#{_anchor_of(table, info.alias or name)})"
            for name, info in subtables
        )
        lines += [f"Tables of their own: {links}.", ""]
    own = table.own_fields()
    if not own:
        return lines
    lines += ["| Key | Type | Default | Constraint | Description |", "|---|---|---|---|---|"]
    docs = _attribute_docs(table.model)
    for name, info in own.items():
        key = info.alias or name
        description = info.description or docs.get(name, "")
        cells = (
            f"`{key}`",
            _type_name(info.annotation),
            _default(info),
            _constraints(info),
            _one_line(description),
        )
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _anchor_of(parent: Table, key: str) -> str:
    """The anchor of the first table at ``parent.path + key``."""
    path = (*parent.path, key)
    return next(t.anchor for t in tables() if t.path == path)


# --- types, defaults, constraints ------------------------------------------------------------


def _sections_in(annotation: Any) -> list[type[BaseModel]]:
    """The ``Section`` subclasses in a field's type (through unions, ``Annotated``, tuples)."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        for member in _sections_in(arg):
            if member not in found:
                found.append(member)
    return found


def _is_sequence(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (tuple, list, frozenset, set):
        return True
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return any(_is_sequence(a) for a in typing.get_args(annotation)[:1] or ())
    return False


def _kind_of(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("kind")
    return str(field.default) if field is not None and isinstance(field.default, str) else None


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is None:
        return _class_name(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{_toml(a)}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        text = " or ".join(_type_name(a) for a in present)
        return f"{text}, optional" if len(present) < len(args) else text
    if origin is typing.Annotated:
        return _type_name(args[0])
    return _container_name(origin, args) or str(annotation).replace("typing.", "")


def _container_name(origin: Any, args: tuple[Any, ...]) -> str | None:
    if origin is dict and len(args) == 2:
        return f"table of {_type_name(args[0])} → {_type_name(args[1])}"
    if origin in (tuple, list, frozenset, set):
        items = [a for a in args if a is not Ellipsis]
        return "list of " + (" or ".join(_type_name(a) for a in items) or "values")
    return None


def _class_name(annotation: Any) -> str:
    names: dict[Any, str] = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        type(None): "none",
        SecretStr: "secret string",
    }
    if annotation in names:
        return names[annotation]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{_toml(m.value)}`" for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]  # no validated data
    else:
        value = info.default
    secret = "secret" in _type_name(info.annotation) or isinstance(value, SecretStr)
    if value is None:
        return "unset"
    if secret:
        return "(secret)"
    if isinstance(value, BaseModel):
        return "(its defaults)"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return _number(value)
    return f"`{_toml(value)}`"


def _toml(value: Any) -> str:
    """``value`` as written in the TOML file."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str | Path):
        return f'"{value}"'
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple | set | frozenset):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


def _number(value: float) -> str:
    """``value`` as code, with its size in MiB or KiB when it is a whole number of them."""
    text = f"`{value!r}`"
    if isinstance(value, int) and value >= MiB and value % MiB == 0:
        return f"{text} ({value // MiB} MiB)"
    if isinstance(value, int) and value >= 1024 and value % 1024 == 0:
        return f"{text} ({value // 1024} KiB)"
    return text


def _constraints(info: FieldInfo) -> str:
    parts: list[str] = []
    for item in info.metadata:
        if isinstance(item, annotated_types.Gt):
            parts.append(f"> {_bound(item.gt)}")
        elif isinstance(item, annotated_types.Ge):
            parts.append(f"≥ {_bound(item.ge)}")
        elif isinstance(item, annotated_types.Lt):
            parts.append(f"< {_bound(item.lt)}")
        elif isinstance(item, annotated_types.Le):
            parts.append(f"≤ {_bound(item.le)}")
        elif isinstance(item, annotated_types.MinLen):
            parts.append(f"length ≥ {item.min_length}")
        elif isinstance(item, annotated_types.MaxLen):
            parts.append(f"length ≤ {item.max_length}")
        elif isinstance(item, annotated_types.MultipleOf):
            parts.append(f"multiple of {item.multiple_of}")
        else:
            pattern = getattr(item, "pattern", None)
            if pattern is not None:
                parts.append(f"pattern `{pattern}`")
    return ", ".join(parts)


def _bound(value: object) -> str:
    return _number(value) if isinstance(value, int | float) else f"`{value}`"


# --- docstrings ------------------------------------------------------------------------------


def _class_doc(model: type[BaseModel]) -> str:
    doc = model.__dict__.get("__doc__")
    return inspect.cleandoc(doc) if isinstance(doc, str) else ""


@cache
def _attribute_docs(model: type[BaseModel]) -> dict[str, str]:
    """Attribute docstrings (a string right after ``name: type = ...``) of ``model`` and its
    bases, the nearest class winning."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
        node = ast.parse(source).body[0]
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt, after in zip(node.body, node.body[1:], strict=False):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


_ROLE = re.compile(r":(?:mod|data|attr|meth|func|class|obj):`~?([^`]+)`")


def _one_line(text: str) -> str:
    """A docstring as one Markdown line: Sphinx roles as code, RST literals kept."""
    return " ".join(_ROLE.sub(r"`\1`", text).split())


def _cell(text: str) -> str:
    """Escape what would end a table cell (a pipe outside an escape already made)."""
    return re.sub(r"(?<!\\)\|", r"\\|", text)


def _code(text: str) -> str:
    return f"`{text}`" if text.startswith("[") else text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-o", "--output", type=Path, help="write here (default: stdout)")
    args = parser.parse_args(argv)
    page = render()
    if args.output is None:
        sys.stdout.write(page)
    else:
        args.output.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
