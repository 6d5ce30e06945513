//! Events for stages that wait (issue 38): when NodeStage of a shared class's volume waits for a
//! lock another node holds, the engine says so once per stage ([`StageWait`]); this posts it as a
//! Warning Event `WaitingForLock` on the volume's claim, the object a user looks at, with when
//! sanlock frees the lock. kubelet's own `FailedMount` on the pod comes only once the call gives up.

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume};
use kube::{
    Api, Client,
    api::ListParams,
    runtime::events::{Event, EventType, Recorder},
};
use lvms_engine::local::StageWait;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::{debug, warn};

/// Posts each wait of `waits` on its claim until the senders are gone.
pub async fn post_events(client: Client, mut waits: UnboundedReceiver<StageWait>) {
    let recorder = lvms_k8s::reconciler::recorder(client.clone(), "lvms-node");
    while let Some(wait) = waits.recv().await {
        match claim_of(&client, &wait.volume_id).await {
            Some(claim) => publish(&recorder, &claim, wait.message).await,
            None => debug!(volume_id = %wait.volume_id, "a waiting stage's volume has no claim"),
        }
    }
}

/// The claim whose PersistentVolume has the handle `volume_id`.
async fn claim_of(client: &Client, volume_id: &str) -> Option<ObjectReference> {
    let pvs = match Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            warn!(error = %e, "listing PersistentVolumes for a waiting stage's claim failed");
            return None;
        }
    };
    claim_in(&pvs, volume_id)
}

/// The claim reference of the volume in `pvs` whose CSI handle is `volume_id`.
fn claim_in(pvs: &[PersistentVolume], volume_id: &str) -> Option<ObjectReference> {
    pvs.iter()
        .filter_map(|pv| pv.spec.as_ref())
        .find(|spec| {
            spec.csi
                .as_ref()
                .is_some_and(|c| c.volume_handle == volume_id)
        })
        .and_then(|spec| spec.claim_ref.clone())
}

async fn publish(recorder: &Recorder, claim: &ObjectReference, note: String) {
    let ev = Event {
        type_: EventType::Warning,
        reason: "WaitingForLock".to_owned(),
        note: Some(note),
        action: "NodeStage".to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, claim).await {
        warn!(error = %e, "publishing a waiting stage's event failed");
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_claim_is_found_by_the_volumes_handle() {
        let pv = |name: &str, handle: &str, claim: &str| -> PersistentVolume {
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": name},
                "spec": {"csi": {"driver": "topolvm.io", "volumeHandle": handle},
                         "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "app",
                                      "name": claim, "uid": "u-1"}}
            }))
            .unwrap()
        };
        let pvs = [pv("pv-a", "lv-a", "data-a"), pv("pv-b", "lv-b", "data-b")];
        let claim = claim_in(&pvs, "lv-b").unwrap();
        assert_eq!(claim.name.as_deref(), Some("data-b"));
        assert_eq!(claim.namespace.as_deref(), Some("app"));
        assert_eq!(claim_in(&pvs, "lv-c"), None);
    }
}
