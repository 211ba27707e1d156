"""devicelab: run the same llama.cpp recipe on every device you own, measure it, and pick a quant."""

__version__ = "0.1.0"
