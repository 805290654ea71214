//! `hwaccel plan`: flags, input loading, and the exit-code contract — 0 when the goal fits,
//! 2 when it does not (the output says why and what would), 1 on bad input.
//!
//! The flags become a [`PlanInput`], the same description of the question a ModelPlacement
//! spec becomes, and [`prepare`] turns it into the planner's request. DRA ResourceSlices
//! (`--resource-slices`) are read and merged in [`super::plan_dra`]. `--emit deployment|lws`
//! prints a workload that runs the plan instead ([`super::plan_emit`]).

use std::cell::RefCell;
use std::path::PathBuf;
use std::process::ExitCode;

use super::plan_dra::{self, DraNames};
use super::plan_emit::{self, EmitArgs};

use crate::output::{self, Format};
use crate::plan::capability::PrecisionChoice;
use crate::plan::engine::choice::{EngineChoice, EngineKind, EngineVersion};
use crate::plan::error::{PlanError, Result};
use crate::plan::inventory::{NodeSpec, Reservations};
use crate::plan::kv::KvDtype;
use crate::plan::load::{load_inventories, parse_bytes};
use crate::plan::model::presets;
use crate::plan::report::Plan;
use crate::plan::request::{ModelInput, PlanInput, prepare};
use crate::plan::search::{Disaggregation, Goal, plan};
use crate::plan::shorthand::parse_hardware;
use crate::plan::training::{
    Adamw, Kernels, LoraTarget, Loss, Method, OptimizerStates, TrainingTarget,
};

