//! The serving memory model against published engine start-up logs: for each cited log, the
//! planner's KV cache per replica (through `serving_fit`, the search's own code path) must be
//! within ±10 % of what the engine logged ("GPU KV cache size: N tokens", "# GPU blocks: N"
//! x 16, SGLang's "KV Cache is allocated. #tokens: N", or the logged KV memory in GiB when the
//! log gives no token count). Sources and the resulting errors: `docs/planner.md`,
//! "Calibration".

#![allow(clippy::expect_used)]

use hwaccel::hardware::{GIB, Precision, Vendor};
use hwaccel::plan::Bytes;
use hwaccel::plan::kv::KvDtype;
use hwaccel::plan::memory::{Engine, ServingDevice, ServingTarget, default_gpu_util, serving_fit};
use hwaccel::plan::model::presets;
use hwaccel::plan::weights::WeightBytes;

/// What the log reports.
#[derive(Debug, Clone, Copy)]
enum Logged {
    /// KV-cache tokens per replica.
    Tokens(u64),
    /// KV-cache memory per device, GiB ("Available KV cache memory", "available_kv_cache_memory").
    KvGib(f64),
}

/// One published start-up log.
#[derive(Debug, Clone, Copy)]
struct Row {
    source: &'static str,
    engine: Engine,
    model: &'static str,
    precision: Precision,
    /// Device memory as the engine logged it (`total_gpu_memory`), GiB.
    capacity_gib: f64,
    product: &'static str,
    tp: u32,
    /// Pipeline stages.
    pp: u32,
    /// The TP group sits in one NVLink-class domain (NVLink / NVSwitch); otherwise its
    /// collectives cross PCIe.
    nvlink: bool,
    context: u64,
    /// `None`: the engine's default.
    util: Option<f64>,
    kv_dtype: KvDtype,
    max_num_batched_tokens: Option<u64>,
    max_num_seqs: Option<u64>,
    /// `--enforce-eager` (vLLM) / `--disable-cuda-graph` (SGLang): no CUDA graphs.
    enforce_eager: bool,
    logged: Logged,
}

const TOLERANCE: f64 = 0.10;

// Logs read and left out, with the reason (also in docs/planner.md):
// * vllm-project/vllm#21348, vLLM side (Qwen3-235B-A22B-FP8, TP 4, 178,880 tokens): launched
//   with LMCache's KV connector, whose GPU buffers are not part of vLLM's own accounting.
// * vllm-project/vllm#23278 and #27508 (gpt-oss-120b on one H100: "Available KV cache memory:
//   -2.14 GiB" and 1.71 GiB): vLLM loads 65.97 GiB of weights there (it pads the MXFP4 experts
//   for its MoE kernels), 5 GiB more than the checkpoint; weight padding is not modelled. The
//   planner agrees that the model does not start at vLLM's defaults on one H100.
// * vllm-project/vllm#13061 (2x RTX 4090): the logged token count (81,536) does not follow
//   from the logged KV memory (8.69 GiB) at the model's 96 KiB per token and rank.
// * vllm-project/vllm issue on Llama-3.1-8B with EAGLE on an H100 (410,128 tokens in 51.63 GiB):
//   the draft model's KV layer and weights share the pool; speculative decoding is not modelled.
// * LLaVA-1.6-Mistral-7B (vLLM 0.10.2, H100) and Qwen3.5/Qwen3.6/Gemma-4/Granite logs: vision
//   towers, hybrid linear attention or architectures without a preset.
// * Mistral-7B-GPTQ on a DGX Spark (vLLM 0.11, 840,160 tokens) and Qwen2.5-32B "on A100 80GB or
//   H100" (239,152 tokens): the device memory is not logged (the second cannot be an 80 GB card).
// * vllm-project/vllm#12330 (A100 40GB, Meta-Llama-3-8B, V0 0.6.6, 5691 blocks): the log shows a
//   9.37 GiB activation peak, 7x the 1.26 GiB the same model and defaults logged on an H100
//   (vllm-project/vllm#10511), and no launch flags. 9.37 GiB is what 8192 sampler rows of FP32
//   logits cost (a max_num_seqs near 8192); with that flag assumed the planner lands at +4.7 %,
//   at the defaults +73 %. The flag is not in the log, so the row is left out and the memory
//   model unchanged: the A100-40GB is still missing from the table.
// * vllm-project/vllm#17327 / #17469 (vLLM 0.8.5 V1, Qwen3-30B-A3B, 4x A10, 198,784 tokens at
//   8192): the device memory and utilisation are not in the quoted log.
// * vLLM 0.8.5 logs of Qwen2-7B at TP 2 (473,184 tokens) and Qwen3-32B at TP 2 (67,856 tokens)
//   quoted in vLLM issues name no GPU.

