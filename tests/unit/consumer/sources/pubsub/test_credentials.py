"""Without Google credentials and without PUBSUB_EMULATOR_HOST, the producer and the consumer
(run, check, admin ensure) fail with one line of rowbatch's own naming what to set, exit 2,
never google-auth's traceback; and messages name the emulator's host:port when it is set.

Credentials are looked up through fakes (an injected lookup, or ``google.auth.default``
replaced), so nothing here asks a metadata server or reads a key file."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import google.auth
import pytest
from google.auth.exceptions import DefaultCredentialsError

from rowbatch.consumer.service import admin as service_admin
from rowbatch.consumer.service import cli as consumer_cli
from rowbatch.consumer.service import logs as consumer_logs
from rowbatch.consumer.service.build_io import check_source_credentials
from rowbatch.consumer.sources.base import SourceConfigError
from rowbatch.consumer.sources.pubsub.admin import GooglePubSubAdmin
from rowbatch.consumer.sources.pubsub.clients import (
    check_credentials,
    client_address,
    default_async_subscriber,
    default_publisher,
    default_subscriber,
)
from rowbatch.consumer.sources.pubsub.errors import PubSubCredentialsError
from rowbatch.consumer.sources.pubsub.pull import LibraryClients, PubSubPullSource
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.producer.cli.main import main as producer_main
from rowbatch.producer.publishers.errors import PublisherConfigError
from rowbatch.producer.publishers.pubsub import PubSubPublisher
from rowbatch.pubsub_env import (
    credentials_message,
    emulator_host,
    missing_credentials,
    project_of,
    pubsub_address,
)
from tests.pubsub_consumer_config import pubsub_consumer_config

NOT_FOUND = (
    "Your default credentials were not found. To set up Application Default Credentials, see "
    "https://cloud.google.com/docs/authentication/external/set-up-adc for more information."
)
SUBSCRIPTION = "projects/proj-a/subscriptions/rows-sub"


def credentials_error(text: str) -> DefaultCredentialsError:
    return DefaultCredentialsError(text)  # type: ignore[no-untyped-call]


def no_credentials(*_args: object, **_kwargs: object) -> NoReturn:
    raise credentials_error(NOT_FOUND)


def found_credentials() -> object:
    return ("fake-credentials", "proj-a")


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No emulator, no key file, and google-auth's own lookup replaced by "not found"."""
    for name in ("PUBSUB_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    monkeypatch.setattr(google.auth, "default", no_credentials)
    yield


def assert_names_what_to_set(message: str, project: str | None = "proj-a") -> None:
    assert "\n" not in message
    assert "GOOGLE_APPLICATION_CREDENTIALS" in message
    assert "PUBSUB_EMULATOR_HOST=host:port" in message
    assert "gcloud auth application-default login" in message
    if project is not None:
        assert f"project '{project}'" in message


# --- the shared wording (rowbatch.pubsub_env)
# -----------------------------------------------------


def test_emulator_host_and_address_come_from_the_environment() -> None:
    assert emulator_host({}) is None
    assert emulator_host({"PUBSUB_EMULATOR_HOST": "  "}) is None
    assert emulator_host({"PUBSUB_EMULATOR_HOST": "127.0.0.1:8085"}) == "127.0.0.1:8085"
    assert pubsub_address({"PUBSUB_EMULATOR_HOST": "127.0.0.1:8085"}) == "127.0.0.1:8085"
    assert pubsub_address({}) == "pubsub.googleapis.com"


def test_project_of_a_path() -> None:
    assert project_of(SUBSCRIPTION) == "proj-a"
    assert project_of("projects/p/topics/t") == "p"
    assert project_of("rows") is None
    assert project_of(None) is None


def test_no_credentials_names_the_project_and_what_to_set() -> None:
    message = missing_credentials("proj-a", lookup=no_credentials, environ={})
    assert message == (
        "no Google Cloud credentials for Pub/Sub project 'proj-a': set "
        "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, run `gcloud auth "
        "application-default login`, or set PUBSUB_EMULATOR_HOST=host:port for the emulator"
    )
    assert "https://" not in message  # google-auth's generic text is replaced, not quoted


def test_a_bad_key_file_is_named_with_google_auths_reason() -> None:
    def missing_file() -> NoReturn:
        raise credentials_error("File /keys/sa.json was not found.")

    env = {"GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json"}
    message = missing_credentials("proj-a", lookup=missing_file, environ=env)
    assert message is not None
    assert "GOOGLE_APPLICATION_CREDENTIALS=/keys/sa.json: File /keys/sa.json was not found." in (
        message
    )
    assert_names_what_to_set(message)


def test_another_reason_is_quoted_on_one_line() -> None:
    message = credentials_message(None, credentials_error("bad\nADC file:\n  not JSON"), {})
    assert "(bad ADC file: not JSON)" in message
    assert "project" not in message
    assert_names_what_to_set(message, project=None)


def test_found_credentials_or_an_emulator_need_nothing() -> None:
    assert missing_credentials("p", lookup=found_credentials, environ={}) is None
    calls: list[int] = []

    def counted() -> NoReturn:
        calls.append(1)
        no_credentials()

    emulator = {"PUBSUB_EMULATOR_HOST": "127.0.0.1:8085"}
    assert missing_credentials("p", lookup=counted, environ=emulator) is None
    assert calls == []  # the emulator needs no credentials: none are looked up


def test_other_errors_of_the_lookup_are_not_hidden() -> None:
    def broken() -> NoReturn:
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError, match="bug"):
        missing_credentials("p", lookup=broken, environ={})


