//! Size bounds on everything a client writes into our CRDs, and cutting an object to fit them.
//!
//! Every string, list and map in a schema the apiserver enforces carries a bound: those that
//! matter are set on the types (`devices` at most [`MAX_DEVICES`], DRA's 32 attributes...), and
//! [`add_defaults`] gives every other one a generous default. Without them one node's agent
//! could publish an inventory of 9,000 devices and stall every plan, a tenant could store
//! megabytes in a placement, and the apiserver could not estimate the cost of our CEL rules.
//!
//! The writers must never have a write refused for size, which would lose the whole update:
//! [`fit`] cuts a value to the same schema before it is sent (the agent reports what it cut as
//! a warning on the inventory).

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Devices in one inventory. The largest real nodes list a few dozen (16 Trainium chips, 8
/// GPUs with their MIG instances kept inside the device entry).
pub const MAX_DEVICES: u64 = 1024;
/// Default `maxLength` of a string the types leave unbounded.
pub const DEFAULT_MAX_LENGTH: u64 = 4096;
/// Default `maxItems` of a list the types leave unbounded.
pub const DEFAULT_MAX_ITEMS: u64 = 1024;
/// Default `maxProperties` of a map the types leave unbounded.
pub const DEFAULT_MAX_PROPERTIES: u64 = 128;

/// Fields at the root of a CRD schema that the apiserver describes itself (a structural
/// schema may not restrict them beyond `metadata.name`).
const ROOT_FIELDS_LEFT_ALONE: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// Gives every string, list and map in a CRD's root schema a bound where it has none.
pub fn add_defaults(root: &mut Value) {
    let Some(properties) = root.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    for (name, schema) in properties.iter_mut() {
        if !ROOT_FIELDS_LEFT_ALONE.contains(&name.as_str()) {
            bound(schema);
        }
    }
}

fn bound(schema: &mut Value) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let bound_missing = |object: &mut Map<String, Value>, key: &str, value: u64| {
        object.entry(key).or_insert(Value::from(value));
    };
    match object.get("type").and_then(Value::as_str) {
        Some("string") if !object.contains_key("enum") => {
            bound_missing(object, "maxLength", DEFAULT_MAX_LENGTH);
        }
        Some("array") => bound_missing(object, "maxItems", DEFAULT_MAX_ITEMS),
        Some("object") if object.contains_key("additionalProperties") => {
            bound_missing(object, "maxProperties", DEFAULT_MAX_PROPERTIES);
        }
        _ => {}
    }
    for key in ["items", "additionalProperties"] {
        if let Some(child) = object.get_mut(key) {
            bound(child);
        }
    }
    if let Some(properties) = object.get_mut("properties").and_then(Value::as_object_mut) {
        properties.values_mut().for_each(bound);
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = object.get_mut(key) {
            branches.iter_mut().for_each(bound);
        }
    }
}

/// `object` cut to the bounds of `schema` (see [`fit`]), and the paths cut; unchanged (and no
/// paths) when it already fits or cannot pass through JSON.
pub fn fit_typed<T: Serialize + DeserializeOwned>(
    object: T,
    schema: &Value,
    path: &str,
) -> (T, Vec<String>) {
    let Ok(mut value) = serde_json::to_value(&object) else {
        return (object, Vec::new());
    };
    let cut = fit(&mut value, schema, path);
    if cut.is_empty() {
        return (object, cut);
    }
    match serde_json::from_value(value) {
        Ok(fitted) => (fitted, cut),
        Err(_) => (object, Vec::new()),
    }
}

/// Room for one more entry in the list property `list` of an object `schema`: `maxItems - 1`
/// (unbounded lists have room for everything).
pub fn room_for_one_more(schema: &Value, list: &str) -> usize {
    schema
        .get("properties")
        .and_then(|p| p.get(list))
        .and_then(|l| l.get("maxItems"))
        .and_then(Value::as_u64)
        .and_then(|n| usize::try_from(n).ok())
        .map_or(usize::MAX, |n| n.saturating_sub(1))
}

