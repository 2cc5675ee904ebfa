"""A checkpoint folder as golinear writes it: its new parameters and config.json (weights.py, torch) and its model
card (model_card.py). What config.json may hold, and the folder's identity, are the model spec's (models.spec)."""
