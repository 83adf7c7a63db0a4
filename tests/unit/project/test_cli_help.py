"""Every command line's --help is plain text: no reST markup (double backquotes, roles such as
:func:) that a terminal would show literally, a description, and, for the commands a user
runs (rowbatch-consumer, rowbatch-producer and its subcommands, python -m harness), help for
every argument."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable

import pytest

from bench.help_text import description
from rowbatch.consumer.rollout.compare_cli import build_parser as compare_parser

MARKUP = re.compile(r"``|:[a-z]+:`")


def help_of(call: Callable[[], object], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``call`` prints for --help (it exits 0)."""
    with pytest.raises(SystemExit) as done:
        call()
    assert done.value.code == 0
    return capsys.readouterr().out


def assert_plain(text: str, name: str) -> None:
    assert text.strip(), f"{name}: no help"
    found = MARKUP.findall(text)
    assert not found, f"{name} --help shows markup {found}:\n{text}"


def _consumer_parser() -> argparse.ArgumentParser:
    from rowbatch.consumer.service.cli import build_parser

    return build_parser()


def _producer_parsers() -> dict[str, argparse.ArgumentParser]:
    from rowbatch.producer.cli.parser import build_parser

    parser = build_parser()
    found = {"rowbatch-producer": parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[f"rowbatch-producer {name}"] = sub
    return found


def _dlq_parser() -> argparse.ArgumentParser:
    from rowbatch.consumer.service.dlq_cli import build_parser

    return build_parser()


def _consumer_command_parsers() -> dict[str, argparse.ArgumentParser]:
    from rowbatch.consumer.service.cli import COMMANDS, command_parser

    return {f"rowbatch-consumer {name}": command_parser(name) for name in COMMANDS}


def _user_parsers() -> dict[str, argparse.ArgumentParser]:
    return {
        "rowbatch-consumer": _consumer_parser(),
        **_consumer_command_parsers(),
        "rowbatch-consumer dlq": _dlq_parser(),
        "rowbatch-consumer compare": compare_parser(),
        **_producer_parsers(),
    }


@pytest.mark.parametrize("name", sorted(_user_parsers()))
def test_user_commands_help_is_plain_with_help_for_every_argument(name: str) -> None:
    parser = _user_parsers()[name]
    text = parser.format_help()
    assert_plain(text, name)
    assert parser.description, f"{name}: no description"
    silent = [
        "/".join(a.option_strings) or a.dest
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction) and not a.help
    ]
    assert not silent, f"{name}: arguments without help: {silent}"


def test_consumer_help_lists_the_commands_and_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rowbatch.consumer.service.cli import main

    text = help_of(lambda: main(["--help"]), capsys)
    assert_plain(text, "rowbatch-consumer")
    for needle in ("run --config FILE", "check --config FILE", "admin ensure --config FILE"):
        assert needle in text
    assert "exit codes:" in text
    assert "PUBSUB_EMULATOR_HOST" in text
    assert "COMMAND --help" in text  # says where each command's own help is


def test_table_help_is_the_table_commands_own(capsys: pytest.CaptureFixture[str]) -> None:
    """``table --help`` shows what table accepts and does, not the general help."""
    from rowbatch.consumer.service.cli import main

    general = help_of(lambda: main(["--help"]), capsys)
    text = help_of(lambda: main(["table", "--help"]), capsys)
    assert text != general
    assert_plain(text, "rowbatch-consumer table")
    assert text.startswith("usage: rowbatch-consumer table [-h] [--config FILE]")
    for option in ("--config FILE", "--input PATH_OR_URL", "--shard K/N", "--new-run"):
        assert option in text
    assert "--summary FILE" in text
    for field in ("chunk_rows", "state", "shards", "schema"):  # [source] kind = "table"
        assert field in text
    assert "exit codes:" in text and "4 the end was reached" in text
    for other in ("--dry-run", "--timeout", "check --config", "admin ensure"):
        assert other not in text  # another command's
    # either word order, other options before it, and -h
    assert help_of(lambda: main(["--config", "x.toml", "table", "-h"]), capsys) == text
    assert help_of(lambda: main(["--help", "table"]), capsys) == text


