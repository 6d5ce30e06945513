//! The CRDs generated from the types, and their YAML form as checked in under `deploy/crds/`.
//!
//! kube's derive marks every `Option` field `nullable: true` (and lists `null` among enum values).
//! The generated schemas drop both: our serialisers never write `null`, LVMS's CRDs do not allow
//! it, and the API server prunes a `null` sent for a non-nullable field before defaulting, so a
//! client that sends one gets the default instead of an error.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::Value;

use crate::{LVMCluster, LVMVolumeGroup, LVMVolumeGroupNodeStatus, LogicalVolume};

/// Errors of CRD generation and rendering.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The generated CRD did not survive the JSON round trip of the schema clean-up.
    #[error("post-processing the schema of CRD {name}")]
    Schema {
        /// `metadata.name` of the CRD.
        name: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// The CRD could not be written as YAML.
    #[error("rendering CRD {name} as YAML")]
    Yaml {
        /// `metadata.name` of the CRD.
        name: String,
        /// Cause.
        #[source]
        source: serde_norway::Error,
    },
}

/// `Result` with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every CRD of lvms-rs, in a stable order.
pub fn all() -> Result<Vec<CustomResourceDefinition>> {
    [
        LVMCluster::crd(),
        LVMVolumeGroup::crd(),
        LVMVolumeGroupNodeStatus::crd(),
        LogicalVolume::crd(),
    ]
    .into_iter()
    .map(tidy)
    .collect()
}

/// Removes `nullable` and `null` enum values from every schema of the CRD (see the module docs).
fn tidy(crd: CustomResourceDefinition) -> Result<CustomResourceDefinition> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let schema_error = |source| Error::Schema {
        name: name.clone(),
        source,
    };
    let mut value = serde_json::to_value(&crd).map_err(schema_error)?;
    if let Some(versions) = value
        .pointer_mut("/spec/versions")
        .and_then(Value::as_array_mut)
    {
        for version in versions {
            if let Some(schema) = version.pointer_mut("/schema/openAPIV3Schema") {
                drop_nullable(schema);
            }
        }
    }
    serde_json::from_value(value).map_err(schema_error)
}

/// Walks a schema (as JSON) and every nested schema in it.
fn drop_nullable(schema: &mut Value) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    obj.remove("nullable");
    if let Some(Value::Array(values)) = obj.get_mut("enum") {
        values.retain(|v| !v.is_null());
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(sub) = obj.get_mut(key) {
            drop_nullable(sub);
        }
    }
    for key in [
        "properties",
        "patternProperties",
        "definitions",
        "dependencies",
    ] {
        if let Some(Value::Object(map)) = obj.get_mut(key) {
            map.values_mut().for_each(drop_nullable);
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(list)) = obj.get_mut(key) {
            list.iter_mut().for_each(drop_nullable);
        }
    }
}

/// File name of a CRD under `deploy/crds/`, `<group>_<plural>.yaml` as controller-gen names them.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// One CRD as a YAML document, starting with `---`.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String> {
    let body = serde_norway::to_string(crd).map_err(|source| Error::Yaml {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })?;
    Ok(format!("---\n{body}"))
}

/// Every CRD as one multi-document YAML stream (the concatenation of the checked-in files).
pub fn all_yaml() -> Result<String> {
    let mut out = String::new();
    for crd in all()? {
        out.push_str(&to_yaml(&crd)?);
    }
    Ok(out)
}

/// Every CRD as `(file name, YAML)`, for writing one file per CRD.
pub fn files() -> Result<Vec<(String, String)>> {
    all()?
        .iter()
        .map(|crd| Ok((file_name(crd), to_yaml(crd)?)))
        .collect()
}