/// A short account of what was cut: the first few paths.
pub fn describe_cut(cut: &[String]) -> String {
    let mut named: Vec<&str> = cut.iter().map(String::as_str).take(8).collect();
    if cut.len() > named.len() {
        named.push("...");
    }
    named.join(", ")
}

/// Cuts `value` to the bounds of `schema` (strings to `maxLength` characters, lists to
/// `maxItems`, maps to their first `maxProperties` keys); returns the JSON paths it cut, so
/// the caller can say so.
pub fn fit(value: &mut Value, schema: &Value, path: &str) -> Vec<String> {
    let mut cut = Vec::new();
    fit_at(value, schema, path, &mut cut);
    cut
}

fn fit_at(value: &mut Value, schema: &Value, path: &str, cut: &mut Vec<String>) {
    let limit = |key: &str| {
        schema
            .get(key)
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
    };
    match value {
        Value::String(text) => {
            if let Some(max) = limit("maxLength")
                && let Some((at, _)) = text.char_indices().nth(max)
            {
                text.truncate(at);
                cut.push(path.to_string());
            }
        }
        Value::Array(items) => {
            if let Some(max) = limit("maxItems")
                && items.len() > max
            {
                items.truncate(max);
                cut.push(path.to_string());
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    fit_at(item, item_schema, &format!("{path}[{i}]"), cut);
                }
            }
        }
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let map_values = schema.get("additionalProperties").filter(|s| s.is_object());
            if let Some(max) = limit("maxProperties")
                && fields.len() > max
            {
                let extra: Vec<String> = fields.keys().skip(max).cloned().collect();
                for key in extra {
                    fields.remove(&key);
                }
                cut.push(path.to_string());
            }
            for (key, field) in fields.iter_mut() {
                let child = properties.and_then(|p| p.get(key)).or(map_values);
                if let Some(child) = child {
                    fit_at(field, child, &format!("{path}.{key}"), cut);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_unbounded_string_list_and_map_gets_a_default_and_explicit_bounds_stay() {
        let mut root = json!({"type": "object", "properties": {
            "apiVersion": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {"type": "object", "properties": {
                "name": {"type": "string"},
                "short": {"type": "string", "maxLength": 8},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "list": {"type": "array", "items": {"type": "string"}},
                "map": {"type": "object", "additionalProperties": {"type": "string"}},
            }},
        }});
        add_defaults(&mut root);
        let spec = &root["properties"]["spec"]["properties"];
        assert_eq!(spec["name"]["maxLength"], DEFAULT_MAX_LENGTH);
        assert_eq!(spec["short"]["maxLength"], 8);
        assert!(spec["mode"].get("maxLength").is_none());
        assert_eq!(spec["list"]["maxItems"], DEFAULT_MAX_ITEMS);
        assert_eq!(spec["list"]["items"]["maxLength"], DEFAULT_MAX_LENGTH);
        assert_eq!(spec["map"]["maxProperties"], DEFAULT_MAX_PROPERTIES);
        assert_eq!(
            spec["map"]["additionalProperties"]["maxLength"],
            DEFAULT_MAX_LENGTH
        );
        assert!(root["properties"]["apiVersion"].get("maxLength").is_none());
    }

    #[test]
    fn fit_cuts_to_the_schema_and_says_where() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 3},
            "list": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 2}},
            "map": {"type": "object", "maxProperties": 1, "additionalProperties": {"type": "string"}},
        }});
        let mut value =
            json!({"name": "ééééé", "list": ["abc", "d", "e"], "map": {"a": "1", "b": "2"}});
        let cut = fit(&mut value, &schema, "spec");
        assert_eq!(
            value,
            json!({"name": "ééé", "list": ["ab", "d"], "map": {"a": "1"}})
        );
        assert_eq!(cut, ["spec.list", "spec.list[0]", "spec.map", "spec.name"]);
        // A value within bounds is left as it is.
        let mut within = value.clone();
        assert!(fit(&mut within, &schema, "spec").is_empty());
        assert_eq!(within, value);
    }
}
