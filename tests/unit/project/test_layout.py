"""The package layering of docs/architecture.md holds: no package imports one above it, the
broker, model and sink adapters do not import each other, the producer and the consumer are
siblings over the wire contract, the wire contract imports nothing else of rowbatch, and the
table readers (``rowbatch.tables``) sit between the contract and its users. The installed
package is ``rowbatch`` alone, one real directory (rowbatch/consumer, rowbatch/producer,
rowbatch/tables and rowbatch/wire are folders, not links; no top-level consumer/, producer/ or
wire/ is left, so no module can load under a second name), nothing in it imports the
repository's harness, bench or tests. The old alias modules of the wire contract are gone."""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Collection, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

#: The subpackages of the installed package ``rowbatch`` (real folders under rowbatch/);
#: harness/ and bench/ stay in the repository, out of the wheel.
INSTALLED = ("consumer", "producer", "wire")
#: Its subpackages: those three, top-level folders once (their old names must stay unused), and
#: ``tables``, the table readers, born under rowbatch/.
SUBPACKAGES = (*INSTALLED, "tables")
PACKAGE = ROOT / "rowbatch"
DEV_ONLY = ("harness", "bench", "tests")

#: Lowest first. A module may import its own layer's package or a lower layer, never a higher
#: one; packages on the same layer (the three adapters) may not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("rowbatch.wire", "rowbatch.timing", "rowbatch.tracing", "rowbatch.pubsub_env"),
    ("rowbatch.tables",),
    ("rowbatch.progress",),
    ("rowbatch.consumer.section",),
    ("rowbatch.consumer.observe",),
    ("rowbatch.consumer.sources", "rowbatch.consumer.model", "rowbatch.consumer.sinks"),
    ("rowbatch.consumer.engine", "rowbatch.consumer.dlq"),
    ("rowbatch.consumer.rollout",),
    ("rowbatch.consumer.service",),
    ("rowbatch.producer",),
)


def _package_of(module: str) -> str | None:
    best: str | None = None
    for layer in LAYERS:
        for package in layer:
            if (module == package or module.startswith(package + ".")) and (
                best is None or len(package) > len(best)
            ):
                best = package
    return best


def _rank(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


def _module_name(path: Path) -> str:
    """The installed name of a file or folder under rowbatch/ (``rowbatch.consumer.x``,
    ``rowbatch.timing``)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _sources() -> list[Path]:
    """The wheel's Python files."""
    return sorted(PACKAGE.rglob("*.py"))


def _repository_python_files() -> list[Path]:
    """Every .py file of the checkout but deploy/models (Triton's models, which import nothing of
    rowbatch), venvs and build output."""
    found: list[Path] = []
    for folder, dirs, files in os.walk(ROOT):
        here = Path(folder)
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".")
            and d not in {"build", "dist", "__pycache__", "node_modules"}
            and not d.endswith(".egg-info")
            and here / d != ROOT / "deploy" / "models"
        ]
        found.extend(here / f for f in files if f.endswith(".py"))
    return sorted(found)


