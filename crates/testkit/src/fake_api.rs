//! An in-memory stand-in for the Kubernetes API server, served to a real `kube::Client` through a tower
//! service, for tests that need more than one scripted answer: the node agent's reconcilers run many
//! steps against one object and are judged by the state they leave.
//!
//! What it does, as the API server does it:
//! - `GET` an object (404 `NotFound` when absent) or a collection (a `List`);
//! - `POST` to a collection creates (409 `AlreadyExists` when the name is taken);
//! - `PATCH` with a JSON merge patch, a JSON patch or a server-side apply; a patch that carries
//!   `metadata.resourceVersion` fails with 409 `Conflict` when the object has moved on;
//! - `PATCH …/status` changes only `status`, and a patch of the object never changes `status`;
//! - `DELETE` of an object with finalizers sets `metadata.deletionTimestamp`; the object goes when its last
//!   finalizer is removed;
//! - every write bumps `metadata.resourceVersion`; creation sets `uid` and `creationTimestamp`.
//!
//! What it does not: watches, field ownership of server-side apply (an apply is merged like a merge
//! patch), label or field selectors, admission, validation against the schema. Every request is
//! recorded ([`FakeApi::requests`]) so a test can still assert the exact calls, and
//! [`FakeApi::fail`] makes chosen calls fail, as a crash or a lost connection would.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::{
    collections::BTreeMap,
    convert::Infallible,
    sync::{Arc, Mutex},
};

use http::{Method, Request, Response, StatusCode};
use kube::{Client, client::Body};
use serde_json::{Value, json};

/// One request as the fake saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub content_type: Option<String>,
    /// The JSON body (`Null` when empty).
    pub body: Value,
    /// The status code answered.
    pub status: u16,
}

#[derive(Debug)]
struct Fault {
    method: Method,
    path: String,
    status: StatusCode,
    times: usize,
}

#[derive(Debug, Default)]
struct State {
    objects: BTreeMap<String, Value>,
    resource_version: u64,
    uid: u64,
    seen: Vec<Seen>,
    faults: Vec<Fault>,
}

/// The fake API server; clones share one state.
#[derive(Debug, Clone, Default)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
}

/// Where a path points.
enum Target<'a> {
    Collection,
    Object,
    Status(&'a str),
}

fn target(path: &str) -> Target<'_> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    // `/api/v1/...` or `/apis/<group>/<version>/...`
    let base = if segs.first() == Some(&"api") { 2 } else { 3 };
    let mut rest = segs.get(base..).unwrap_or_default();
    if rest.len() >= 3 && rest[0] == "namespaces" {
        rest = &rest[2..];
    }
    match rest.len() {
        1 => Target::Collection,
        3 if rest[2] == "status" => Target::Status(path.trim_end_matches("/status")),
        _ => Target::Object,
    }
}

fn status(code: StatusCode, reason: &str, message: String) -> (StatusCode, Value) {
    (
        code,
        json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
               "reason": reason, "message": message, "code": code.as_u16()}),
    )
}

impl FakeApi {
    pub fn new() -> Self {
        Self::default()
    }

    /// A client whose requests this fake answers; `namespace` is its default namespace.
    pub fn client(&self, namespace: &str) -> Client {
        let api = self.clone();
        let service = tower::service_fn(move |req: Request<Body>| {
            let api = api.clone();
            async move { Ok::<_, Infallible>(api.serve(req).await) }
        });
        Client::new(service, namespace)
    }

    /// Stores `object` at `path` (its object path, such as
    /// `/apis/topolvm.io/v1/logicalvolumes/pvc-1`), as if it had been created.
    pub fn insert(&self, path: &str, mut object: Value) {
        let mut st = self.state.lock().unwrap();
        st.resource_version += 1;
        st.uid += 1;
        let meta = &mut object["metadata"];
        if meta.get("uid").is_none() {
            meta["uid"] = json!(format!("uid-{}", st.uid));
        }
        meta["resourceVersion"] = json!(st.resource_version.to_string());
        meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        st.objects.insert(path.to_owned(), object);
    }

