//! The alerts and the dashboard against the metric contract: every alert `expr` of the rendered
//! PrometheusRule, every query of `dashboards/hwaccel-fleet.json` and every PromQL example of
//! `docs/observability.md` goes through a real PromQL parser (`promql-parser`), and every
//! `hwaccel_*` metric and label they select must be in the contract tables of that document.
//! Alerts need a helm binary and are skipped with a notice without one (see
//! `tests/helm/mod.rs`); the dashboard and the documentation are read as files. The cluster
//! tier stores the rendered dashboard ConfigMap in a real apiserver
//! (`cluster_helm::apiserver_stores_the_dashboard_config_map_as_rendered`).

use crate::helm;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use promql_parser::parser::{self, Expr};
use promql_parser::util::{ExprVisitor, walk_expr};
use serde_json::Value;

use helm::{chart_dir, documents, find_helm, of_kind, skip_notice};

const DOC: &str = "docs/observability.md";
const DASHBOARD: &str = "dashboards/hwaccel-fleet.json";

/// Labels a scrape adds to every series: the Prometheus Operator's target labels, and `node`,
/// which the agent's ServiceMonitor copies from the pod.
const TARGET_LABELS: &[&str] = &[
    "job",
    "namespace",
    "pod",
    "instance",
    "service",
    "endpoint",
    "container",
    "node",
];

/// The alerts the issue asks for; the PrometheusRule must have exactly these.
const ALERTS: &[&str] = &[
    "HwaccelDevicesMissing",
    "HwaccelDeviceUnhealthy",
    "HwaccelPlacementUnschedulable",
    "HwaccelAgentNotReporting",
];

/// One metric of the contract: the labels it carries itself.
#[derive(Debug, Clone)]
struct Metric {
    labels: BTreeSet<String>,
}

/// Every stored series name the operator exports, with its labels.
#[derive(Debug, Default)]
struct Contract {
    metrics: BTreeMap<String, Metric>,
}

/// Why a query does not fit the contract.
#[derive(Debug, thiserror::Error, PartialEq)]
enum QueryError {
    #[error("does not parse as PromQL: {0}")]
    Parse(String),
    #[error("selects a series without a metric name")]
    Unnamed,
    #[error("uses {0}, which docs/observability.md does not list")]
    UnknownMetric(String),
    #[error("selects {metric} by label {label}, which that metric does not carry")]
    UnknownLabel { metric: String, label: String },
}

/// Whether `name` is a valid Prometheus metric name (skips `hwaccel_agent_*` rows).
fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The backticked words of a table cell, leaving out parenthesised value lists
/// (`` `object` (`status`, `node_labels`) `` names the label `object` only).
fn backticked_outside_parens(cell: &str) -> Vec<String> {
    let mut depth = 0usize;
    let mut outside = String::new();
    for c in cell.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => outside.push(c),
            _ => {}
        }
    }
    outside
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

impl Contract {
    /// Reads every `| metric | type | labels | meaning |` table of the document. A histogram
    /// contributes its `_bucket` (with `le`), `_sum` and `_count` series.
    fn parse(markdown: &str) -> Self {
        let mut contract = Self::default();
        let mut in_metric_table = false;
        for line in markdown.lines() {
            let line = line.trim();
            if !line.starts_with('|') {
                in_metric_table = false;
                continue;
            }
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            if cells.first() == Some(&"metric") && cells.get(2) == Some(&"labels") {
                in_metric_table = true;
                continue;
            }
            if !in_metric_table || cells.len() < 4 {
                continue;
            }
            let Some(name) = cells[0]
                .strip_prefix('`')
                .and_then(|rest| rest.strip_suffix('`'))
            else {
                continue;
            };
            if !is_metric_name(name) {
                continue;
            }
            let labels: BTreeSet<String> =
                backticked_outside_parens(cells[2]).into_iter().collect();
            if cells[1].starts_with("histogram") {
                let mut bucket = labels.clone();
                bucket.insert("le".to_string());
                contract
                    .metrics
                    .insert(format!("{name}_bucket"), Metric { labels: bucket });
                for suffix in ["_sum", "_count"] {
                    contract.metrics.insert(
                        format!("{name}{suffix}"),
                        Metric {
                            labels: labels.clone(),
                        },
                    );
                }
            } else {
                contract.metrics.insert(name.to_string(), Metric { labels });
            }
        }
        contract
    }