def test_no_package_imports_one_above_it() -> None:
    wrong: list[str] = []
    for path in _sources():
        module = _module_name(path)
        own = _package_of(module)
        if own is None:  # rowbatch/consumer/__init__.py, __main__.py: the top, free to import
            continue
        for imported in _imports(path):
            other = _package_of(imported)
            if other is None or other == own:
                continue
            if _rank(other) > _rank(own) or (_rank(other) == _rank(own) and other != own):
                wrong.append(f"{module} imports {imported} ({other} is not below {own})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_wire_contract_imports_nothing_of_rowbatch() -> None:
    for path in (PACKAGE / "wire").rglob("*.py"):
        for imported in _imports(path):
            ours = imported.split(".")[0] in {"rowbatch", *INSTALLED, *DEV_ONLY}
            contract = imported in {"rowbatch", "rowbatch.wire"} or imported.startswith(
                "rowbatch.wire."
            )
            assert contract or not ours, f"{path.name} imports {imported}"


def test_the_producer_and_the_consumer_are_siblings() -> None:
    for own, other in (("producer", "consumer"), ("consumer", "producer")):
        for path in (PACKAGE / own).rglob("*.py"):
            for imported in _imports(path):
                assert not imported.startswith(f"rowbatch.{other}"), (
                    f"{path.relative_to(ROOT)} imports {imported}"
                )


#: The modules no layer holds: the package markers and the consumer's ``python -m`` entry, at the
#: top, free to import anything.
UNLAYERED = {"rowbatch", "rowbatch.consumer", "rowbatch.consumer.__main__"}


def test_the_layering_sees_every_module() -> None:
    """Every module of the wheel is on a layer, so the check above sees its imports (a new
    package or top-level module must be placed in ``LAYERS``)."""
    modules = {_module_name(p) for p in _sources()}
    unplaced = {m for m in modules - UNLAYERED if _package_of(m) is None}
    assert not unplaced, sorted(unplaced)


def test_the_table_readers_sit_between_the_contract_and_its_users() -> None:
    """``rowbatch.tables`` is above the wire contract and below both of its users (the
    producer's ``publish``, the consumer's table mode), and imports nothing of rowbatch but the
    contract."""
    tables = _rank("rowbatch.tables")
    assert _rank("rowbatch.wire") < tables
    assert tables < _rank("rowbatch.consumer.sources") < _rank("rowbatch.producer")
    for path in (PACKAGE / "tables").rglob("*.py"):
        for imported in _imports(path):
            if imported.split(".")[0] in {"rowbatch", *SUBPACKAGES, *DEV_ONLY}:
                ours = imported in {"rowbatch.wire", "rowbatch.tables"} or imported.startswith(
                    ("rowbatch.wire.", "rowbatch.tables.")
                )
                assert ours, f"{path.relative_to(ROOT)} imports {imported}"


def _importing(paths: Iterable[Path], names: Collection[str]) -> list[str]:
    """``file imports module`` for each import in ``paths`` whose top-level name is in ``names``."""
    return [
        f"{path.relative_to(ROOT)} imports {imported}"
        for path in paths
        for imported in _imports(path)
        if imported.split(".")[0] in names
    ]


def test_the_installed_package_imports_no_harness_bench_or_tests() -> None:
    wrong = _importing(_sources(), DEV_ONLY)
    assert not wrong, "\n".join(wrong)


def test_no_code_imports_the_old_top_level_names() -> None:
    """An ``import consumer`` (or ``producer``, ``wire``): the names they had when they were
    top-level folders; nothing provides them now."""
    wrong = _importing(_repository_python_files(), INSTALLED)
    assert not wrong, "\n".join(wrong)


def test_no_module_is_loaded_under_its_old_name() -> None:
    """The same, at run time: whatever the tests imported so far, nothing came in as ``wire``,
    ``consumer`` or ``producer`` (a string import, a subprocess-free plugin...)."""
    import rowbatch.consumer.service.cli
    import rowbatch.producer.cli  # noqa: F401

    old = sorted(m for m in sys.modules if m.split(".")[0] in INSTALLED)
    assert not old, old


def test_rowbatch_is_one_real_directory() -> None:
    """No links: every file has one path (tools that do not follow links, clones with
    ``core.symlinks=false``), and no top-level folder of the old names is left."""
    import rowbatch

    links = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*") if p.is_symlink()]
    assert not links, links
    for name in SUBPACKAGES:
        assert (PACKAGE / name / "__init__.py").is_file(), name
    for name in INSTALLED:
        assert not (ROOT / name).exists(), f"a top-level {name}/ is back"
    assert {p.name for p in PACKAGE.iterdir()} <= {
        *SUBPACKAGES,
        "__init__.py",
        "py.typed",
        "timing.py",
        "progress.py",
        "tracing.py",
        "pubsub_env.py",
        "__pycache__",
    }, (
        "rowbatch/ holds the package marker, its four subpackages, timing.py (clock and "
        "backoff of the producer and the consumer), progress.py (their progress line), "
        "tracing.py and pubsub_env.py (the Pub/Sub environment both sides read)"
    )
    assert Path(rowbatch.__file__).parent.resolve() == PACKAGE


def test_the_contract_has_one_import_path() -> None:
    """The old alias modules (producer.wire, producer.headers...) are gone: one name, one path."""
    for name in ("wire", "errors", "headers", "columns", "codec_json", "codec_arrow"):
        assert not (PACKAGE / "producer" / f"{name}.py").exists(), name


#: The two public facades: the only modules that re-export names defined elsewhere (issue 23).
FACADES = ("rowbatch.wire", "rowbatch.producer")


def _top_level(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    """A module's statements, those under a top-level ``if`` or ``try`` included."""
    for node in body:
        yield node
        if isinstance(node, ast.If | ast.Try):
            nested = [*node.body, *node.orelse]
            if isinstance(node, ast.Try):
                nested += [*node.finalbody, *(s for h in node.handlers for s in h.body)]
            yield from _top_level(nested)


class _ModuleNames:
    """What one module defines, imports (local name -> (module, name)), star-imports and lists
    in a literal ``__all__``."""

    def __init__(self, tree: ast.Module) -> None:
        self.defined: set[str] = set()
        self.imported: dict[str, tuple[str, str]] = {}
        self.explicit: set[str] = set()  # ``from m import x as x``
        self.star: list[str] = []
        self.listed: set[str] = set()
        for node in _top_level(tree.body):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                self.defined.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id == "__all__":
                        value = node.value
                        if isinstance(value, ast.List | ast.Tuple):
                            self.listed |= {
                                e.value
                                for e in value.elts
                                if isinstance(e, ast.Constant) and isinstance(e.value, str)
                            }
                    elif isinstance(target, ast.Name):
                        self.defined.add(target.id)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if alias.name == "*":
                        self.star.append(node.module)
                        continue
                    local = alias.asname or alias.name
                    self.imported[local] = (node.module, alias.name)
                    if alias.asname == alias.name:
                        self.explicit.add(local)


def _exporters() -> dict[tuple[str, str], set[str]]:
    """(defining module, public name) -> every module under rowbatch that exports that name:
    the one defining it and each re-exporting it (imported and listed in ``__all__``, imported
    ``as`` itself, or star-imported)."""
    names = {_module_name(p): _ModuleNames(ast.parse(p.read_text(), str(p))) for p in _sources()}

    def exported(module: str) -> set[str]:
        own = names[module]
        found = {n for n in own.defined if not n.startswith("_")}
        found |= {n for n in own.imported if n in own.listed or n in own.explicit}
        for other in own.star:
            found |= exported(other) if other in names else set()
        return found

    def origin(module: str, name: str) -> tuple[str, str] | None:
        own = names[module]
        if name in own.defined:
            return module, name
        if name in own.imported:
            source, original = own.imported[name]
            return origin(source, original) if source in names else None
        for other in own.star:
            if other in names and name in exported(other):
                return origin(other, name)
        return None

    found: dict[tuple[str, str], set[str]] = {}
    for module in names:
        for name in exported(module):
            home = origin(module, name)
            if home is not None:
                found.setdefault(home, set()).add(module)
    return found


def test_one_name_one_path() -> None:
    """Each public name is exported by the module that defines it and at most one facade of its
    own part (``rowbatch.wire`` for the contract, ``rowbatch.producer`` for the publishing
    library); no other package or module re-exports it, so it has one import path, two at most."""
    wrong: list[str] = []
    for (home, name), modules in sorted(_exporters().items()):
        others = modules - {home}
        fine = len(others) <= 1 and all(m in FACADES and home.startswith(m + ".") for m in others)
        if home not in modules or not fine:
            wrong.append(f"{home}.{name} is exported by {sorted(modules)}")
    assert not wrong, f"{len(wrong)} names with more than one path:\n" + "\n".join(wrong)
