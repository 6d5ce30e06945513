//! The Kubernetes side of the garbage collectors (the node agent's and the CSI controller's; their
//! rules are [`lvms_engine::gc`]): which volume handles PersistentVolumes hold, and the Warning
//! events an orphan is reported with.

use std::collections::BTreeSet;

/// The volume handles of `driver`'s PersistentVolumes.
pub async fn pv_handles(client: &kube::Client, driver: &str) -> Result<BTreeSet<String>, String> {
    use k8s_openapi::api::core::v1::PersistentVolume;
    let pvs = kube::Api::<PersistentVolume>::all(client.clone())
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| format!("list PersistentVolumes: {e}"))?;
    Ok(pvs
        .items
        .into_iter()
        .filter_map(|pv| pv.spec?.csi)
        .filter(|csi| csi.driver == driver)
        .map(|csi| csi.volume_handle)
        .collect())
}

/// Publishes a Warning event about `reference` (logged when the API refuses it).
pub async fn warn_event(
    recorder: &kube::runtime::events::Recorder,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    reason: &str,
    note: String,
) {
    use kube::runtime::events::{Event, EventType};
    let ev = Event {
        type_: EventType::Warning,
        reason: reason.to_owned(),
        note: Some(note),
        action: "GarbageCollect".to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, reference).await {
        tracing::warn!(error = %e, reason, "publishing an event failed");
    }
}