/// The goal flags `hwaccel plan` and `hwaccel fleet` share: serving or training, their
/// shape, precision and limits. One struct so the two commands cannot drift apart.
#[derive(Debug, Clone, clap::Args)]
pub struct GoalArgs {
    /// Exact checkpoint size (`462GB`, `430GiB`, bytes), replacing computed weight bytes at the
    /// checkpoint's precision.
    #[arg(long)]
    pub checkpoint_bytes: Option<String>,
    /// Plan serving (the default goal).
    #[arg(long, conflicts_with = "train")]
    pub serve: bool,
    /// Tokens per request, prompt and output (default: the model's maximum).
    #[arg(long)]
    pub context: Option<u64>,
    /// Serving: YaRN RoPE scaling to lengthen the model's context, as the model card gives it:
    /// yarn:FACTOR, or yarn:FACTOR:ORIGINAL when the trained window is not the config's
    /// maximum (Qwen3: yarn:4:32768); the engine arguments that apply it are emitted.
    #[arg(long)]
    pub rope_scaling: Option<String>,
    /// Concurrent full-context requests to hold; replicas are added to reach it.
    #[arg(long, default_value_t = 1)]
    pub concurrency: u64,
    /// Plan whole devices even where a DRA driver publishes them shareable by memory
    /// (--resource-slices); without it a small model gets a share of a device.
    #[arg(long)]
    pub whole_devices: bool,
    /// Plan fine-tuning with this method.
    #[arg(long, value_enum)]
    pub train: Option<Method>,
    /// Training sequence length.
    #[arg(long, default_value_t = 2048)]
    pub seq_len: u64,
    /// Training sequences per device per step.
    #[arg(long, default_value_t = 1)]
    pub micro_batch: u64,
    /// Train without gradient checkpointing (keeps every activation).
    #[arg(long)]
    pub no_gradient_checkpointing: bool,
    /// Precision of the optimizer's states: fp32 (mixed precision, FP32 master weights and
    /// Adam moments), bf16 (everything in BF16) or 8bit (8-bit Adam moments).
    #[arg(long, value_enum, default_value_t = OptimizerStates::Fp32)]
    pub optimizer_states: OptimizerStates,
    /// The training loss: standard (transformers' cross-entropy on the whole logits, upcast to
    /// FP32) or fused (a fused linear cross-entropy over chunks of tokens, such as Liger
    /// Kernel's with `use_liger_kernel=True`; the logits are never whole).
    #[arg(long, value_enum, default_value_t = Loss::Standard)]
    pub loss: Loss,
    /// How AdamW steps: fused (each parameter updated in place: the HF Trainer's default
    /// `adamw_torch_fused`, DeepSpeed's FusedAdam) or foreach (`torch.optim.AdamW`'s default
    /// on CUDA, the HF Trainer's `adamw_torch`: a copy of the moments held during the step).
    #[arg(long, value_enum, default_value_t = Adamw::Fused)]
    pub adamw: Adamw,
    /// Which kernels run the layers' norms, rotary embedding and MLP activation: standard
    /// (transformers' own) or liger (Liger Kernel's RMSNorm, RoPE and SwiGLU/GeGLU, as
    /// `use_liger_kernel=True` puts them in beside its fused loss; they keep less).
    #[arg(long, value_enum, default_value_t = Kernels::Standard)]
    pub kernels: Kernels,
    /// LoRA rank.
    #[arg(long, default_value_t = 16)]
    pub lora_rank: u64,
    /// LoRA target modules, comma-separated (q,k,v,o,gate,up,down).
    #[arg(long, default_value = "q,k,v,o,gate,up,down")]
    pub lora_targets: String,
    /// Weight precision: auto, bf16, fp16, fp8, int8, int4, nf4, fp4 (nvfp4 or mxfp4), fp32.
    #[arg(long, default_value = "auto")]
    pub precision: String,
    /// KV-cache type.
    #[arg(long, value_enum, default_value_t = KvDtype::Auto)]
    pub kv_dtype: KvDtype,
    /// Most nodes the plan may use.
    #[arg(long)]
    pub max_nodes: Option<u32>,
    /// Fraction of device memory to use (default 0.90 for serving, like vLLM; 0.95 for training).
    #[arg(long)]
    pub gpu_util: Option<f64>,
    /// Serving engine whose memory accounting the plan follows and whose arguments --emit
    /// renders: vllm or sglang (default: vllm, said in the plan's reasons).
    #[arg(long)]
    pub engine: Option<String>,
    /// Engine release (0.10, 0.11.2) or vLLM generation (v0 = 0.7 and earlier, v1 = 0.8 to
    /// 0.20, current = 0.21 and later, CUDA graphs inside the budget). Default: current.
    #[arg(long)]
    pub engine_version: Option<String>,
    /// Serving without CUDA graphs (vLLM --enforce-eager, SGLang --disable-cuda-graph): their
    /// memory is not reserved.
    #[arg(long)]
    pub enforce_eager: bool,
    /// Sequences the engine runs at once (vLLM --max-num-seqs, SGLang --max-running-requests),
    /// 1 to 65536; sizes the sampler in the profile run. Default: the engine's for the device.
    #[arg(long)]
    pub max_num_seqs: Option<u64>,
    /// Tokens per scheduler step (vLLM --max-num-batched-tokens, SGLang
    /// --chunked-prefill-size), 1 to 4194304 and at least --max-num-seqs; sizes the profile
    /// run's activations. Default: the engine's for the device.
    #[arg(long)]
    pub max_num_batched_tokens: Option<u64>,
    /// SGLang's --mem-fraction-static, in (0, 1]: weights and KV pool per device (needs
    /// --engine sglang; replaces --gpu-util). Default: SGLang's own for the device and TP.
    #[arg(long)]
    pub mem_fraction_static: Option<f64>,
}

