"""Payload kinds: one module each, registered in base.REGISTRY. Adding a kind is one file here and its
import below."""

from . import base, batched, bench, eval, kld, membw  # noqa: F401  (each registers itself)
from .base import REGISTRY, SkipCell, get

__all__ = ["REGISTRY", "SkipCell", "get", "base"]
