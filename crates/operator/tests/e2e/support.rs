//! What every end-to-end test shares: the switch, the client, the CRDs, throw-away namespaces and
//! nodes, waiting, and error matching.

use std::{
    collections::BTreeMap,
    future::Future,
    time::{Duration, SystemTime},
};

use k8s_openapi::{
    api::core::v1::{Namespace, Node},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use lvms_api::LVMCluster;
use serde_json::json;

/// Field manager of everything the tests write themselves.
pub const MANAGER: &str = "lvms-e2e";
/// Label on every object the tests create, so leftovers of a failed run can be found.
pub const E2E_LABEL: &str = "lvms-e2e";
/// How long any single expectation may take to come true.
pub const WAIT: Duration = Duration::from_secs(60);

/// Whether the end-to-end tests run (`LVMS_E2E=1`); prints why not otherwise.
pub fn enabled(test: &str) -> bool {
    let on = std::env::var("LVMS_E2E").is_ok_and(|v| v == "1");
    if !on {
        eprintln!("{test}: skipped (set LVMS_E2E=1 to run it against the cluster in KUBECONFIG)");
    }
    on
}

/// A client for the cluster in `KUBECONFIG` (or the in-cluster config).
pub async fn client() -> Client {
    Client::try_default()
        .await
        .expect("a Kubernetes client from KUBECONFIG")
}

/// A short lowercase suffix, unique enough to keep concurrent runs apart.
pub fn suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut n = nanos ^ (u128::from(std::process::id()) << 64);
    let mut s = String::new();
    for _ in 0..6 {
        let d = u8::try_from(n % 36).unwrap_or(0);
        s.push(char::from(if d < 10 { b'0' + d } else { b'a' + d - 10 }));
        n /= 36;
    }
    s
}

/// Polls `check` every 500 ms until it returns `Ok`, for at most `timeout`; panics with `what` and
/// the last reason otherwise.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(why) if tokio::time::Instant::now() >= deadline => {
                panic!("{what}: not within {timeout:?}; last seen: {why}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Asserts `check` stays `Ok` for `period` (polled every 500 ms).
pub async fn consistently<F, Fut>(what: &str, period: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = tokio::time::Instant::now() + period;
    while tokio::time::Instant::now() < deadline {
        if let Err(why) = check().await {
            panic!("{what}: stopped holding: {why}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The API server's answer in an error, as (HTTP code, message); panics on other errors.
pub fn api_error<T: std::fmt::Debug>(res: kube::Result<T>) -> (u16, String) {
    match res {
        Err(kube::Error::Api(status)) => (status.code, status.message.clone()),
        other => panic!("expected the API server to refuse, got {other:?}"),
    }
}

/// Server-side applies the generated CRDs (as `deploy/crds/` holds them) and waits until each is
/// Established. Idempotent; CRDs are left installed.
pub async fn install_crds(client: &Client) {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    for crd in lvms_api::crd::all().expect("the CRDs generate") {
        let name = crd.name_any();
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("the API server refused CRD {name}: {e}"));
        eventually(&format!("CRD {name} Established"), WAIT, || {
            let api = api.clone();
            let name = name.clone();
            async move {
                let crd = api.get(&name).await.map_err(|e| e.to_string())?;
                let established = crd
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| {
                        c.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    });
                if established {
                    Ok(())
                } else {
                    Err(format!("{:?}", crd.status))
                }
            }
        })
        .await;
    }
}

/// Waits until `LVMCluster` `name` reports Ready.
pub async fn wait_cluster_ready(clusters: &Api<LVMCluster>, name: &str, timeout: Duration) {
    eventually(
        &format!("LVMCluster {name} is Ready"),
        timeout,
        || async move {
            let c = clusters.get(name).await.map_err(|e| e.to_string())?;
            match &c.status {
                Some(s) if s.ready => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// Waits until `LVMCluster` `name` is gone (its finalizers and status while it is not).
pub async fn wait_cluster_gone(clusters: &Api<LVMCluster>, name: &str, timeout: Duration) {
    eventually(
        &format!("LVMCluster {name} is gone"),
        timeout,
        || async move {
            match clusters.get_opt(name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(c) => Err(format!("{:?} {:?}", c.metadata.finalizers, c.status)),
            }
        },
    )
    .await;
}

/// A namespace for one test, with extra labels; [`TestNamespace::delete`] removes it.
pub struct TestNamespace {
    pub name: String,
    client: Client,
}

impl TestNamespace {
    pub async fn create(client: &Client, name: &str, labels: &[(&str, &str)]) -> Self {
        let mut all: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        all.insert(E2E_LABEL.to_owned(), "true".to_owned());
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": all},
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        Self {
            name: name.to_owned(),
            client: client.clone(),
        }
    }

    /// Starts deleting the namespace (the namespace controller finishes it).
    pub async fn delete(self) {
        let _ = Api::<Namespace>::all(self.client)
            .delete(&self.name, &DeleteParams::default())
            .await;
    }
}

/// Creates a Node object (there is no kubelet: it only stands for a node in the API) with `labels`.
pub async fn create_node(client: &Client, name: &str, labels: &[(&str, &str)]) -> Node {
    let mut all: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    all.insert(E2E_LABEL.to_owned(), "true".to_owned());
    all.insert("kubernetes.io/hostname".to_owned(), name.to_owned());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all},
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap_or_else(|e| panic!("creating node {name}: {e}"))
}

/// Deletes a Node object; "not found" is fine.
pub async fn delete_node(client: &Client, name: &str) {
    let _ = Api::<Node>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await;
}

/// A shutdown signal for in-process servers and controllers.
pub fn stop_signal() -> (
    tokio::sync::watch::Sender<bool>,
    impl Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + Sync>>,
) {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = rx.clone();
        Box::pin(async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }) as std::pin::Pin<Box<dyn Future<Output = ()> + Send + Sync>>
    };
    (tx, stopped)
}
