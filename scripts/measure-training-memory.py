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

Needs: PyTorch with CUDA, transformers, PEFT (LoRA cases); bitsandbytes for `8bit` optimizer
states (a case without it is recorded as `"status": "skipped"`). DPO is run without TRL: the
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
"""

from __future__ import annotations

import argparse
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

# Fields of the preset table that are the planner's own, not Hugging Face config fields.
PLANNER_ONLY = {
    "kv_bytes_per_token_bf16",
    "params_computed_b",
    "active_params_computed_b",
    "moe",
    "qkv_bias",
    "quantization_config",
}

METHODS = ("full", "lora", "dpo")
STATES = ("fp32", "bf16", "8bit")
ATTENTION = ("sdpa", "eager", "flash_attention_2")


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

    def check(self) -> None:
        """Raises ValueError naming the field at fault."""
        if self.method not in METHODS:
            raise ValueError(f"{self.name}: method {self.method!r} is not one of {METHODS}")
        if self.optimizer_states not in STATES:
            raise ValueError(f"{self.name}: optimizer_states {self.optimizer_states!r} not in {STATES}")
        if self.attention not in ATTENTION:
            raise ValueError(f"{self.name}: attention {self.attention!r} not in {ATTENTION}")
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


def default_cases() -> list[Case]:
    """21 cases from 1B to 47B: vocabularies 128k-256k, sequences 1k-16k, micro-batches 1-8,
    checkpointing on and off, full / LoRA / DPO, all three optimizer precisions, two MoEs.
    About a minute of H200 time in steps; model building and process start-up add to it."""
    qv = ("q", "v")
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
        Case("qwen3-30b-a3b-lora-2k", "qwen3-30b-a3b", method="lora"),
        Case("mixtral-8x7b-lora-qv-r8-2k", "mixtral-8x7b", method="lora", lora_rank=8,
             lora_targets=qv),
    ]


def load_presets() -> dict[str, dict]:
    with PRESETS.open() as f:
        return {m["key"]: m for m in json.load(f)["models"]}


def hf_config(model: str, presets: dict[str, dict]) -> dict:
    """The Hugging Face config fields for a preset key or a config.json path."""
    path = Path(model)
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
    for module in ("transformers", "peft", "bitsandbytes", "trl", "flash_attn"):
        try:
            info[module] = __import__(module).__version__
        except ImportError:
            info[module] = None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=False,
        )
        info["driver"] = out.stdout.strip().splitlines()[0] if out.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        info["driver"] = None
    return info


def measure(case: Case, config: dict) -> dict:
    """Runs one case in this process and returns its row."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    row = {"case": case.name, **dataclasses.asdict(case), "steps": STEPS}
    row["lora_targets"] = list(case.lora_targets)
    torch.cuda.init()
    torch.empty(1, device="cuda")
    free, total = torch.cuda.mem_get_info()
    row["cuda_context_bytes"] = total - free - torch.cuda.memory_reserved()
    row["device_total_bytes"] = total
    torch.cuda.reset_peak_memory_stats()

    bf16 = torch.bfloat16
    trained_dtype = bf16 if case.optimizer_states == "bf16" else torch.float32
    model_type = config.get("model_type", "llama")
    fields = {k: v for k, v in config.items() if k not in ("model_type", "torch_dtype", "dtype")}
    hf = transformers.AutoConfig.for_model(model_type, **fields)
    hf.use_cache = False
    phase = "build"
    try:
        def build(dtype):
            # Random weights made on the GPU; transformers 5 names the argument `dtype`,
            # earlier releases `torch_dtype`.
            with torch.device("cuda"):
                try:
                    return transformers.AutoModelForCausalLM.from_config(
                        hf, dtype=dtype, attn_implementation=case.attention
                    )
                except TypeError:
                    return transformers.AutoModelForCausalLM.from_config(
                        hf, torch_dtype=dtype, attn_implementation=case.attention
                    )

        if case.method == "lora":
            import peft  # noqa: PLC0415

            model = build(bf16)
            modules = dict(LORA_MODULES)
            if model_type == "mixtral":
                modules.update(MIXTRAL_MODULES)
            targets = [modules[t] for t in case.lora_targets]
            lora = peft.LoraConfig(r=case.lora_rank, lora_alpha=2 * case.lora_rank,
                                   target_modules=targets, lora_dropout=0.0,
                                   task_type="CAUSAL_LM")
            model = peft.get_peft_model(model, lora)
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
        trainable = [p for p in model.parameters() if p.requires_grad]
        row["trainable_params"] = sum(p.numel() for p in trainable)
        row["total_params"] = sum(p.numel() for p in model.parameters())
        row["after_build_allocated_bytes"] = torch.cuda.memory_allocated()
        optimizer = make_optimizer(case, trainable)
        if optimizer is None:
            return {**row, "status": "skipped", "reason": "bitsandbytes is not installed"}
        vocab = hf.vocab_size
        batch = case.micro_batch * (2 if case.method == "dpo" else 1)
        generator = torch.Generator(device="cuda").manual_seed(0)
        tokens = torch.randint(0, vocab, (batch, case.seq_len), device="cuda", generator=generator)
        autocast = case.optimizer_states != "bf16"
        times = []
        for _ in range(STEPS):
            phase = "step"
            torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.autocast("cuda", dtype=bf16, enabled=autocast):
                if reference is None:
                    loss = model(input_ids=tokens, labels=tokens).loss
                else:
                    loss = dpo_loss(model, reference, tokens, case.micro_batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        row["status"] = "ok"
        row["step_seconds"] = sum(times[1:]) / max(1, len(times) - 1)
    except torch.OutOfMemoryError as err:
        row["status"] = "oom"
        row["phase"] = phase
        row["reason"] = str(err).splitlines()[0][:300]
    row["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
    row["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
    row["peak_device_bytes"] = row["peak_reserved_bytes"] + row["cuda_context_bytes"]
    row["peak_device_gib"] = round(row["peak_device_bytes"] / GIB, 3)
    return row


def make_optimizer(case: Case, params):
    import torch  # noqa: PLC0415

    if case.optimizer_states == "8bit":
        try:
            import bitsandbytes  # noqa: PLC0415
        except ImportError:
            return None
        return bitsandbytes.optim.AdamW8bit(params, lr=1e-5)
    # foreach=False: the default multi-tensor path keeps a transient copy of every update.
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


def child(case_json: str, config_json: str) -> None:
    """`--child`: one case in a fresh process; prints its row as one JSON line."""
    case = Case.from_json(json.loads(case_json))
    print("ROW " + json.dumps(measure(case, json.loads(config_json))), flush=True)


def run_case(case: Case, config: dict, timeout: int) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps(dataclasses.asdict(case)), json.dumps(config)]
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
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
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
    if not provenance.get("gpu"):
        print("measure-training-memory: no CUDA device (use --list or --dry-run without one)", file=sys.stderr)
        return 1
    rows = []
    started = time.time()
    for case in cases:
        row = run_case(case, configs[case.name], args.timeout)
        rows.append(row)
        peak = row.get("peak_device_gib", "-")
        print(f"{case.name:45s} {row['status']:8s} peak {peak} GiB", file=sys.stderr, flush=True)
    provenance["wall_seconds"] = round(time.time() - started, 1)
    provenance["command"] = " ".join([Path(__file__).name, *argv])
    result = {"provenance": provenance, "rows": rows}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    if args.csv:
        write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
