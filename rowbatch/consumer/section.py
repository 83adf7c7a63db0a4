"""``Section``: the base of every settings class (frozen; an unknown field is an error).

Each component owns its settings type beside its code (``sources/kafka/settings.py``,
``sources/pubsub/settings.py``, ``sinks/settings.py``, ``model/settings.py``), validated once,
defaults in one place; ``service/config.py`` only assembles them into the consumer's
configuration tree (the TOML file and ``ROWBATCH_*`` variables)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

MiB = 1024 * 1024


class Section(BaseModel):
    """A config section: frozen, and an unknown field is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")