fn rows() -> Vec<Row> {
    let base = Row {
        source: "",
        engine: Engine::Vllm,
        model: "",
        precision: Precision::Bf16,
        capacity_gib: 0.0,
        product: "",
        tp: 1,
        pp: 1,
        nvlink: false,
        context: 8192,
        util: None,
        kv_dtype: KvDtype::Auto,
        max_num_batched_tokens: None,
        max_num_seqs: None,
        enforce_eager: false,
        logged: Logged::Tokens(0),
    };
    vec![
        Row {
            source: "vllm-project/vllm#10517 (RTX 3090, V0, --max-model-len 20000)",
            engine: Engine::VllmV0,
            model: "llama-3.1-8b",
            capacity_gib: 23.58,
            product: "NVIDIA GeForce RTX 3090",
            context: 20_000,
            logged: Logged::Tokens(1952 * 16),
            ..base
        },
        Row {
            source: "vllm-project/vllm#10517 (RTX 3090, V0, --max-model-len 29000)",
            engine: Engine::VllmV0,
            model: "llama-3.1-8b",
            capacity_gib: 23.58,
            product: "NVIDIA GeForce RTX 3090",
            context: 29_000,
            logged: Logged::Tokens(23_648),
            ..base
        },
        Row {
            source: "vllm-project/vllm#10511 (H100, V0, Meta-Llama-3-8B, defaults)",
            engine: Engine::VllmV0,
            model: "llama-3.1-8b",
            capacity_gib: 79.22,
            product: "NVIDIA H100 80GB HBM3",
            context: 8192,
            logged: Logged::KvGib(53.29),
            ..base
        },
        Row {
            source: "vllm-project/vllm#2031 (A100-80GB, V0, Llama-2-7B, benchmark_throughput)",
            engine: Engine::VllmV0,
            model: "llama-2-7b",
            precision: Precision::Fp16,
            capacity_gib: 79.15,
            product: "NVIDIA A100-SXM4-80GB",
            context: 4096,
            logged: Logged::Tokens(7351 * 16),
            ..base
        },
        Row {
            source: "vllm-project/vllm#21348 (4x H100, SGLang, Qwen3-235B-A22B-FP8, --tp 4 --mem-fraction-static 0.93)",
            engine: Engine::Sglang,
            model: "qwen3-235b-a22b",
            precision: Precision::Fp8,
            capacity_gib: 79.22,
            product: "NVIDIA H100 80GB HBM3",
            tp: 4,
            // The issue does not describe the board; four H100 80GB HBM3 (SXM) sit on an
            // NVSwitch baseboard in the usual servers, as the former name-based rule assumed.
            nvlink: true,
            context: 40_960,
            util: Some(0.93),
            logged: Logged::Tokens(367_404),
            ..base
        },
        Row {
            // The post says "A100"; 0.65 of it held 13.72 GiB of weights and 36.56 GiB of KV,
            // so it is the 80 GB card.
            source: "myoceane.fr/index.php/ai-vllm-a100-gemma-4 (A100 80GB, vLLM 0.19, gpt-oss-20b, --gpu-memory-utilization 0.65)",
            engine: Engine::VllmV1,
            model: "gpt-oss-20b",
            precision: Precision::Mxfp4,
            capacity_gib: 79.15,
            product: "NVIDIA A100-SXM4-80GB",
            context: 131_072,
            util: Some(0.65),
            logged: Logged::KvGib(36.56),
            ..base
        },
        Row {
            // WSL2 on an RTX 4080 (16,376 MiB); the notes itemise 5.29 GiB of weights, 1.04 GiB of
            // activations, 0.48 GiB of CUDA graphs and 8.0 GiB of KV cache.
            source: "akiyax/kvcache-lab docs/phase1-baseline.md (vLLM 0.26, RTX 4080 15.99 GiB, Qwen2.5-7B-Instruct-AWQ, --max-model-len 32768)",
            engine: Engine::Vllm,
            model: "qwen2-7b",
            precision: Precision::Int4,
            capacity_gib: 15.99,
            product: "NVIDIA GeForce RTX 4080",
            context: 32_768,
            logged: Logged::Tokens(149_712),
            ..base
        },
        Row {
            // The README quotes the log but not the device total; an L40S reports 44.42 GiB
            // (the 8x L40S log below).
            source: "aws-samples/sample-claude-code-multi-model self-hosted/vllm/README.md (4x L40S, vLLM 0.24, Qwen3-Coder-30B-A3B, TP 4, 32k)",
            engine: Engine::Vllm,
            model: "qwen3-30b-a3b",
            capacity_gib: 44.42,
            product: "NVIDIA L40S",
            tp: 4,
            context: 32_768,
            logged: Logged::Tokens(1_037_152),
            ..base
        },
        Row {
            // Capacity as the same log prints it ("Free memory on device (43.93/44.42 GiB)"). The
            // file's heading command says TP 4; the log under it ran `--tensor-parallel-size 8`
            // (non-default args, Worker_TP0..TP7). Source repository untraceable: the code index
            // holds the file but does not name its repository.
            source: "untraceable public notes \"Hosting Qwen3-235B-A22B-Instruct-2507-FP8 on 8xL40S\" (vLLM 0.10.2, TP 8 + EP, 32k)",
            engine: Engine::VllmV1,
            model: "qwen3-235b-a22b",
            precision: Precision::Fp8,
            capacity_gib: 44.42,
            product: "NVIDIA L40S",
            tp: 8,
            context: 32_768,
            logged: Logged::Tokens(238_208),
            ..base
        },
        Row {
            // server_args shows mem_fraction_static=0.85 chosen by SGLang itself (an older default than
            // today's formula, which gives 0.815 here), so the row passes it explicitly. The
            // device total is CUDA's for an L4, 22.05 GiB ("Free memory on device (1.53/22.05
            // GiB)" on vLLM's L4 CI agents, vllm-project/vllm CI build 48519), not nvidia-smi's
            // 23,034 MiB: the log agrees (21.63 GB free after 0.13 GB of communicators and the
            // CUDA context).
            source: "didier-durand/llms-in-clouds docs/sglang.md (SGLang, March 2025, QwQ-32B, 4x L4, --tp 4)",
            engine: Engine::Sglang,
            model: "qwen2.5-32b",
            capacity_gib: 22.05,
            product: "NVIDIA L4",
            tp: 4,
            context: 131_072,
            util: Some(0.85),
            logged: Logged::Tokens(46_611),
            ..base
        },
        Row {
            // The notes ("Week 4 笔记(Day1):vLLM 初体验", section "启动日志挖金矿") ran vLLM 0.6.6
            // on an RTX 3090. Source repository untraceable: the code index holds the file but
            // does not name its repository.
            source: "untraceable study notes \"启动日志挖金矿\" (vLLM 0.6.6 V0, Qwen2.5-7B BF16, RTX 3090 23.57 GiB, --max-model-len 8192 --max-num-seqs 16)",
            engine: Engine::VllmV0,
            model: "qwen2-7b",
            capacity_gib: 23.57,
            product: "NVIDIA GeForce RTX 3090",
            context: 8192,
            max_num_seqs: Some(16),
            logged: Logged::Tokens(6749 * 16),
            ..base
        },
        Row {
            // GGUF Q8_0 stands in as INT8 (8.5 bits per weight with its scales; vLLM logged 3.26 GiB).
            // The walkthrough ("Local RAG with LangChain") links its CPU variant,
            // eformat/rag-local-intel-cpu; its own repository is untraceable: the code index
            // holds the file but does not name its repository.
            source: "untraceable RAG walkthrough \"Local RAG with LangChain\" (vLLM 0.8 V0, Llama-3.2-3B-Instruct Q8_0 GGUF, RTX 4070 7.65 GiB, --max-model-len 10000 --enforce-eager)",
            engine: Engine::VllmV0,
            model: "llama-3.2-3b",
            precision: Precision::Int8,
            capacity_gib: 7.65,
            enforce_eager: true,
            product: "NVIDIA GeForce RTX 4070",
            context: 10_000,
            logged: Logged::Tokens(1395 * 16),
            ..base
        },
        Row {
            // Unsloth's SyntheticDataKit starting vLLM on a Colab T4 (Turing: V0 and XFormers);
            // its logged args give max_num_seqs 192 and max_num_batched_tokens 2048.
            source: "huggingface/cookbook notebooks/en/fine_tune_chatbot_docs_synthetic.ipynb (vLLM 0.8.2 V0, unsloth/Llama-3.2-3B-Instruct FP16, T4 14.74 GiB, gpu_memory_utilization 0.89, max_model_len 2048)",
            engine: Engine::VllmV0,
            model: "llama-3.2-3b",
            precision: Precision::Fp16,
            capacity_gib: 14.74,
            product: "Tesla T4",
            context: 2048,
            util: Some(0.89),
            max_num_seqs: Some(192),
            logged: Logged::Tokens(3637 * 16),
            ..base
        },
        Row {
            // vLLM 0.8.4's V1 engine through the `LLM` class on one of four RTX 3090s (the post's
            // hardware section), `max_model_len=4096`, default utilisation; the log states the
            // 8192-token chunked-prefill budget of the `LLM` class. Source repository
            // untraceable: the code index holds the post (author "hsc", 2025-02-27) but does not
            // name its repository; no vllm-project/vllm issue found gives a V1 0.8-0.9 log with
            // both the GPU and the flags.
            source: "untraceable blog post \"vLLM 框架介绍与本地私有化部署\" (vLLM 0.8.4 V1, Qwen2.5-7B BF16, RTX 3090, max_model_len 4096)",
            engine: Engine::VllmV1,
            model: "qwen2-7b",
            capacity_gib: 23.58,
            product: "NVIDIA GeForce RTX 3090",
            context: 4096,
            max_num_batched_tokens: Some(8192),
            logged: Logged::Tokens(97_680),
            ..base
        },
        Row {
            // The same post, TP 2 at 0.8: rank 0 logged 359,328 tokens, rank 1 359,712.
            source: "untraceable blog post \"vLLM 框架介绍与本地私有化部署\" (vLLM 0.8.4 V1, Qwen2.5-7B BF16, 2x RTX 3090, tensor_parallel_size 2, gpu_memory_utilization 0.8)",
            engine: Engine::VllmV1,
            model: "qwen2-7b",
            capacity_gib: 23.58,
            product: "NVIDIA GeForce RTX 3090",
            tp: 2,
            context: 4096,
            util: Some(0.8),
            max_num_batched_tokens: Some(8192),
            logged: Logged::Tokens(359_328),
            ..base
        },
        Row {
            // V0 (the `worker.py` profiling lines and `# CUDA blocks`), April 2025; the log
            // prints 44.42 GiB, 0.90, 30.71 GiB of weights per rank and 3947 blocks.
            source: "vllm-project/vllm#15815 (V0, Qwen2.5-32B-Instruct BF16, 2x L40S, TP 2, --max-model-len 10000)",
            engine: Engine::VllmV0,
            model: "qwen2.5-32b",
            capacity_gib: 44.42,
            product: "NVIDIA L40S",
            tp: 2,
            context: 10_000,
            logged: Logged::Tokens(3947 * 16),
            ..base
        },
        Row {
            // ROCm: 192 GB HBM3 reported as 191.98 GiB.
            source: "AUGMXNT/MI300-testing README.md (vLLM 0.6.3 ROCm, 1x MI300X, Llama-2-7b-chat, benchmark_throughput)",
            engine: Engine::VllmV0,
            model: "llama-2-7b",
            precision: Precision::Fp16,
            capacity_gib: 191.98,
            product: "AMD Instinct MI300X",
            context: 4096,
            logged: Logged::Tokens(20_186 * 16),
            ..base
        },
        Row {
            source: "AUGMXNT/MI300-testing README.md (vLLM 0.6.3 ROCm, 8x MI300X, Llama-2-7b-chat, -tp 8)",
            engine: Engine::VllmV0,
            model: "llama-2-7b",
            precision: Precision::Fp16,
            capacity_gib: 191.98,
            product: "AMD Instinct MI300X",
            tp: 8,
            context: 4096,
            logged: Logged::Tokens(169_460 * 16),
            ..base
        },
        Row {
            // Google Cloud a2-highgpu-1g (one A100 40GB, the README's machine). The log prints
            // no device total; 39.50 GiB is what vLLM logged for the same product in
            // vllm-project/vllm#12330. The `LLM` class logged its 8192-token chunked-prefill
            // budget; eager mode (no CUDA graphs) was asked for.
            source: "ilseokoh/vllm-gce README.md (vLLM 0.15.1 V1, Meta-Llama-3.1-8B-Instruct BF16, 1x A100 40GB, LLM(enforce_eager=True), max_model_len 131072)",
            engine: Engine::VllmV1,
            model: "llama-3.1-8b",
            capacity_gib: 39.50,
            product: "NVIDIA A100-SXM4-40GB",
            context: 131_072,
            max_num_batched_tokens: Some(8192),
            enforce_eager: true,
            logged: Logged::Tokens(157_936),
            ..base
        },
        Row {
            // benchmark_throughput at its defaults: the model's 32,768-token context, 0.90.
            source: "AUGMXNT/MI300-testing inference-vllm-mixtral-runpod.ipynb (vLLM 0.6.4 ROCm V0, Mixtral-8x7B-Instruct BF16, 1x MI300X, benchmark_throughput)",
            engine: Engine::VllmV0,
            model: "mixtral-8x7b",
            capacity_gib: 191.98,
            product: "AMD Instinct MI300X",
            context: 32_768,
            logged: Logged::Tokens(39_212 * 16),
            ..base
        },
        Row {
            source: "AUGMXNT/MI300-testing inference-vllm-mixtral-runpod.ipynb (vLLM 0.6.4 ROCm V0, Mixtral-8x7B-Instruct BF16, 2x MI300X, benchmark_throughput --tensor-parallel-size 2)",
            engine: Engine::VllmV0,
            model: "mixtral-8x7b",
            capacity_gib: 191.98,
            product: "AMD Instinct MI300X",
            tp: 2,
            context: 32_768,
            logged: Logged::Tokens(124_518 * 16),
            ..base
        },
        Row {
            // benchmark_latency at its defaults (Meta-Llama-3-8B: an 8,192-token context).
            source: "AUGMXNT/MI300-testing inference-vllm-gemm-tuning.ipynb (vLLM 0.6.4 ROCm V0, Meta-Llama-3-8B-Instruct BF16, 1x MI300X, benchmark_latency)",
            engine: Engine::VllmV0,
            model: "llama-3.1-8b",
            capacity_gib: 191.98,
            product: "AMD Instinct MI300X",
            context: 8192,
            logged: Logged::Tokens(78_921 * 16),
            ..base
        },
        Row {
            // The logged arguments turn chunked prefill off (`enable_chunked_prefill=False`),
            // so V0 profiles the whole 131,072-token context in one step:
            // `max_num_batched_tokens = max(max_model_len, 2048)` (V0 `SchedulerConfig`).
            source: "AUGMXNT/MI300-testing inference-vllm-gemm-tuning.ipynb (vLLM 0.6.4 ROCm V0, Llama-3.1-8B-Instruct BF16, 1x MI300X, benchmark_throughput --num-scheduler-steps 15, max_model_len 131072, chunked prefill off)",
            engine: Engine::VllmV0,
            model: "llama-3.1-8b",
            capacity_gib: 191.98,
            product: "AMD Instinct MI300X",
            context: 131_072,
            max_num_batched_tokens: Some(131_072),
            logged: Logged::Tokens(71_538 * 16),
            ..base
        },
        Row {
            // As above, on eight devices; the same log itemises 7.24 GiB of peak torch memory
            // and 6.8 to 7.0 GiB of non-torch memory (RCCL) per device.
            source: "AUGMXNT/MI300-testing inference-vllm-vs-vllm-rocm.ipynb (vLLM 0.6.4 ROCm V0, Llama-3.1-8B-Instruct BF16, 8x MI300X, benchmark_throughput -tp 8, max_model_len 131072, chunked prefill off)",
            engine: Engine::VllmV0,
            model: "llama-3.1-8b",
            capacity_gib: 191.98,
            product: "AMD Instinct MI300X",
            tp: 8,
            context: 131_072,
            max_num_batched_tokens: Some(131_072),
            logged: Logged::Tokens(645_227 * 16),
            ..base
        },
        Row {
            // The PR's worked example replays a logged SGLang start-up: DeepSeek-R1 FP8
            // weights, BF16 MLA cache, mem_fraction_static 0.82, "the observed ~509k" tokens
            // (its own rounding). The device total is CUDA's for an H200 (139.81 GiB, the
            // vLLM H200 logs quoted in docs/planner.md).
            source: "ai-dynamo/aisimulate#263 (SGLang, DeepSeek-R1 FP8, 8x H200, TP 8, --mem-fraction-static 0.82)",
            engine: Engine::Sglang,
            model: "deepseek-v3",
            precision: Precision::Fp8,
            capacity_gib: 139.81,
            product: "NVIDIA H200",
            tp: 8,
            nvlink: true,
            context: 163_840,
            util: Some(0.82),
            logged: Logged::Tokens(509_000),
            ..base
        },
        Row {
            // vLLM 0.19.0 (V1: CUDA graphs outside the budget) on "h100-80gb" nodes: 79.19 GiB
            // as CUDA reports it ("Free memory on device (78.68/79.19 GiB)"), 0.95, 8192 batched
            // tokens and 1024 sequences (logged defaults). The TP 1 reference for the rows below:
            // 0.25 GiB of non-torch memory.
            source: "llm-d-incubation/llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs/meta-llama-llama-3-1-8b---h100-80gb--tp1pp1dp1--8192.log (vLLM 0.19.0, Llama-3.1-8B-Instruct BF16, 1x H100, --gpu-memory-utilization 0.95)",
            engine: Engine::VllmV1,
            model: "llama-3.1-8b",
            capacity_gib: 79.19,
            product: "NVIDIA H100 80GB HBM3",
            util: Some(0.95),
            logged: Logged::Tokens(476_016),
            ..base
        },
        Row {
            // The same sweep at TP 2: 2.07 GiB of non-torch memory per device. The GPUs share
            // NVLink: vLLM's custom all-reduce (which refuses more than two PCIe-only GPUs) and
            // FlashInfer's trtllm all-reduce ran at TP 4 on the same nodes.
            source: "llm-d-incubation/llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs/meta-llama-llama-3-1-8b---h100-80gb--tp2pp1dp1--8192.log (vLLM 0.19.0, Llama-3.1-8B-Instruct BF16, 2x H100 NVLink, TP 2, 0.95)",
            engine: Engine::VllmV1,
            model: "llama-3.1-8b",
            capacity_gib: 79.19,
            product: "NVIDIA H100 80GB HBM3",
            tp: 2,
            nvlink: true,
            util: Some(0.95),
            logged: Logged::Tokens(1_044_688),
            ..base
        },
        Row {
            source: "llm-d-incubation/llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs/meta-llama-llama-3-1-8b---h100-80gb--tp4pp1dp1--8192.log (vLLM 0.19.0, Llama-3.1-8B-Instruct BF16, 4x H100 NVLink, TP 4, 0.95)",
            engine: Engine::VllmV1,
            model: "llama-3.1-8b",
            capacity_gib: 79.19,
            product: "NVIDIA H100 80GB HBM3",
            tp: 4,
            nvlink: true,
            util: Some(0.95),
            logged: Logged::Tokens(2_209_792),
            ..base
        },
        Row {
            // Pipeline stages only: 0.07 GiB of non-torch memory per device, no all-reduce
            // buffers. vLLM keeps the smaller stage's pool (the first stage logged 66.54 GiB, the
            // last, with the sampler, 65.64 GiB: 1,075,312 tokens of 64 KiB).
            source: "llm-d-incubation/llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs/meta-llama-llama-3-1-8b---h100-80gb--tp1pp2dp1--8192.log (vLLM 0.19.0, Llama-3.1-8B-Instruct BF16, 2x H100, PP 2, 0.95)",
            engine: Engine::VllmV1,
            model: "llama-3.1-8b",
            capacity_gib: 79.19,
            product: "NVIDIA H100 80GB HBM3",
            pp: 2,
            util: Some(0.95),
            logged: Logged::Tokens(1_075_312),
            ..base
        },
        Row {
            source: "llm-d-incubation/llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs/qwen-qwen2-5-7b-instruct--h100-80gb--tp2pp1dp1--8192.log (vLLM 0.19.0, Qwen2.5-7B-Instruct BF16, 2x H100 NVLink, TP 2, 0.95)",
            engine: Engine::VllmV1,
            model: "qwen2-7b",
            capacity_gib: 79.19,
            product: "NVIDIA H100 80GB HBM3",
            tp: 2,
            nvlink: true,
            util: Some(0.95),
            logged: Logged::Tokens(2_390_592),
            ..base
        },
        Row {
            source: "llm-d-incubation/llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs/qwen-qwen2-5-7b-instruct--h100-80gb--tp4pp1dp1--8192.log (vLLM 0.19.0, Qwen2.5-7B-Instruct BF16, 4x H100 NVLink, TP 4, 0.95)",
            engine: Engine::VllmV1,
            model: "qwen2-7b",
            capacity_gib: 79.19,
            product: "NVIDIA H100 80GB HBM3",
            tp: 4,
            nvlink: true,
            util: Some(0.95),
            logged: Logged::Tokens(5_043_280),
            ..base
        },
        Row {
            // RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic: Llama-3.1-70B's shapes, FP8 weights
            // (33.88 GiB per device logged).
            source: "llm-d-incubation/llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs/fp8dyn-llama-3-3-70b--h100-80gb--tp2pp1dp1--8192.log (vLLM 0.19.0, Llama-3.3-70B-Instruct FP8-dynamic, 2x H100 NVLink, TP 2, 0.95)",
            engine: Engine::VllmV1,
            model: "llama-3.1-70b",
            precision: Precision::Fp8,
            capacity_gib: 79.19,
            product: "NVIDIA H100 80GB HBM3",
            tp: 2,
            nvlink: true,
            util: Some(0.95),
            logged: Logged::Tokens(244_304),
            ..base
        },
        Row {
            source: "llm-d-incubation/llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs/fp8dyn-llama-3-3-70b--h100-80gb--tp4pp1dp1--8192.log (vLLM 0.19.0, Llama-3.3-70B-Instruct FP8-dynamic, 4x H100 NVLink, TP 4, 0.95)",
            engine: Engine::VllmV1,
            model: "llama-3.1-70b",
            precision: Precision::Fp8,
            capacity_gib: 79.19,
            product: "NVIDIA H100 80GB HBM3",
            tp: 4,
            nvlink: true,
            util: Some(0.95),
            logged: Logged::Tokens(708_992),
            ..base
        },
        Row {
            source: "llm-d-incubation/llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs/mistralai-mixtral-8x7b-i--h100-80gb--tp2pp1dp1--8192.log (vLLM 0.19.0, Mixtral-8x7B-Instruct BF16, 2x H100 NVLink, TP 2, 0.95)",
            engine: Engine::VllmV1,
            model: "mixtral-8x7b",
            capacity_gib: 79.19,
            product: "NVIDIA H100 80GB HBM3",
            tp: 2,
            nvlink: true,
            util: Some(0.95),
            logged: Logged::Tokens(465_936),
            ..base
        },
        Row {
            // Issue 38: a sliding-window model (21 of 42 layers over 4,096 tokens). At 8,192
            // tokens and 8,192 batched tokens a windowed layer keeps the whole context either
            // way, so the row checks the accounting, not the window.
            source: "llm-d-incubation/llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs/google-gemma-2-9b-it--h100-80gb--tp1pp1dp1--8192.log (vLLM 0.19.0, gemma-2-9b-it BF16, 1x H100, 0.95)",
            engine: Engine::VllmV1,
            model: "gemma-2-9b",
            capacity_gib: 79.19,
            product: "NVIDIA H100 80GB HBM3",
            util: Some(0.95),
            logged: Logged::Tokens(168_880),
            ..base
        },
        Row {
            source: "llm-d-incubation/llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs/google-gemma-2-27b-it--h100-80gb--tp1pp1dp1--8192.log (vLLM 0.19.0, gemma-2-27b-it BF16, 1x H100, 0.95)",
            engine: Engine::VllmV1,
            model: "gemma-2-27b",
            capacity_gib: 79.19,
            product: "NVIDIA H100 80GB HBM3",
            util: Some(0.95),
            logged: Logged::Tokens(58_672),
            ..base
        },
        Row {
            // 67.8 GiB of weights per device leave a 3.04 GiB pool: the row most sensitive to
            // the communication buffers (2.09 GiB of non-torch memory logged).
            source: "llm-d-incubation/llm-d-planner@d3121e0 accuracy/results/v0.19.0/logs/qwen-qwen2-5-72b-instruc--h100-80gb--tp2pp1dp1--8192.log (vLLM 0.19.0, Qwen2.5-72B-Instruct BF16, 2x H100 NVLink, TP 2, 0.95)",
            engine: Engine::VllmV1,
            model: "qwen2.5-72b",
            capacity_gib: 79.19,
            product: "NVIDIA H100 80GB HBM3",
            tp: 2,
            nvlink: true,
            util: Some(0.95),
            logged: Logged::Tokens(19_920),
            ..base
        },
    ]
}

