"""vLLM's side of the generated shape models: a load format that draws prompt-dependent random weights.

vLLM's own ``--load-format dummy`` fills every weight from uniform(-0.001, 0.001): a model so flat that it
answers every prompt alike, which hides a cache that serves wrong content. ``pytest_apc_dummy`` starts as
``dummy`` does (no files read) and then redraws the weights as the generated tiny model's are
(``weights.py``), on the GPU, seeded by each parameter's name, so that both servers of a pair hold the same
weights. vLLM finds it through the ``vllm.general_plugins`` entry point of this package (``register``),
which every vLLM process loads at start-up.
"""

from __future__ import annotations

from typing import Any

LOAD_FORMAT = "pytest_apc_dummy"


def register() -> None:
    """Register the load format with vLLM (called by vLLM for the ``vllm.general_plugins`` entry point)."""
    try:
        from vllm.model_executor.model_loader import register_model_loader
        from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader
    except ImportError:  # a vLLM without custom loaders: --load-format pytest_apc_dummy then fails by name
        return

    from pytest_apc.workload.weights import redraw

    @register_model_loader(LOAD_FORMAT)
    class PromptDependentDummyLoader(DummyModelLoader):
        """``dummy``, then weights whose answers depend on the prompt."""

        def load_weights(self, model: Any, *args: Any, **kwargs: Any) -> None:
            super().load_weights(model, *args, **kwargs)
            redraw(model.named_parameters())
