//! `hwaccel fleet`: the three questions a platform team asks of its accelerators — which are
//! sick or missing, what could still run on the free ones, and what to buy for a model that
//! does not fit — over inventory files or the cluster.
//!
//! Reading the fleet is [`super::fleet_input`]; the answers are the pure `fleet` module's
//! (`health::roll_up`, `capacity::capacity`); this file holds the flags, asks the question for
//! one model (`--model`) or for every preset, and writes the answers as a table or JSON/YAML.

use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use super::fleet_input::{self, FleetInput};
use super::plan::{GoalArgs, model_input};
use crate::fleet::capacity::{self, Capacity, Question, Stranded};
use crate::fleet::health::{self, FleetHealth, Holdings};
use crate::output::{self, Format, Table};
use crate::plan::error::{PlanError, Result};
use crate::plan::model::presets;
use crate::plan::request::{ModelInput, prepare};
use crate::plan::{Goal, NodeSpec};

/// Groups of the "nodes to add" plan listed one by one; more are summed per node.
const MAX_LISTED_GROUPS: usize = 8;

/// Flags of `hwaccel fleet`.
#[derive(Debug, Clone, clap::Args)]
pub struct FleetArgs {
    /// Inventory file or directory (AcceleratorInventory objects, detection reports or node
    /// lists, JSON or YAML); repeatable. Without it, the cluster is read.
    #[arg(long = "inventory")]
    pub inventory: Vec<PathBuf>,
    /// ModelPlacements with status (`kubectl get mp -A -o yaml`), whose devices are held;
    /// repeatable. Only with --inventory.
    #[arg(long = "placements", requires = "inventory")]
    pub placements: Vec<PathBuf>,
    /// Answer for this model (a preset key or a config.json) instead of every preset.
    #[arg(long, conflicts_with = "params")]
    pub model: Option<String>,
    /// Answer for a model given by its parameter count (`70B`).
    #[arg(long)]
    pub params: Option<String>,
    /// Replicas wanted on top of what runs: when fewer fit, the nodes to add (default 1 with
    /// --model: what to add when not even one fits).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=capacity::MAX_REPLICAS as i64))]
    pub replicas: Option<u32>,
    /// The goal each replica serves (one replica holds --concurrency requests of --context).
    #[command(flatten)]
    pub goal: GoalArgs,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// Everything the command answers, as `-o json|yaml` prints it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetReport {
    /// Sick or missing: the health roll-up.
    pub health: FleetHealth,
    /// Placements whose held devices were counted.
    pub placements: usize,
    /// What fits now, per model asked about.
    pub capacity: Vec<Capacity>,
    /// Presets the flags cannot be asked of, with the planner's error (every preset view
    /// only; `--model` fails the command instead).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Free devices that no model asked about can use (every preset view only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stranded_for_every_model: Option<Vec<Stranded>>,
    /// What was skipped while reading.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Nodes whose accelerators fall between detection, DRA and device plugins (the
    /// publication audit), by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub publication: Vec<PublicationGaps>,
}

/// One node's publication gaps, as the inventory's `DRAPublished` condition says them.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicationGaps {
    /// The node.
    pub node: String,
    /// The most urgent reason (`DriverSliceMissing`...).
    pub reason: String,
    /// Every gap, with the counts.
    pub message: String,
    /// Devices the gaps cover.
    pub devices: u32,
}

/// Runs `hwaccel fleet`.
pub fn run(args: FleetArgs) -> anyhow::Result<ExitCode> {
    let input = if args.inventory.is_empty() {
        fleet_input::from_cluster()?
    } else {
        fleet_input::from_files(&args.inventory, &args.placements)?
    };
    let report = answer(&args, input)?;
    let text = match args.output {
        Format::Table => render_table(&report, args.model.is_some() || args.params.is_some()),
        Format::Json => output::to_json(&report)?,
        Format::Yaml => output::to_yaml(&report)?,
    };
    super::write_stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}