    /// The object at `path`, if any.
    pub fn get(&self, path: &str) -> Option<Value> {
        self.state.lock().unwrap().objects.get(path).cloned()
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Seen> {
        self.state.lock().unwrap().seen.clone()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.state.lock().unwrap().seen.clear();
    }

    /// Makes the next `times` requests with `method` to `path` fail with `code` (a 5xx looks like a
    /// server error, which is what a connection lost mid-call leaves the client with).
    pub fn fail(&self, method: Method, path: &str, code: StatusCode, times: usize) {
        self.state.lock().unwrap().faults.push(Fault {
            method,
            path: path.to_owned(),
            status: code,
            times,
        });
    }

    async fn serve(&self, req: Request<Body>) -> Response<Body> {
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.unwrap_or_default();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        let content_type = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let path = parts.uri.path().to_owned();
        let mut st = self.state.lock().unwrap();
        let (code, answer) = st.answer(&parts.method, &path, content_type.as_deref(), &body);
        st.seen.push(Seen {
            method: parts.method,
            path,
            query: parts.uri.query().unwrap_or_default().to_owned(),
            content_type,
            body,
            status: code.as_u16(),
        });
        Response::builder()
            .status(code)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(serde_json::to_vec(&answer).unwrap()))
            .unwrap()
    }
}

impl State {
    fn answer(
        &mut self,
        method: &Method,
        path: &str,
        content_type: Option<&str>,
        body: &Value,
    ) -> (StatusCode, Value) {
        if let Some(f) = self
            .faults
            .iter_mut()
            .find(|f| f.times > 0 && f.method == method && f.path == path)
        {
            f.times -= 1;
            return status(
                f.status,
                "InternalError",
                format!("injected fault on {path}"),
            );
        }
        match (method, target(path)) {
            (&Method::GET, Target::Collection) => self.list(path),
            (&Method::GET, Target::Object) => match self.objects.get(path) {
                Some(obj) => (StatusCode::OK, obj.clone()),
                None => not_found(path),
            },
            (&Method::GET, Target::Status(obj)) => match self.objects.get(obj) {
                Some(obj) => (StatusCode::OK, obj.clone()),
                None => not_found(path),
            },
            (&Method::POST, Target::Collection) => self.create(path, body.clone()),
            (&Method::PATCH, Target::Object) => self.patch(path, content_type, body, false),
            (&Method::PATCH, Target::Status(obj)) => {
                let obj = obj.to_owned();
                self.patch(&obj, content_type, body, true)
            }
            (&Method::DELETE, Target::Object) => self.delete(path),
            _ => status(
                StatusCode::METHOD_NOT_ALLOWED,
                "MethodNotAllowed",
                format!("{method} {path} is not served by the fake API"),
            ),
        }
    }

