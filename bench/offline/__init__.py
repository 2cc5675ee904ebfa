"""The offline bundle for a GPU machine without network (`golinear bundle`)."""
