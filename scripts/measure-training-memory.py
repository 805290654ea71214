#!/usr/bin/env python3
"""Measure fine-tuning peak memory on one GPU, for calibrating `plan::training` (issue 38).

Each case builds a model from the architecture of a planner preset
(`src/plan/data/model-configs.json`) or a `config.json` file, with random weights made on
the GPU (nothing is downloaded), trains it for three AdamW steps on synthetic tokens and
records the peak memory PyTorch allocated and reserved, the CUDA context, and the step time.
Out of memory is a result (`"status": "oom"`), not an error. Every case runs in a fresh
process, so one case's cache, context and fragmentation never leak into the next.

    scripts/measure-training-memory.py --list             # the cases, no GPU or torch needed
    scripts/measure-training-memory.py --dry-run          # validate them, print the plan as JSON
    scripts/measure-training-memory.py --out rows.json --csv rows.csv
    scripts/measure-training-memory.py --only llama-3.1-8b-full-2k --out rows.json
    scripts/measure-training-memory.py --trace --out traced.json   # no GPU: traced and modelled

`--trace` runs the same training code on fake tensors (PyTorch's FakeTensorMode: shapes and
dtypes, no storage) and adds up the bytes of the live storages after every operation, so any
machine with PyTorch gives each case's peak *allocated* memory in seconds, at any model size.
The same allocations, in their order, pass through a model of the CUDA caching allocator
(`caching_allocator.py`) for the memory a GPU would *reserve* and whether an H200 would run
out; only a GPU shows the CUDA context and what the model leaves out. `fixtures/training/`
holds such rows; the planner is tested against them (`tests/plan_training_trace.rs`).

Needs: PyTorch with CUDA (any PyTorch for `--trace`), transformers, PEFT (LoRA cases); bitsandbytes for `8bit` optimizer
states and QLoRA (a case without it is recorded as `"status": "skipped"`; QLoRA traces run
bitsandbytes' own quantisation and matmul ops, which accept fake tensors, and its CUDA
matmul's dequantised weight is added as the kernel's scratch); Liger Kernel for the cases
with `"loss": "fused"` (its fused linear cross-entropy in place of transformers' loss, the
planner's `--loss fused`; traced without launching its Triton kernels, which only write into
tensors its Python code has allocated). DPO is run without TRL: the
policy takes the chosen and the rejected sequence (a doubled batch) and a frozen copy of the
model scores both under `no_grad`, the loss of arXiv:2305.18290 eq. 7, which is the memory
shape of TRL's `DPOTrainer` with a reference model.

What "optimizer states" means here (the planner's `--optimizer-states`):
  fp32  the model's parameters in FP32, forward and backward under BF16 autocast, AdamW
        moments in FP32 (HF Trainer's `bf16=True` on an FP32 model: 4 + 4 + 8 bytes per
        trained parameter; the planner's DeepSpeed-style 2 + 2 + 12 is the same 16);
  bf16  parameters, gradients and AdamW moments in BF16 (a model loaded in BF16 and trained
        with `torch.optim.AdamW`: 8 bytes per parameter);
  8bit  FP32 parameters under autocast, bitsandbytes `AdamW8bit` (4 + 4 + 2).
LoRA and DPO cases follow the same rule for their trained parameters; a LoRA base is frozen
in BF16 in every mode, and LoRA adapters are FP32 unless the states are bf16 (PEFT's default).

Peak device memory = peak reserved + CUDA context, where the context is what the device had
in use after CUDA initialised and before the first tensor (`mem_get_info` total - free -
reserved). The issue's rows use exactly this figure.

On a GPU each row also carries, unless `--no-model`, what `--trace`'s tracker and allocator
model make of the same run (`tracked_peak_allocated_bytes`, `modelled_gpu_*`): the measured
peaks beside the modelled ones, step by step, test the model the planner's reserve is
checked on.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRESETS = REPO / "src" / "plan" / "data" / "model-configs.json"
STEPS = 3
GIB = 1 << 30
sys.path.insert(0, str(REPO / "scripts"))  # caching_allocator.py, however this file is loaded

# What CUDA kernels allocate that the cpu device's kernels, which a trace runs, do not. cuBLAS
# keeps a workspace per handle and stream, 32 MiB on sm90 by default (PyTorch's
# CUBLAS_WORKSPACE_CONFIG ":4096:8", aten/src/ATen/cuda/CublasHandlePool.cpp; cuBLASLt
# shares it), taken from the caching allocator at the first matrix product.
CUBLAS_WORKSPACE = 32 << 20
# An H200 as CUDA reports it (139.8 GiB) less a 512 MiB CUDA context: what a modelled H200's
# allocator can reserve, for whether a traced case would run out of memory on one.
H200_ALLOCATABLE = 150_108_897_280 - (512 << 20)
MATMULS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm"}

# Fields of the preset table that are the planner's own, not Hugging Face config fields.
PLANNER_ONLY = {
    "kv_bytes_per_token_bf16",
    "params_computed_b",
    "active_params_computed_b",
    "moe",
    "qkv_bias",
    "quantization_config",
}

METHODS = ("full", "lora", "qlora", "dpo")
STATES = ("fp32", "bf16", "8bit")
ATTENTION = ("sdpa", "eager", "flash_attention_2")
# The loss: transformers' own (the whole logits tensor, upcast to FP32), or Liger Kernel's
# fused linear cross-entropy (the planner's `--loss fused`), which never makes it.
LOSSES = ("standard", "fused")
# How AdamW steps (the planner's `--adamw`): updating each parameter in place (the fused
# kernel on a GPU, the single-tensor loop under --trace: the same memory), or PyTorch's
# multi-tensor path, whose step holds a copy of every second moment's square root.
ADAMWS = ("fused", "foreach")
# The layers' kernels (the planner's `--kernels`; `kernels` in a row is the attention and loss
# operators a trace saw): transformers' own, or Liger Kernel's RMSNorm, RoPE and SwiGLU/GeGLU,
# which `use_liger_kernel=True` puts in beside its fused loss.
KERNELS = ("standard", "liger")


@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement: a model, a method and a batch shape."""

    name: str
    model: str
    method: str = "full"
    seq_len: int = 2048
    micro_batch: int = 1
    gradient_checkpointing: bool = True
    optimizer_states: str = "fp32"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
    attention: str = "sdpa"
    loss: str = "standard"
    adamw: str = "fused"
    layer_kernels: str = "standard"

    def check(self) -> None:
        """Raises ValueError naming the field at fault."""
        if self.method not in METHODS:
            raise ValueError(f"{self.name}: method {self.method!r} is not one of {METHODS}")
        if self.optimizer_states not in STATES:
            raise ValueError(f"{self.name}: optimizer_states {self.optimizer_states!r} not in {STATES}")
        if self.attention not in ATTENTION:
            raise ValueError(f"{self.name}: attention {self.attention!r} not in {ATTENTION}")
        if self.loss not in LOSSES:
            raise ValueError(f"{self.name}: loss {self.loss!r} not in {LOSSES}")
        if self.adamw not in ADAMWS:
            raise ValueError(f"{self.name}: adamw {self.adamw!r} not in {ADAMWS}")
        if self.layer_kernels not in KERNELS:
            raise ValueError(f"{self.name}: layer_kernels {self.layer_kernels!r} not in {KERNELS}")
        if self.loss == "fused" and self.method == "dpo":
            raise ValueError(f"{self.name}: the fused loss is measured for full and LoRA, not DPO")
        for field in ("seq_len", "micro_batch", "lora_rank"):
            value = getattr(self, field)
            if not isinstance(value, int) or not 1 <= value <= 1 << 20:
                raise ValueError(f"{self.name}: {field} {value!r} must be an integer in 1..2^20")
        unknown = set(self.lora_targets) - set(LORA_MODULES)
        if unknown:
            raise ValueError(f"{self.name}: unknown LoRA targets {sorted(unknown)}")

    @staticmethod
    def from_json(obj: dict) -> "Case":
        fields = {f.name for f in dataclasses.fields(Case)}
        unknown = set(obj) - fields
        if unknown:
            raise ValueError(f"case {obj.get('name')!r}: unknown fields {sorted(unknown)}")
        if "lora_targets" in obj:
            obj = {**obj, "lora_targets": tuple(obj["lora_targets"])}
        return Case(**obj)


