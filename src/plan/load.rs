//! The thin file layer between the CLI and the pure planner: reads a model (`config.json` or
//! a preset name) and inventories (files or directories of JSON/YAML) and hands back plain
//! values. Everything else in `plan` is free of I/O.
//!
//! An inventory file may hold a detection report (`hwaccel detect -o json|yaml`; the node is
//! named after the file), one planner [`NodeSpec`], or a list of them (bare, or under
//! `nodes:`). Kubernetes objects (alone or in a `List`) are read by the caller's
//! [`ObjectReader`]: the command line passes the `api` module's, which reads
//! `AcceleratorInventory` objects, so the planner itself never sees a CRD type.
//!
//! Every read is bounded and never blocks: only regular files are read (a FIFO or device node
//! is refused before it is opened), each at most [`MAX_FILE_BYTES`], all inventories together
//! at most [`MAX_TOTAL_BYTES`], and a directory contributes at most
//! [`MAX_FILES_PER_DIRECTORY`] files.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::detect::{FileReadError, read_at_most};
use crate::hardware::Report;

use super::error::{PlanError, Result};
use super::inventory::NodeSpec;
use super::model::config::parse_config_text;
use super::model::{Model, presets};
use super::units::Bytes;

/// Largest model config or inventory file read: a 10,000-device inventory is a few MiB.
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// Largest total of all inventory files of one plan.
pub const MAX_TOTAL_BYTES: u64 = 256 << 20;
/// Most inventory files taken from one directory.
pub const MAX_FILES_PER_DIRECTORY: usize = 100_000;

/// Reads `--model`: a preset key, a `config.json` file, or a directory holding one.
pub fn load_model(spec: &str) -> Result<Model> {
    if let Some(model) = presets::find(spec)? {
        return Ok(model);
    }
    let path = Path::new(spec);
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    if !file.exists() {
        return Err(PlanError::UnknownModel {
            name: spec.to_string(),
            hint: presets::hint(spec, "; run `hwaccel plan --list-models` for the presets"),
        });
    }
    let text = read(&file)?;
    let origin = file.display().to_string();
    let parsed = parse_config_text(&origin, &text)?;
    let name = file
        .parent()
        .and_then(Path::file_name)
        .filter(|_| file.file_name().is_some_and(|n| n == "config.json"))
        .or_else(|| file.file_stem())
        .map_or_else(|| origin.clone(), |n| n.to_string_lossy().into_owned());
    Ok(Model::from_config(name, origin, parsed))
}

/// Parses a byte size: `462000000000`, `462GB` (10^9), `430GiB` (2^30), `1.5TB`.
pub fn parse_bytes(text: &str) -> Option<Bytes> {
    let lower = text.trim().to_ascii_lowercase();
    let units: [(&str, f64); 7] = [
        ("tib", 1024f64.powi(4)),
        ("gib", 1024f64.powi(3)),
        ("mib", 1024f64.powi(2)),
        ("tb", 1e12),
        ("gb", 1e9),
        ("mb", 1e6),
        ("b", 1.0),
    ];
    let (number, scale) = units
        .iter()
        .find_map(|(unit, scale)| lower.strip_suffix(unit).map(|n| (n.trim(), *scale)))
        .unwrap_or((lower.as_str(), 1.0));
    let value: f64 = number.parse().ok()?;
    let bytes = value * scale;
    (1.0..1e18).contains(&bytes).then(|| Bytes::from_f64(bytes))
}

/// The bounds on reading inventories; constants in the CLI, smaller in tests.
#[derive(Debug, Clone, Copy)]
struct Limits {
    total_bytes: u64,
    files_per_directory: usize,
}

const LIMITS: Limits = Limits {
    total_bytes: MAX_TOTAL_BYTES,
    files_per_directory: MAX_FILES_PER_DIRECTORY,
};

