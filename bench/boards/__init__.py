"""Rendering the result store: the leaderboard tables, plots and page, the KV-compression comparison, the
README's results table and the model cards (`golinear leaderboard`, `golinear cards`)."""