# The planner's short LoRA target names and the module names transformers gives them.
LORA_MODULES = {
    "q": "q_proj",
    "k": "k_proj",
    "v": "v_proj",
    "o": "o_proj",
    "gate": "gate_proj",
    "up": "up_proj",
    "down": "down_proj",
}
# Mixtral names its expert projections w1 (gate), w3 (up), w2 (down).
MIXTRAL_MODULES = {"gate": "w1", "up": "w3", "down": "w2"}


GEMMA_32K = "fixtures/training/configs/gemma-2-9b-vocab-32k.json"
GPT_OSS_32K = "fixtures/training/configs/gpt-oss-20b-vocab-32k.json"


def default_cases() -> list[Case]:
    """76 cases from 1B to 70B: vocabularies 32k-256k, sequences 1k-16k, micro-batches 1-8,
    checkpointing on and off, full / LoRA / QLoRA / DPO, all three optimizer precisions, two
    MoEs, eager attention, transformers' loss and Liger Kernel's fused one, fused and foreach
    AdamW, transformers' layers and Liger Kernel's. A few minutes of H200 time (about a minute
    for the first 21 in steps);
    model building and process start-up add to it. `--trace` runs them all without a GPU in
    about ten minutes."""
    qv = ("q", "v")
    qkvo = ("q", "k", "v", "o")
    return [
        Case("llama-3.2-1b-full-2k", "llama-3.2-1b"),
        Case("llama-3.2-1b-full-8k-mb4", "llama-3.2-1b", seq_len=8192, micro_batch=4),
        Case("llama-3.2-1b-full-2k-mb8-nockpt-bf16", "llama-3.2-1b", micro_batch=8,
             gradient_checkpointing=False, optimizer_states="bf16"),
        Case("llama-3.2-3b-full-4k-mb2", "llama-3.2-3b", seq_len=4096, micro_batch=2),
        Case("llama-3.2-3b-lora-4k-nockpt", "llama-3.2-3b", method="lora", seq_len=4096,
             gradient_checkpointing=False),
        Case("llama-3.1-8b-full-2k", "llama-3.1-8b"),
        Case("llama-3.1-8b-full-2k-bf16", "llama-3.1-8b", optimizer_states="bf16"),
        Case("llama-3.1-8b-full-2k-8bit", "llama-3.1-8b", optimizer_states="8bit"),
        Case("llama-3.1-8b-lora-2k", "llama-3.1-8b", method="lora"),
        Case("llama-3.1-8b-lora-16k", "llama-3.1-8b", method="lora", seq_len=16384),
        Case("llama-3.1-8b-lora-qv-r64-4k-mb4-nockpt", "llama-3.1-8b", method="lora",
             seq_len=4096, micro_batch=4, gradient_checkpointing=False, lora_rank=64,
             lora_targets=qv),
        Case("llama-3.1-8b-dpo-1k-bf16", "llama-3.1-8b", method="dpo", seq_len=1024,
             optimizer_states="bf16"),
        Case("qwen3-8b-full-4k-bf16", "qwen3-8b", seq_len=4096, optimizer_states="bf16"),
        Case("gemma-2-9b-lora-4k-mb2", "gemma-2-9b", method="lora", seq_len=4096,
             micro_batch=2, attention="eager"),
        Case("gemma-2-9b-full-2k-bf16", "gemma-2-9b", optimizer_states="bf16",
             attention="eager"),
        Case("qwen2.5-14b-lora-8k", "qwen2.5-14b", method="lora", seq_len=8192),
        Case("qwen2.5-14b-full-2k-bf16", "qwen2.5-14b", optimizer_states="bf16"),
        Case("qwen2.5-32b-lora-4k", "qwen2.5-32b", method="lora", seq_len=4096),
        Case("qwen2.5-32b-full-1k", "qwen2.5-32b", seq_len=1024),
        Case("qwen3-30b-a3b-lora-2k", "qwen3-30b-a3b", method="lora", lora_targets=qkvo),
        Case("mixtral-8x7b-lora-qv-r8-2k", "mixtral-8x7b", method="lora", lora_rank=8,
             lora_targets=qv),
        # Vocabularies of 32k (Llama 2, Mistral, Phi-3) and 152k (Qwen2), micro-batches of 8,
        # 16k-token full fine-tuning, FP32-state DPO, a full MoE fine-tune.
        Case("mistral-7b-full-4k-bf16", "mistral-7b-v0.1", seq_len=4096, optimizer_states="bf16"),
        Case("mistral-7b-lora-8k-mb2", "mistral-7b-v0.1", method="lora", seq_len=8192, micro_batch=2),
        Case("llama-2-7b-lora-2k-mb4-nockpt", "llama-2-7b", method="lora", micro_batch=4,
             gradient_checkpointing=False),
        Case("phi-3-mini-full-2k-mb4-bf16", "phi-3-mini", micro_batch=4, optimizer_states="bf16"),
        Case("qwen2-7b-full-1k-mb8-bf16", "qwen2-7b", seq_len=1024, micro_batch=8,
             optimizer_states="bf16"),
        Case("qwen2-7b-lora-16k", "qwen2-7b", method="lora", seq_len=16384),
        Case("qwen3-8b-lora-8k-mb2-nockpt", "qwen3-8b", method="lora", seq_len=8192, micro_batch=2,
             gradient_checkpointing=False),
        Case("llama-3.1-8b-full-16k-bf16", "llama-3.1-8b", seq_len=16384, optimizer_states="bf16"),
        Case("llama-3.2-3b-dpo-2k", "llama-3.2-3b", method="dpo"),
        Case("gemma-2-9b-lora-1k-mb8", "gemma-2-9b", method="lora", seq_len=1024, micro_batch=8,
             attention="eager"),
        Case("qwen3-32b-lora-2k-mb2", "qwen3-32b", method="lora", micro_batch=2),
        Case("qwen3-30b-a3b-full-2k-bf16", "qwen3-30b-a3b", optimizer_states="bf16"),
        Case("mixtral-8x7b-lora-qkvo-4k-mb2", "mixtral-8x7b", method="lora", seq_len=4096,
             micro_batch=2, lora_targets=qkvo),
        # Eager attention (transformers trains Gemma 2 and gpt-oss so: `_supports_sdpa =
        # False`) keeps `s x s` scores per head. With their own vocabularies the loss's logits
        # hide the scores behind the checkpointed backward pass, so two configs differ only in
        # a 32k vocabulary (fixtures/training/configs/) and show them.
        Case("gemma-2-9b-lora-qkvo-2k-nockpt", "gemma-2-9b", method="lora",
             gradient_checkpointing=False, lora_targets=qkvo, attention="eager"),
        Case("gpt-oss-20b-lora-qkvo-8k", "gpt-oss-20b", method="lora", seq_len=8192,
             lora_targets=qkvo, attention="eager"),
        Case("gpt-oss-20b-lora-qkvo-2k-mb2-nockpt", "gpt-oss-20b", method="lora",
             micro_batch=2, gradient_checkpointing=False, lora_targets=qkvo, attention="eager"),
        Case("gemma-2-9b-vocab-32k-lora-qkvo-8k", GEMMA_32K, method="lora", seq_len=8192,
             lora_targets=qkvo, attention="eager"),
        Case("gemma-2-9b-vocab-32k-lora-qkvo-1k-nockpt", GEMMA_32K, method="lora",
             seq_len=1024, gradient_checkpointing=False, lora_targets=qkvo, attention="eager"),
        Case("gpt-oss-20b-vocab-32k-lora-qkvo-4k", GPT_OSS_32K, method="lora", seq_len=4096,
             lora_targets=qkvo, attention="eager"),
        Case("gpt-oss-20b-vocab-32k-lora-qkvo-1k-nockpt", GPT_OSS_32K, method="lora",
             seq_len=1024, gradient_checkpointing=False, lora_targets=qkvo, attention="eager"),
        # transformers 5 keeps an MoE layer's experts as 3-D parameters (`gate_up_proj`,
        # `down_proj`); PEFT converts the module targets of Mixtral's and Qwen's families onto
        # them, gate and up fused into one adapter of twice the rank.
        Case("qwen3-30b-a3b-lora-all-2k", "qwen3-30b-a3b", method="lora"),
        Case("qwen3-30b-a3b-lora-down-4k", "qwen3-30b-a3b", method="lora", seq_len=4096,
             lora_targets=("down",)),
        Case("mixtral-8x7b-lora-all-1k-mb2", "mixtral-8x7b", method="lora", seq_len=1024,
             micro_batch=2),
        # Liger Kernel's fused linear cross-entropy (`--loss fused`): the logits never whole.
        Case("llama-3.1-8b-lora-16k-fused", "llama-3.1-8b", method="lora", seq_len=16384,
             loss="fused"),
        Case("llama-3.2-1b-full-8k-mb4-fused", "llama-3.2-1b", seq_len=8192, micro_batch=4,
             loss="fused"),
        Case("qwen2.5-14b-lora-8k-mb2-fused", "qwen2.5-14b", method="lora", seq_len=8192,
             micro_batch=2, loss="fused"),
        Case("qwen3-8b-full-4k-bf16-fused", "qwen3-8b", seq_len=4096, optimizer_states="bf16",
             loss="fused"),
        Case("mistral-7b-lora-8k-mb2-nockpt-fused", "mistral-7b-v0.1", method="lora",
             seq_len=8192, micro_batch=2, gradient_checkpointing=False, loss="fused"),
        # QLoRA (bitsandbytes NF4, double quantisation) as TRL's SFTTrainer prepares it; rank
        # 32 on all seven projections, batch 1, as Unsloth's published Hugging Face runs.
        Case("llama-3.1-8b-qlora-r32-16k", "llama-3.1-8b", method="qlora", seq_len=16384,
             lora_rank=32),
        Case("llama-3.1-70b-qlora-r32-4k", "llama-3.1-70b", method="qlora", seq_len=4096,
             lora_rank=32),
        Case("llama-3.1-70b-qlora-r32-8k", "llama-3.1-70b", method="qlora", seq_len=8192,
             lora_rank=32),
        Case("mistral-7b-qlora-4k-mb2-nockpt", "mistral-7b-v0.1", method="qlora", seq_len=4096,
             micro_batch=2, gradient_checkpointing=False),
        # PyTorch's multi-tensor AdamW (the HF Trainer's `adamw_torch` before torch 2.8). The
        # first two are fms-acceleration's published single-A100 runs of Mistral 7B (4096
        # packed tokens x 4, checkpointing; BF16 full fine-tuning and LoRA r16 on q, k, v, o;
        # `scripts/benchmarks/refs/a100_80gb.csv`), so a trace meets a GPU figure.
        Case("mistral-7b-full-4k-mb4-bf16-foreach", "mistral-7b-v0.1", seq_len=4096,
             micro_batch=4, optimizer_states="bf16", adamw="foreach"),
        Case("mistral-7b-lora-qkvo-4k-mb4-foreach", "mistral-7b-v0.1", method="lora",
             seq_len=4096, micro_batch=4, lora_targets=("q", "k", "v", "o"), adamw="foreach"),
        Case("llama-3.2-1b-full-2k-foreach", "llama-3.2-1b", adamw="foreach"),
        # QLoRA of MoE models as transformers 5 loads them in 4 bits: their routed experts are
        # 3-D parameters bitsandbytes does not quantize, made FP32 by PEFT's preparation. The
        # second is fms-acceleration's published Mixtral recipe (transformers 4.48 quantized
        # the experts, and the run fit one A100 in 40 GiB).
        Case("qwen3-30b-a3b-qlora-2k", "qwen3-30b-a3b", method="qlora"),
        Case("mixtral-8x7b-qlora-qkvo-4k-mb4", "mixtral-8x7b", method="qlora", seq_len=4096,
             micro_batch=4, lora_targets=("q", "k", "v", "o"), adamw="foreach"),
        # Liger Kernel's RMSNorm, RoPE and SwiGLU/GeGLU (`--kernels liger`), each against a case
        # above run with transformers' own layers; the last two are fms-acceleration's published
        # Llama 3 8B LoRA recipe with Liger's fused loss (4096 x 4 and x 8, torch's AdamW).
        Case("llama-3.2-1b-full-2k-mb8-nockpt-bf16-liger", "llama-3.2-1b", micro_batch=8,
             gradient_checkpointing=False, optimizer_states="bf16", layer_kernels="liger"),
        Case("llama-3.2-1b-full-2k-mb2-nockpt", "llama-3.2-1b", micro_batch=2,
             gradient_checkpointing=False),
        Case("llama-3.2-1b-full-2k-mb2-nockpt-liger", "llama-3.2-1b", micro_batch=2,
             gradient_checkpointing=False, layer_kernels="liger"),
        Case("llama-3.2-3b-lora-4k-nockpt-liger", "llama-3.2-3b", method="lora", seq_len=4096,
             gradient_checkpointing=False, layer_kernels="liger"),
        Case("mistral-7b-qlora-4k-mb2-nockpt-liger", "mistral-7b-v0.1", method="qlora",
             seq_len=4096, micro_batch=2, gradient_checkpointing=False, layer_kernels="liger"),
        Case("qwen3-8b-lora-8k-mb2-nockpt-liger", "qwen3-8b", method="lora", seq_len=8192,
             micro_batch=2, gradient_checkpointing=False, layer_kernels="liger"),
        Case("gemma-2-9b-lora-qkvo-2k-nockpt-liger", "gemma-2-9b", method="lora",
             lora_targets=qkvo, gradient_checkpointing=False, attention="eager",
             layer_kernels="liger"),
        Case("phi-3-mini-full-2k-mb4-bf16-liger", "phi-3-mini", micro_batch=4,
             optimizer_states="bf16", layer_kernels="liger"),
        Case("llama-3.1-8b-qlora-r32-16k-liger", "llama-3.1-8b", method="qlora", seq_len=16384,
             lora_rank=32, layer_kernels="liger"),
        Case("llama-3.1-8b-lora-16k-fused-liger", "llama-3.1-8b", method="lora", seq_len=16384,
             loss="fused", layer_kernels="liger"),
        Case("llama-3.1-8b-lora-qkvo-16k-fused", "llama-3.1-8b", method="lora", seq_len=16384,
             lora_targets=qkvo, loss="fused"),
        Case("llama-3.1-8b-lora-qkvo-16k-fused-liger", "llama-3.1-8b", method="lora",
             seq_len=16384, lora_targets=qkvo, loss="fused", layer_kernels="liger"),
        Case("llama-3.2-1b-full-8k-mb4-fused-liger", "llama-3.2-1b", seq_len=8192, micro_batch=4,
             loss="fused", layer_kernels="liger"),
        Case("qwen2.5-14b-lora-8k-mb2-fused-liger", "qwen2.5-14b", method="lora", seq_len=8192,
             micro_batch=2, loss="fused", layer_kernels="liger"),
        Case("llama-3.1-8b-lora-qkvo-4k-mb4-fused-liger-foreach", "llama-3.1-8b", method="lora",
             seq_len=4096, micro_batch=4, lora_targets=qkvo, loss="fused", layer_kernels="liger",
             adamw="foreach"),
        Case("llama-3.1-8b-lora-qkvo-4k-mb8-fused-liger-foreach", "llama-3.1-8b", method="lora",
             seq_len=4096, micro_batch=8, lora_targets=qkvo, loss="fused", layer_kernels="liger",
             adamw="foreach"),
        # fms-acceleration's published Llama 3 8B full fine-tune with Liger's fused loss (BF16
        # states, torch's AdamW): 4096 x 8 ran on an A100 80GB, 4096 x 16 ran out of memory.
        Case("llama-3.1-8b-full-4k-mb8-bf16-fused-foreach", "llama-3.1-8b", seq_len=4096,
             micro_batch=8, optimizer_states="bf16", loss="fused", adamw="foreach"),
        Case("llama-3.1-8b-full-4k-mb16-bf16-fused-foreach", "llama-3.1-8b", seq_len=4096,
             micro_batch=16, optimizer_states="bf16", loss="fused", adamw="foreach"),
    ]