/// The planner's value for a row, in the unit the log gives, and the logged value.
fn planned(row: &Row) -> (f64, f64) {
    let model = presets::find(row.model)
        .expect("presets parse")
        .expect("preset exists");
    let weights = WeightBytes::of(&model, row.precision);
    let capacity = Bytes::from_f64(row.capacity_gib * GIB as f64);
    let target = ServingTarget {
        engine: row.engine,
        gpu_util: row
            .util
            .unwrap_or_else(|| default_gpu_util(row.engine, capacity, row.tp, row.pp)),
        max_num_batched_tokens: row.max_num_batched_tokens,
        max_num_seqs: row.max_num_seqs,
        enforce_eager: row.enforce_eager,
        ..ServingTarget::new(row.context, row.kv_dtype, 0.0)
    };
    let vendor = if row.product.starts_with("AMD") {
        Vendor::Amd
    } else {
        Vendor::Nvidia
    };
    let device = ServingDevice::new(vendor, capacity, row.product)
        .with_fast_domain(if row.nvlink { row.tp } else { 0 });
    let fit = serving_fit(&model, &weights, device, row.tp, row.pp, &target);
    match row.logged {
        Logged::Tokens(tokens) => (fit.kv_tokens as f64, tokens as f64),
        Logged::KvGib(gib) => (fit.kv_free.as_f64() / GIB as f64, gib),
    }
}

