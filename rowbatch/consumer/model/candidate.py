"""``[model.candidate]``: a second model version run beside the production one over the same
rows, as a **shadow** (every row, or a share chosen by the row key, also goes to the candidate;
its answers land in a comparison table, never in the results) or a **canary** (a share of the
rows, chosen by the row key, is answered by the candidate and written to the result table
with the version that answered). docs/rollout.md.

Every field of ``[model]`` may be given here too: the candidate is the production model with
those fields replaced (``version = "2"``, another ``name``, another ``url``: another endpoint
set). The fields of the rollout itself are :class:`CandidateSettings`'."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from rowbatch.consumer.section import Section


class CandidateSettings(Section):
    """The rollout's own fields; any other field is one of ``[model]``'s, replaced for the
    candidate (checked when the configuration loads)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    mode: Literal["shadow", "canary"]
    share: float | None = Field(default=None, gt=0, le=1)
    """The share of rows the candidate sees, chosen by a hash of the row key (chunk id and row
    index: a redelivered row lands in the same arm, and a larger share keeps every row of a
    smaller one). Shadow: default 1 (every row); canary: required."""
    salt: str = ""
    """Mixed into the key hash: another salt picks another subset of the same share."""
    table: str = ""
    """Shadow: the comparison table, in the sink's store (default: the result table's name
    with ``_candidate`` appended)."""
    backlog_rows: int = Field(default=4096, ge=1)
    """Shadow: most rows waiting for the candidate (answered by the production model, not yet
    by the candidate, or not yet written to the comparison table); rows past it are skipped
    and counted (``rowbatch_rollout_rows_total{arm="candidate",outcome="skipped"}``), never
    waited for."""
    timeout_s: float = Field(default=10.0, gt=0)
    """Shadow: a candidate request taking longer fails (its rows are written to the
    comparison table with the error) and is not retried."""

    @model_validator(mode="after")
    def _share_for_canary(self) -> CandidateSettings:
        if self.mode == "canary" and self.share is None:
            raise ValueError(
                "a canary needs model.candidate.share: the share of rows (0 < share <= 1) the "
                "candidate answers"
            )
        return self

    @property
    def fraction(self) -> float:
        """The share of rows the candidate sees."""
        return 1.0 if self.share is None else self.share

    def overrides(self) -> dict[str, Any]:
        """The ``[model]`` fields replaced for the candidate."""
        return dict(self.model_extra or {})

    def comparison_table(self, result_table: str) -> str:
        """The shadow's comparison table name."""
        return self.table or f"{result_table}_candidate"