    fn from_repository() -> Self {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DOC);
        let markdown = std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
        Self::parse(&markdown)
    }

    /// Labels `metric` may be selected by: its own, the scrape's, and `__name__`.
    fn allows_label(&self, metric: &str, label: &str) -> bool {
        label == "__name__"
            || TARGET_LABELS.contains(&label)
            || self
                .metrics
                .get(metric)
                .is_some_and(|known| known.labels.contains(label))
    }
}

/// Which series a query selects, and by which labels.
#[derive(Default)]
struct Selections {
    /// (metric name or `None`, label names its matchers use)
    selectors: Vec<(Option<String>, Vec<String>)>,
}

impl ExprVisitor for Selections {
    type Error = std::convert::Infallible;

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, Self::Error> {
        let selector = match expr {
            Expr::VectorSelector(selector) => selector,
            Expr::MatrixSelector(matrix) => &matrix.vs,
            _ => return Ok(true),
        };
        let matchers = selector
            .matchers
            .matchers
            .iter()
            .chain(selector.matchers.or_matchers.iter().flatten());
        let mut name = selector.name.clone();
        let mut labels = Vec::new();
        for matcher in matchers {
            if matcher.name == "__name__" && name.is_none() {
                name = Some(matcher.value.clone());
            }
            labels.push(matcher.name.clone());
        }
        self.selectors.push((name, labels));
        Ok(true)
    }
}

/// Grafana's interval macros are not PromQL; they stand for a duration.
fn expand_grafana_macros(expr: &str) -> String {
    ["$__rate_interval", "$__interval", "$__range"]
        .iter()
        .fold(expr.to_string(), |text, ident| text.replace(ident, "5m"))
}

/// Parses `expr` and checks its selectors against the contract. With `foreign_allowed`,
/// metrics outside the `hwaccel_` namespace (vendor exporters, kube-state-metrics) pass
/// unchecked; `up` always passes, with target labels only. Returns the metrics it selects.
fn check_query(
    expr: &str,
    contract: &Contract,
    foreign_allowed: bool,
) -> Result<BTreeSet<String>, QueryError> {
    let parsed = parser::parse(expr).map_err(QueryError::Parse)?;
    let mut selections = Selections::default();
    // The visitor never fails.
    let _ = walk_expr(&mut selections, &parsed);
    let mut used = BTreeSet::new();
    for (name, labels) in selections.selectors {
        let name = name.ok_or(QueryError::Unnamed)?;
        let ours = name.starts_with("hwaccel_");
        if name == "up" {
            if let Some(label) = labels
                .iter()
                .find(|label| !TARGET_LABELS.contains(&label.as_str()))
            {
                return Err(QueryError::UnknownLabel {
                    metric: name,
                    label: label.clone(),
                });
            }
        } else if ours || !foreign_allowed {
            if !contract.metrics.contains_key(&name) {
                return Err(QueryError::UnknownMetric(name));
            }
            if let Some(label) = labels
                .iter()
                .find(|label| !contract.allows_label(&name, label))
            {
                return Err(QueryError::UnknownLabel {
                    metric: name,
                    label: label.clone(),
                });
            }
        }
        used.insert(name);
    }
    Ok(used)
}

