"""The offload case's sizes: a GPU KV cache too small for the prefix groups, and a CPU tier that holds them.

Both come from the workload and the model's KV bytes per token, never from a hand-set number:

    KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element of the KV dtype
                         (KV heads: at least one per tensor-parallel rank, so fewer than the ranks are copied)
                         (MLA models: layers x (kv_lora_rank + qk_rope_head_dim) x bytes per element)
    one request        = blocks of the template header, prompt and output
    GPU cache          = 1.5 requests: one request fits (it never evicts its own prefix), two prefix
                         groups do not (``--apc-set offload_gpu_blocks`` overrides)
    working set        = every group's prefix and every request's own blocks (suffix and output): the
                         tier keeps every block the GPU cache evicts, so this is what it must hold for no
                         prompt token to be computed twice. A conversation (case M) is one request whose
                         suffix is its whole history, and it leaves one output per turn
    tier               = 1.5 x the working set, whole GiB (``--apc-set offload_tier_gib`` overrides)

vLLM takes them as ``--num-gpu-blocks-override`` and ``--kv-offloading-size`` (GiB, all tensor-parallel
ranks together; the native OffloadingConnector, pinned host memory). The tier holds whole blocks, each
rounded up to the host's memory page, so what it holds is

    tier tokens        = (tier bytes // block bytes rounded up to a page) x block size

which is below tier bytes // KV bytes per token when a block is not a whole number of pages (small
models). vLLM 0.33 and later also say what they allocated (``vllm:kv_offload_config_info``, after the
first request); a run records that number and it is the one verdicts and diagnoses use.
"""

from __future__ import annotations

import dataclasses
import json
import math
import mmap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_apc.config import flag_value
from pytest_apc.workload.cases import ServerMode, Workload, ceil_div

GIB = 1 << 30
# vLLM's default KV block size, by profile: on GPUs, and in its CPU build (the server reports its own).
DEFAULT_BLOCK_SIZE = {"gpu": 16, "cpu": 128}
HEADROOM = 1.5  # both sizes: a GPU cache of 1.5 requests, a tier of 1.5 working sets
# Bytes per element of a KV-cache dtype (vLLM --kv-cache-dtype, or the model's dtype under "auto").
DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp16": 2, "bf16": 2}
# The tier rounds each block up to the memory page of the host it runs on (pytest-apc launches it here).
PAGE_BYTES = mmap.PAGESIZE


class OffloadSizeError(ValueError):
    """The model's KV bytes per token cannot be worked out (say the sizes instead)."""


@dataclass(frozen=True)
class OffloadSizes:
    """What both offload servers get, and why."""

    kv_bytes_per_token: int
    block_size: int  # the size the sizes assume (vLLM's default, or --block-size); the server reports its own
    request_blocks: int  # one request at its longest, header room included
    gpu_blocks: int
    working_set_tokens: int
    tier_gib: float
    page_bytes: int = PAGE_BYTES
    # What the server says its tier holds (vLLM 0.33+: vllm:kv_offload_config_info), once a run has read it.
    reported_tier_tokens: int | None = None

    @property
    def block_bytes(self) -> int:
        """One block in the tier: its KV bytes on all GPUs together, rounded up to a memory page."""
        return ceil_div(self.kv_bytes_per_token * self.block_size, self.page_bytes) * self.page_bytes

    @property
    def tier_tokens(self) -> int:
        """What the tier holds: as the server reports it, else worked out (the module's docstring)."""
        if self.reported_tier_tokens is not None:
            return self.reported_tier_tokens
        return int(self.tier_gib * GIB) // self.block_bytes * self.block_size

    def reported(self, labels: Mapping[str, str], block_size: int | None = None) -> OffloadSizes:
        """These sizes with the tier's capacity as ``vllm:kv_offload_config_info`` reports it (``labels``):
        chunks x blocks per chunk x the server's block size (``block_size``, when it reported one: an
        attention backend may choose another than the one assumed); unchanged when the labels do not say."""
        try:
            chunks, per_chunk = int(labels["cpu_num_chunks"]), int(labels.get("cpu_blocks_per_chunk") or 1)
        except (KeyError, ValueError):
            return self
        tokens = chunks * per_chunk * (block_size or self.block_size)
        return dataclasses.replace(self, reported_tier_tokens=tokens)

    @property
    def tokens_short(self) -> int:
        """How much of the working set the tier cannot hold (0 when it holds it all)."""
        return max(0, self.working_set_tokens - self.tier_tokens)

    @classmethod
    def of(cls, recorded: dict[str, Any]) -> OffloadSizes:
        """The sizes a server was launched with, from ``as_dict`` (``ServerInfo.offload``)."""
        return cls(**{name: value for name, value in recorded.items() if name != "tier_tokens"})

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "tier_tokens": self.tier_tokens}

    def server_args(self, mode: ServerMode) -> tuple[str, ...]:
        """vLLM flags of the small-cache server (no tier) or the one with the tier."""
        args: tuple[str, ...] = ("--num-gpu-blocks-override", str(self.gpu_blocks))
        if mode.tier:
            args += ("--kv-offloading-size", f"{self.tier_gib:g}")
        return args

    def warnings(self, tier: bool) -> list[str]:
        """A tier too small for the working set (``tier``: the server has one), or a GPU cache that holds it
        (then nothing is evicted and the case measures nothing)."""
        warned: list[str] = []
        if tier and self.tokens_short:
            warned.append(
                f"the CPU tier of {self.tier_gib:g} GiB holds {self.tier_tokens:,} tokens at "
                f"{self.block_bytes:,} bytes per block of {self.block_size} tokens, {self.tokens_short:,} short of "
                f"the working set of {self.working_set_tokens:,} (every prefix group and every request's own blocks): "
                "hits across the tiers will fall short of the prediction"
            )
        if self.gpu_blocks * self.block_size >= self.working_set_tokens:
            warned.append(
                f"the GPU cache of {self.gpu_blocks:,} blocks holds the whole working set of "
                f"{self.working_set_tokens:,} tokens: nothing is evicted, so neither eviction nor the tier is measured"
            )
        return warned