/// Reads a Kubernetes object of a `kind` the planner does not define into a node and notes
/// about its skipped devices: `None` when it does not know the kind, an error (what is wrong)
/// when the object is malformed.
pub type ObjectReader<'a> =
    &'a dyn Fn(&str, &Value) -> Option<std::result::Result<(NodeSpec, Vec<String>), String>>;

/// Reads every `--inventory` path. Directories contribute their `.json`, `.yaml` and `.yml`
/// files in name order; `objects` reads the Kubernetes objects among them. Returns the nodes
/// and notes about devices that were skipped.
pub fn load_inventories(
    paths: &[PathBuf],
    objects: ObjectReader<'_>,
) -> Result<(Vec<NodeSpec>, Vec<String>)> {
    load_inventories_within(paths, objects, LIMITS)
}

fn load_inventories_within(
    paths: &[PathBuf],
    objects: ObjectReader<'_>,
    limits: Limits,
) -> Result<(Vec<NodeSpec>, Vec<String>)> {
    let mut nodes = Vec::new();
    let mut notes = Vec::new();
    let mut total: u64 = 0;
    for path in paths {
        for file in inventory_files(path, limits.files_per_directory)? {
            let text = read(&file)?;
            total = total.saturating_add(u64::try_from(text.len()).unwrap_or(u64::MAX));
            if total > limits.total_bytes {
                return Err(PlanError::Io {
                    path: file,
                    source: io::Error::other(format!(
                        "the inventories add up to more than {} bytes",
                        limits.total_bytes
                    )),
                });
            }
            let (found, skipped) = interpret(&file, &text, objects)?;
            nodes.extend(found);
            notes.extend(skipped);
        }
    }
    let mut names = BTreeSet::new();
    if let Some(duplicate) = nodes.iter().find(|n| !names.insert(n.name.as_str())) {
        return Err(PlanError::InvalidInventory {
            path: paths.first().cloned().unwrap_or_default(),
            reason: format!("node {:?} appears twice", duplicate.name),
        });
    }
    Ok((nodes, notes))
}

fn inventory_files(path: &Path, cap: usize) -> Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).map_err(|source| PlanError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut files = Vec::new();
    for entry in entries.filter_map(std::result::Result::ok) {
        let p = entry.path();
        let wanted = p
            .extension()
            .is_some_and(|e| e == "json" || e == "yaml" || e == "yml");
        // `is_file` follows links and only stats; a FIFO named `x.json` is skipped here, and a
        // file swapped for one afterwards is refused by `read`.
        if wanted && p.is_file() {
            if files.len() == cap {
                return Err(PlanError::Io {
                    path: path.to_path_buf(),
                    source: io::Error::other(format!(
                        "more than {cap} inventory files in one directory"
                    )),
                });
            }
            files.push(p);
        }
    }
    files.sort();
    Ok(files)
}

/// Reads a whole regular file of at most [`MAX_FILE_BYTES`] as UTF-8.
fn read(path: &Path) -> Result<String> {
    read_text(path, MAX_FILE_BYTES)
}

