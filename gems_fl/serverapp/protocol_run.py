"""What one protocol run produced, in the same form for both model kinds: the model,
its accepted spaces, the rounds, and the models the evaluate round sends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import nn

from gems_fl.geometry.spaces import SummedGramSpace
from gems_fl.protocol.base import ConvexOutcome

__all__ = ["ProtocolRun"]


@dataclass
class ProtocolRun:
    """What one protocol produced, in the same form for both model kinds."""

    gems_model: nn.Module
    model_state: dict[str, np.ndarray]
    outcome: ConvexOutcome  # the accepted spaces of the last (linear) layer and h_G
    rounds: list[dict[str, Any]]
    rejected: list[dict[str, object]]
    node_models: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    local_models: dict[str, nn.Module] | None = None  # Local rows, by node name
    averaged: nn.Module | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def holds_only_sums(self) -> bool:
        """Whether the server kept only the sums of the nodes' Gram statistics."""
        return any(isinstance(r.space, SummedGramSpace) for r in self.outcome.accepted)