def kv_bytes_per_token(config: dict[str, Any], server_args: tuple[str, ...] = ()) -> int:
    """KV-cache bytes one token takes on all GPUs together, from a Hugging Face model config and the
    server's ``--kv-cache-dtype`` / ``--dtype`` / ``--tensor-parallel-size``: what the CPU tier keeps of it.
    Each tensor-parallel rank holds at least one KV head, so a model with fewer KV heads than ranks keeps
    copies, and the tier keeps what the ranks hold."""
    text = config.get("text_config") or config  # multimodal configs nest the language model
    try:
        ranks = int(flag_value(server_args, ("--tensor-parallel-size", "-tp")) or 1)
        layers = int(text["num_hidden_layers"])
        kv_dtype = flag_value(server_args, ("--kv-cache-dtype",)) or "auto"
        if kv_dtype.startswith("fp8"):
            element = 1
        else:
            dtype = flag_value(server_args, ("--dtype",)) or "auto"
            if dtype == "auto":
                dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16")
            element = DTYPE_BYTES[dtype.removeprefix("torch.")]
        if text.get("kv_lora_rank"):  # MLA: one latent vector and the rope part per layer
            # Every rank holds the whole latent; vLLM 0.33's tier keeps one copy of it (earlier ones, one per rank).
            return layers * (int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 0)) * element
        heads = int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError) as err:
        raise OffloadSizeError(f"the model config lacks what KV bytes per token need ({err!r})") from err
    return 2 * layers * ranks * max(1, kv_heads // ranks) * head_dim * element


def model_config(model: str) -> dict[str, Any]:
    """The model's config.json: from its folder, else through transformers (a hub name)."""
    local = Path(model) / "config.json"
    if local.is_file():
        data: dict[str, Any] = json.loads(local.read_text())
        return data
    try:
        from transformers import AutoConfig

        return dict(AutoConfig.from_pretrained(model).to_dict())
    except Exception as err:
        raise OffloadSizeError(f"cannot read the config of model {model!r}: {err}") from err


def sizes(
    workload: Workload,
    config: dict[str, Any],
    server_args: tuple[str, ...],
    header_room: int,
    *,
    gpu_blocks: int = 0,
    tier_gib: float = 0.0,
    outputs: int = 1,
    default_block_size: int = DEFAULT_BLOCK_SIZE["gpu"],
) -> OffloadSizes:
    """The sizes for ``workload`` (0: derived); ``header_room`` bounds the chat template's tokens, ``outputs``
    is how many outputs each request leaves in the cache (a conversation's turns)."""
    block = int(flag_value(server_args, ("--block-size",)) or default_block_size)
    per_token = kv_bytes_per_token(config, server_args)
    request = workload.kv_blocks_per_request(header_room, block)
    groups, n = workload.prefix_groups, workload.num_prompts
    own = ceil_div(workload.suffix_len + outputs * workload.output_len + block, block) * block  # the boundary block too
    working_set = groups * (header_room + workload.prefix_len) + n * own
    gpu = gpu_blocks or math.ceil(HEADROOM * request)
    derived = OffloadSizes(per_token, block, request, gpu, working_set, 0.0)
    tier = tier_gib or float(math.ceil(HEADROOM * working_set * derived.block_bytes / block / GIB))
    return dataclasses.replace(derived, tier_gib=tier)
