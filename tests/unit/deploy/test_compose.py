"""docker-compose.yml, checked without a Docker engine: it validates against the Compose
specification's JSON schema (the copy check-jsonschema ships), every host and port the consumers'
config names is a service of the file listening there, the start order is enforced with
healthchecks, Prometheus scrapes every replica, and the image runs the command the tests run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from harness.consumer_process import ConsumerProcess
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.service.config import ConsumerConfig, load_config
from rowbatch.consumer.service.shutdown import CLOSE_MARGIN_S
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.producer.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[3]
COMPOSE = ROOT / "docker-compose.yml"
CONFIG_MOUNT = "/etc/rowbatch/consumer.toml"
BROKERS = ("pubsub", "kafka")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def _services(compose: dict[str, Any]) -> dict[str, Any]:
    services: dict[str, Any] = compose["services"]
    return services


def _interpolate(text: str, broker: str) -> str:
    """Compose's ``${BROKER:-pubsub}`` with ``BROKER`` set to ``broker``."""
    return re.sub(r"\$\{BROKER:-[a-z]+\}", broker, text)


def _env(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items()}


def _config(compose: dict[str, Any], service: str, broker: str) -> tuple[Path, ConsumerConfig]:
    """The config file ``service`` mounts at CONFIG_MOUNT, loaded with the service's env."""
    spec = _services(compose)[service]
    volumes = [_interpolate(v, broker).split(":") for v in spec["volumes"]]
    (mount,) = [v for v in volumes if v[1] == CONFIG_MOUNT]
    path = ROOT / mount[0]
    assert path.is_file(), f"{service} mounts {path}, which does not exist"
    env = {k: v for k, v in _env(spec).items() if k.startswith("ROWBATCH_")}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        return path, load_config(path)


def _listens(compose: dict[str, Any], service: str) -> set[int]:
    """The ports ``service`` listens on inside the network: the container side of its
    published ports, plus Kafka's listeners and the emulator's --host-port."""
    spec = _services(compose)[service]
    ports = {int(str(p).rsplit(":", 1)[-1].split("/")[0]) for p in spec.get("ports", [])}
    listeners = _env(spec).get("KAFKA_LISTENERS", "")
    ports |= {int(p) for p in re.findall(r"://[^:,]*:(\d+)", listeners)}
    ports |= {int(p) for p in re.findall(r"--host-port=[^:]+:(\d+)", str(spec.get("command")))}
    return ports


