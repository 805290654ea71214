#!/usr/bin/env python3
"""What a 4-bit (bitsandbytes) load leaves unquantized in an MoE model, and what PEFT's
preparation then makes of it: the fact behind the planner's QLoRA count for MoE models
(docs/planner.md, "QLoRA of MoE models"; `plan::training::qlora_unquantized_experts`).

Builds a tiny Mixtral (random weights, nothing downloaded) with transformers' own classes,
saves it to a temporary directory, loads it back with `BitsAndBytesConfig(load_in_4bit=True)`
on the cpu device, runs `peft.prepare_model_for_kbit_training`, and prints each parameter of
the first decoder layer with its class and dtype at both stages. transformers 5 keeps routed
experts as 3-D parameters (`experts.gate_up_proj`, `experts.down_proj`) that bitsandbytes,
which replaces `nn.Linear` modules only, leaves in BF16; PEFT's preparation casts every 16-bit
parameter that is not 4-bit to FP32. Needs torch, transformers, peft and bitsandbytes (the
`make training-trace` environment); a few seconds on a CPU. Exit status 0 when the experts
are unquantized and FP32 after preparation (what the planner counts), 1 otherwise.
"""

import sys
import tempfile


def main() -> int:
    import torch
    import transformers
    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, MixtralConfig

    config = MixtralConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=1000,
    )
    with tempfile.TemporaryDirectory() as path:
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(path)
        quantization = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.bfloat16
        )
        model = AutoModelForCausalLM.from_pretrained(path, quantization_config=quantization, device_map="cpu")
    print(f"transformers {transformers.__version__}")

    def layer(stage: str) -> dict[str, str]:
        seen = {}
        for name, param in model.named_parameters():
            if name.startswith("model.layers.0."):
                seen[name] = f"{type(param).__name__} {param.dtype}"
                print(f"{stage:9} {name:45} {seen[name]}")
        return seen

    loaded = layer("loaded")
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    prepared = layer("prepared")
    experts = [n for n in loaded if ".experts." in n]
    quantized = [n for n in loaded if loaded[n].startswith("Params4bit")]
    unquantized_then_fp32 = bool(experts) and all(
        not loaded[n].startswith("Params4bit") and prepared[n].endswith("float32") for n in experts
    )
    print(f"quantized: {len(quantized)} parameters; experts unquantized and FP32 after preparation: {unquantized_then_fp32}")
    return 0 if unquantized_then_fp32 else 1


if __name__ == "__main__":
    sys.exit(main())
