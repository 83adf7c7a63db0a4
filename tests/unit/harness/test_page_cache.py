"""The memory test and bench put the libraries in a known page-cache state first."""

from __future__ import annotations

from pathlib import Path

from harness.page_cache import evict_libraries


def test_evicts_each_shared_library_once_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libx.so.1").write_bytes(b"\0" * 4096)
    (tmp_path / "liby.so").write_bytes(b"\0" * 1024)
    (tmp_path / "lib" / "libx.so").symlink_to(tmp_path / "lib" / "libx.so.1")
    (tmp_path / "notes.txt").write_text("not a library")
    evicted = evict_libraries([tmp_path])
    assert (evicted.files, evicted.bytes) == (2, 5120)
    assert evicted.describe() == "2 shared libraries (0 MiB) evicted"