/// Flags of `hwaccel plan`.
#[derive(Debug, Clone, clap::Args)]
pub struct PlanArgs {
    /// Model: a preset key (`llama-3.1-70b`; see --list-models) or a Hugging Face config.json.
    #[arg(long, conflicts_with = "params", required_unless_present_any = ["params", "list_models", "placement"])]
    pub model: Option<String>,
    /// Model given only by its parameter count (`70B`, `8e9`); a Llama-like shape is assumed.
    #[arg(long)]
    pub params: Option<String>,
    /// Inventory file or directory (detection reports or node lists, JSON or YAML); repeatable.
    #[arg(long = "inventory", conflicts_with = "hardware")]
    pub inventory: Vec<PathBuf>,
    /// DRA ResourceSlices (`kubectl get resourceslices -o yaml` output, JSON or YAML);
    /// merged with --inventory files, one device per PCI bus id or UUID; repeatable.
    #[arg(long = "resource-slices", conflicts_with = "hardware")]
    pub resource_slices: Vec<PathBuf>,
    /// Hardware shorthand: `NODESxDEVICESxPRODUCT[-MEMGB][+nvswitch|+nvlink|+xgmi|+pcie|+ib]`.
    #[arg(long, required_unless_present_any = ["inventory", "resource_slices", "list_models", "placement"])]
    pub hardware: Option<String>,
    /// Serving replicas to place, each holding its share of --concurrency (default: as many
    /// as the concurrency needs).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), conflicts_with = "train")]
    pub replicas: Option<u32>,
    /// Serving: plan a decode pool for --concurrency and a separate prefill pool on other
    /// devices (docs/planner.md, "Disaggregated serving").
    #[arg(long, conflicts_with = "train")]
    pub disaggregated: bool,
    /// Prefill replicas with --disaggregated, each holding one full-context request.
    #[arg(long, requires = "disaggregated", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub prefill_replicas: Option<u32>,
    /// The goal and its shape (shared with `hwaccel fleet`).
    #[command(flatten)]
    pub goal: GoalArgs,
    /// A device already in use, as NODE/DEVICE (its inventory name, PCI address or UUID);
    /// repeatable. A device the node does not have is an error.
    #[arg(long = "reserved")]
    pub reserved: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    pub output: Format,
    /// List the built-in model presets and exit.
    #[arg(long)]
    pub list_models: bool,
    /// `--emit deployment|lws` and its flags.
    #[command(flatten)]
    pub emit: EmitArgs,
}

/// Runs `hwaccel plan`.
pub fn run(args: PlanArgs) -> ExitCode {
    if args.list_models {
        return finish(list_models());
    }
    if let Some(kind) = args.emit.emit {
        return plan_emit::run(&args.emit, kind, args.output, || plan_and_nodes(&args));
    }
    match plan_with_dra(&args).and_then(|(plan, names)| {
        render(&plan, names.as_ref(), args.output).map(|text| (plan.fits, text))
    }) {
        Ok((fits, text)) => match write_stdout(&text) {
            Ok(()) if fits => ExitCode::SUCCESS,
            Ok(()) => ExitCode::from(2),
            Err(err) => fail(&err),
        },
        Err(err) => fail(&err),
    }
}

fn finish(result: Result<String>) -> ExitCode {
    match result.and_then(|text| write_stdout(&text)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => fail(&err),
    }
}

fn fail(err: &PlanError) -> ExitCode {
    eprintln!("hwaccel plan: {err}");
    ExitCode::from(1)
}

fn list_models() -> Result<String> {
    let mut table = output::Table::new(["KEY", "HUGGING FACE", "SOURCE", "CONFIG"]);
    for preset in presets::list()? {
        table.row([preset.key, preset.hf_id, preset.source, preset.config]);
    }
    Ok(table.render())
}

/// Everything from flags to a plan.
pub fn plan_from_args(args: &PlanArgs) -> Result<Plan> {
    plan_with_dra(args).map(|(plan, _)| plan)
}

/// Everything from flags to a plan, with the DRA names of the devices when
/// `--resource-slices` was given.
fn plan_with_dra(args: &PlanArgs) -> Result<(Plan, Option<DraNames>)> {
    planned(args).map(|(plan, _, names)| (plan, names))
}

/// The plan and the nodes it was made on (`--emit` reads their devices' vendor).
pub fn plan_and_nodes(args: &PlanArgs) -> Result<(Plan, Vec<NodeSpec>)> {
    planned(args).map(|(plan, nodes, _)| (plan, nodes))
}