/// `label_values(metric, label)`: a Grafana variable query, checked like a selector.
fn check_label_values(query: &str, contract: &Contract) -> Result<(), QueryError> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|rest| rest.strip_suffix(')'))
        .ok_or_else(|| QueryError::Parse(format!("not a label_values query: {query}")))?;
    let (selector, label) = inner
        .rsplit_once(',')
        .ok_or_else(|| QueryError::Parse(format!("label_values needs a label: {query}")))?;
    let used = check_query(selector.trim(), contract, false)?;
    let label = label.trim();
    for metric in used {
        if !contract.allows_label(&metric, label) {
            return Err(QueryError::UnknownLabel {
                metric,
                label: label.to_string(),
            });
        }
    }
    Ok(())
}

#[test]
fn contract_tables_list_fleet_and_operational_metrics() {
    let contract = Contract::from_repository();
    let info = contract
        .metrics
        .get("hwaccel_device_info")
        .expect("hwaccel_device_info is in the contract");
    for label in [
        "node",
        "vendor",
        "product",
        "uuid",
        "serial",
        "pci_address",
        "index",
        "device",
    ] {
        assert!(
            info.labels.contains(label),
            "hwaccel_device_info lacks {label}"
        );
    }
    let state = &contract.metrics["hwaccel_placement_state"];
    assert_eq!(
        state.labels,
        ["namespace", "placement", "state"]
            .into_iter()
            .map(String::from)
            .collect()
    );
    for name in [
        "hwaccel_node_devices_missing",
        "hwaccel_fleet_devices_free",
        "hwaccel_agent_detections_total",
        "hwaccel_agent_backend_duration_seconds_bucket",
        "hwaccel_controller_reconcile_errors_total",
        "hwaccel_controller_api_write_duration_seconds_count",
    ] {
        assert!(contract.metrics.contains_key(name), "{name} missing");
    }
    // Value lists in parentheses are not labels; the wildcard rows are not metrics.
    let writes = &contract.metrics["hwaccel_agent_api_writes_total"];
    assert_eq!(writes.labels.len(), 1, "{:?}", writes.labels);
    assert!(!contract.metrics.keys().any(|name| name.contains('*')));
}

#[test]
fn checker_refuses_broken_unknown_and_mislabelled_queries() {
    let contract = Contract::parse(
        "| metric | type | labels | meaning |\n\
         |---|---|---|---|\n\
         | `hwaccel_fleet_devices` | gauge | `product`, `vendor` | x |\n\
         | `hwaccel_agent_backend_duration_seconds` | histogram | `backend` | x |\n\
         | `hwaccel_agent_*` | | | operational |\n",
    );
    assert!(matches!(
        check_query("sum(hwaccel_fleet_devices", &contract, false),
        Err(QueryError::Parse(_))
    ));
    assert!(matches!(
        check_query(
            "rate(hwaccel_fleet_devices[$__rate_interval])",
            &contract,
            false
        ),
        Err(QueryError::Parse(_))
    ));
    assert_eq!(
        check_query("sum by (product) (hwaccel_fleet_gpus)", &contract, false),
        Err(QueryError::UnknownMetric("hwaccel_fleet_gpus".into()))
    );
    assert_eq!(
        check_query("hwaccel_fleet_devices{gpu=\"0\"}", &contract, false),
        Err(QueryError::UnknownLabel {
            metric: "hwaccel_fleet_devices".into(),
            label: "gpu".into()
        })
    );
    assert_eq!(
        check_query("up{gpu=\"0\"} == 0", &contract, false),
        Err(QueryError::UnknownLabel {
            metric: "up".into(),
            label: "gpu".into()
        })
    );
    assert_eq!(
        check_query("{__name__=~\"hwaccel_.+\"}", &contract, false),
        Err(QueryError::UnknownMetric("hwaccel_.+".into()))
    );
    // A vendor metric is refused in an operator query, accepted in a join example, but a
    // misspelt operator metric inside a join is not.
    assert!(check_query("DCGM_FI_DEV_GPU_UTIL", &contract, false).is_err());
    assert!(
        check_query(
            "DCGM_FI_DEV_GPU_UTIL * on (uuid) group_left hwaccel_fleet_devices",
            &contract,
            true
        )
        .is_ok()
    );
    assert!(
        check_query(
            "DCGM_FI_DEV_GPU_UTIL * on (uuid) group_left hwaccel_fleet_device",
            &contract,
            true
        )
        .is_err()
    );
    // Histogram series and their `le`; a gauge has no buckets.
    assert!(
        check_query(
            "histogram_quantile(0.99, sum by (le, backend) (rate(hwaccel_agent_backend_duration_seconds_bucket{backend=\"nvidia\"}[5m])))",
            &contract,
            false
        )
        .is_ok()
    );
    assert!(check_query("hwaccel_fleet_devices_bucket", &contract, false).is_err());
    assert!(check_query(&expand_grafana_macros("rate(hwaccel_agent_backend_duration_seconds_count{node=~\"$node\"}[$__rate_interval])"), &contract, false).is_ok());
    assert!(check_label_values("label_values(hwaccel_fleet_devices, product)", &contract).is_ok());
    assert!(check_label_values("label_values(hwaccel_fleet_devices, gpu)", &contract).is_err());
}

