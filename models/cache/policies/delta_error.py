"""delta_error (the default retention score): a token leaving the window is scored by how badly the decayed state
already stores it, ||v - a S^T k|| (the delta rule's own correction), mean over its KV head's query heads. It
depends on the state at that step, so the retention ops compute it (models.retention.ops.delta_error)."""
from __future__ import annotations

import dataclasses
from typing import ClassVar

from golinear.models.cache.policies.retention_slots import RetentionSlots


@dataclasses.dataclass(eq=False, repr=False)
class DeltaError(RetentionSlots):
    name: ClassVar[str] = "delta_error"

    def op_score(self, keys):
        return "delta_error", None