/// Answers the three questions for the flags on `input`.
pub fn answer(args: &FleetArgs, input: FleetInput) -> Result<FleetReport> {
    let FleetInput {
        nodes: inputs,
        reserved: held_by_placements,
        claimed,
        placements,
        notes,
        publication,
    } = input;
    let publication: Vec<PublicationGaps> = publication
        .into_iter()
        .map(|(node, audit)| PublicationGaps {
            reason: audit.reason().to_string(),
            message: audit.message(),
            devices: audit
                .gaps
                .iter()
                .fold(0u32, |sum, gap| sum.saturating_add(gap.devices)),
            node,
        })
        .collect();
    // In the counts, a device with any share on it is no free device.
    let (counted_placements, counted_claims) = (
        held_by_placements.clone().with_consumed_taken(),
        claimed.clone().with_consumed_taken(),
    );
    let health = health::roll_up(
        &inputs,
        &Holdings {
            placements: &counted_placements,
            claims: Some(&counted_claims),
        },
    );
    // The planner plans around both: what claims hold is as taken as what placements hold,
    // and what either takes of a shared device is not left for another share.
    let mut reserved = held_by_placements.clone();
    reserved.merge(&claimed);
    let shapes = capacity::whole_shapes(&inputs);
    let nodes: Vec<NodeSpec> = inputs.into_iter().map(|i| i.node).collect();
    let one = args.model.is_some() || args.params.is_some();
    let mut answers = Vec::new();
    let mut errors = Vec::new();
    if one {
        let model = model_input(args.model.as_deref(), args.params.as_deref())?;
        let wanted = Some(args.replicas.unwrap_or(1));
        answers.push(ask(args, model, wanted, &shapes, &nodes, &reserved)?);
    } else {
        for preset in presets::list()? {
            let model = ModelInput::Preset(preset.key.clone());
            match ask(args, model, args.replicas, &shapes, &nodes, &reserved) {
                Ok(answer) => answers.push(answer),
                Err(err) => errors.push(format!("{}: {err}", preset.key)),
            }
        }
    }
    let stranded_for_every_model = (!one).then(|| capacity::stranded_for_all(&answers));
    Ok(FleetReport {
        health,
        placements,
        capacity: answers,
        errors,
        stranded_for_every_model,
        notes,
        publication,
    })
}

fn ask(
    args: &FleetArgs,
    model: ModelInput,
    wanted: Option<u32>,
    shapes: &[NodeSpec],
    nodes: &[NodeSpec],
    reserved: &crate::plan::Reservations,
) -> Result<Capacity> {
    let mut prepared = prepare(args.goal.plan_input(model, None)?)?;
    // Every preset is asked with the same flags: a context beyond a model's maximum is cut to
    // it rather than refused (`--model` keeps the planner's refusal).
    if let (Goal::Serve { context, .. }, Some(max), true) = (
        &mut prepared.request.goal,
        prepared.model.max_context,
        args.model.is_none() && args.params.is_none(),
    ) && context.is_some_and(|c| c > max)
    {
        *context = Some(max);
    }
    if !matches!(prepared.request.goal, Goal::Serve { .. }) {
        return Err(PlanError::constraint(
            "hwaccel fleet counts serving replicas; ask `hwaccel plan --train` about training",
        ));
    }
    let question = Question {
        model: &prepared.model,
        request: &prepared.request,
        wanted,
        shapes,
    };
    capacity::capacity(&question, nodes, reserved)
}

/// `8× NVIDIA H100 80GB HBM3`.
fn times(count: impl std::fmt::Display, product: &str) -> String {
    format!("{count}× {product}")
}

/// The table: one section per question, in words a platform engineer reads.
pub fn render_table(report: &FleetReport, one_model: bool) -> String {
    let mut out = String::new();
    out.push_str("Accelerators\n");
    let mut table = Table::new([
        "PRODUCT",
        "NODES",
        "DEVICES",
        "HEALTHY",
        "DEGRADED",
        "UNHEALTHY",
        "UNKNOWN",
        "MISSING",
        "RESERVED",
        "FREE",
    ]);
    for p in &report.health.products {
        let c = &p.counts;
        table.row([
            p.product.clone(),
            p.nodes.to_string(),
            c.devices.to_string(),
            c.healthy.to_string(),
            c.degraded.to_string(),
            c.unhealthy.to_string(),
            c.unknown.to_string(),
            c.missing.to_string(),
            c.reserved.to_string(),
            c.free.to_string(),
        ]);
    }
    out.push_str(&table.render());
    let t = &report.health.total;
    out.push_str(&format!(
        "total: {} device(s) on {} node(s), {} reserved by {} placement(s), {} free\n",
        t.devices,
        report.health.nodes.len(),
        t.reserved,
        report.placements,
        t.free
    ));
    out.push_str("\nSick or missing\n");
    let mut sick = 0;
    for node in report.health.sick_nodes() {
        sick += 1;
        let mut parts = Vec::new();
        for device in node
            .attention
            .iter()
            .filter(|d| crate::hardware::device_state::needs_attention(d.health))
        {
            parts.push(format!("{} {}", device.name, device.describe()));
        }
        if node.counts.missing > 0 {
            parts.push(format!(
                "{} missing (expected {}, present {})",
                node.counts.missing,
                node.expected.unwrap_or(0),
                node.counts.devices
            ));
        }
        out.push_str(&format!("  {}: {}\n", node.name, parts.join("; ")));
    }
    for gaps in &report.publication {
        sick += 1;
        out.push_str(&format!(
            "  {}: DRA publication {}: {}\n",
            gaps.node, gaps.reason, gaps.message
        ));
    }
    if sick == 0 {
        out.push_str("  none: no accelerator is degraded, unhealthy or missing\n");
    }
    if one_model {
        for answer in &report.capacity {
            render_one(&mut out, answer);
        }
    } else {
        render_presets(&mut out, report);
    }
    if !report.notes.is_empty() {
        out.push_str("\nNotes\n");
        for note in &report.notes {
            out.push_str(&format!("  {note}\n"));
        }
    }
    out
}

