"""A model spec, golinear's one schema of a model configuration (CLI strings, lm-eval model_args, `golinear train`
flags, a checkpoint's config.json, the result store's key), read top to bottom:

- values.py            the allowed values, the one check of each value and of the option pairs (no torch)
- checkpoint_paths.py  where a checkpoint given by name is found
- checkpoint_files.py  a checkpoint folder's files: its config.json, complete weights, the hashes of its identity
- schema.py            ModelSpec and its conversions to and from every front end
- store_key.py         the model's key in the result store, escaped so no name spells another spec
- linearize_checks.py  LinearizeConfig's checks against a backbone's config, and the layers kept as full attention
- backbone_checks.py   the same checks on the backbone's config.json, before any weights load

The names below are the package's surface; `from golinear.models.spec import ModelSpec` is the usual import.
"""
from golinear.models.spec.checkpoint_files import (CONFIG, CONTENT_HASH_LIMIT, SCORER, WEIGHTS,  # noqa: F401
                                                   check_checkpoint_files, checkpoint_identity, file_identity,
                                                   local_files_identity, read_checkpoint_config, read_layer_scores)
from golinear.models.spec.schema import FIELD_DEFAULTS, ModelSpec  # noqa: F401
from golinear.models.spec.store_key import KEY_ESCAPES, store_key_parts  # noqa: F401
from golinear.models.spec.values import (CACHE_KEYS, CONV_ON, DEFAULT_BASE, DTYPES, FALSE, LINEAR_KEYS,  # noqa: F401
                                         LINEARIZE_KEYS, MECHANISMS, MINIMUM, OUT_NORM_MECHANISMS, PARSERS, PRESETS,
                                         PRESS_KEYS, RETAIN_SCORES, RETENTION_KEYS, SELECTIONS, STRING_KEYS, TRUE,
                                         check_option_pairs, linearize_values, parse_full_layers, parse_value,
                                         value_text, with_cache_options, without_unused_retention)
