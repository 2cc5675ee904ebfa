"""Log filters for lm-eval messages a golinear user cannot act on (installed by the `golinear` command).

- "Overwriting default num_fewshot of T from 5 to 5" (or "from None to 0"): lm-eval logs it for every task
  and group it is given a shot count for, even when the count does not change (126 lines for 5-shot MMLU;
  an unset count means 0 to lm-eval); a real change (from 0 to 5, from None to 5) still shows.
- transformers' FutureWarning that `past_key_values` is deprecated (renamed `cache`): lm-eval's generation
  calls pass it, once per run; the rename is theirs to make.
"""
from __future__ import annotations

import logging
import warnings

FEWSHOT_MESSAGE = "Overwriting default num_fewshot of %s from %s to %s"


class DropUnchangedFewshot(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.msg != FEWSHOT_MESSAGE or len(args) != 3:
            return True
        before, after = ("0" if a is None else str(a) for a in args[1:])
        return before != after


FILTERS = {"lm_eval.evaluator": DropUnchangedFewshot}
DEPRECATED_KWARG = r"`past_key_values` is deprecated"


def install() -> None:
    """Attach each filter to its logger once (idempotent)."""
    warnings.filterwarnings("ignore", message=DEPRECATED_KWARG, category=FutureWarning)
    for name, kind in FILTERS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())