fn dashboard() -> Value {
    let path = chart_dir().join(DASHBOARD);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|err| panic!("{DASHBOARD} is not JSON: {err}"))
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        all.push(panel);
        all.extend(panel["panels"].as_array().into_iter().flatten());
    }
    all
}

#[test]
fn dashboard_is_grafana_json_with_datasource_node_and_product_variables() {
    let dashboard = dashboard();
    let schema = dashboard["schemaVersion"].as_u64().expect("schemaVersion");
    assert!(schema >= 39, "schemaVersion {schema}");
    assert_eq!(dashboard["uid"], "hwaccel-fleet");
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list");
    let by_name: BTreeMap<&str, &Value> = variables
        .iter()
        .filter_map(|variable| Some((variable["name"].as_str()?, variable)))
        .collect();
    let datasource = by_name.get("datasource").expect("a datasource variable");
    assert_eq!(datasource["type"], "datasource");
    assert_eq!(datasource["query"], "prometheus");
    for name in ["node", "product"] {
        let variable = by_name
            .get(name)
            .unwrap_or_else(|| panic!("no {name} variable"));
        assert_eq!(variable["type"], "query");
        assert_eq!(variable["datasource"]["uid"], "${datasource}");
    }
    let mut ids = BTreeSet::new();
    for panel in panels(&dashboard) {
        let id = panel["id"].as_u64().expect("every panel has a numeric id");
        assert!(ids.insert(id), "panel id {id} used twice");
        for key in ["h", "w", "x", "y"] {
            assert!(
                panel["gridPos"][key].is_u64(),
                "panel {id} lacks gridPos.{key}"
            );
        }
    }
}

#[test]
fn dashboard_panels_query_only_the_contract() {
    let contract = Contract::from_repository();
    let dashboard = dashboard();
    let mut used = BTreeSet::new();
    let mut queried = 0;
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or_default();
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "panel {title:?} must use the datasource variable"
        );
        let targets = panel["targets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        assert!(!targets.is_empty(), "panel {title:?} has no target");
        for target in targets {
            assert_eq!(
                target["datasource"]["uid"], "${datasource}",
                "a target of {title:?}"
            );
            let expr = target["expr"]
                .as_str()
                .filter(|expr| !expr.trim().is_empty())
                .unwrap_or_else(|| panic!("a target of {title:?} has no expr"));
            match check_query(&expand_grafana_macros(expr), &contract, false) {
                Ok(metrics) => used.extend(metrics),
                Err(err) => panic!("panel {title:?}: `{expr}` {err}"),
            }
            queried += 1;
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] == "query" {
            let query = variable["query"]["query"]
                .as_str()
                .or_else(|| variable["query"].as_str())
                .expect("a query variable has a query");
            if let Err(err) = check_label_values(query, &contract) {
                panic!("variable {}: `{query}` {err}", variable["name"]);
            }
        }
    }
    assert!(queried >= 10, "only {queried} queries");
    // The issue's panels: fleet by product, free vs reserved, health, placements.
    for metric in [
        "hwaccel_fleet_devices",
        "hwaccel_fleet_devices_free",
        "hwaccel_fleet_devices_reserved",
        "hwaccel_device_healthy",
        "hwaccel_device_info",
        "hwaccel_node_devices_missing",
        "hwaccel_placement_state",
        "hwaccel_placement_devices",
    ] {
        assert!(used.contains(metric), "no panel shows {metric}");
    }
}

