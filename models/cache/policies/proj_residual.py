"""proj_residual: a token is scored when it arrives by R_j = |P_j k~_j - kbar_j| (its unit key against the running
mean of the unit keys so far; high = hard for a linear state: models.training.diagnostics.projection_residual). The running
mean is the op's state (RetentionState.ksum), so the retention ops compute it (models.retention.ops.residual)."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from golinear.models.cache.policies.retention_slots import RetentionSlots


@dataclasses.dataclass(eq=False, repr=False)
class ProjResidual(RetentionSlots):
    name: ClassVar[str] = "proj_residual"

    def op_score(self, keys):
        return "proj_residual", None