# --- the consumer -------------------------------------------------------------------------------


def test_check_credentials_is_a_configuration_error(bare_env: None) -> None:
    with pytest.raises(PubSubCredentialsError) as caught:
        check_credentials("proj-a", lookup=no_credentials)
    assert isinstance(caught.value, SourceConfigError)
    assert_names_what_to_set(str(caught.value))
    check_credentials("proj-a", lookup=found_credentials)


@pytest.mark.parametrize(
    "make", [default_subscriber, default_publisher], ids=["subscriber", "publisher"]
)
def test_clients_without_credentials_raise_ours(
    bare_env: None, make: Callable[[str | None], Any]
) -> None:
    with pytest.raises(PubSubCredentialsError) as caught:
        make("proj-a")
    assert_names_what_to_set(str(caught.value))
    assert caught.value.__cause__ is None  # google-auth's traceback is not chained in


async def test_the_async_subscriber_without_credentials_raises_ours(bare_env: None) -> None:
    with pytest.raises(PubSubCredentialsError, match="project 'proj-a'"):
        default_async_subscriber("proj-a")


def test_the_pull_source_without_credentials_raises_ours(bare_env: None) -> None:
    with pytest.raises(PubSubCredentialsError, match="project 'proj-a'"):
        PubSubPullSource(PubSubSettings(subscription=SUBSCRIPTION, dead_letter_topic=None))


def test_the_service_checks_a_pubsub_source_only(bare_env: None) -> None:
    with pytest.raises(PubSubCredentialsError, match="project 'proj-a'"):
        check_source_credentials(PubSubSettings(subscription=SUBSCRIPTION))


def test_admin_without_credentials_is_a_configuration_error(bare_env: None) -> None:
    with pytest.raises(PubSubCredentialsError, match="project 'proj-a'"):
        GooglePubSubAdmin(timeout_s=1, project="proj-a")


def consumer_config(tmp_path: Path) -> Path:
    return pubsub_consumer_config(tmp_path, "proj-a")


@pytest.mark.parametrize("command", ["run", "check"])
def test_consumer_run_and_check_fail_at_once_with_one_line(
    bare_env: None,
    command: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[object] = []
    monkeypatch.setattr(consumer_cli, "run_bounded", started.append)
    monkeypatch.setattr(consumer_logs, "configure", lambda *_: None)  # keep pytest's logging
    code = consumer_cli.main([command, "--config", str(consumer_config(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2
    assert started == []  # before waiting for the model server or the sink
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: no Google Cloud credentials for Pub/Sub project 'proj-a'")
    assert_names_what_to_set(lines[0])


def test_admin_ensure_without_credentials_exits_2(bare_env: None, tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = service_admin.ensure_broker(consumer_config(tmp_path), out=out, err=err)
    assert code == service_admin.EXIT_CONFIG == 2
    assert out.getvalue() == ""
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: no Google Cloud credentials")
    assert_names_what_to_set(lines[0])


class FakeTarget:
    """A client on an emulator channel still reports Google's endpoint as its target."""

    target = "pubsub.googleapis.com:443"


def test_messages_name_the_emulator_not_googles_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:8085")
    assert client_address(FakeTarget()) == "127.0.0.1:8085"
    source = PubSubPullSource(
        PubSubSettings(subscription=SUBSCRIPTION, dead_letter_topic=None),
        clients=LibraryClients(subscriber=FakeTarget()),
    )
    assert source.host == "127.0.0.1:8085"
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST")
    assert client_address(FakeTarget()) == "pubsub.googleapis.com:443"


# --- the producer -------------------------------------------------------------------------------


async def test_the_publisher_checks_credentials_before_making_a_client(bare_env: None) -> None:
    publisher = PubSubPublisher("rows", project="proj-a", credentials=no_credentials)
    try:
        with pytest.raises(PublisherConfigError) as caught:
            await publisher.start()
    finally:
        await publisher.close()
    assert caught.value.topic == "projects/proj-a/topics/rows"
    assert caught.value.address == "pubsub.googleapis.com"
    assert_names_what_to_set(str(caught.value))


def test_the_publisher_names_the_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:8085")
    assert PubSubPublisher("rows", project="p").address == "127.0.0.1:8085"
    given = PubSubPublisher("rows", project="p", emulator_host="127.0.0.1:9999")
    assert given.address == "127.0.0.1:9999"
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST")
    assert PubSubPublisher("rows", project="p").address == "pubsub.googleapis.com"


@pytest.mark.parametrize("command", [["loadgen", "--rows", "10"], ["publish", "--file", "x.csv"]])
def test_producer_without_credentials_exits_2_with_one_line(
    bare_env: None, command: list[str], tmp_path: Path
) -> None:
    (tmp_path / "x.csv").write_text("id\n1\n")
    argv = [*command, "--broker", "pubsub", "--project", "proj-a", "--topic", "rows"]
    argv = [str(tmp_path / a) if a == "x.csv" else a for a in argv]
    out, err = io.StringIO(), io.StringIO()
    code = producer_main(argv, stdout=out, stderr=err)
    assert code == 2
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1, err.getvalue()
    assert lines[0].startswith(f"rowbatch-producer {command[0]}: error: no Google Cloud ")
    assert_names_what_to_set(lines[0])
