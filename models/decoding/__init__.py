"""Generation: the chunked prefill, the static-cache decoder and batched decoding."""
