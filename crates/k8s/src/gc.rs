//! The Kubernetes side of the garbage collectors (the node agent's and the CSI controller's; their
//! rules are [`lvms_engine::gc`]): which volume handles PersistentVolumes hold, and the Warning
//! events an orphan is reported with.

use std::collections::BTreeSet;

/// The volume handles of `driver`'s PersistentVolumes.
pub async fn pv_handles(client: &kube::Client, driver: &str) -> Result<BTreeSet<String>, String> {
    use k8s_openapi::api::core::v1::PersistentVolume;
    let api = kube::Api::<PersistentVolume>::all(client.clone());
    let mut handles = BTreeSet::new();
    let mut params = kube::api::ListParams::default().limit(PV_PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| format!("list PersistentVolumes: {e}"))?;
        handles.extend(
            page.items
                .into_iter()
                .filter_map(|pv| pv.spec?.csi)
                .filter(|csi| csi.driver == driver)
                .map(|csi| csi.volume_handle),
        );
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(handles),
        }
    }
}

/// PersistentVolumes read per request by [`pv_handles`]: a sweep holds one page at a time, not
/// every PersistentVolume of the cluster (10,000 of them took the CSI controller from 19 to 145 MiB
/// in `cargo xtask scale`; issue 39).
pub const PV_PAGE: u32 = 500;

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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;

    use super::*;

    fn pv(name: &str, driver: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
               "spec": {"csi": {"driver": driver, "volumeHandle": name}}})
    }

    #[tokio::test]
    async fn every_page_of_persistent_volumes_is_read_and_only_the_drivers_handles_kept() {
        let queries = Arc::new(Mutex::new(Vec::new()));
        let seen = queries.clone();
        let service = tower::service_fn(move |req: Request<Body>| {
            let query = req.uri().query().unwrap_or_default().to_owned();
            seen.lock().unwrap().push(query.clone());
            let (items, next) = if query.contains("continue=page2") {
                (vec![pv("c", "topolvm.io")], "")
            } else {
                (vec![pv("a", "topolvm.io"), pv("b", "other.io")], "page2")
            };
            let list = json!({"apiVersion": "v1", "kind": "PersistentVolumeList",
                              "metadata": {"continue": next, "resourceVersion": "1"}, "items": items});
            async move {
                Ok::<_, std::convert::Infallible>(Response::new(Body::from(
                    serde_json::to_vec(&list).unwrap(),
                )))
            }
        });
        let client = kube::Client::new(service, "default");
        let handles = pv_handles(&client, "topolvm.io").await.unwrap();
        assert_eq!(handles, BTreeSet::from(["a".to_owned(), "c".to_owned()]));
        let queries = queries.lock().unwrap();
        assert_eq!(queries.len(), 2, "{queries:?}");
        assert!(
            queries
                .iter()
                .all(|q| q.contains(&format!("limit={PV_PAGE}"))),
            "{queries:?}"
        );
    }
}