fn planned(args: &PlanArgs) -> Result<(Plan, Vec<NodeSpec>, Option<DraNames>)> {
    let prepared = prepare(input_from_args(args)?)?;
    let (nodes, mut notes, names) = hardware_from_args(args)?;
    let reserved = reservations(&args.reserved, &nodes)?;
    let mut plan = plan(&prepared.model, &nodes, &reserved, &prepared.request)?;
    notes.extend(prepared.notes);
    plan.reasons.extend(notes);
    Ok((plan, nodes, names))
}

/// The planning question the flags ask.
fn input_from_args(args: &PlanArgs) -> Result<PlanInput> {
    let model = model_input(args.model.as_deref(), args.params.as_deref())?;
    let mut input = args.goal.plan_input(model, args.replicas)?;
    input.disaggregation = args.disaggregated.then(|| Disaggregation {
        prefill_replicas: args.prefill_replicas.unwrap_or(1),
    });
    Ok(input)
}

/// `--model` or `--params` as the planner's model input.
pub fn model_input(model: Option<&str>, params: Option<&str>) -> Result<ModelInput> {
    match (model, params) {
        (Some(spec), _) => Ok(ModelInput::PresetOrFile(spec.to_string())),
        (None, Some(count)) => Ok(ModelInput::ParamCount(count.to_string())),
        (None, None) => Err(PlanError::constraint("give --model or --params")),
    }
}

impl GoalArgs {
    /// The planning question for `model` with these goal flags and `replicas`.
    pub fn plan_input(&self, model: ModelInput, replicas: Option<u32>) -> Result<PlanInput> {
        let checkpoint_bytes = match &self.checkpoint_bytes {
            Some(text) => Some(parse_bytes(text).ok_or_else(|| {
                PlanError::constraint(format!(
                    "--checkpoint-bytes {text:?} is not a size (e.g. 462GB, 430GiB)"
                ))
            })?),
            None => None,
        };
        let precision: PrecisionChoice = self
            .precision
            .parse()
            .map_err(|err| PlanError::constraint(format!("--precision: {err}")))?;
        let goal = match self.train {
            Some(method) => Goal::Train(TrainingTarget {
                method,
                seq_len: self.seq_len,
                micro_batch: self.micro_batch,
                gradient_checkpointing: !self.no_gradient_checkpointing,
                lora_rank: self.lora_rank,
                lora_targets: lora_targets(&self.lora_targets)?,
                optimizer_states: self.optimizer_states,
                loss: self.loss,
                adamw: self.adamw,
                kernels: self.kernels,
            }),
            None => Goal::Serve {
                context: self.context,
                concurrency: self.concurrency,
            },
        };
        Ok(PlanInput {
            model,
            checkpoint_bytes,
            goal,
            precision,
            kv_dtype: self.kv_dtype,
            max_nodes: self.max_nodes,
            gpu_util: self.gpu_util,
            replicas,
            disaggregation: None,
            engine: self.engine_choice()?,
            rope_scaling: self
                .rope_scaling
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(|err: String| PlanError::constraint(format!("--rope-scaling: {err}")))?,
            whole_devices: self.whole_devices,
        })
    }

    /// The engine flags as the planner's [`EngineChoice`]; bounds are checked by the planner.
    pub fn engine_choice(&self) -> Result<EngineChoice> {
        let kind = match &self.engine {
            Some(text) => text
                .parse::<EngineKind>()
                .map_err(|err| PlanError::constraint(format!("--engine: {err}")))?,
            None => EngineKind::default(),
        };
        let version = match &self.engine_version {
            Some(text) => Some(
                text.parse::<EngineVersion>()
                    .map_err(|err| PlanError::constraint(format!("--engine-version: {err}")))?,
            ),
            None => None,
        };
        Ok(EngineChoice {
            kind,
            version,
            stated: self.engine.is_some() || self.engine_version.is_some(),
            enforce_eager: self.enforce_eager,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            mem_fraction_static: self.mem_fraction_static,
        })
    }
}

type Hardware = (Vec<NodeSpec>, Vec<String>, Option<DraNames>);

