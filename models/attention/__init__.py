"""The linearized attention layer: the mechanisms, the frozen projection, the conversion and the ops."""