/// `1× NVIDIA H100 80GB HBM3, TP 1 × PP 1, bf16`, or for replicas sharing devices `a 24Gi
/// share of NVIDIA H100 80GB HBM3, TP 1 × PP 1, bf16`.
fn packed_text(p: &capacity::Packed) -> String {
    let precision = p.precision.map_or_else(String::new, |x| format!(", {x}"));
    format!("{}{precision}", packed_shape(p))
}

/// `1× NVIDIA H100 80GB HBM3, TP 1 × PP 1` (the precision has its own column), `a 24Gi
/// share of ...` or `a cpx_nps4 partition of ...` for replicas on fractions.
fn packed_shape(p: &capacity::Packed) -> String {
    if let Some(profile) = &p.partition {
        return format!(
            "a {profile} partition of {}, TP {} × PP {}",
            p.device, p.tp, p.pp
        );
    }
    match p.share_bytes {
        Some(bytes) => format!(
            "a {} share of {}, TP {} × PP {}",
            crate::api::quantity::bytes(bytes).0,
            p.device,
            p.tp,
            p.pp
        ),
        None => format!("{}, TP {} × PP {}", p.device, p.tp, p.pp),
    }
}

/// The precision an answer took, and the policy that chose it: `int4 (auto)`, `bf16`.
fn precision_text(answer: &Capacity) -> String {
    let chosen = answer
        .packing
        .first()
        .and_then(|p| p.precision)
        .map(|p| p.to_string());
    match (chosen, answer.precision_asked.as_str()) {
        (Some(chosen), "auto") => format!("{chosen} (auto)"),
        (Some(chosen), asked) if chosen != asked => format!("{chosen} ({asked})"),
        (Some(chosen), _) => chosen,
        (None, asked) => asked.to_string(),
    }
}

/// The assumptions every answer states, so the table and `--model` can be compared.
fn assumptions(answer: &Capacity) -> String {
    let policy = if answer.precision_asked == "auto" {
        "precision auto (per model, the widest at which the most replicas fit; --precision fixes it)"
            .to_string()
    } else {
        format!("precision {} (asked)", answer.precision_asked)
    };
    format!(
        "context {} tokens, {} request(s) per replica, {policy}",
        answer.context, answer.concurrency_per_replica
    )
}

fn render_presets(out: &mut String, report: &FleetReport) {
    out.push_str("\nWhat fits now (more replicas on the free devices)\n");
    if let Some(first) = report.capacity.first() {
        // Every preset is asked with the same flags; only a context cut to a model's maximum
        // differs, and the CONTEXT column shows it.
        out.push_str(&format!("  assumed: {}\n", assumptions(first)));
    }
    let mut table = Table::new([
        "MODEL",
        "CONTEXT",
        "PRECISION",
        "MORE",
        "EACH ON",
        "ALL KINDS",
        "STRANDED",
    ]);
    let mut none_fit = Vec::new();
    for answer in &report.capacity {
        let Some(first) = answer.packing.first() else {
            none_fit.push(answer.model.as_str());
            continue;
        };
        table.row([
            answer.model.clone(),
            answer.context.to_string(),
            precision_text(answer),
            answer.more_replicas.to_string(),
            packed_shape(first),
            answer.total_replicas.to_string(),
            answer.stranded_devices.to_string(),
        ]);
    }
    if table.is_empty() {
        out.push_str("  no model fits on the free devices\n");
    } else {
        out.push_str(&table.render());
    }
    if !none_fit.is_empty() {
        out.push_str(&format!(
            "does not fit on the free devices: {}\n",
            none_fit.join(", ")
        ));
    }
    for error in &report.errors {
        out.push_str(&format!("  {error}\n"));
    }
    if let Some(stranded) = &report.stranded_for_every_model {
        out.push_str("\nStranded for every model (free, but no preset can use them)\n");
        render_stranded(out, stranded);
    }
}

