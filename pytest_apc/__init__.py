"""pytest-apc: a pass/fail gate for vLLM's Automatic Prefix Caching, as a pytest plugin."""

__version__ = "0.1.0"
