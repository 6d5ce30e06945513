//! The one way the node agent and the operator's node-removal pass change finalizers: a JSON merge patch of the whole list that carries the
//! object's `resourceVersion`, so a concurrent change (another finalizer added or removed, a deletion)
//! fails the patch with 409 instead of being overwritten; the next reconcile starts from the new object.

use std::fmt::Debug;

use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::de::DeserializeOwned;
use serde_json::json;

/// Sets `obj`'s finalizers to `finalizers`; returns the object as the server now has it.
pub async fn set<K>(api: &Api<K>, obj: &K, finalizers: Vec<String>) -> kube::Result<K>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": obj.resource_version(),
    }});
    api.patch(
        &obj.name_any(),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await
}

/// `obj`'s finalizers with `finalizer` added (once).
pub fn with<K: Resource>(obj: &K, finalizer: &str) -> Vec<String> {
    let mut all = obj.finalizers().to_vec();
    if !all.iter().any(|f| f == finalizer) {
        all.push(finalizer.to_owned());
    }
    all
}

/// `obj`'s finalizers without `finalizer`.
pub fn without<K: Resource>(obj: &K, finalizer: &str) -> Vec<String> {
    obj.finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect()
}
