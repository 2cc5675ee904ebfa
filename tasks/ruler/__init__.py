"""RULER (S-NIAH-1/2/3 and the extended subsets) as offline lm-eval tasks; see api.build_samples."""
from .api import (DISPLAY_NAMES, GROUPS, SUITES, TASKS, build_samples, check_data, check_seq_length, data_files,
                  resolve_task, score)
from .metrics import postprocess_pred, string_match_all, string_match_part

__all__ = ["DISPLAY_NAMES", "GROUPS", "SUITES", "TASKS", "build_samples", "check_data", "check_seq_length", "data_files",
           "resolve_task", "score", "postprocess_pred", "string_match_all", "string_match_part"]