@pytest.mark.parametrize(
    ("argv", "accepts", "not_accepted"),
    [
        (["run", "--help"], ["--config FILE"], ["--input", "--shard", "--dry-run"]),
        (["check", "--help"], ["--config FILE"], ["--input", "--new-run", "--timeout"]),
        (
            ["admin", "ensure", "--help"],
            ["--config FILE", "--dry-run", "--timeout SECONDS", "{ensure}"],
            ["--input", "--summary"],
        ),
    ],
)
def test_every_command_has_its_own_help(
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    accepts: list[str],
    not_accepted: list[str],
) -> None:
    from rowbatch.consumer.service.cli import main

    text = help_of(lambda: main(argv), capsys)
    assert text.startswith(f"usage: rowbatch-consumer {argv[0]} ")
    assert_plain(text, f"rowbatch-consumer {argv[0]}")
    assert "exit codes:" in text
    for option in accepts:
        assert option in text
    for option in not_accepted:
        assert option not in text


def test_a_command_word_given_as_an_options_value_is_not_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--config table --help``: ``table`` is the file's name; no command: the general help."""
    from rowbatch.consumer.service.cli import main

    general = help_of(lambda: main(["--help"]), capsys)
    assert help_of(lambda: main(["--config", "table", "--help"]), capsys) == general


def test_harness_help_is_plain(capsys: pytest.CaptureFixture[str]) -> None:
    from harness.__main__ import main

    text = help_of(lambda: main(["--help"]), capsys)
    assert_plain(text, "python -m harness")
    assert "up" in text and "demo" in text


def _bench_helps() -> dict[str, Callable[[], object]]:
    from bench import chaos, cite, cli, multi_endpoint, naive, pubsub_intake, reference
    from bench.autoscale import cli as autoscale
    from bench.autoscale_real import cli as autoscale_real

    return {
        "python -m bench": lambda: cli.parse_args(["--help"]),
        "python -m bench chaos": lambda: chaos.parse_args(["--help"]),
        "python -m bench autoscale": lambda: autoscale.parse_args(["--help"]),
        "python -m bench autoscale_real": lambda: autoscale_real.main(["--help"]),
        "python -m bench multi_endpoint": lambda: multi_endpoint.main(["--help"]),
        "python -m bench.naive": lambda: naive.main(["--help"]),
        "python -m bench.pubsub_intake": lambda: pubsub_intake.main(["--help"]),
        "python -m bench.reference": lambda: reference.main(["--help"]),
        "python -m bench.cite": lambda: cite.main(["--help"]),
    }


@pytest.mark.parametrize(
    "name",
    [
        "python -m bench",
        "python -m bench chaos",
        "python -m bench autoscale",
        "python -m bench autoscale_real",
        "python -m bench multi_endpoint",
        "python -m bench.naive",
        "python -m bench.pubsub_intake",
        "python -m bench.reference",
        "python -m bench.cite",
    ],
)
def test_bench_help_is_plain(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert_plain(help_of(_bench_helps()[name], capsys), name)


def test_bench_hot_path_help_is_plain(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.hot_path import cli

    monkeypatch.setattr(sys, "argv", ["python -m bench.hot_path", "--help"])
    assert_plain(help_of(cli.main, capsys), "python -m bench.hot_path")


def test_descriptions_from_docstrings_drop_the_markup() -> None:
    doc = """``python -m bench x``: runs :func:`bench.x.run` on
    ``rowbatch-consumer run``.

    More detail."""
    assert description(doc) == "python -m bench x: runs bench.x.run on rowbatch-consumer run."
    assert description(None) == ""


def test_every_console_script_names_a_function() -> None:
    """``[project.scripts]`` targets resolve to callables, not to a module of the same name
    (``rowbatch.producer.cli:main`` named the submodule ``main`` once the package stopped
    re-exporting the function)."""
    import importlib
    import inspect
    import tomllib

    from harness.service import REPO_ROOT

    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"rowbatch-consumer", "rowbatch-producer"}
    for name, target in scripts.items():
        module, _, attr = target.partition(":")
        function = getattr(importlib.import_module(module), attr)
        assert inspect.isfunction(function), f"{name} = {target} is {function!r}"
