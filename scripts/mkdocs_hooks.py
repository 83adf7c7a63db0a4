"""MkDocs hooks (``hooks:`` in mkdocs.yml) of the docs site.

- The configuration reference (``configuration-reference.md``) is generated from the settings
  models at every build (``scripts/config_reference.py``): it is never a file in docs/, so it
  cannot drift from the code.
- Links from a page to a repository file outside docs/ (``../deploy/consumer.example.toml``,
  which GitHub renders) cannot resolve inside the site. Each is checked: a target missing from
  the checkout is a warning, so ``strict`` fails the build, as MkDocs does for a missing page
  or anchor. A file that exists is copied into the site under ``repository/`` and the link
  points there; a folder or a Markdown file (which would become a page of its own) links to
  ``repo_url`` when mkdocs.yml sets one, else the link becomes its text plus the path in code.

Links between pages are left to MkDocs' own validation (mkdocs.yml ``validation:``).
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

import config_reference  # beside this file: MkDocs puts the hook's folder on sys.path to load it
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.plugins import get_plugin_logger
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

log = get_plugin_logger("rowbatch-docs")

SITE_REPOSITORY_DIR = "repository"
"""Where repository files linked from pages are copied in the site."""

# Fenced code, inline code, or an inline link/image: code is matched first so a link-like text
# inside it is left alone.
_MARKDOWN = re.compile(
    r"(?P<fence>^[ \t]*(?P<mark>`{3,}|~{3,})[^\n]*\n.*?^[ \t]*(?P=mark)[ \t]*$)"
    r"|(?P<code>(?P<ticks>`+).+?(?P=ticks))"
    r"|(?P<bang>!?)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)",
    re.MULTILINE | re.DOTALL,
)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    page = config_reference.PAGE
    if files.get_file_from_path(page) is not None:
        raise PluginError(
            f"docs/{page} exists, but that page is generated from the settings models "
            f"(scripts/config_reference.py): remove or rename the file"
        )
    files.append(File.generated(config, page, content=config_reference.render()))
    for doc in list(files.documentation_pages()):
        for target in _outside_targets(doc, config):
            uri = f"{SITE_REPOSITORY_DIR}/{target}"
            if files.get_file_from_path(uri) is None:
                source = _repo_root(config) / target
                files.append(File.generated(config, uri, abs_src_path=str(source)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, **_: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group("target") is None:
            return match.group(0)
        return _rewrite(match, page.file, config)

    return _MARKDOWN.sub(replace, markdown)


def _repo_root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def _outside(target: str, doc: File, config: MkDocsConfig) -> str | None:
    """The repository path (POSIX, from the root) of a relative link ``target`` of page
    ``doc`` that leaves docs/; None for any other link."""
    path = target.split("#", 1)[0].split("?", 1)[0]
    if not path or _SCHEME.match(path) or path.startswith("/"):
        return None
    docs = Path(config.docs_dir).resolve()
    root = _repo_root(config)
    resolved = Path(posixpath.normpath(posixpath.join(posixpath.dirname(doc.src_uri), path)))
    absolute = Path(posixpath.normpath((docs / resolved).as_posix()))
    if absolute.is_relative_to(docs) or not absolute.is_relative_to(root):
        return None
    return absolute.relative_to(root).as_posix() + ("/" if path.endswith("/") else "")


def _copyable(repo_path: str, config: MkDocsConfig) -> bool:
    source = _repo_root(config) / repo_path
    return source.is_file() and not repo_path.endswith(".md")


def _outside_targets(doc: File, config: MkDocsConfig) -> set[str]:
    """Repository files outside docs/ that page ``doc`` links to and the site can carry."""
    found: set[str] = set()
    for match in _MARKDOWN.finditer(doc.content_string):
        target = match.group("target")
        repo_path = None if target is None else _outside(target, doc, config)
        if repo_path is not None and _copyable(repo_path, config):
            found.add(repo_path)
    return found


def _rewrite(match: re.Match[str], doc: File, config: MkDocsConfig) -> str:
    target = match.group("target")
    repo_path = _outside(target, doc, config)
    if repo_path is None:
        return match.group(0)
    fragment = "#" + target.split("#", 1)[1] if "#" in target else ""
    bang, text, title = match.group("bang"), match.group("text"), match.group("title") or ""
    source = _repo_root(config) / repo_path
    if not source.exists():
        log.warning(
            "Doc file '%s' contains a link '%s' to '%s', which is not in the repository.",
            doc.src_uri,
            target,
            repo_path,
        )
        return text  # the warning above fails the build; MkDocs need not warn again
    if _copyable(repo_path, config):
        site_path = f"{SITE_REPOSITORY_DIR}/{repo_path}"
        relative = posixpath.relpath(site_path, posixpath.dirname(doc.src_uri) or ".")
        return f"{bang}[{text}]({relative}{fragment}{title})"
    if config.repo_url:
        kind = "tree" if source.is_dir() else "blob"
        url = f"{config.repo_url.rstrip('/')}/{kind}/HEAD/{repo_path}{fragment}"
        return f"{bang}[{text}]({url}{title})"
    shown = repo_path.rstrip("/") + ("/" if source.is_dir() else "")
    if text.strip("`").rstrip("/") == shown.rstrip("/"):
        return f"`{shown}`"
    return f"{text} (`{shown}` in the repository)"