/// The ```promql blocks of a markdown document.
fn promql_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match (&mut current, line.trim_start()) {
            (None, fence) if fence.starts_with("```promql") => current = Some(String::new()),
            (Some(_), "```") => blocks.extend(current.take()),
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn documented_joins_parse_and_name_real_operator_metrics() {
    let contract = Contract::from_repository();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DOC);
    let markdown = std::fs::read_to_string(&path).expect("docs/observability.md");
    let blocks = promql_blocks(&markdown);
    assert!(blocks.len() >= 5, "only {} promql examples", blocks.len());
    let mut vendors = BTreeSet::new();
    for block in &blocks {
        let used = check_query(block, &contract, true)
            .unwrap_or_else(|err| panic!("docs example {err}:\n{block}"));
        vendors.extend(
            used.into_iter()
                .filter(|name| !name.starts_with("hwaccel_")),
        );
    }
    for vendor in ["DCGM_FI_DEV_GPU_UTIL", "gpu_gfx_activity"] {
        assert!(vendors.contains(vendor), "no join example for {vendor}");
    }
}

/// The rendered PrometheusRule with `extra` values, or `None` without helm.
fn rendered_rule(test: &str, extra: &[&str]) -> Option<Value> {
    let Some(helm) = find_helm() else {
        skip_notice(test);
        return None;
    };
    let mut args = vec!["--set", "metrics.prometheusRule.enabled=true"];
    args.extend_from_slice(extra);
    let yaml = helm::template(&helm, &chart_dir(), "hwaccel", "hwaccel-system", &args)
        .unwrap_or_else(|err| panic!("helm template failed:\n{err}"));
    let docs = documents(&yaml);
    let rules = of_kind(&docs, "PrometheusRule");
    assert_eq!(rules.len(), 1, "one PrometheusRule");
    Some(rules[0].clone())
}

