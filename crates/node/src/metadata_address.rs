//! Where this node serves changed-block tracking, published on its Node for the CSI controller
//! ([`lvms_api::snapshot_metadata_annotation`], ADR 0039).

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;

/// Sets the annotation of `node` to `address` (a merge patch: nothing else of the Node changes).
pub async fn publish(
    client: Client,
    node: &str,
    driver: &str,
    address: &str,
) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"annotations": {
        lvms_api::snapshot_metadata_annotation(driver): address,
    }}});
    Api::<Node>::all(client)
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
}