    fn list(&self, path: &str) -> (StatusCode, Value) {
        let prefix = format!("{path}/");
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|(k, _)| k.strip_prefix(&prefix).is_some_and(|n| !n.contains('/')))
            .map(|(_, v)| v.clone())
            .collect();
        // Cluster-wide lists of namespaced kinds (`/apis/g/v/plural` over `…/namespaces/ns/plural/x`).
        let items = if items.is_empty() {
            let plural = path.rsplit('/').next().unwrap_or_default();
            let group = path.rsplit_once('/').map(|(g, _)| g).unwrap_or_default();
            self.objects
                .iter()
                .filter(|(k, _)| {
                    k.strip_prefix(&format!("{group}/namespaces/"))
                        .is_some_and(|rest| {
                            let s: Vec<&str> = rest.split('/').collect();
                            s.len() == 3 && s[1] == plural
                        })
                })
                .map(|(_, v)| v.clone())
                .collect()
        } else {
            items
        };
        (
            StatusCode::OK,
            json!({"apiVersion": "v1", "kind": "List",
                   "metadata": {"resourceVersion": self.resource_version.to_string()},
                   "items": items}),
        )
    }

    fn bump(&mut self, object: &mut Value) {
        self.resource_version += 1;
        object["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
    }

    fn create(&mut self, collection: &str, mut object: Value) -> (StatusCode, Value) {
        let Some(name) = object["metadata"]["name"].as_str().map(str::to_owned) else {
            return status(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                "metadata.name: Required value".to_owned(),
            );
        };
        let path = format!("{collection}/{name}");
        if self.objects.contains_key(&path) {
            return status(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{name} already exists"),
            );
        }
        self.uid += 1;
        object["metadata"]["uid"] = json!(format!("uid-{}", self.uid));
        object["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        self.bump(&mut object);
        self.objects.insert(path, object.clone());
        (StatusCode::CREATED, object)
    }

    fn patch(
        &mut self,
        path: &str,
        content_type: Option<&str>,
        patch: &Value,
        status_only: bool,
    ) -> (StatusCode, Value) {
        let apply = content_type == Some("application/apply-patch+yaml");
        let current = match self.objects.get(path) {
            Some(obj) => obj.clone(),
            None if apply && !status_only => json!({}),
            None => return not_found(path),
        };
        let mut next = current.clone();
        match content_type {
            Some("application/merge-patch+json" | "application/apply-patch+yaml") => {
                if let Some(rv) = patch["metadata"]["resourceVersion"].as_str()
                    && current["metadata"]["resourceVersion"].as_str() != Some(rv)
                {
                    return status(
                        StatusCode::CONFLICT,
                        "Conflict",
                        format!(
                            "Operation cannot be fulfilled on {path}: the object has been \
                             modified; please apply your changes to the latest version and try again"
                        ),
                    );
                }
                json_patch::merge(&mut next, patch);
            }
            Some("application/json-patch+json") => {
                let ops: json_patch::Patch = match serde_json::from_value(patch.clone()) {
                    Ok(ops) => ops,
                    Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
                };
                if let Err(e) = json_patch::patch(&mut next, &ops) {
                    return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e.to_string());
                }
            }
            other => {
                return status(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    format!("content type {other:?} is not a patch"),
                );
            }
        }
        // The status subresource changes only `status`; the object's endpoint never does.
        let mut merged = current.clone();
        if status_only {
            merged["status"] = next["status"].clone();
        } else {
            let keep = current.get("status").cloned();
            merged = next;
            match keep {
                Some(s) => merged["status"] = s,
                None => {
                    if let Some(m) = merged.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            for field in ["uid", "creationTimestamp", "deletionTimestamp"] {
                match current["metadata"].get(field) {
                    Some(v) => merged["metadata"][field] = v.clone(),
                    None => {
                        if let Some(m) = merged["metadata"].as_object_mut() {
                            m.remove(field);
                        }
                    }
                }
            }
            if current == json!({}) {
                self.uid += 1;
                merged["metadata"]["uid"] = json!(format!("uid-{}", self.uid));
                merged["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
        }
        self.bump(&mut merged);
        let finalizers_left = merged["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if merged["metadata"].get("deletionTimestamp").is_some() && !finalizers_left {
            self.objects.remove(path);
        } else {
            self.objects.insert(path.to_owned(), merged.clone());
        }
        (StatusCode::OK, merged)
    }

    fn delete(&mut self, path: &str) -> (StatusCode, Value) {
        let Some(mut object) = self.objects.get(path).cloned() else {
            return not_found(path);
        };
        let finalizers_left = object["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if finalizers_left {
            if object["metadata"].get("deletionTimestamp").is_none() {
                object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:01Z");
                self.bump(&mut object);
                self.objects.insert(path.to_owned(), object.clone());
            }
        } else {
            self.objects.remove(path);
        }
        (StatusCode::OK, object)
    }
}

fn not_found(path: &str) -> (StatusCode, Value) {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{} not found", path.rsplit('/').next().unwrap_or(path)),
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::{
        Api,
        api::{DeleteParams, Patch, PatchParams, PostParams},
    };

    use super::*;

    const CM: &str = "/api/v1/namespaces/ns/configmaps/a";

    fn cm() -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "a", "namespace": "ns"}, "data": {"k": "v"}})
    }

    #[tokio::test]
    async fn create_get_and_list_through_a_real_client() {
        let fake = FakeApi::new();
        let api: Api<ConfigMap> = Api::namespaced(fake.client("ns"), "ns");
        let made = api
            .create(
                &PostParams::default(),
                &serde_json::from_value(cm()).unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(made.metadata.uid.as_deref(), Some("uid-1"));
        let again = api
            .create(
                &PostParams::default(),
                &serde_json::from_value(cm()).unwrap(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(again, kube::Error::Api(ref s) if s.code == 409),
            "{again:?}"
        );
        assert_eq!(api.get("a").await.unwrap().data, made.data);
        assert!(api.get_opt("b").await.unwrap().is_none());
        assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 1);
        let all: Api<ConfigMap> = Api::all(fake.client("ns"));
        assert_eq!(all.list(&Default::default()).await.unwrap().items.len(), 1);
    }

    #[tokio::test]
    async fn a_merge_patch_with_a_stale_resource_version_is_a_conflict() {
        let fake = FakeApi::new();
        fake.insert(CM, cm());
        let api: Api<ConfigMap> = Api::namespaced(fake.client("ns"), "ns");
        let rv = api
            .get("a")
            .await
            .unwrap()
            .metadata
            .resource_version
            .unwrap();
        let patch = |rv: &str| json!({"metadata": {"resourceVersion": rv, "finalizers": ["x"]}});
        api.patch("a", &PatchParams::default(), &Patch::Merge(patch(&rv)))
            .await
            .unwrap();
        let err = api
            .patch("a", &PatchParams::default(), &Patch::Merge(patch(&rv)))
            .await
            .unwrap_err();
        assert!(
            matches!(err, kube::Error::Api(ref s) if s.code == 409),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn deletion_waits_for_the_last_finalizer() {
        let fake = FakeApi::new();
        let mut obj = cm();
        obj["metadata"]["finalizers"] = json!(["x"]);
        fake.insert(CM, obj);
        let api: Api<ConfigMap> = Api::namespaced(fake.client("ns"), "ns");
        api.delete("a", &DeleteParams::default()).await.unwrap();
        let held = fake.get(CM).unwrap();
        assert!(held["metadata"]["deletionTimestamp"].is_string());
        api.patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
        assert!(fake.get(CM).is_none());
    }

    #[tokio::test]
    async fn status_and_object_endpoints_change_only_their_part_and_faults_fire_as_asked() {
        let fake = FakeApi::new();
        let path = "/apis/topolvm.io/v1/logicalvolumes/lv";
        fake.insert(
            path,
            json!({"metadata": {"name": "lv"}, "spec": {"size": "1Gi"}}),
        );
        let client = fake.client("ns");
        let api: Api<kube::api::DynamicObject> = Api::all_with(
            client,
            &kube::api::ApiResource {
                group: "topolvm.io".into(),
                version: "v1".into(),
                api_version: "topolvm.io/v1".into(),
                kind: "LogicalVolume".into(),
                plural: "logicalvolumes".into(),
            },
        );
        let pp = PatchParams::default();
        api.patch_status(
            "lv",
            &pp,
            &Patch::Merge(json!({"status": {"code": 5}, "spec": {"size": "2Gi"}})),
        )
        .await
        .unwrap();
        api.patch("lv", &pp, &Patch::Merge(json!({"status": {"code": 0}})))
            .await
            .unwrap();
        let obj = fake.get(path).unwrap();
        assert_eq!(obj["status"]["code"], 5);
        assert_eq!(obj["spec"]["size"], "1Gi");
        fake.fail(
            Method::PATCH,
            &format!("{path}/status"),
            StatusCode::INTERNAL_SERVER_ERROR,
            1,
        );
        assert!(
            api.patch_status("lv", &pp, &Patch::Merge(json!({"status": {"code": 6}})))
                .await
                .is_err()
        );
        api.patch_status("lv", &pp, &Patch::Merge(json!({"status": {"code": 6}})))
            .await
            .unwrap();
        let statuses: Vec<u16> = fake.requests().iter().map(|s| s.status).collect();
        assert_eq!(statuses, [200, 200, 500, 200]);
    }
}