fn alert_rules(rule: &Value) -> Vec<&Value> {
    rule["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|group| group["rules"].as_array().into_iter().flatten())
        .collect()
}

#[test]
fn prometheus_rule_alerts_parse_and_use_the_contract() {
    let Some(rule) = rendered_rule("prometheus_rule_alerts_parse_and_use_the_contract", &[]) else {
        return;
    };
    let contract = Contract::from_repository();
    let markdown = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(DOC))
        .expect("docs/observability.md");
    let mut names = BTreeSet::new();
    for alert in alert_rules(&rule) {
        let name = alert["alert"].as_str().expect("every rule is an alert");
        assert!(names.insert(name.to_string()), "alert {name} defined twice");
        let expr = alert["expr"].as_str().expect("expr");
        if let Err(err) = check_query(expr, &contract, false) {
            panic!("alert {name}: `{expr}` {err}");
        }
        let hold = alert["for"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no for"));
        let hold = promql_parser::util::parse_duration(hold)
            .unwrap_or_else(|err| panic!("{name}: for {hold:?}: {err}"));
        assert!(hold.as_secs() >= 60, "{name} fires on a blip");
        assert!(
            ["warning", "critical", "info"]
                .contains(&alert["labels"]["severity"].as_str().unwrap_or_default()),
            "{name} severity"
        );
        for key in ["summary", "description"] {
            let text = alert["annotations"][key]
                .as_str()
                .unwrap_or_else(|| panic!("{name} has no {key}"));
            // Prometheus' templates survived Helm and name what is affected.
            assert!(
                text.contains("{{ $labels."),
                "{name} {key} names nothing: {text}"
            );
            assert_eq!(
                text.matches("{{").count(),
                text.matches("}}").count(),
                "{name} {key}"
            );
        }
        let runbook = alert["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_default();
        let anchor = name.to_lowercase();
        assert!(
            runbook.ends_with(&format!("observability.md#{anchor}")),
            "{name}: {runbook}"
        );
        assert!(
            markdown.contains(&format!("\n### {name}\n")),
            "no runbook section for {name}"
        );
    }
    let expected: BTreeSet<String> = ALERTS.iter().map(|name| name.to_string()).collect();
    assert_eq!(names, expected);
}

#[test]
fn alert_windows_and_labels_come_from_values() {
    let Some(rule) = rendered_rule(
        "alert_windows_and_labels_come_from_values",
        &[
            "--set",
            "metrics.prometheusRule.unschedulableFor=42m",
            "--set",
            "metrics.prometheusRule.agentSilence=1h30m",
            "--set",
            "metrics.prometheusRule.alertLabels.team=ml",
            "--set",
            "metrics.prometheusRule.labels.release=prom",
            "--set",
            "metrics.prometheusRule.namespace=monitoring",
        ],
    ) else {
        return;
    };
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    assert_eq!(rule["metadata"]["labels"]["release"], "prom");
    let alerts = alert_rules(&rule);
    let by_name: BTreeMap<&str, &Value> = alerts
        .iter()
        .filter_map(|alert| Some((alert["alert"].as_str()?, *alert)))
        .collect();
    let unschedulable = by_name["HwaccelPlacementUnschedulable"];
    assert_eq!(unschedulable["for"], "42m");
    let agent = by_name["HwaccelAgentNotReporting"]["expr"]
        .as_str()
        .unwrap_or_default();
    assert!(agent.contains("[1h30m]"), "{agent}");
    // The agent job is the agent metrics Service in the release namespace, not the rule's.
    assert!(agent.contains("job=\"hwaccel-agent-metrics\""), "{agent}");
    assert!(agent.contains("namespace=\"hwaccel-system\""), "{agent}");
    for alert in alerts {
        assert_eq!(alert["labels"]["team"], "ml", "{}", alert["alert"]);
        assert!(alert["labels"]["severity"].is_string());
    }
}

/// The families a registry exposes, with the names their series are stored under
/// (`_total` for counters, `_bucket`/`_sum`/`_count` for histograms).
fn exported_series_names(registry: &prometheus_client::registry::Registry) -> BTreeSet<String> {
    let mut text = String::new();
    if let Err(err) = prometheus_client::encoding::text::encode(&mut text, registry) {
        panic!("the registry does not encode: {err}");
    }
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(family), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|suffix| format!("{family}{suffix}")));
    }
    names
}