fn render_stranded(out: &mut String, stranded: &[Stranded]) {
    if stranded.is_empty() {
        out.push_str("  none\n");
    }
    for s in stranded {
        out.push_str(&format!(
            "  {}: {} ({}): {}\n",
            s.node,
            times(s.devices.len(), &s.product),
            s.devices.join(", "),
            s.reason
        ));
    }
}

fn render_one(out: &mut String, answer: &Capacity) {
    out.push_str(&format!("\nWhat fits now: {}\n", answer.model));
    out.push_str(&format!("  assumed: {}\n", assumptions(answer)));
    if answer.more_replicas == 0 {
        out.push_str(&format!(
            "  no more replica of {} fits on the free devices\n",
            answer.model
        ));
        for reason in answer.reasons.iter().take(3) {
            out.push_str(&format!("  why: {reason}\n"));
        }
    } else {
        out.push_str(&format!(
            "  {} more replica(s) in one placement",
            answer.more_replicas
        ));
        if let Some(first) = answer.packing.first() {
            out.push_str(&format!(", each on {}", packed_text(first)));
        }
        out.push('\n');
        if answer.packing.len() > 1 {
            out.push_str(&format!(
                "  {} across every kind of device:\n",
                answer.total_replicas
            ));
            for p in &answer.packing {
                out.push_str(&format!("    {} on {}\n", p.replicas, packed_text(p)));
            }
        }
    }
    out.push_str(&format!(
        "\nStranded for {} ({} free device(s) no replica can use)\n",
        answer.model, answer.stranded_devices
    ));
    render_stranded(out, &answer.stranded);
    if let Some(wanted) = answer.wanted {
        out.push_str(&format!(
            "\nTo run {wanted} more replica(s) of {}\n",
            answer.model
        ));
        match &answer.add {
            Some(add) => {
                let plan = &add.plan;
                out.push_str(&format!(
                    "  add: {} node(s) like {} ({})\n",
                    add.nodes,
                    add.shape.like,
                    times(add.shape.devices_per_node, &add.shape.product)
                ));
                out.push_str(&format!(
                    "  then: {} replica(s) of TP {} × PP {} at {} on {} device(s) of {} node(s)\n",
                    plan.replicas.unwrap_or(0),
                    plan.tp.unwrap_or(0),
                    plan.pp.unwrap_or(0),
                    plan.precision
                        .map_or_else(|| "-".to_string(), |p| p.to_string()),
                    plan.devices.unwrap_or(0),
                    plan.nodes.unwrap_or(0)
                ));
                if plan.assignments.len() <= MAX_LISTED_GROUPS {
                    for a in &plan.assignments {
                        out.push_str(&format!(
                            "    replica {} stage {}: {} {}\n",
                            a.replica,
                            a.stage,
                            a.node,
                            a.devices.join(",")
                        ));
                    }
                } else {
                    // Many groups: devices per node, in order of first use, is what a reader
                    // needs (`-o json` has every group).
                    let mut per_node: Vec<(&str, usize)> = Vec::new();
                    for a in &plan.assignments {
                        match per_node.iter_mut().find(|(n, _)| *n == a.node) {
                            Some((_, count)) => *count += a.devices.len(),
                            None => per_node.push((a.node.as_str(), a.devices.len())),
                        }
                    }
                    let listed: Vec<String> = per_node
                        .iter()
                        .map(|(node, count)| format!("{node} ({count})"))
                        .collect();
                    out.push_str(&format!("    on: {}\n", listed.join(", ")));
                }
            }
            None => out.push_str(&format!(
                "  no node shape in this fleet does it with at most {} more nodes\n",
                capacity::MAX_ADDED_NODES
            )),
        }
    }
}
