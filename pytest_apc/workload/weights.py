"""Random weights whose answers depend on the prompt, for the generated models.

A Llama with the usual small initialisation (std 0.02) or vLLM's dummy weights (uniform +-0.001) barely
mixes its context: its output follows the last prompt token, which the chat template makes the same for
every prompt, so every prompt gets the same answer and a cache that serves wrong content looks right.
Drawn instead from normal(0, GAIN / sqrt(fan_in)), each layer keeps its activations at unit scale and
attention spreads over the whole prompt: answers differ between prompts and change when a token far back
in the prefix changes (``tests/test_tinymodel.py`` measures both). Norm weights are 1.

Each tensor's values come from a generator seeded with its name, so two servers that load the same
architecture (the APC-on and APC-off server of a pair) hold the same weights without sharing a file.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any

# Scale of the weights relative to 1/sqrt(fan_in): above 1, attention is sharp enough to depend on the
# prompt; at 2 the generated tiny model answered 29 of C's 30 prompts differently.
GAIN = 2.0


def redraw(named_parameters: Iterable[tuple[str, Any]], gain: float = GAIN) -> None:
    """Overwrite every parameter in place: matrices from normal(0, gain / sqrt(fan_in)) seeded by name,
    vectors (norm weights) with 1. ``named_parameters``: a torch module's ``named_parameters()``."""
    import torch

    with torch.no_grad():
        for name, param in named_parameters:
            if param.dim() < 2:
                param.fill_(1.0)
                continue
            generator = torch.Generator(device=param.device)
            generator.manual_seed(zlib.crc32(name.encode()))
            param.normal_(0.0, gain / float(param.shape[-1]) ** 0.5, generator=generator)
