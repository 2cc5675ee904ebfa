"""What the softmax path keeps inside the cache budget: the decode state, the cache policies and scorers."""
