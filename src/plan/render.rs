//! The plan as people read it: the table `hwaccel plan` prints (the decision, the memory
//! behind it, where it runs, and why) and the engines' command lines. Reads the answer
//! ([`super::report`]); nothing in the search or the answer depends on how it is shown.

use std::fmt::Write as _;

use crate::output::Table;

use super::capability::Execution;
use super::memory::DeviceMemory;
use super::report::{EngineSettings, FractionKind, Plan};

impl Plan {
    /// The table people read: the decision, the memory behind it, where it runs, and why. A
    /// disaggregated plan shows the decode pool, then the prefill pool, each with its memory.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        let verdict = if self.fits { "FITS" } else { "DOES NOT FIT" };
        let _ = writeln!(
            out,
            "{verdict}: {} {} ({:.1}B params){}",
            self.goal,
            self.model.name,
            self.model.params as f64 / 1e9,
            if self.prefill.is_some() {
                ", disaggregated"
            } else {
                ""
            }
        );
        match &self.prefill {
            Some(prefill) => {
                out.push_str("\n== decode pool ==\n");
                self.pool_table(&mut out);
                out.push_str("\n== prefill pool ==\n");
                prefill.pool_table(&mut out);
                if !prefill.reasons.is_empty() {
                    let _ = writeln!(out, "\nwhy (prefill pool):");
                    for line in &prefill.reasons {
                        let _ = writeln!(out, "  - {line}");
                    }
                }
            }
            None => self.pool_table(&mut out),
        }
        for (title, lines) in [("why", &self.reasons), ("try", &self.suggestions)] {
            if !lines.is_empty() {
                let _ = writeln!(out, "\n{title}:");
                for line in lines {
                    let _ = writeln!(out, "  - {line}");
                }
            }
        }
        out
    }

    /// One pool's layout, memory, context, throughput, engine line and assignments.
    fn pool_table(&self, out: &mut String) {
        if let (Some(device), Some(precision)) = (&self.device, self.precision) {
            let layout = format!(
                "{} x {} | precision {precision}{} | TP {} x PP {} x {} replica(s) on {} node(s)",
                self.devices.unwrap_or(0),
                device,
                if self.execution == Some(Execution::WeightOnly) {
                    " (weight-only)"
                } else {
                    ""
                },
                self.tp.unwrap_or(0),
                self.pp.unwrap_or(0),
                self.replicas.unwrap_or(0),
                self.nodes.unwrap_or(0),
            );
            let _ = writeln!(out, "{layout}");
        }
        if let Some(fraction) = &self.fraction {
            let _ = match fraction.kind {
                FractionKind::Partition => writeln!(
                    out,
                    "FRACTION partition: {} ({}) of a {} device per replica",
                    fraction.profile.as_deref().unwrap_or("a profile"),
                    fraction.bytes,
                    fraction.device_bytes
                ),
                FractionKind::Share => writeln!(
                    out,
                    "FRACTION share: {} of a {} device per replica",
                    fraction.bytes, fraction.device_bytes
                ),
                FractionKind::Device => writeln!(
                    out,
                    "FRACTION device: all {} of each shareable device",
                    fraction.device_bytes
                ),
            };
        }
        if let Some(memory) = &self.per_device {
            out.push('\n');
            out.push_str(&memory_table(memory, self.fits));
        }
        if let (Some(context), Some(max)) = (self.context, self.max_concurrency) {
            let _ = writeln!(
                out,
                "\ncontext {context} tokens, {max} concurrent full-context request(s) fit{}",
                self.kv_tokens
                    .map_or(String::new(), |kv| format!(" ({kv} KV tokens per replica)"))
            );
        }
        if let Some(t) = &self.throughput {
            let _ = writeln!(
                out,
                "decode estimate (bandwidth roofline, per replica): {:.0} tok/s single stream, {:.0} tok/s at {} streams",
                t.single_stream_tokens_per_s, t.batched_tokens_per_s, t.batch
            );
        }
        if let Some(engine) = &self.engine {
            let _ = writeln!(out, "run with: {}", engine.vllm_command(&self.model.name));
        }
        if !self.assignments.is_empty() {
            out.push('\n');
            let mut table = Table::new(["REPLICA", "STAGE", "NODE", "DEVICES"]);
            for a in &self.assignments {
                table.row([
                    a.replica.to_string(),
                    a.stage.to_string(),
                    a.node.clone(),
                    a.devices.join(","),
                ]);
            }
            out.push_str(&table.render());
        }
    }
}

fn memory_table(memory: &DeviceMemory, fits: bool) -> String {
    let mut table = Table::new(["PER DEVICE", "BYTES", ""]);
    let rows = [
        ("weights", memory.weights),
        ("kv cache", memory.kv_cache),
        ("activations", memory.activations),
        ("overhead", memory.overhead),
        ("total", memory.total),
        ("budget", memory.budget),
        ("capacity", memory.capacity),
    ];
    for (name, bytes) in rows {
        let share = if memory.budget.0 > 0 && name != "capacity" && name != "budget" {
            format!(
                "{:.0}% of budget",
                100.0 * bytes.as_f64() / memory.budget.as_f64()
            )
        } else {
            String::new()
        };
        table.row([name.to_string(), bytes.to_string(), share]);
    }
    let mut text = table.render();
    if !fits && memory.total > memory.budget {
        let _ = writeln!(
            text,
            "over budget by {}",
            memory.total.saturating_sub(memory.budget)
        );
    }
    text
}

impl EngineSettings {
    /// `vllm serve <model> <args>` as one shell line.
    pub fn vllm_command(&self, fallback_model: &str) -> String {
        command(
            &["vllm", "serve"],
            self.model.as_deref().unwrap_or(fallback_model),
            &self.vllm,
        )
    }

    /// `python -m sglang.launch_server --model-path <model> <args>` as one shell line.
    pub fn sglang_command(&self, fallback_model: &str) -> String {
        command(
            &["python", "-m", "sglang.launch_server", "--model-path"],
            self.model.as_deref().unwrap_or(fallback_model),
            &self.sglang,
        )
    }
}

fn command(head: &[&str], model: &str, args: &[String]) -> String {
    let mut words: Vec<String> = head.iter().map(|w| (*w).to_string()).collect();
    words.push(quoted(model));
    words.extend(args.iter().map(|a| quoted(a)));
    words.join(" ")
}

/// `word` as one shell word: single-quoted when it holds anything but plain characters (the
/// JSON of `--kv-transfer-config`).
fn quoted(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "._/=:,@+-".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
