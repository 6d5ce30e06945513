//! Helpers shared by the API tests: the generated CRDs as JSON, sample loading, a small checker for
//! the OpenAPI keywords our schemas use, and client-side CEL evaluation.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::cel::Validator;
use serde_json::Value;

/// The generated CRD of `kind`.
pub fn crd(kind: &str) -> CustomResourceDefinition {
    lvms_api::crd::all()
        .expect("CRDs generate")
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for kind {kind}"))
}

/// The `openAPIV3Schema` of the only version of the CRD of `kind`, as JSON.
pub fn schema(kind: &str) -> Value {
    let crd = crd(kind);
    assert_eq!(crd.spec.versions.len(), 1, "{kind} has one version");
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .expect("schema present");
    serde_json::to_value(schema).expect("schema serialises")
}

/// Follows `a.b.[].c` through `properties` (`[]` steps into `items`).
pub fn at<'a>(schema: &'a Value, path: &str) -> &'a Value {
    let mut cur = schema;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        cur = if part == "[]" {
            &cur["items"]
        } else {
            &cur["properties"][part]
        };
        assert!(!cur.is_null(), "schema path {path} missing at {part}");
    }
    cur
}

/// The CEL rules (`rule` strings) on the schema node.
pub fn rules(node: &Value) -> Vec<String> {
    node["x-kubernetes-validations"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .map(|r| r["rule"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

pub fn samples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/samples")
}

/// Every sample file and its parsed content.
pub fn samples() -> Vec<(String, Value)> {
    let mut files: Vec<_> = std::fs::read_dir(samples_dir())
        .expect("samples dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("sample readable");
            let value: Value = serde_norway::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not YAML: {e}", p.display()));
            let name = p
                .file_name()
                .expect("file name")
                .to_string_lossy()
                .into_owned();
            (name, value)
        })
        .collect()
}

pub fn sample(name: &str) -> Value {
    samples()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no sample {name}"))
        .1
}

/// Checks `value` against the OpenAPI keywords our schemas use (type, enum, required, bounds,
/// lengths, pattern, item and property counts, int-or-string). Returns one message per violation.
/// The API server checks more; this catches a sample our schema would reject.
pub fn schema_violations(schema: &Value, value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    check(schema, value, "", &mut out);
    out
}

fn check(schema: &Value, value: &Value, path: &str, out: &mut Vec<String>) {
    let mut fail = |msg: String| {
        out.push(format!(
            "{}: {msg}",
            if path.is_empty() { "<root>" } else { path }
        ))
    };
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            fail(format!("{value} is neither integer nor string"));
        }
        return;
    }
    if let Some(values) = schema["enum"].as_array()
        && !values.contains(value)
    {
        fail(format!("{value} not in enum {values:?}"));
    }
    match schema["type"].as_str() {
        Some("object") => {
            let Some(obj) = value.as_object() else {
                fail(format!("{value} is not an object"));
                return;
            };
            for req in schema["required"].as_array().into_iter().flatten() {
                let key = req.as_str().unwrap_or_default();
                if !obj.contains_key(key) {
                    fail(format!("required field {key} missing"));
                }
            }
            if let Some(max) = schema["maxProperties"].as_u64()
                && obj.len() as u64 > max
            {
                fail(format!("{} properties > maxProperties {max}", obj.len()));
            }
            let props = schema["properties"].as_object();
            for (k, v) in obj {
                let child = format!("{path}.{k}");
                if let Some(sub) = props.and_then(|p| p.get(k)) {
                    check(sub, v, &child, out);
                } else if let Some(sub) =
                    schema.get("additionalProperties").filter(|s| s.is_object())
                {
                    check(sub, v, &child, out);
                } else if path.is_empty()
                    && ["apiVersion", "kind", "metadata"].contains(&k.as_str())
                {
                    // root fields the API server handles itself
                } else if schema.get("x-kubernetes-preserve-unknown-fields")
                    != Some(&Value::Bool(true))
                {
                    out.push(format!("{child}: unknown field (would be pruned)"));
                }
            }
        }
        Some("array") => {
            let Some(items) = value.as_array() else {
                fail(format!("{value} is not an array"));
                return;
            };
            if let Some(max) = schema["maxItems"].as_u64()
                && items.len() as u64 > max
            {
                fail(format!("{} items > maxItems {max}", items.len()));
            }
            for (i, item) in items.iter().enumerate() {
                check(&schema["items"], item, &format!("{path}[{i}]"), out);
            }
        }
        Some("string") => {
            let Some(s) = value.as_str() else {
                fail(format!("{value} is not a string"));
                return;
            };
            let len = s.chars().count() as u64;
            if let Some(min) = schema["minLength"].as_u64()
                && len < min
            {
                fail(format!("{s:?} shorter than {min}"));
            }
            if let Some(max) = schema["maxLength"].as_u64()
                && len > max
            {
                fail(format!("{s:?} longer than {max}"));
            }
            if let Some(pattern) = schema["pattern"].as_str()
                && !regex::Regex::new(pattern)
                    .expect("pattern compiles")
                    .is_match(s)
            {
                fail(format!("{s:?} does not match {pattern}"));
            }
        }
        Some("integer") | Some("number") => {
            let Some(n) = value.as_f64() else {
                fail(format!("{value} is not a number"));
                return;
            };
            if schema["type"] == "integer" && !(value.is_i64() || value.is_u64()) {
                fail(format!("{value} is not an integer"));
            }
            if let Some(min) = schema["minimum"].as_f64()
                && n < min
            {
                fail(format!("{n} < minimum {min}"));
            }
            if let Some(max) = schema["maximum"].as_f64()
                && n > max
            {
                fail(format!("{n} > maximum {max}"));
            }
        }
        Some("boolean") if !value.is_boolean() => fail(format!("{value} is not a boolean")),
        _ => {}
    }
}

/// Evaluates the CRD's CEL rules on `new` (with `old` for transition rules) as the API server
/// would, after applying schema defaults; returns the failed rules' messages.
///
/// kube-cel correlates list items by index, not by `x-kubernetes-list-map-keys` as the API server
/// does; tests keep device classes in the same order between `old` and `new`.
pub fn cel_errors(kind: &str, new: &Value, old: Option<&Value>) -> Vec<String> {
    match Validator::new().validate(&schema(kind), new, old) {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .iter()
            .map(|e| format!("{}: {}", e.field_path, e.message))
            .collect(),
    }
}