#[test]
fn kv_cache_matches_published_start_up_logs_within_ten_percent() {
    let rows = rows();
    // Issue 23 asks for at least 25 published logs; the table must not shrink below that.
    assert!(rows.len() >= 25, "{} rows", rows.len());
    let mut errors = Vec::new();
    let mut failures = Vec::new();
    for row in rows {
        let (planner, logged) = planned(&row);
        let error = planner / logged - 1.0;
        println!(
            "{:+6.1}%  planner {planner:>12.2}  logged {logged:>12.2}  {}",
            error * 100.0,
            row.source
        );
        if error.abs() > TOLERANCE {
            failures.push(format!(
                "{}: planner {planner:.2}, logged {logged:.2}",
                row.source
            ));
        }
        errors.push(error.abs());
    }
    errors.sort_by(f64::total_cmp);
    println!(
        "max error {:.1} %, median {:.1} %",
        errors.last().copied().unwrap_or(0.0) * 100.0,
        errors.get(errors.len() / 2).copied().unwrap_or(0.0) * 100.0
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Issue 38: vLLM 0.19.0's own per-request count for a model mixing sliding-window and full
/// layers. gpt-oss-20b at TP 2 logged "GPU KV cache size: 2,591,776 tokens" and "Maximum
/// concurrency for 8,192 tokens per request: 316.07x" (llm-d-incubation/llm-d-planner@d3121e0,
/// `accuracy/results/v0.19.0/logs/openai-gpt-oss-20b--h100-80gb--tp2pp1dp1--8192.log`): its 12
/// windowed layers hold one 16-token block more than the 12 full ones
/// (`cdiv(min(window - 1 + 8192, 8192), 16) + 1`), which the planner's per-request bytes
/// reproduce. (The weights are left out of the KV table: vLLM pads the MXFP4 experts.)
#[test]
fn windowed_layers_cost_what_vllm_counts_per_request() {
    use hwaccel::plan::kv::{KvLayout, WindowCaching};
    let model = presets::find("gpt-oss-20b").unwrap().unwrap();
    let kv = KvLayout::new(&model, KvDtype::Auto, 2, 1).with_window_caching(WindowCaching::All);
    let pool = 2_591_776.0 * kv.bytes_per_token().as_f64();
    let concurrency = pool / kv.per_request(8192, 8192).as_f64();
    assert!((concurrency - 316.07).abs() < 0.01, "{concurrency}");
}

/// Issue 38: `scripts/measure-training-memory.py --list` and `--dry-run` need neither a GPU
/// nor PyTorch; the default case list parses, spans the models the issue names (1B to 47B,
/// two MoEs), every method and optimizer precision, and builds a config for every case.
#[test]
fn the_training_measurement_script_lists_its_cases_without_a_gpu() {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/measure-training-memory.py"
    );
    let out = std::process::Command::new("python3")
        .args([script, "--dry-run"])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cases = plan["cases"].as_array().unwrap();
    assert!(cases.len() >= 21, "{} cases", cases.len());
    let field = |name: &str| -> std::collections::BTreeSet<String> {
        cases
            .iter()
            .map(|c| c[name].to_string().trim_matches('"').to_string())
            .collect()
    };
    for model in [
        "llama-3.2-1b",
        "llama-3.1-8b",
        "qwen2.5-32b",
        "mixtral-8x7b",
        "qwen3-30b-a3b",
    ] {
        assert!(field("model").contains(model), "{model}");
    }
    for method in ["full", "lora", "dpo"] {
        assert!(field("method").contains(method), "{method}");
    }
    for states in ["fp32", "bf16", "8bit"] {
        assert!(field("optimizer_states").contains(states), "{states}");
    }
    assert_eq!(field("gradient_checkpointing").len(), 2);
    for case in cases {
        let config = &case["config"];
        assert!(config["num_hidden_layers"].as_u64().unwrap() > 0, "{case}");
        assert!(
            config.get("params_computed_b").is_none(),
            "planner-only field in {case}"
        );
    }
    // A bad selection is an error, not an empty run.
    let out = std::process::Command::new("python3")
        .args([script, "--list", "--only", "no-such-case"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no case named"));
}