/// The documented names are the exported ones, both ways: a renamed metric breaks this test
/// before it breaks someone's dashboard, and a new metric must be documented.
#[test]
fn the_contract_is_exactly_what_the_agent_and_controller_export() {
    use hwaccel::agent::metrics::{AgentMetrics, DeviceRow, NodeCounts, StageLabel, WriteLabel};
    use hwaccel::controller::core::fleet_figures::FleetTotals;
    use hwaccel::controller::core::ledger::PlacementKey;
    use hwaccel::controller::metrics::fleet::{FleetMetrics, PlacementFigures};
    use hwaccel::fleet::expected::{Expected, ExpectedSource};
    use hwaccel::hardware::device_state::Counts;

    let mut registry = prometheus_client::registry::Registry::default();
    // A family shows in the exposition once it has a series: give each one.
    let agent = AgentMetrics::register(&mut registry);
    let inventory = hwaccel::testing::inventory::fixture_inventory("h100-8x-nvswitch", "n1");
    let rows: Vec<DeviceRow> = inventory
        .spec
        .devices
        .iter()
        .filter_map(|device| DeviceRow::of("n1", device))
        .collect();
    let expected = Expected {
        count: 8,
        source: ExpectedSource::Seen,
    };
    agent.device_series.set(
        "n1",
        &rows,
        NodeCounts {
            expected,
            present: 8,
            missing: 0,
        },
    );
    agent.detections.inc();
    agent
        .api_writes
        .get_or_create(&WriteLabel {
            object: "inventory".into(),
        })
        .inc();
    agent
        .errors
        .get_or_create(&StageLabel {
            stage: "detect".into(),
        })
        .inc();
    agent
        .backend_seconds
        .get_or_create(&hwaccel::agent::metrics::BackendLabel {
            backend: "nvidia".into(),
        })
        .observe(0.01);
    let controller = hwaccel::controller::metrics::ControllerMetrics::register(&mut registry);
    controller.wrote("inventory_status", std::time::Duration::from_millis(3));
    controller.failed("conflict");
    controller.skipped("ModelPlacement", "undecodable");
    controller.set_states([("Planned", 1)]);
    let fleet = FleetMetrics::register(&mut registry);
    let totals = FleetTotals {
        by_product: BTreeMap::from([(
            ("nvidia-h100-80gb-hbm3".to_string(), "nvidia".to_string()),
            Counts {
                devices: 8,
                healthy: 8,
                reserved: 2,
                free: 6,
                ..Counts::default()
            },
        )]),
        nodes_missing_devices: 0,
    };
    let placement = PlacementKey {
        namespace: "ml".into(),
        name: "llama".into(),
    };
    fleet.publish(
        &totals,
        &BTreeMap::from([(
            placement,
            PlacementFigures {
                devices: 2,
                state: Some("Planned"),
                idle_devices: 0,
            },
        )]),
    );
    fleet.publish_models(&[hwaccel::controller::core::fleet_figures::ModelCount {
        model: "llama-3.1-70b".into(),
        context: 8192,
        precision: "bf16".into(),
        replicas: 3,
        stranded_devices: 0,
    }]);
    fleet.publish_share_headroom(&BTreeMap::from([(
        ("NVIDIA H100 80GB HBM3".to_string(), "nvidia".to_string()),
        56u64 << 30,
    )]));
    fleet.publish_unpublished(&BTreeMap::from([(
        hwaccel::controller::metrics::fleet::UnpublishedLabel {
            node: "gpu-7".into(),
            driver: "gpu.amd.com".into(),
            reason: "DriverSliceMissing".into(),
        },
        8u32,
    )]));
    let exported = exported_series_names(&registry);
    let documented: BTreeSet<String> = Contract::from_repository()
        .metrics
        .into_keys()
        .filter(|name| name.starts_with("hwaccel_"))
        .collect();
    let undocumented: Vec<_> = exported.difference(&documented).collect();
    let not_exported: Vec<_> = documented.difference(&exported).collect();
    assert!(
        undocumented.is_empty() && not_exported.is_empty(),
        "exported but not in {DOC}: {undocumented:?}\nin {DOC} but not exported: {not_exported:?}"
    );
}

/// Every `state="..."` an alert or a panel selects is a state the controller reports.
#[test]
fn placement_states_selected_are_states_the_controller_reports() {
    let chart = chart_dir();
    let sources = [
        chart.join("templates/prometheusrule.yaml"),
        chart.join(DASHBOARD),
        Path::new(env!("CARGO_MANIFEST_DIR")).join(DOC),
    ];
    let mut selected = 0;
    for path in sources {
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
        let text = text.replace("\\\"", "\"");
        for (at, _) in text.match_indices("state=\"") {
            let value: String = text[at + 7..].chars().take_while(|c| *c != '"').collect();
            assert!(
                hwaccel::controller::metrics::fleet::PLACEMENT_STATES.contains(&value.as_str()),
                "{}: state=\"{value}\" is never reported",
                path.display()
            );
            selected += 1;
        }
    }
    assert!(selected > 0, "the alert selects a state");
}