fn hardware_from_args(args: &PlanArgs) -> Result<Hardware> {
    if let Some(spec) = &args.hardware {
        return Ok((parse_hardware(spec)?, Vec::new(), None));
    }
    if args.resource_slices.is_empty() {
        let (nodes, notes) = load_inventories(
            &args.inventory,
            &crate::dra::inventory_node::planner_node_from_object,
        )?;
        return Ok((nodes, notes, None));
    }
    // The inventories are kept whole so their nodes merge with the slices the way the
    // controller merges them (by PCI bus id, else UUID).
    let kept = RefCell::new(Vec::new());
    let reader =
        |kind: &str, object: &serde_json::Value| plan_dra::keep_inventory(&kept, kind, object);
    let (nodes, mut notes) = load_inventories(&args.inventory, &reader)?;
    let slices = plan_dra::load_resource_slices(&args.resource_slices)?;
    let (nodes, names, merge_notes) = plan_dra::merge_slices(nodes, &kept.borrow(), &slices);
    notes.extend(merge_notes);
    Ok((nodes, notes, Some(names)))
}

/// `--reserved NODE/DEVICE` entries as the planner's reservations: each names a device by
/// any name an inventory prints (device name, PCI address, UUID), resolved to the id the
/// planner uses; one that names nothing is an error listing what the node has.
fn reservations(entries: &[String], nodes: &[NodeSpec]) -> Result<Reservations> {
    let mut reserved = Reservations::none();
    for entry in entries {
        let (node, device) = entry
            .split_once('/')
            .filter(|(n, d)| !n.is_empty() && !d.is_empty())
            .ok_or_else(|| {
                PlanError::constraint(format!("--reserved {entry:?}: expected NODE/DEVICE"))
            })?;
        let found = crate::plan::inventory::resolve_device(nodes, node, device)
            .map_err(|why| PlanError::constraint(format!("--reserved {entry:?}: {why}")))?;
        reserved.insert(node, found.id.clone());
    }
    Ok(reserved)
}

fn lora_targets(text: &str) -> Result<Vec<LoraTarget>> {
    let mut targets: Vec<LoraTarget> = text
        .split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| {
            LoraTarget::parse(t).ok_or_else(|| {
                PlanError::constraint(format!(
                    "--lora-targets: unknown module {t:?} (q, k, v, o, gate, up, down)"
                ))
            })
        })
        .collect::<Result<_>>()?;
    targets.sort();
    targets.dedup();
    if targets.is_empty() {
        return Err(PlanError::constraint("--lora-targets names no module"));
    }
    Ok(targets)
}

fn render(plan: &Plan, names: Option<&DraNames>, format: Format) -> Result<String> {
    let encode = |err: String| PlanError::constraint(format!("cannot encode the plan: {err}"));
    let Some(names) = names else {
        return match format {
            Format::Table => Ok(plan.to_table()),
            Format::Json => output::to_json(plan).map_err(|e| encode(e.to_string())),
            Format::Yaml => output::to_yaml(plan).map_err(|e| encode(e.to_string())),
        };
    };
    // With slices, the chosen devices' DRA names join the plan: a table section, or a
    // `draDevices` field next to the plan's own (which stay as they are).
    let chosen = plan_dra::chosen_devices(plan, names);
    if format == Format::Table {
        return Ok(format!(
            "{}{}",
            plan.to_table(),
            plan_dra::table_section(&chosen)
        ));
    }
    let mut value = serde_json::to_value(plan).map_err(|e| encode(e.to_string()))?;
    if let Some(map) = value.as_object_mut() {
        let chosen = serde_json::to_value(&chosen).map_err(|e| encode(e.to_string()))?;
        map.insert("draDevices".to_string(), chosen);
    }
    match format {
        Format::Yaml => output::to_yaml(&value).map_err(|e| encode(e.to_string())),
        _ => output::to_json(&value).map_err(|e| encode(e.to_string())),
    }
}

/// Writes to stdout; a closed pipe (`hwaccel plan | head`) is not an error.
fn write_stdout(text: &str) -> Result<()> {
    super::write_stdout(text).map_err(|source| PlanError::Io {
        path: PathBuf::from("<stdout>"),
        source,
    })
}