def load_presets() -> dict[str, dict]:
    with PRESETS.open() as f:
        return {m["key"]: m for m in json.load(f)["models"]}


def hf_config(model: str, presets: dict[str, dict]) -> dict:
    """The Hugging Face config fields for a preset key or a config.json path."""
    path = Path(model)
    if not path.is_absolute() and (REPO / path).exists():
        path = REPO / path  # fixtures/training/configs/... from any working directory
    if path.suffix == ".json" or path.is_dir():
        file = path / "config.json" if path.is_dir() else path
        with file.open() as f:
            return json.load(f)
    if model not in presets:
        raise ValueError(f"unknown model {model!r}: give a preset key ({', '.join(sorted(presets))}) or a config.json")
    arch = {k: v for k, v in presets[model]["architecture"].items() if k not in PLANNER_ONLY}
    # The preset table normalises MoE fields; Mixtral's config spells them its own way.
    if arch.get("model_type") == "mixtral":
        arch["num_local_experts"] = arch.pop("num_experts")
        arch["intermediate_size"] = arch.pop("moe_intermediate_size")
    if presets[model]["architecture"].get("qkv_bias"):
        arch.setdefault("attention_bias", True)
    return arch


def select(cases: list[Case], only: list[str]) -> list[Case]:
    if not only:
        return cases
    names = {c.name for c in cases}
    missing = [n for n in only if n not in names]
    if missing:
        raise ValueError(f"no case named {missing}; --list prints them")
    return [c for c in cases if c.name in only]


