"""The package layering of docs/architecture.md holds: no package imports one above it, the
broker, model and sink adapters do not import each other, and the wire contract imports
nothing else of rowbatch. The old alias modules of the wire contract are gone."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The repository folders the installed package ``rowbatch`` is made of (rowbatch/<name> links
#: to ../<name>); harness/ and bench/ stay in the repository, out of the wheel.
INSTALLED = ("consumer", "producer", "wire")
DEV_ONLY = ("harness", "bench", "tests")

#: Lowest first. A module may import its own layer's package or a lower layer, never a higher
#: one; packages on the same layer (the three adapters) may not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("rowbatch.wire",),
    ("rowbatch.consumer.observe",),
    ("rowbatch.consumer.sources", "rowbatch.consumer.model", "rowbatch.consumer.sinks"),
    ("rowbatch.consumer.engine",),
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
    """The installed name of a file of consumer/, producer/ or wire/ (``rowbatch.consumer.x``)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("rowbatch", *(parts[:-1] if parts[-1] == "__init__" else parts)))


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
    """The wheel's Python files, each once (from the real folders, not through rowbatch/'s
    links)."""
    return sorted(
        [ROOT / "rowbatch" / "__init__.py"]
        + [p for top in INSTALLED for p in (ROOT / top).rglob("*.py")]
    )


def test_no_package_imports_one_above_it() -> None:
    wrong: list[str] = []
    for path in _sources():
        module = _module_name(path)
        own = _package_of(module)
        if own is None:  # consumer/__init__.py, consumer/__main__.py: the top, free to import
            continue
        for imported in _imports(path):
            other = _package_of(imported)
            if other is None or other == own:
                continue
            if _rank(other) > _rank(own) or (_rank(other) == _rank(own) and other != own):
                wrong.append(f"{module} imports {imported} ({other} is not below {own})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_wire_contract_imports_nothing_of_rowbatch() -> None:
    for path in (ROOT / "wire").rglob("*.py"):
        for imported in _imports(path):
            ours = imported.split(".")[0] in {"rowbatch", *INSTALLED, *DEV_ONLY}
            contract = imported in {"rowbatch", "rowbatch.wire"} or imported.startswith(
                "rowbatch.wire."
            )
            assert contract or not ours, f"{path.name} imports {imported}"


def test_the_layering_sees_every_consumer_package() -> None:
    packages = {
        _module_name(p.parent) for p in (ROOT / "consumer").rglob("__init__.py") if p.parent.name
    }
    unplaced = {p for p in packages if p != "rowbatch.consumer" and _package_of(p) is None}
    assert not unplaced


def test_the_contract_has_one_import_path() -> None:
    """The old alias modules (producer.wire, producer.headers...) are gone: one name, one path."""
    for name in ("wire", "errors", "headers", "columns", "codec_json", "codec_arrow"):
        assert not (ROOT / "producer" / f"{name}.py").exists(), name
