"""Backbones: pretrained and random-weight ones, and the named architectures as data."""