# ---------------------------------------------------------------------------------------
# Measurement (imports torch; runs in a child process per case).


def versions() -> dict:
    """The software and hardware a set of rows was measured on."""
    import torch  # noqa: PLC0415 - lazily, so --list works without torch

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "gpu_total_bytes": torch.cuda.mem_get_info()[1] if torch.cuda.is_available() else None,
    }
    for module in ("transformers", "peft", "bitsandbytes", "trl", "flash_attn", "liger_kernel"):
        try:
            info[module] = __import__(module).__version__
        except (ImportError, AttributeError):
            info[module] = None
    if info["liger_kernel"] is None:
        try:
            from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

            info["liger_kernel"] = version("liger-kernel")
        except PackageNotFoundError:
            pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False,
        )
        info["driver"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        info["driver"] = None
    return info


def measure(case: Case, config: dict, model_allocator: bool = True) -> dict:
    """Runs one case on the GPU in this process and returns its row. With `model_allocator`,
    the steps also run under the allocation tracker of `--trace` (host-side bookkeeping that
    holds no tensor alive), so the row carries the modelled allocator's figures for the very
    run the GPU measured (`tracked_peak_allocated_bytes`, `modelled_gpu_*`); its step times
    then include the tracker's Python overhead."""
    import torch  # noqa: PLC0415

    row = {**base_row(case), "kind": "measured"}
    missing = missing_module(case)
    if missing:
        return {**row, "status": "skipped", "reason": missing}
    torch.cuda.init()
    torch.empty(1, device="cuda")
    free, total = torch.cuda.mem_get_info()
    row["cuda_context_bytes"] = total - free - torch.cuda.memory_reserved()
    row["device_total_bytes"] = total
    torch.cuda.reset_peak_memory_stats()
    tracker = allocation_tracker() if model_allocator else None
    figures = StepFigures(tracker) if tracker is not None else None
    by_step: dict[str, list[int]] = {"allocated": [], "reserved": []}

    def after_step():
        by_step["allocated"].append(torch.cuda.max_memory_allocated())
        by_step["reserved"].append(torch.cuda.max_memory_reserved())
        torch.cuda.reset_peak_memory_stats()
        if figures is not None:
            figures.after_step()

    phase = "build"
    try:
        model, reference, hf = build_models(case, config, "cuda")
        row.update(parameter_counts(model))
        row["after_build_allocated_bytes"] = torch.cuda.memory_allocated()
        optimizer = make_optimizer(case, [p for p in model.parameters() if p.requires_grad])
        if optimizer is None:
            return {**row, "status": "skipped", "reason": "bitsandbytes is not installed"}
        phase = "step"
        if tracker is not None:
            tracker.add_models(model, reference)
            for t in quant_state_tensors(model):
                tracker.add(t)
        with tracker if tracker is not None else contextlib.nullcontext():
            times = train_steps(
                case, model, reference, optimizer, hf.vocab_size, "cuda", torch.cuda.synchronize, after_step
            )
        row["status"] = "ok"
        row["step_seconds"] = sum(times[1:]) / max(1, len(times) - 1)
    except torch.OutOfMemoryError as err:
        row["status"] = "oom"
        row["phase"] = phase
        row["reason"] = str(err).splitlines()[0][:300]
    # A step cut short by running out of memory counts with what it reached.
    row["peak_allocated_bytes"] = max([*by_step["allocated"], torch.cuda.max_memory_allocated()])
    row["peak_reserved_bytes"] = max([*by_step["reserved"], torch.cuda.max_memory_reserved()])
    row["peak_allocated_by_step_bytes"] = by_step["allocated"]
    row["peak_reserved_by_step_bytes"] = by_step["reserved"]
    row["peak_device_bytes"] = row["peak_reserved_bytes"] + row["cuda_context_bytes"]
    row["peak_device_gib"] = round(row["peak_device_bytes"] / GIB, 3)
    if figures is not None:
        row.update(figures.fields("tracked_peak_allocated"))
    return row


def trace(case: Case, config: dict) -> dict:
    """Runs one case without a GPU and returns its row. Every tensor is a FakeTensor (shape,
    dtype and device, no storage); an allocation tracker counts the bytes of every live
    storage, as the CUDA caching allocator's `allocated` figure does (rounded up to its
    512-byte blocks), after every operation. The peak is what the program allocates, op for
    op: the same model code, autograd, checkpointing, autocast casts and loss. It runs on the
    cpu device, whose autocast casts linear, matmul and attention to BF16 as CUDA's does and
    whose SDPA picks a flash kernel that keeps what the CUDA one keeps (the output and the
    log-sum-exp); the row names the attention and loss kernels used.

    The same allocations and frees, in order, also pass through a model of the CUDA caching
    allocator (`caching_allocator.py`) with the CUDA kernels' own workspaces added
    (`cuda_scratch`, `CUBLAS_WORKSPACE`): `modelled_gpu_peak_reserved_bytes` is the memory a
    GPU's allocator would reserve for the step, and `modelled_h200` whether an H200's would
    run out. Not seen: the CUDA context, and workspaces of kernels not named here."""
    import torch  # noqa: PLC0415
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415

    row = {**base_row(case), "kind": "traced"}
    missing = missing_module(case)
    if missing:
        return {**row, "status": "skipped", "reason": missing}
    if case.optimizer_states == "8bit":
        return {**row, "status": "skipped", "reason": "8-bit Adam runs bitsandbytes' CUDA kernels; it cannot be traced"}
    if case.attention == "flash_attention_2":
        return {**row, "status": "skipped", "reason": "flash_attention_2 needs CUDA; trace sdpa instead"}
    if case.method == "qlora" and is_moe(config):
        return {**row, "status": "skipped", "reason": "QLoRA of an MoE runs transformers' eager experts, which route tokens by their values (nonzero); a trace has none"}
    # `Module.to` swaps a fake parameter for its converted copy, which fails while the fake
    # mode holds a weak reference to it (PEFT moves every adapter so); the trace only needs
    # the parameter to take the copy's dtype, which assigning `.data` gives.
    swap_tensors = torch.utils.swap_tensors

    def swap_or_assign(t1, t2):
        try:
            swap_tensors(t1, t2)
        except RuntimeError:
            t1.data = t2.data

    torch.utils.swap_tensors = swap_or_assign
    # transformers tells packed sequences apart by the position ids' values
    # (`find_packed_sequence_indices`), which a fake tensor has none of (`is_tracing` is true
    # for one): it then takes every batch for packed and builds the whole `batch x s x s` causal
    # mask, 3 bytes per element held through the step, which the GPU run, whose position ids
    # read 0..s-1, never makes (SDPA's `is_causal` stands for it). The trace's tokens are one
    # sequence per row, as the GPU run's are.
    import transformers.masking_utils as masking  # noqa: PLC0415

    masking.find_packed_sequence_indices = lambda position_ids: None
    if case.method == "qlora":
        import bitsandbytes.functional as bnb_functional  # noqa: PLC0415

        # Double quantisation's 256-entry code is built from Python numbers (`.tolist()`),
        # which fake tensors have none of: made for real first, as the first call would.
        bnb_functional.name2qmap.setdefault("dynamic", bnb_functional.create_dynamic_map())
    started = time.perf_counter()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model, reference, hf = build_models(case, config, "cpu")
        row.update(parameter_counts(model))
        optimizer = make_optimizer(case, [p for p in model.parameters() if p.requires_grad])
        tracker = allocation_tracker()
        tracker.add_models(model, reference)
        for t in quant_state_tensors(model):
            tracker.add(t)
        row["after_build_allocated_bytes"] = tracker.live
        figures = StepFigures(tracker)
        with tracker:
            train_steps(case, model, reference, optimizer, hf.vocab_size, "cpu", after_step=figures.after_step)
        row["after_steps_allocated_bytes"] = tracker.live
    row["status"] = "ok"
    row.update(figures.fields("peak_allocated"))
    row["trace_seconds"] = round(time.perf_counter() - started, 1)
    return row


class StepFigures:
    """Each step's peaks as an allocation tracker saw them: the tracked storages, and the
    modelled CUDA caching allocator's allocated and reserved bytes (which start each step
    from where the last ended, as after `torch.cuda.reset_peak_memory_stats()`)."""

    def __init__(self, tracker):
        self.tracker = tracker
        self.allocated: list[int] = []
        self.gpu_allocated: list[int] = []
        self.gpu_reserved: list[int] = []

    def after_step(self) -> None:
        tracker = self.tracker
        self.allocated.append(tracker.peak)
        tracker.peak = tracker.live
        self.gpu_allocated.append(tracker.allocator.peak_allocated)
        self.gpu_reserved.append(tracker.allocator.peak_reserved)
        tracker.allocator.reset_peaks()

    def fields(self, allocated_name: str) -> dict:
        """The row's fields, the tracked peak named `allocated_name`. A step cut short (out of
        memory) counts in the peaks with what it reached, not in the per-step lists."""
        tracker = self.tracker
        return {
            f"{allocated_name}_bytes": max([*self.allocated, tracker.peak]),
            f"{allocated_name}_by_step_bytes": self.allocated,
            # What a GPU would allocate (with the CUDA kernels' workspaces) and reserve,
            # without the CUDA context.
            "modelled_gpu_peak_allocated_bytes": max([*self.gpu_allocated, tracker.allocator.peak_allocated]),
            "modelled_gpu_peak_reserved_bytes": max([*self.gpu_reserved, tracker.allocator.peak_reserved]),
            "modelled_gpu_peak_reserved_by_step_bytes": self.gpu_reserved,
            "modelled_gpu_segments": tracker.allocator.segments,
            "modelled_h200": "out of memory" if tracker.h200_out_of_memory else "fits",
            # The least memory the same allocations run in when the allocator, short of it,
            # gives its cached segments back and retries, as PyTorch's does (without the CUDA
            # context): what a GPU of that size holds, where the figure above is what an
            # allocator that is never short keeps.
            "modelled_gpu_min_capacity_bytes": min_capacity(
                tracker.events, max([*self.gpu_allocated, tracker.allocator.peak_allocated]),
                max([*self.gpu_reserved, tracker.allocator.peak_reserved])),
            "kernels": sorted(tracker.kernels),
        }


def allocation_tracker():
    """A dispatch mode that adds up the bytes of live tensor storages: every operation's
    outputs are counted once per storage, and a storage's bytes leave the count when Python
    frees it (a weak-reference callback), which is when the caching allocator would take the
    block back. The same allocations and frees, in their order, also go through a model of
    the CUDA caching allocator (`caching_allocator.py`), with what CUDA kernels add that the
    cpu device's do not (cuBLAS workspaces, flash-attention's backward scratch), for the
    memory a GPU would reserve."""
    import weakref  # noqa: PLC0415

    from caching_allocator import CachingAllocator, OutOfMemory  # noqa: PLC0415

    import torch  # noqa: PLC0415
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC0415
    from torch.utils._pytree import tree_flatten  # noqa: PLC0415

    from torch._subclasses.fake_tensor import FakeTensor  # noqa: PLC0415

    DATA_DEPENDENT = {torch.ops.aten._local_scalar_dense.default: 1, torch.ops.aten.equal.default: True}

    class Tracker(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live = 0
            self.peak = 0
            self.kernels: set[str] = set()
            self._refs: dict[int, weakref.ref] = {}
            self.allocator = CachingAllocator()
            # The same program on an H200's allocator, which gives cached blocks back and
            # retries before running out; None once it has run out.
            self.h200: CachingAllocator | None = CachingAllocator(capacity=H200_ALLOCATABLE)
            self.h200_out_of_memory = False
            self._workspaces: list = []
            # Every malloc (its size) and free (its malloc's index, as ~index), in order, for
            # replays at other capacities (`min_capacity`).
            self.events: list[int] = []

        def add_models(self, *models) -> None:
            """Counts the parameters and buffers of `models` (None skipped), made before the
            tracker was entered."""
            for m in models:
                if m is not None:
                    for t in [*m.parameters(), *m.buffers()]:
                        self.add(t)

        def _malloc(self, nbytes: int) -> tuple:
            """`nbytes` from both modelled allocators: (block, H200 block), None where none
            is taken (CUDA hands out no memory for an empty storage)."""
            if not nbytes:
                return None, None, None
            block = self.allocator.malloc(nbytes)
            event = len(self.events)
            self.events.append(nbytes)
            if self.h200 is None:
                return block, None, event
            try:
                return block, self.h200.malloc(nbytes), event
            except OutOfMemory:
                self.h200, self.h200_out_of_memory = None, True
                return block, None, event

        def _free(self, blocks: tuple) -> None:
            block, on_h200, event = blocks
            if block is not None:
                self.allocator.free(block)
                self.events.append(~event)
            if on_h200 is not None and self.h200 is not None:
                self.h200.free(on_h200)

        def add(self, tensor) -> None:
            storage = tensor.untyped_storage()
            key = id(storage)
            ref = self._refs.get(key)
            if ref is not None and ref() is storage:
                return
            nbytes = storage.nbytes()
            size = 512 if nbytes <= 512 else -(-nbytes // 512) * 512  # the allocator's rounding
            blocks = self._malloc(nbytes)

            def free(ref, key=key, size=size, blocks=blocks):
                if self._refs.get(key) is ref:
                    del self._refs[key]
                self.live -= size
                self._free(blocks)

            self._refs[key] = weakref.ref(storage, free)
            self.live += size
            self.peak = max(self.peak, self.live)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if func in DATA_DEPENDENT and isinstance(args[0], FakeTensor):
                # A fake tensor has no values. Liger's fused loss asks for two, both read
                # only by kernels a trace does not launch: how many tokens count (`.item()`)
                # and whether the loss's gradient is 1 (`torch.equal`). Neither allocates.
                return DATA_DEPENDENT[func]
            if "attention" in name or "softmax" in name or "nll_loss" in name:
                self.kernels.add(name)
            if not self._workspaces and name.split(".")[1] in MATMULS:
                # cuBLAS's workspace, one per handle and stream, through the caching allocator
                # and never freed: the forward thread's and autograd's device thread's.
                self._workspaces = [self._malloc(CUBLAS_WORKSPACE) for _ in range(2)]
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.add(t)
            scratch = [self._malloc(n) for n in cuda_scratch(name, args)]
            for blocks in scratch:
                self._free(blocks)
            return out

    return Tracker()


def replay_fits(events: list[int], capacity: int) -> bool:
    """Whether `events` (a tracker's mallocs and frees) run in an allocator of `capacity`."""
    from caching_allocator import CachingAllocator, OutOfMemory  # noqa: PLC0415

    allocator = CachingAllocator(capacity=capacity)
    blocks: dict[int, object] = {}
    try:
        for index, event in enumerate(events):
            if event >= 0:
                blocks[index] = allocator.malloc(event)
            else:
                allocator.free(blocks.pop(~event))
    except OutOfMemory:
        return False
    return True


def min_capacity(events: list[int], allocated: int, reserved: int) -> int:
    """The least capacity, to within 64 MiB, at which `events` run: between the peak
    allocated (no less can do) and the peak an allocator that is never short reserves (which
    always does), bisected."""
    step = 64 << 20
    low, high = allocated, max(reserved, allocated)
    if replay_fits(events, low):
        return low
    while high - low > step:
        middle = (low + high) // 2
        if replay_fits(events, middle):
            high = middle
        else:
            low = middle
    return high


def bnb_dequantize_scratch(op: str, args) -> list[int]:
    """bitsandbytes' 4-bit matmul for training-sized inputs (more rows than its custom kernel
    takes) dequantises the weight to the input's dtype and calls `F.linear`
    (`_dequant_linear_fallback`, backends/cuda/ops.py), with the double-quantised absmax
    dequantised to FP32 first; the op a trace runs has no such intermediates. Arguments:
    (A, B, shapeB, absmax, blocksize, ...)."""
    if not op.startswith("bitsandbytes.gemm_4bit"):
        return []
    a, shape, blocksize = args[0], args[2], args[4]
    n, k = shape[0], shape[1]
    return [n * k * a.element_size(), 4 * -(-(n * k) // blocksize)]


def cuda_scratch(op: str, args) -> list[int]:
    """The bytes a CUDA kernel for `op` takes and gives back beyond its outputs, where the cpu
    kernel a trace runs does not. Flash attention's backward (PyTorch's port of flash-attention
    2, `mha_bwd` in aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp) takes an
    FP32 softmax correction (batch x heads x sequence rounded to 128), an FP32 accumulator for
    the query gradient (batch x sequence rounded to 128 x heads x head size rounded to 32), and,
    where keys and values have fewer heads than queries (GQA, which transformers passes to
    SDPA as is), the key and value gradients expanded to every query head before they are
    summed. The cpu kernel's arguments are (grad_out, query, key, value, ...), each
    batch x heads x sequence x head size."""
    if op.startswith("bitsandbytes."):
        return bnb_dequantize_scratch(op, args)
    if not (op.startswith("aten._scaled_dot_product_flash_attention") and "backward" in op):
        return []
    query, key = args[1], args[2]
    batch, heads, seq, head_size = query.shape
    seq_rounded = -(-seq // 128) * 128
    head_rounded = -(-head_size // 32) * 32 if head_size <= 192 else 256
    scratch = [4 * batch * heads * seq_rounded, 4 * batch * seq_rounded * heads * head_rounded]
    if key.shape[1] != heads:
        scratch += [query.element_size() * batch * key.shape[2] * heads * head_size] * 2
    return scratch


def base_row(case: Case) -> dict:
    row = {"case": case.name, **dataclasses.asdict(case), "steps": STEPS}
    row["lora_targets"] = list(case.lora_targets)
    return row


def parameter_counts(model) -> dict:
    return {
        "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "total_params": sum(p.numel() for p in model.parameters()),
    }


def is_moe(config: dict) -> bool:
    """Whether a Hugging Face config has routed experts."""
    return any(config.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts"))


def build_models(case: Case, config: dict, device: str):
    """The model to train (PEFT-wrapped for LoRA, checkpointing set) and, for DPO, the frozen
    reference, with random weights made on `device`; and the transformers config."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    bf16 = torch.bfloat16
    trained_dtype = bf16 if case.optimizer_states == "bf16" else torch.float32
    model_type = config.get("model_type", "llama")
    fields = {k: v for k, v in config.items() if k not in ("model_type", "torch_dtype", "dtype")}
    hf = transformers.AutoConfig.for_model(model_type, **fields)
    hf.use_cache = False

    # A 4-bit load leaves an MoE's routed experts unquantized and PEFT's preparation makes them
    # FP32, which transformers 5's default grouped-matmul experts refuse ("Expected inputs of
    # BF16 type"); its eager experts (a loop of matmuls under autocast) run them.
    extra = {"experts_implementation": "eager"} if case.method == "qlora" and is_moe(config) else {}

    def build(dtype):
        # transformers 5 names the argument `dtype`, earlier releases `torch_dtype`.
        with torch.device(device):
            try:
                return transformers.AutoModelForCausalLM.from_config(
                    hf, dtype=dtype, attn_implementation=case.attention, **extra
                )
            except TypeError:
                return transformers.AutoModelForCausalLM.from_config(
                    hf, torch_dtype=dtype, attn_implementation=case.attention, **extra
                )

    if case.loss == "fused" or case.layer_kernels == "liger":
        use_liger(model_type, fused_loss=case.loss == "fused", layers=case.layer_kernels == "liger",
                  traced=device == "cpu")
    if case.method in ("lora", "qlora"):
        import peft  # noqa: PLC0415

        if case.method == "lora":
            model = build(bf16)
        else:
            # The BF16 model is only a skeleton on a GPU (the meta device): each linear
            # weight is made and quantised one at a time, so a 70B model never needs its
            # 16-bit size there.
            with torch.device("meta") if device != "cpu" else contextlib.nullcontext():
                model = build(bf16)
            quantize_linears(model, device)
            # What TRL's SFTTrainer (and most QLoRA scripts) do to a 4-bit model: freeze it
            # and cast every other 16-bit parameter (embedding, head, norms) to FP32.
            model.is_loaded_in_4bit = True
            model = peft.prepare_model_for_kbit_training(
                model, use_gradient_checkpointing=False, auto_clear_cache=False
            )
        modules = dict(LORA_MODULES)
        if model_type == "mixtral":
            modules.update(MIXTRAL_MODULES)
        targets = [modules[t] for t in case.lora_targets]
        lora = peft.LoraConfig(r=case.lora_rank, lora_alpha=2 * case.lora_rank,
                               target_modules=targets, lora_dropout=0.0,
                               task_type="CAUSAL_LM")
        model = peft.get_peft_model(model, lora)
        if case.method == "qlora" and case.optimizer_states != "bf16":
            # TRL's SFTTrainer then, training in BF16 (`peft_module_casting_to_bf16`): norms
            # stay FP32, the embedding and head go back to BF16.
            for name, module in model.named_modules():
                if "norm" in name:
                    module.to(torch.float32)
                elif any(k in name for k in ("lm_head", "embed_tokens")) and getattr(
                    module, "weight", None
                ) is not None and module.weight.dtype == torch.float32:
                    module.to(bf16)
        for p in model.parameters():
            if p.requires_grad:
                p.data = p.data.to(trained_dtype)
        if case.gradient_checkpointing:
            model.enable_input_require_grads()
    else:
        model = build(trained_dtype)
    reference = build(bf16).eval().requires_grad_(False) if case.method == "dpo" else None
    if case.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model, reference, hf


def quantize_linears(model, device: str) -> None:
    """Replaces every linear layer but the head with bitsandbytes' `Linear4bit`: NF4 weights,
    double-quantised absmax, BF16 compute, what `BitsAndBytesConfig(load_in_4bit=True,
    bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
    bnb_4bit_compute_dtype=torch.bfloat16)` loads. A weight still on the meta device (a GPU
    run's skeleton) is made at random on `device` first, then the skeleton's other parameters
    and buffers are made there too. Traced, the weights are fake tensors, which bitsandbytes'
    `Params4bit` cannot wrap (it is a tensor subclass of its own); a frozen Parameter carrying
    the same attributes stands in, and bitsandbytes' quantisation and matmul ops, which accept
    fake tensors, run as they are."""
    import bitsandbytes as bnb  # noqa: PLC0415
    import bitsandbytes.functional as bnb_functional  # noqa: PLC0415
    import bitsandbytes.nn.modules as bnb_modules  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from torch._subclasses.fake_tensor import FakeTensor  # noqa: PLC0415

    real_params4bit = bnb_modules.Params4bit

    def fake_params4bit(data=None, requires_grad=False, quant_state=None, blocksize=64,
                        compress_statistics=True, quant_type="fp4", quant_storage=torch.uint8,
                        module=None, bnb_quantized=False):
        param = torch.nn.Parameter(torch.empty(0) if data is None else data, requires_grad=False)
        param.quant_state, param.blocksize = quant_state, blocksize
        param.compress_statistics, param.quant_type = compress_statistics, quant_type
        param.quant_storage, param.module, param.bnb_quantized = quant_storage, module, bnb_quantized
        return param

    class FakeParams4bit:
        def __new__(cls, *args, **kwargs):
            return fake_params4bit(*args, **kwargs)

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, torch.nn.Linear) or name == "lm_head":
                continue
            weight = child.weight.data
            if weight.is_meta:
                weight = torch.empty(weight.shape, dtype=torch.bfloat16, device=device).normal_(std=0.02)
            fake = isinstance(weight, FakeTensor)
            packed, state = bnb_functional.quantize_4bit(
                weight, blocksize=64, compress_statistics=True, quant_type="nf4"
            )
            del weight
            params4bit = FakeParams4bit if fake else real_params4bit
            bnb_modules.Params4bit = params4bit
            try:
                layer = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=False,
                                          compute_dtype=torch.bfloat16, quant_type="nf4",
                                          device=packed.device)
            finally:
                bnb_modules.Params4bit = real_params4bit
            layer.weight = params4bit(packed, requires_grad=False, quant_state=state,
                                      quant_type="nf4", compress_statistics=True,
                                      bnb_quantized=True, module=layer)
            if child.bias is not None:
                bias = child.bias.data
                if bias.is_meta:
                    bias = torch.zeros(bias.shape, dtype=torch.bfloat16, device=device)
                layer.bias = torch.nn.Parameter(bias, requires_grad=False)
            setattr(parent, name, layer)
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            if param.is_meta:
                value = torch.empty(param.shape, dtype=param.dtype, device=device).normal_(std=0.02)
                module._parameters[name] = torch.nn.Parameter(value, requires_grad=param.requires_grad)
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer is not None and buffer.is_meta:
                module._buffers[name] = torch.zeros(buffer.shape, dtype=buffer.dtype, device=device)


def quant_state_tensors(model) -> list:
    """The tensors of every 4-bit weight's quantisation state (absmax, its own absmax and
    code when double-quantised): on the device, yet neither parameters nor buffers."""
    import bitsandbytes.functional as bnb_functional  # noqa: PLC0415
    import torch  # noqa: PLC0415

    found = []

    def walk(state):
        for value in vars(state).values():
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif isinstance(value, bnb_functional.QuantState):
                walk(value)

    for param in model.parameters():
        state = getattr(param, "quant_state", None)
        if isinstance(state, bnb_functional.QuantState):
            walk(state)
    return found


def missing_module(case: Case) -> str | None:
    """Why `case` cannot run here, when a package it needs is not installed."""
    if case.method == "qlora":
        try:
            import bitsandbytes  # noqa: F401, PLC0415
        except ImportError:
            return "bitsandbytes is not installed (QLoRA's NF4 base is bitsandbytes')"
    if case.loss == "fused" or case.layer_kernels == "liger":
        try:
            import liger_kernel  # noqa: F401, PLC0415
        except ImportError:
            return "liger-kernel is not installed (the fused loss and the liger kernels are Liger Kernel's)"
    return None


# Liger Kernel's layer kernels, by the keyword its `apply_liger_kernel_to_<model>` takes them.
LIGER_LAYER_KERNELS = ("rope", "rms_norm", "swiglu", "geglu", "layer_norm")


def use_liger(model_type: str, fused_loss: bool, layers: bool, traced: bool) -> None:
    """Liger Kernel in place of transformers' code, as TRL's and the HF Trainer's
    `use_liger_kernel=True` put it there (the model classes patched before the model is
    built): its fused linear cross-entropy for the loss (`fused_loss`), and its RMSNorm, RoPE
    and SwiGLU/GeGLU for the layers' own (`layers`); each left off otherwise, so that a case
    changes one thing at a time. Traced, no Triton kernel is launched (there is no GPU):
    Liger's kernels write into tensors its Python code allocated before the launch (or into
    their inputs, in place), so what the trace counts is that code's allocations, the same
    launched or not."""
    import inspect  # noqa: PLC0415

    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN  # noqa: PLC0415

    apply = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply is None:
        raise ValueError(f"Liger Kernel has no kernels for model type {model_type!r}")
    flags = {name: False for name, p in inspect.signature(apply).parameters.items()
             if isinstance(p.default, bool)}
    if fused_loss:
        flags["fused_linear_cross_entropy"] = True
    if layers:
        flags.update({name: True for name in LIGER_LAYER_KERNELS if name in flags})
    apply(**flags)
    if traced:
        not_launched(fused_loss, layers)


def not_launched(fused_loss: bool, layers: bool) -> None:
    """Every Triton kernel of the Liger ops a case uses made a no-op: `kernel[grid](...)`
    returns None. The ops' Python code, which allocates every output, runs as it is."""
    import importlib  # noqa: PLC0415

    from triton.runtime.autotuner import Autotuner, Heuristics  # noqa: PLC0415
    from triton.runtime.jit import JITFunction  # noqa: PLC0415

    class NotLaunched:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    modules = ["fused_linear_cross_entropy", "cross_entropy"] if fused_loss else []
    if layers:
        modules += ["rms_norm", "rope", "swiglu", "geglu", "layer_norm"]
    for name in modules:
        module = importlib.import_module(f"liger_kernel.ops.{name}")
        for attr, value in list(vars(module).items()):
            if isinstance(value, (JITFunction, Autotuner, Heuristics)):
                setattr(module, attr, NotLaunched())


def train_steps(case: Case, model, reference, optimizer, vocab: int, device: str,
                synchronize=lambda: None, after_step=lambda: None) -> list[float]:
    """STEPS optimizer steps on synthetic tokens; the seconds each took."""
    import torch  # noqa: PLC0415

    batch = case.micro_batch * (2 if case.method == "dpo" else 1)
    tokens = torch.randint(0, vocab, (batch, case.seq_len), device=device)
    autocast = case.optimizer_states != "bf16"
    times = []
    for _ in range(STEPS):
        synchronize()
        start = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            if reference is None:
                loss = model(input_ids=tokens, labels=tokens).loss
            else:
                loss = dpo_loss(model, reference, tokens, case.micro_batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize()
        times.append(time.perf_counter() - start)
        after_step()
    return times


def make_optimizer(case: Case, params):
    import torch  # noqa: PLC0415

    if case.optimizer_states == "8bit":
        try:
            import bitsandbytes  # noqa: PLC0415
        except ImportError:
            return None
        return bitsandbytes.optim.AdamW8bit(params, lr=1e-5)
    if case.adamw == "foreach":
        # PyTorch's multi-tensor path (`torch.optim.AdamW`'s default on CUDA): its step
        # holds a copy of every second moment's square root at once.
        return torch.optim.AdamW(params, lr=1e-5, foreach=True)
    # Each parameter in place: the fused kernel on a GPU (the HF Trainer's
    # `adamw_torch_fused`); on the trace's fake cpu tensors the single-tensor loop, which
    # holds no more than one parameter's temporaries.
    if params and params[0].device.type == "cuda":
        return torch.optim.AdamW(params, lr=1e-5, fused=True)
    return torch.optim.AdamW(params, lr=1e-5, foreach=False)


def dpo_loss(model, reference, tokens, pairs: int, beta: float = 0.1):
    """DPO (arXiv:2305.18290 eq. 7) on `pairs` chosen rows followed by `pairs` rejected rows."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415

    def logps(m, grad: bool):
        with torch.set_grad_enabled(grad):
            logits = m(input_ids=tokens).logits[:, :-1].float()
            labels = tokens[:, 1:]
            return torch.gather(logits.log_softmax(-1), 2, labels.unsqueeze(2)).squeeze(2).sum(-1)

    policy = logps(model, True)
    ref = logps(reference, False)
    margin = (policy[:pairs] - ref[:pairs]) - (policy[pairs:] - ref[pairs:])
    return -F.logsigmoid(beta * margin).mean()


# ---------------------------------------------------------------------------------------
# Driver.


def child(case_json: str, config_json: str, traced: bool, model_allocator: bool) -> None:
    """`--child`: one case in a fresh process; prints its row as one JSON line."""
    import torch  # noqa: PLC0415

    torch.manual_seed(0)  # MoE routing depends on the weights and tokens
    case = Case.from_json(json.loads(case_json))
    config = json.loads(config_json)
    row = trace(case, config) if traced else measure(case, config, model_allocator)
    print("ROW " + json.dumps(row), flush=True)


def run_case(case: Case, config: dict, timeout: int, traced: bool, model_allocator: bool = True) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps(dataclasses.asdict(case)), json.dumps(config)]
    if traced:
        cmd.append("--trace")
    if not model_allocator:
        cmd.append("--no-model")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"case": case.name, "status": "timeout", "timeout_seconds": timeout}
    for line in out.stdout.splitlines():
        if line.startswith("ROW "):
            return json.loads(line[4:])
    tail = (out.stderr or out.stdout).strip().splitlines()[-5:]
    return {"case": case.name, "status": "error", "returncode": out.returncode, "reason": " | ".join(tail)[:600]}


def write_csv(path: Path, rows: list[dict]) -> None:
    keys = sorted({k for row in rows for k in row})
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()})


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the case names and exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate the cases and print them with their configs as JSON (no torch)")
    parser.add_argument("--cases", type=Path, help="a JSON list of cases instead of the default ones")
    parser.add_argument("--only", action="append", default=[], help="run only this case (repeatable)")
    parser.add_argument("--out", type=Path, help="write the rows and their provenance as JSON")
    parser.add_argument("--csv", type=Path, help="also write the rows as CSV")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per case (default 300)")
    parser.add_argument("--deadline", type=int,
                        help="seconds for the whole run: a case that might not end before it (its --timeout) is not started")
    parser.add_argument("--trace", action="store_true",
                        help="no GPU: trace each case's allocations with fake tensors (peak allocated; reserved by a model of the caching allocator)")
    parser.add_argument("--no-model", action="store_true",
                        help="on a GPU, measure only: no allocation tracker or allocator model beside the run")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child, traced=args.trace, model_allocator=not args.no_model)
        return 0
    try:
        if args.cases:
            with args.cases.open() as f:
                cases = [Case.from_json(obj) for obj in json.load(f)]
        else:
            cases = default_cases()
        cases = select(cases, args.only)
        presets = load_presets()
        configs = {}
        for case in cases:
            case.check()
            configs[case.name] = hf_config(case.model, presets)
        if len({c.name for c in cases}) != len(cases):
            raise ValueError("case names must be unique")
    except (OSError, ValueError, TypeError, KeyError, json.JSONDecodeError) as err:
        print(f"measure-training-memory: {err}", file=sys.stderr)
        return 1
    if args.list:
        for case in cases:
            print(case.name)
        return 0
    if args.dry_run:
        plan = [{**dataclasses.asdict(c), "config": configs[c.name]} for c in cases]
        print(json.dumps({"steps": STEPS, "cases": plan}, indent=1))
        return 0
    try:
        provenance = versions()
    except ImportError as err:
        print(f"measure-training-memory: {err} (measuring needs PyTorch; --list and --dry-run do not)", file=sys.stderr)
        return 1
    if args.trace:
        provenance["device"] = (
            "none: traced with FakeTensorMode on the cpu device (peak allocated bytes), and the same "
            "allocations through a model of the CUDA caching allocator (caching_allocator.py) with "
            "cuBLAS workspaces and flash-attention's backward scratch (modelled_gpu_*; no CUDA context)"
        )
    elif not provenance.get("gpu"):
        print("measure-training-memory: no CUDA device (use --list or --dry-run without one)", file=sys.stderr)
        return 1
    rows = []
    started = time.time()
    provenance["command"] = " ".join([Path(__file__).name, *argv])
    for case in cases:
        elapsed = time.time() - started
        if args.deadline is not None and elapsed + args.timeout > args.deadline:
            # A case that might not finish before the deadline is not started: a lent GPU's
            # minutes are counted, and the rows so far are worth more than a killed run.
            row = {"case": case.name, "status": "not run", "reason": f"--deadline {args.deadline} s"}
        else:
            row = run_case(case, configs[case.name], args.timeout, args.trace, not args.no_model)
        rows.append(row)
        peak = row.get("peak_device_gib", "-")
        if args.trace and "peak_allocated_bytes" in row:
            peak = f"{row['peak_allocated_bytes'] / GIB:.3f} allocated"
        print(f"{case.name:45s} {row['status']:8s} peak {peak} GiB", file=sys.stderr, flush=True)
        provenance["wall_seconds"] = round(time.time() - started, 1)
        if args.out:
            # Written after every case, so a run cut short keeps what it measured.
            write_json(args.out, {"provenance": provenance, "rows": rows})
    if not args.out:
        print(json.dumps({"provenance": provenance, "rows": rows}, indent=1))
    if args.csv:
        write_csv(args.csv, rows)
    return 0


def write_json(path: Path, result: dict) -> None:
    """Replaces `path` whole (a temporary file renamed over it), never half-written."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(result, indent=1) + "\n")
    partial.replace(path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