def _host_port(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def test_validates_against_the_compose_specification(compose: dict[str, Any]) -> None:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((vendor / "compose-spec.json").read_text())
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    errors = sorted(validator_class(schema).iter_errors(compose), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_the_check_jsonschema_command_accepts_it() -> None:
    done = subprocess.run(
        # The venv's console script: the tests may run without the venv on PATH.
        [
            str(Path(sys.executable).with_name("check-jsonschema")),
            "--builtin-schema",
            "vendor.compose-spec",
            str(COMPOSE),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("broker", BROKERS)
def test_every_address_the_config_names_is_a_service_listening_there(
    compose: dict[str, Any], broker: str
) -> None:
    services = _services(compose)
    _, config = _config(compose, "consumer", broker)
    env = _env(services["consumer"])
    assert isinstance(config.model, ModelSettings)
    wanted: list[tuple[str, str]] = [("model.url", config.model.url)]
    source = config.source
    if isinstance(source, PubSubSettings):
        wanted.append(("PUBSUB_EMULATOR_HOST", env["PUBSUB_EMULATOR_HOST"]))
        assert source.subscription.startswith("projects/rowbatch-local/")
        assert "--project=rowbatch-local" in services["pubsub"]["command"]
    else:
        assert isinstance(source, KafkaSettings)
        wanted += [("bootstrap_servers", a) for a in source.bootstrap_servers.split(",")]
        assert source.replication_factor == 1, "the compose stack has one broker"
        assert source.partitions >= services["consumer"]["deploy"]["replicas"]
    dsn = env["ROWBATCH_SINK__DSN"]
    wanted.append(("ROWBATCH_SINK__DSN", re.sub(r"^.*@([^/]+)/.*$", r"\1", dsn)))
    for what, address in wanted:
        host, port = _host_port(address)
        assert host in services, f"{what} names {host}, which is not a compose service"
        assert port in _listens(compose, host), f"{what}: {host} does not listen on {port}"


def test_kafka_advertises_an_address_for_each_side_of_the_network(
    compose: dict[str, Any],
) -> None:
    kafka = _services(compose)["kafka"]
    advertised = dict(
        item.split("://") for item in _env(kafka)["KAFKA_ADVERTISED_LISTENERS"].split(",")
    )
    _, config = _config(compose, "consumer", "kafka")
    assert isinstance(config.source, KafkaSettings)
    assert config.source.bootstrap_servers in advertised.values(), "inside: the service name"
    outside = [a for a in advertised.values() if a.startswith("localhost:")]
    published = {str(p).split(":")[-2] for p in kafka["ports"]}
    assert outside, "the host needs a localhost listener"
    assert all(a.split(":")[1] in published for a in outside)


def test_start_order_uses_health_and_completion(compose: dict[str, Any]) -> None:
    services = _services(compose)
    consumer = services["consumer"]["depends_on"]
    assert consumer["admin"] == {"condition": "service_completed_successfully"}
    assert services["loadgen"]["depends_on"]["admin"]["condition"] == (
        "service_completed_successfully"
    )
    for name in ("triton", "postgres"):
        assert consumer[name] == {"condition": "service_healthy"}
    for name in ("pubsub", "kafka"):
        assert services["admin"]["depends_on"][name] == {"condition": "service_healthy"}
    for name, spec in services.items():
        for dependency, how in (spec.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on undefined {dependency}"
            if how["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"


def test_two_consumer_replicas_write_to_postgres_and_drain_before_sigkill(
    compose: dict[str, Any],
) -> None:
    consumer = _services(compose)["consumer"]
    assert consumer["deploy"]["replicas"] == 2
    assert "ports" not in consumer, "two replicas cannot publish the same host port"
    for broker in BROKERS:
        _, config = _config(compose, "consumer", broker)
        assert config.sink.kind == "postgres"
        assert config.server.host == "0.0.0.0"
        grace = float(consumer["stop_grace_period"].rstrip("s"))
        assert grace > config.shutdown_grace_s + CLOSE_MARGIN_S  # the drain, then the close
        assert f":{config.server.port}/readyz" in " ".join(consumer["healthcheck"]["test"])


def test_prometheus_scrapes_every_consumer_replica(compose: dict[str, Any]) -> None:
    services = _services(compose)
    mount = services["prometheus"]["volumes"][0].split(":")
    assert mount[1] == "/etc/prometheus/prometheus.yml"
    scrape = yaml.safe_load((ROOT / mount[0]).read_text())
    (job,) = [j for j in scrape["scrape_configs"] if j["job_name"] == "rowbatch-consumer"]
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["consumer"], "the service name resolves to every replica"
    assert job["metrics_path"] == "/metrics"
    for broker in BROKERS:
        _, config = _config(compose, "consumer", broker)
        assert sd["port"] == config.server.port


def _dockerfile_argv() -> list[str]:
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    entry = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.MULTILINE)
    cmd = re.search(r"^CMD (\[.*\])$", text, re.MULTILINE)
    assert entry and cmd
    argv: list[str] = json.loads(entry.group(1)) + json.loads(cmd.group(1))
    return argv


def test_the_image_runs_the_command_the_tests_run(
    compose: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = _dockerfile_argv()
    assert argv == ["rowbatch-consumer", "run", "--config", CONFIG_MOUNT]
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'rowbatch-consumer = "rowbatch.consumer.service.cli:entry"' in pyproject
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "COPY rowbatch rowbatch" in dockerfile
    for old in ("wire", "consumer", "producer"):
        assert f"COPY {old} " not in dockerfile, f"{old}/ is under rowbatch/ now"
    assert "COPY harness" not in dockerfile, "the image installs the wheel's package alone"

    started: list[list[str]] = []

    class Popen:
        def __init__(self, args: list[str], **_: object) -> None:
            started.append(args)

        def poll(self) -> int:
            return 0  # "exited": stop() only closes the log

    monkeypatch.setattr(subprocess, "Popen", Popen)
    proc = ConsumerProcess("c", tmp_path / "c.toml", tmp_path / "c.log", 0)
    proc.start()
    proc.stop()
    (test_argv,) = started
    assert test_argv[1:3] == ["-m", "rowbatch.consumer"], "python -m rowbatch.consumer is it"
    assert test_argv[3:5] == argv[1:3] and test_argv[5] == str(tmp_path / "c.toml")
    assert "command" not in _services(compose)["consumer"], "the image's command is used"


def test_admin_and_loadgen_commands_parse(compose: dict[str, Any]) -> None:
    services = _services(compose)
    assert services["admin"]["command"] == ["admin", "ensure", "--config", CONFIG_MOUNT]
    for broker in BROKERS:
        path_admin, _ = _config(compose, "admin", broker)
        path_consumer, _ = _config(compose, "consumer", broker)
        assert path_admin == path_consumer, "admin ensure reads the consumers' config"
    loadgen = services["loadgen"]
    assert loadgen["entrypoint"] == ["rowbatch-producer"]
    for broker in BROKERS:
        args = build_parser().parse_args([_interpolate(a, broker) for a in loadgen["command"]])
        assert args.broker == broker
        _, config = _config(compose, "consumer", broker)
        source = config.source
        if isinstance(source, PubSubSettings):
            project = _env(loadgen)["PUBSUB_PROJECT_ID"]
            assert source.topic == f"projects/{project}/topics/{args.topic}"
        else:
            assert isinstance(source, KafkaSettings)
            assert source.topic == args.topic
            assert _env(loadgen)["KAFKA_BOOTSTRAP_SERVERS"] == source.bootstrap_servers


def test_prometheus_loads_the_alert_rules(compose: dict[str, Any]) -> None:
    service = _services(compose)["prometheus"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in service["volumes"])
    assert mounts["./deploy/prometheus/rules"] == "/etc/prometheus/rules"
    config_file = ROOT / mounts_key(mounts, "/etc/prometheus/prometheus.yml")
    scrape = yaml.safe_load(config_file.read_text())
    (pattern,) = scrape["rule_files"]
    assert pattern.startswith("/etc/prometheus/rules/")
    glob = pattern.removeprefix("/etc/prometheus/rules/")
    loaded = sorted(p.name for p in (ROOT / "deploy/prometheus/rules").glob(glob))
    assert loaded == ["rowbatch.rules.yml"], "the rules, not their promtool tests"


def mounts_key(mounts: dict[str, str], target: str) -> str:
    return next(src for src, dst in mounts.items() if dst == target)


def test_the_build_passes_the_base_image_by_digest(compose: dict[str, Any]) -> None:
    """The Dockerfile has no default base and refuses a tag alone: every service built from it
    passes PYTHON_BASE, from a variable compose requires (``:?``) rather than a floating tag."""
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_BASE$", dockerfile, re.MULTILINE), "no default in the file"
    built = {n: s["build"] for n, s in _services(compose).items() if "build" in s}
    assert built, "the consumers' image is built by compose"
    for name, build in built.items():
        assert build["dockerfile"] == "deploy/Dockerfile", name
        value = build["args"]["PYTHON_BASE"]
        match = re.fullmatch(r"\$\{(\w+):\?([^}]*)\}", value)
        assert match, f"{name}: PYTHON_BASE is {value!r}, not a required variable"
        assert "@sha256:" in match.group(2), "the error says to name the base by digest"
