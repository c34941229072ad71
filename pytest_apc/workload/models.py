"""The generated tiny model that the CPU default (``--cpu-node``) serves.

No model can be downloaded on the machines this runs on, so the plugin makes one: a Llama with random
weights (2 layers of width 256, head_dim 64 because vLLM's CPU attention rejects 16) drawn so that its
answers depend on the whole prompt (``weights.py``; untied output embeddings), and a small byte-level BPE
tokenizer trained on text that every Python installation ships (its standard library sources), with a
chat template so that the ``openai-chat`` backend works exactly as on a GPU node.

The model is generated once into a cache folder named after its specification and reused afterwards;
generation writes into a temporary folder and renames it, so concurrent runs never see half a model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Bump when the generated files change in a way that matters to a server (3: prompt-dependent weights).
TINY_MODEL_VERSION = 3
# The shape models hold only the generated tokenizer and an architecture's config: their names follow those
# (``_shape_digest``), not the tiny model's weights, so that a GPU baseline stays comparable when the CPU
# model changes. Bump when their files change in a way that matters to a server.
SHAPE_MODEL_VERSION = 2

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
# A fixed system header makes every chat prompt start with the same tokens, as real templates
# (Llama 3's "Cutting Knowledge Date" block) do: the plugin must measure it, not assume it away.
CHAT_TEMPLATE = (
    "{{ bos_token }}<|system|>\nYou are a tiny test model served by pytest-apc.<|end|>\n"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
# Wide enough that prefilling C's 2K-token prefix costs several times a request's fixed cost (HTTP, chat
# template, scheduling: 20-40 ms on 2 cores): at width 128 a CPU with AVX-512 prefilled it in ~20 ms, so
# C/D's gain at concurrency 1 hung on that fixed cost's jitter (1.1x-2.2x). Width 256 measured 3.8x.
MODEL_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 65536,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


# Architecture shapes for nodes without weights: served with the plugin's own load format (random weights
# drawn as the tiny model's are, so that answers depend on the prompt; see vllm_loader.py), the generated
# tokenizer, and timing, KV-cache size and APC behaviour of the real architecture.
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8},
    "llama-3.1-70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                      "num_attention_heads": 64, "num_key_value_heads": 8},
    # A 32K-context model as --cpu-node measures it: the tiny model's architecture with the context that a
    # 32,768-token one has at the CPU profile's 1/16 lengths. The chat template's 256 tokens of room are not
    # scaled: 32768 / 16 + 256 x 15 / 16 = 2,288 tokens, at which the selected runs are fitted by the same
    # factor as on a 32K model at full length (-m apc: 1/2).
    "tiny-32k": {**{key: MODEL_CONFIG[key] for key in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                       "num_attention_heads", "num_key_value_heads", "head_dim")},
                 "max_position_embeddings": 2288, "rope_scaling": None, "torch_dtype": "float32"},
}  # fmt: skip
LLAMA_31_COMMON: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "vocab_size": VOCAB_SIZE, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "attention_bias": False, "mlp_bias": False,
}  # fmt: skip


def default_cache_dir() -> Path:
    """Where generated models live: ``$PYTEST_APC_CACHE_DIR``, else ``$XDG_CACHE_HOME/pytest-apc``."""
    env = os.environ.get("PYTEST_APC_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-apc"


def _spec_digest() -> str:
    spec = {
        "version": TINY_MODEL_VERSION,
        "config": MODEL_CONFIG,
        "template": CHAT_TEMPLATE,
        "special": SPECIAL_TOKENS,
    }
    return _digest(spec)


def _shape_digest(shape: str) -> str:
    spec = {
        "version": SHAPE_MODEL_VERSION,
        "config": {**LLAMA_31_COMMON, **SHAPES[shape]},
        "template": CHAT_TEMPLATE,
        "special": SPECIAL_TOKENS,
        "tokenizer_max_length": MODEL_CONFIG["max_position_embeddings"],
    }
    return _digest(spec)


def _digest(spec: dict[str, Any]) -> str:
    """The short name part of a generated model's spec: equal specs, equal folders."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def _training_files(limit_bytes: int = 6_000_000) -> list[str]:
    """Python standard library sources: present everywhere, deterministic order, enough text."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        files.append(str(path))
        total += path.stat().st_size
        if total >= limit_bytes:
            break
    return files


def _build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(_training_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="</s>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
        model_max_length=MODEL_CONFIG["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    # Some transformers versions keep the template only in chat_template.jinja; vLLM reads both.
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def _build_weights(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pytest_apc.workload.weights import redraw

    torch.manual_seed(0)
    config = LlamaConfig(**{k: v for k, v in MODEL_CONFIG.items() if k != "architectures"})
    model = LlamaForCausalLM(config)
    redraw(model.named_parameters())
    model.save_pretrained(str(out), safe_serialization=True)
    # Pin the config vLLM reads to exactly what we specified (transformers adds its own keys).
    saved = json.loads((out / "config.json").read_text())
    saved.update(MODEL_CONFIG)
    (out / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True))


def tiny_model_name() -> str:
    """The generated tiny model's folder name (its version and a digest of its spec), known before it is made."""
    return f"tiny-llama-v{TINY_MODEL_VERSION}-{_spec_digest()}"


def shape_model_name(shape: str) -> str:
    """A shape model's folder name, known before it is made (unknown shapes are refused when it is)."""
    return f"{shape}-shape-v{SHAPE_MODEL_VERSION}-{_shape_digest(shape)}"


def _tiny_target(cache_dir: Path | None) -> Path:
    return (cache_dir or default_cache_dir()) / "models" / tiny_model_name()


def tiny_model_cached(cache_dir: Path | None = None) -> bool:
    target = _tiny_target(cache_dir)
    return (target / "config.json").is_file() and (target / "tokenizer.json").is_file()


def _publish(target: Path, build: Callable[[Path], None]) -> Path:
    """Build into a temporary folder beside ``target`` and rename it into place (atomic: concurrent runs
    never see half a model; when another process finished first, its identical model is kept)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        build(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def ensure_tiny_model(cache_dir: Path | None = None) -> Path:
    """Return the folder of the tiny model, generating it first if it is not cached yet."""
    target = _tiny_target(cache_dir)
    if tiny_model_cached(cache_dir):
        return target

    def build(folder: Path) -> None:
        _build_tokenizer(folder)
        _build_weights(folder)

    return _publish(target, build)


def ensure_shape_model(shape: str, cache_dir: Path | None = None) -> Path:
    """A config-only model of a known architecture shape with the generated tokenizer (no weights).

    Serve it with ``--load-format pytest_apc_dummy`` (``vllm_loader.LOAD_FORMAT``). Only the tokenizer is
    trained here; nothing heavy is written.
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown model shape {shape!r} (known: {', '.join(SHAPES)})")
    tiny = ensure_tiny_model(cache_dir)
    target = tiny.parent / shape_model_name(shape)
    if (target / "config.json").is_file():
        return target

    def build(folder: Path) -> None:
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (tiny / name).is_file():
                shutil.copy(tiny / name, folder / name)
        config = {**LLAMA_31_COMMON, **SHAPES[shape]}
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))

    return _publish(target, build)


if __name__ == "__main__":  # pragma: no cover - convenience for people
    import sys

    print(ensure_shape_model(sys.argv[1]) if len(sys.argv) > 1 else ensure_tiny_model())
