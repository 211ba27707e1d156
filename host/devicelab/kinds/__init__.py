"""Payload kinds: one module each, registered in base.REGISTRY. Adding a kind is one file here and its
import below."""

from . import base, batched, bench, eval, kld, membw, soak  # noqa: F401  (each registers itself)
from .base import HOST_OPS, REGISTRY, SkipCell, get, get_op

__all__ = ["HOST_OPS", "REGISTRY", "SkipCell", "get", "get_op", "base"]
