"""KV-cache compression of full-attention models (kvpress's presses), as the other way to hold a cache budget.

kvpress_adapter.py makes kvpress's hooks work on this transformers; presses.py names the presses golinear runs
and holds each at an exact budget; generate.py compresses a prompt's context and decodes greedily.
"""