/// Reads a whole regular file of at most `max` bytes as UTF-8; anything else is an
/// error naming the path.
pub fn read_text(path: &Path, max: u64) -> Result<String> {
    let error = |source: io::Error| PlanError::Io {
        path: path.to_path_buf(),
        source,
    };
    let (bytes, more) = read_at_most(path, max).map_err(|err| match err {
        FileReadError::Io(source) => error(source),
        not_regular @ FileReadError::NotRegular { .. } => error(io::Error::new(
            io::ErrorKind::InvalidInput,
            not_regular.to_string(),
        )),
    })?;
    if more {
        return Err(error(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("larger than {} MiB", max >> 20),
        )));
    }
    String::from_utf8(bytes)
        .map_err(|_| error(io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text")))
}

/// Decodes JSON, or YAML when the text is not JSON.
fn decode(path: &Path, text: &str) -> Result<Value> {
    let invalid = |reason: String| PlanError::InvalidInventory {
        path: path.to_path_buf(),
        reason,
    };
    match serde_json::from_str(text) {
        Ok(value) => Ok(value),
        Err(json_err) => serde_saphyr::from_str::<Value>(text).map_err(|yaml_err| {
            invalid(format!("neither JSON ({json_err}) nor YAML ({yaml_err})"))
        }),
    }
}

/// Turns one file's text into nodes.
pub(crate) fn interpret(
    path: &Path,
    text: &str,
    objects: ObjectReader<'_>,
) -> Result<(Vec<NodeSpec>, Vec<String>)> {
    let value = decode(path, text)?;
    let invalid = |reason: String| PlanError::InvalidInventory {
        path: path.to_path_buf(),
        reason,
    };
    if let Some(kind) = value.get("kind").and_then(Value::as_str)
        && let Some(read) = objects(kind, &value)
    {
        let (node, notes) = read.map_err(invalid)?;
        return Ok((vec![node], notes));
    }
    let node_list = |list: &Value| {
        serde_json::from_value::<Vec<NodeSpec>>(list.clone())
            .map_err(|err| invalid(format!("node list: {err}")))
    };
    match &value {
        Value::Array(_) => Ok((node_list(&value)?, Vec::new())),
        Value::Object(map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
            let mut nodes = Vec::new();
            let mut notes = Vec::new();
            for item in map
                .get("items")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let text = serde_json::to_string(item).map_err(|err| invalid(err.to_string()))?;
                let (mut more, mut more_notes) = interpret(path, &text, objects)?;
                nodes.append(&mut more);
                notes.append(&mut more_notes);
            }
            Ok((nodes, notes))
        }
        Value::Object(map) if map.contains_key("nodes") => {
            Ok((node_list(&map["nodes"])?, Vec::new()))
        }
        Value::Object(map) if map.contains_key("schemaVersion") => {
            let report: Report = serde_json::from_value(value.clone())
                .map_err(|err| invalid(format!("detection report: {err}")))?;
            let name = path
                .file_stem()
                .map_or_else(|| "node".to_string(), |s| s.to_string_lossy().into_owned());
            let (node, notes) = NodeSpec::from_report(&report, &name);
            Ok((vec![node], notes))
        }
        Value::Object(map) if map.contains_key("name") && map.contains_key("devices") => {
            let node = serde_json::from_value(value.clone())
                .map_err(|err| invalid(format!("node: {err}")))?;
            Ok((vec![node], Vec::new()))
        }
        _ => Err(invalid(
            "expected a detection report, a node ({name, devices}) or a list of nodes".to_string(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads no Kubernetes object, like a caller without the `api` module.
    fn no_objects(
        _: &str,
        _: &Value,
    ) -> Option<std::result::Result<(NodeSpec, Vec<String>), String>> {
        None
    }

    /// Reads `kind: Machine` objects: `{name}` makes a node without devices.
    fn machines(
        kind: &str,
        object: &Value,
    ) -> Option<std::result::Result<(NodeSpec, Vec<String>), String>> {
        (kind == "Machine").then(|| {
            let name = object
                .get("name")
                .and_then(Value::as_str)
                .ok_or("Machine: missing field `name`")?;
            Ok((
                NodeSpec {
                    name: name.to_string(),
                    devices: Vec::new(),
                    fabric: None,
                    labels: std::collections::BTreeMap::new(),
                },
                vec![format!("{name}: a machine")],
            ))
        })
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("462GB"), Some(Bytes(462_000_000_000)));
        assert_eq!(parse_bytes("1 GiB"), Some(Bytes(1 << 30)));
        assert_eq!(parse_bytes("1234"), Some(Bytes(1234)));
        for bad in ["", "GB", "-1GB", "0", "1e30TB", "x"] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
    }

    #[test]
    fn reports_nodes_and_lists_are_recognised() {
        let dir = tempfile::tempdir().unwrap();
        let report = serde_json::to_string(&Report::empty()).unwrap();
        std::fs::write(dir.path().join("n1.json"), report).unwrap();
        std::fs::write(
            dir.path().join("n2.yaml"),
            "name: n2\ndevices:\n  - id: gpu0\n    product: NVIDIA L4\n    vendor: nvidia\n    family: gpu\n    memoryBytes: 24152899584\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("ignored.txt"), "x").unwrap();
        let (nodes, _) = load_inventories(&[dir.path().to_path_buf()], &no_objects).unwrap();
        let names: Vec<_> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["n1", "n2"]);
        assert_eq!(nodes[1].devices.len(), 1);
    }

    #[test]
    fn kubernetes_objects_go_to_the_callers_reader_alone_or_in_a_list() {
        let path = Path::new("objects.yaml");
        let (nodes, notes) = interpret(path, "kind: Machine\nname: m1\n", &machines).unwrap();
        assert_eq!(nodes[0].name, "m1");
        assert_eq!(notes, ["m1: a machine"]);
        let list = "kind: List\nitems:\n- kind: Machine\n  name: a\n- kind: Machine\n  name: b\n";
        let (nodes, _) = interpret(path, list, &machines).unwrap();
        let names: Vec<_> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        let err = interpret(path, "kind: Machine\n", &machines)
            .unwrap_err()
            .to_string();
        assert!(err.contains("Machine: missing field `name`"), "{err}");
        let err = interpret(path, "kind: Machine\nname: m1\n", &no_objects)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("expected a detection report"),
            "unknown kinds: {err}"
        );
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("garbage.json", "{not json: [", "neither JSON"),
            ("other.json", "{\"a\": 1}", "expected a detection report"),
            (
                "dup.json",
                "[{\"name\":\"a\",\"devices\":[]},{\"name\":\"a\",\"devices\":[]}]",
                "appears twice",
            ),
        ];
        for (name, text, expected) in cases {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            let err = load_inventories(&[path], &no_objects)
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{name}: {err}");
        }
        let missing = load_inventories(&[dir.path().join("absent.json")], &no_objects).unwrap_err();
        assert!(missing.to_string().contains("cannot read"));
    }

    #[test]
    fn inventory_reads_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let node = |name: &str| format!("{{\"name\":\"{name}\",\"devices\":[]}}");
        for name in ["a", "b", "c"] {
            std::fs::write(dir.path().join(format!("{name}.json")), node(name)).unwrap();
        }
        let paths = [dir.path().to_path_buf()];
        let within = |total_bytes, files_per_directory| {
            load_inventories_within(
                &paths,
                &no_objects,
                Limits {
                    total_bytes,
                    files_per_directory,
                },
            )
        };
        assert_eq!(within(1 << 20, 3).unwrap().0.len(), 3);
        let err = within(1 << 20, 2).unwrap_err().to_string();
        assert!(err.contains("more than 2 inventory files"), "{err}");
        let err = within(50, 3).unwrap_err().to_string();
        assert!(err.contains("add up to more than 50 bytes"), "{err}");

        // Over the per-file cap (sparse), and not UTF-8: clear errors, nothing read whole.
        let big = dir.path().join("big.json");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(MAX_FILE_BYTES + 1)
            .unwrap();
        let err = load_inventories(&[big], &no_objects)
            .unwrap_err()
            .to_string();
        assert!(err.contains("larger than 16 MiB"), "{err}");
        let binary = dir.path().join("bin.json");
        std::fs::write(&binary, [0xff, 0xfe, 0x00]).unwrap();
        let err = load_inventories(&[binary], &no_objects)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not UTF-8"), "{err}");
    }

    #[test]
    fn unknown_models_get_hints() {
        let err = load_model("llama-3.1-7b").unwrap_err().to_string();
        assert!(
            err.contains("did you mean") && err.contains("llama-3.1-8b"),
            "{err}"
        );
        assert!(
            load_model("zzz")
                .unwrap_err()
                .to_string()
                .contains("--list-models")
        );
    }
}
