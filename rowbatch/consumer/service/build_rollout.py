"""Building a rollout (``[model.candidate]``, :mod:`rowbatch.consumer.rollout`): the
candidate model opened like the production one (its own endpoints' clients and window; its
metrics kept apart), checked to answer the bound outputs with the same types, and the canary or
the shadow (with its comparison table, opened in the sink's store) over it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from rowbatch.consumer.engine.gate import Gate
from rowbatch.consumer.engine.rollout_hooks import Rollout
from rowbatch.consumer.model.handler import ModelHandler
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.model.spec import ModelSpec
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.rollout.canary import Canary
from rowbatch.consumer.rollout.comparison import ComparisonLayout, comparison_spec
from rowbatch.consumer.rollout.metrics import RolloutMetrics
from rowbatch.consumer.rollout.read_table import parquet_root
from rowbatch.consumer.rollout.shadow import Shadow, close_quietly
from rowbatch.consumer.service.build_io import make_sink, open_sink, table_spec
from rowbatch.consumer.service.config import ConsumerConfig, SinkSettings
from rowbatch.consumer.service.startup import StartupError, StillUnavailable
from rowbatch.consumer.sinks.settings import ParquetSinkSettings

log = logging.getLogger(__name__)

SHADOW_BUDGET_SHARE = 8
"""A shadow's backlog holds at most this fraction (1/8) of ``budget_bytes``, taken from what
the pipeline has."""


class CandidateMismatch(StartupError):
    """The candidate does not answer the bound outputs as the production model does."""


@dataclass
class CandidateModel:
    """What the runner's model opening gives back, as the rollout needs it."""

    spec: ModelSpec
    handler: ModelHandler
    in_flight: int
    close: Callable[[], Awaitable[None]]


OpenModel = Callable[[ConsumerConfig, Gate, Metrics], Awaitable[CandidateModel]]
"""Opens ``config.model`` (the candidate's settings) with a gate and metrics."""


@dataclass
class RolloutSide:
    rollout: Rollout
    budget_bytes: int
    """What it takes of ``budget_bytes`` (the pipeline gets the rest)."""
    describe: str
    closers: list[Callable[[], Awaitable[None]]]
    shadow: tuple[Shadow, Callable[[], Awaitable[CandidateModel]]] | None = None
    """A shadow and how to open its candidate (in the background: a candidate that does not
    answer yet holds nothing back)."""
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.shadow is not None:
            self._task = asyncio.create_task(self._shadowing(*self.shadow), name="rowbatch-shadow")

    async def _shadowing(
        self, shadow: Shadow, open_candidate: Callable[[], Awaitable[CandidateModel]]
    ) -> None:
        """The candidate opened (again after each start-up wait that ends unanswered), then
        the shadow run over it; a candidate that cannot serve (another model, other outputs)
        leaves the shadow off, logged."""
        while True:
            try:
                model = await open_candidate()
                break
            except StillUnavailable as exc:
                log.warning("shadow candidate still unavailable, trying again: %s", exc)
            except Exception:
                log.exception("the shadow candidate cannot be used; the shadow is off")
                return
        self.closers.append(model.close)
        await shadow.run(model.handler, model.in_flight)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for close in reversed(self.closers):
            await close()


def check_candidate(
    production: ModelSpec, candidate: ModelSpec, outputs: Mapping[str, str]
) -> None:
    """The candidate answers every bound output with production's datatype and shape."""
    problems = []
    for name in outputs:
        mine, theirs = production.output(name), candidate.output(name)
        assert mine is not None and theirs is not None  # check_binding saw both
        if (mine.datatype, mine.dims) != (theirs.datatype, theirs.dims):
            problems.append(
                f"output {name!r}: production {mine.datatype} {list(mine.dims)}, candidate "
                f"{theirs.datatype} {list(theirs.dims)}"
            )
    if problems:
        raise CandidateMismatch(
            "model.candidate answers the bound outputs differently from the production model "
            "(both results land in one table): " + "; ".join(problems)
        )


async def open_rollout(
    config: ConsumerConfig,
    production: ModelSpec,
    *,
    open_model: OpenModel,
    gate: Gate,
    metrics: Metrics,
) -> RolloutSide | None:
    """The configured rollout, or ``None``. A canary's candidate shares the production gate
    (its outage pauses intake: it serves the results); a shadow's has a gate of its own, so
    nothing it meets holds production back."""
    settings = config.model.candidate
    candidate_settings = config.model.candidate_model()
    if settings is None or candidate_settings is None:
        return None
    if settings.mode == "shadow":  # a fixed window of its own: never the production queue's
        candidate_settings = candidate_settings.model_copy(update={"adapt": False})
    apart = Metrics()  # its endpoints' series kept off the production ones
    candidate_config = config.model_copy(update={"model": candidate_settings})
    watch = RolloutMetrics(metrics.registry, settings.mode, config.binding.outputs.values())
    name = candidate_settings.name
    head = f"candidate {name} as a {settings.mode} of {settings.fraction:.0%} of the rows"

    async def open_candidate(own_gate: Gate) -> CandidateModel:
        model = await open_model(candidate_config, own_gate, apart)
        try:
            check_candidate(production, model.spec, config.binding.outputs)
        except BaseException:
            await model.close()
            raise
        return model

    if settings.mode == "canary":
        model = await open_candidate(gate)
        canary = Canary(
            model.handler,
            settings.fraction,
            settings.salt,
            name,
            model.spec.version,
            metrics=watch,
        )
        return RolloutSide(Rollout(canary=canary), 0, f"{head}", [model.close])
    table = comparison_spec(
        table_spec(config, production), settings.comparison_table(config.sink.table)
    )
    sink = make_sink(_comparison_store(config.sink, table.name))
    await open_sink(sink, table, config.sink)
    share = config.budget_bytes // SHADOW_BUDGET_SHARE
    layout = ComparisonLayout(
        dict(config.binding.outputs),
        tuple(config.binding.passthrough),
        name,
        candidate_settings.version if isinstance(candidate_settings, ModelSettings) else "",
    )
    shadow = Shadow(sink, settings=settings, layout=layout, metrics=watch, max_bytes=share)
    return RolloutSide(
        Rollout(shadow=shadow.offer),
        share,
        f"{head} into table {table.name!r} (backlog up to {settings.backlog_rows} rows, "
        f"{share} bytes)",
        [lambda: close_quietly(sink)],
        (shadow, lambda: open_candidate(Gate(apart))),
    )


def _comparison_store(settings: SinkSettings, table: str) -> SinkSettings:
    """The sink settings of the comparison table: the results' store, and for Parquet (a
    dataset per URL) the dataset beside the results' named ``table``."""
    if not isinstance(settings, ParquetSinkSettings):
        return settings
    try:
        return settings.model_copy(update={"url": parquet_root(settings.url, table)})
    except ValueError as exc:
        raise StartupError(str(exc)) from None
