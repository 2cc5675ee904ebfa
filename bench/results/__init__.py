"""The result store (one JSON cell per evaluation, merges, stale and conflicting cells, the values a metric can
take) and the regression check against a committed baseline (`golinear store`, `golinear check`)."""
