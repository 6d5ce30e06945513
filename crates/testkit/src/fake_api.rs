//! An in-memory stand-in for the Kubernetes API server, served to a real `kube::Client` through a tower
//! service, for tests that need more than one scripted answer: the node agent's reconcilers run many
//! steps against one object and are judged by the state they leave.
//!
//! What it does, as the API server does it:
//! - `GET` an object (404 `NotFound` when absent) or a collection (a `List`);
//! - `POST` to a collection creates (409 `AlreadyExists` when the name is taken);
//! - `PUT` of an object replaces it (404 when absent); a body whose `metadata.resourceVersion` is
//!   not the stored one fails with 409 `Conflict`, and `status` is kept as stored;
//! - `PATCH` with a JSON merge patch, a JSON patch or a server-side apply; a patch that carries
//!   `metadata.resourceVersion` fails with 409 `Conflict` when the object has moved on;
//! - `PATCH …/status` changes only `status`, and a patch of the object never changes `status`;
//! - `DELETE` of an object with finalizers sets `metadata.deletionTimestamp`; the object goes when its last
//!   finalizer is removed;
//! - every write bumps `metadata.resourceVersion`; creation sets `uid` and `creationTimestamp`.
//!
//! - `GET …?watch=true` streams `ADDED`/`MODIFIED`/`DELETED` events of the collection from the
//!   request's `resourceVersion` on (earlier changes are replayed), so `kube::runtime` watchers and
//!   `await_condition` work against it;
//! - `fieldSelector=a.b=v,c=w` (equality only, on any field path such as `metadata.name` or a CRD's
//!   selectable `spec.nodeName`) on lists and watches.
//!
//! What it does not: field ownership of server-side apply (an apply is merged like a merge patch),
//! label selectors, `!=` in field selectors, admission, validation against the schema. Every request is
//! recorded ([`FakeApi::requests`]) so a test can still assert the exact calls, and
//! [`FakeApi::fail`] makes chosen calls fail, as a crash or a lost connection would.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::{
    collections::BTreeMap,
    convert::Infallible,
    sync::{Arc, Mutex},
};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::UnsyncBoxBody};
use kube::{Client, client::Body};
use serde_json::{Value, json};
use tokio::sync::mpsc;

type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

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

/// One change, kept so a watch from an older `resourceVersion` replays it.
#[derive(Debug, Clone)]
struct Event {
    resource_version: u64,
    path: String,
    kind: &'static str,
    object: Value,
}

#[derive(Debug)]
struct Watch {
    collection: String,
    fields: Vec<(String, String)>,
    tx: mpsc::UnboundedSender<Bytes>,
}

impl Watch {
    fn wants(&self, path: &str, object: &Value) -> bool {
        in_collection(path, &self.collection) && selected(&self.fields, object)
    }
}

/// Whether `object` has every `field path = value` of a field selector.
fn selected(fields: &[(String, String)], object: &Value) -> bool {
    fields.iter().all(|(path, want)| {
        let got = path.split('.').fold(object, |v, key| &v[key]);
        match got {
            Value::String(s) => s == want,
            Value::Null => want.is_empty(),
            // Numbers and booleans compare in their JSON spelling.
            other => serde_json::to_string(other).is_ok_and(|s| s == *want),
        }
    })
}

/// Whether object `path` is in `collection` (`/apis/g/v/plural` also covers every namespace's).
fn in_collection(path: &str, collection: &str) -> bool {
    let Some((parent, _)) = path.rsplit_once('/') else {
        return false;
    };
    if parent == collection {
        return true;
    }
    let Some((group, plural)) = collection.rsplit_once('/') else {
        return false;
    };
    parent
        .strip_prefix(&format!("{group}/namespaces/"))
        .and_then(|rest| rest.split_once('/'))
        .is_some_and(|(_, p)| p == plural)
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap();
    line.push(b'\n');
    Bytes::from(line)
}

#[derive(Debug, Default)]
struct State {
    objects: BTreeMap<String, Value>,
    events: Vec<Event>,
    watches: Vec<Watch>,
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
            async move { Ok::<Response<ResponseBody>, Infallible>(api.serve(req).await) }
        });
        Client::new(service, namespace)
    }

    /// Stores `object` at `path` (its object path, such as
    /// `/apis/topolvm.io/v1/logicalvolumes/pvc-1`), as if it had been created.
    pub fn insert(&self, path: &str, mut object: Value) {
        let mut st = self.state.lock().unwrap();
        st.uid += 1;
        let meta = &mut object["metadata"];
        if meta.get("uid").is_none() {
            meta["uid"] = json!(format!("uid-{}", st.uid));
        }
        meta["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
        let kind = if st.objects.contains_key(path) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        st.store(path, object, kind);
    }

    /// Deletes the object at `path` as the API server does (held while it has finalizers).
    pub fn delete(&self, path: &str) {
        self.state.lock().unwrap().delete(path);
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

    async fn serve(&self, req: Request<Body>) -> Response<ResponseBody> {
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
        let query = Query::parse(parts.uri.query().unwrap_or_default());
        let mut st = self.state.lock().unwrap();
        let seen = |status: StatusCode| Seen {
            method: parts.method.clone(),
            path: path.clone(),
            query: parts.uri.query().unwrap_or_default().to_owned(),
            content_type: content_type.clone(),
            body: body.clone(),
            status: status.as_u16(),
        };
        if parts.method == Method::GET && query.watch && matches!(target(&path), Target::Collection)
        {
            let rx = st.watch(&path, &query);
            st.seen.push(seen(StatusCode::OK));
            let stream = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|line| (Ok::<_, Infallible>(http_body::Frame::data(line)), rx))
            });
            return Response::builder()
                .status(StatusCode::OK)
                .header(http::header::CONTENT_TYPE, "application/json")
                .body(StreamBody::new(stream).boxed_unsync())
                .unwrap();
        }
        let (code, answer) =
            st.answer(&parts.method, &path, &query, content_type.as_deref(), &body);
        st.seen.push(seen(code));
        Response::builder()
            .status(code)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(serde_json::to_vec(&answer).unwrap())).boxed_unsync())
            .unwrap()
    }
}

/// The query parameters the fake understands.
#[derive(Debug, Default)]
struct Query {
    watch: bool,
    resource_version: Option<u64>,
    fields: Vec<(String, String)>,
}

/// `%XX` decoding of a query value.
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Query {
    fn parse(query: &str) -> Self {
        let mut q = Query::default();
        for kv in query.split('&').filter(|kv| !kv.is_empty()) {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let v = decode(v);
            match k {
                "watch" => q.watch = v == "true" || v == "1",
                "resourceVersion" => q.resource_version = v.parse().ok(),
                "fieldSelector" => {
                    q.fields = v
                        .split(',')
                        .filter_map(|f| f.split_once('='))
                        .map(|(k, v)| (k.trim_end_matches('=').to_owned(), v.to_owned()))
                        .collect();
                }
                _ => {}
            }
        }
        q
    }
}

impl State {
    fn answer(
        &mut self,
        method: &Method,
        path: &str,
        query: &Query,
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
            (&Method::GET, Target::Collection) => self.list(path, query),
            (&Method::GET, Target::Object) => match self.objects.get(path) {
                Some(obj) => (StatusCode::OK, obj.clone()),
                None => not_found(path),
            },
            (&Method::GET, Target::Status(obj)) => match self.objects.get(obj) {
                Some(obj) => (StatusCode::OK, obj.clone()),
                None => not_found(path),
            },
            (&Method::POST, Target::Collection) => self.create(path, body.clone()),
            (&Method::PUT, Target::Object) => self.replace(path, body.clone()),
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

    fn list(&self, path: &str, query: &Query) -> (StatusCode, Value) {
        let items: Vec<Value> = self
            .objects
            .iter()
            .filter(|(k, v)| in_collection(k, path) && selected(&query.fields, v))
            .map(|(_, v)| v.clone())
            .collect();
        (
            StatusCode::OK,
            json!({"apiVersion": "v1", "kind": "List",
                   "metadata": {"resourceVersion": self.resource_version.to_string()},
                   "items": items}),
        )
    }

    /// Registers a watch of `collection`; events after the query's `resourceVersion` are replayed.
    fn watch(&mut self, collection: &str, query: &Query) -> mpsc::UnboundedReceiver<Bytes> {
        let (tx, rx) = mpsc::unbounded_channel();
        let watch = Watch {
            collection: collection.to_owned(),
            fields: query.fields.clone(),
            tx,
        };
        let from = query.resource_version.unwrap_or(self.resource_version);
        for e in self.events.iter().filter(|e| e.resource_version > from) {
            if watch.wants(&e.path, &e.object) {
                let _ = watch.tx.send(event_line(e.kind, &e.object));
            }
        }
        self.watches.push(watch);
        rx
    }

    /// Stores `object` at `path` with a new `resourceVersion` and tells the watches.
    fn store(&mut self, path: &str, mut object: Value, kind: &'static str) -> Value {
        self.resource_version += 1;
        object["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        if kind == "DELETED" {
            self.objects.remove(path);
        } else {
            self.objects.insert(path.to_owned(), object.clone());
        }
        self.events.push(Event {
            resource_version: self.resource_version,
            path: path.to_owned(),
            kind,
            object: object.clone(),
        });
        self.watches.retain(|w| !w.tx.is_closed());
        for w in self.watches.iter().filter(|w| w.wants(path, &object)) {
            let _ = w.tx.send(event_line(kind, &object));
        }
        object
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
        let object = self.store(&path, object, "ADDED");
        (StatusCode::CREATED, object)
    }

    fn replace(&mut self, path: &str, mut object: Value) -> (StatusCode, Value) {
        let Some(current) = self.objects.get(path).cloned() else {
            return not_found(path);
        };
        if let Some(rv) = object["metadata"]["resourceVersion"].as_str()
            && current["metadata"]["resourceVersion"].as_str() != Some(rv)
        {
            return status(
                StatusCode::CONFLICT,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {path}: the object has been modified; please \
                     apply your changes to the latest version and try again"
                ),
            );
        }
        for field in ["uid", "creationTimestamp", "deletionTimestamp"] {
            match current["metadata"].get(field) {
                Some(v) => object["metadata"][field] = v.clone(),
                None => {
                    if let Some(m) = object["metadata"].as_object_mut() {
                        m.remove(field);
                    }
                }
            }
        }
        match current.get("status") {
            Some(s) => object["status"] = s.clone(),
            None => {
                if let Some(m) = object.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        let object = self.store(path, object, "MODIFIED");
        (StatusCode::OK, object)
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
        let finalizers_left = merged["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        let kind = if merged["metadata"].get("deletionTimestamp").is_some() && !finalizers_left {
            "DELETED"
        } else if current == json!({}) {
            "ADDED"
        } else {
            "MODIFIED"
        };
        let merged = self.store(path, merged, kind);
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
                object = self.store(path, object, "MODIFIED");
            }
        } else {
            object = self.store(path, object, "DELETED");
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
    async fn a_replace_with_a_stale_resource_version_is_a_conflict() {
        let fake = FakeApi::new();
        let api: Api<ConfigMap> = Api::namespaced(fake.client("ns"), "ns");
        let absent: ConfigMap = serde_json::from_value(cm()).unwrap();
        let err = api
            .replace("a", &PostParams::default(), &absent)
            .await
            .unwrap_err();
        assert!(
            matches!(err, kube::Error::Api(ref s) if s.code == 404),
            "{err:?}"
        );
        fake.insert(CM, cm());
        let read = api.get("a").await.unwrap();
        let mut changed = read.clone();
        changed.data = Some([("k".to_owned(), "w".to_owned())].into());
        let written = api
            .replace("a", &PostParams::default(), &changed)
            .await
            .unwrap();
        assert_eq!(written.data, changed.data);
        assert_eq!(written.metadata.uid, read.metadata.uid);
        let err = api
            .replace("a", &PostParams::default(), &changed)
            .await
            .unwrap_err();
        assert!(
            matches!(err, kube::Error::Api(ref s) if s.code == 409),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn watches_see_changes_after_their_resource_version_and_await_condition_works() {
        let fake = FakeApi::new();
        fake.insert(CM, cm());
        let api: Api<ConfigMap> = Api::namespaced(fake.client("ns"), "ns");
        let waiting = tokio::spawn(kube::runtime::wait::await_condition(
            api.clone(),
            "a",
            |cm: Option<&ConfigMap>| {
                cm.and_then(|c| c.data.as_ref())
                    .is_some_and(|d| d.get("k").map(String::as_str) == Some("done"))
            },
        ));
        // Let the watcher list and start watching, then change the object twice.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let pp = PatchParams::default();
        api.patch("a", &pp, &Patch::Merge(json!({"data": {"k": "half"}})))
            .await
            .unwrap();
        api.patch("a", &pp, &Patch::Merge(json!({"data": {"k": "done"}})))
            .await
            .unwrap();
        let seen = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the watch delivered the change")
            .unwrap()
            .unwrap();
        assert_eq!(seen.unwrap().data.unwrap()["k"], "done");
        let watches = fake
            .requests()
            .iter()
            .filter(|s| s.query.contains("watch=true"))
            .count();
        assert!(watches >= 1, "{:?}", fake.requests());
        assert!(
            fake.requests()
                .iter()
                .any(|s| s.query.contains("fieldSelector=metadata.name%3Da"))
        );
    }

    #[tokio::test]
    async fn a_watch_from_an_old_resource_version_replays_what_it_missed() {
        let fake = FakeApi::new();
        fake.insert(CM, cm());
        let mut st = fake.state.lock().unwrap();
        let mut rx = st.watch(
            "/api/v1/namespaces/ns/configmaps",
            &Query {
                watch: true,
                resource_version: Some(0),
                fields: Vec::new(),
            },
        );
        drop(st);
        let line = rx.try_recv().unwrap();
        let event: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(event["type"], "ADDED");
        assert_eq!(event["object"]["metadata"]["name"], "a");
        fake.delete(CM);
        let event: Value = serde_json::from_slice(&rx.try_recv().unwrap()).unwrap();
        assert_eq!(event["type"], "DELETED");
    }

    #[tokio::test]
    async fn field_selectors_filter_lists_and_watches_on_any_field_path() {
        let fake = FakeApi::new();
        fake.insert(CM, cm());
        let mut b = cm();
        b["metadata"]["name"] = json!("b");
        b["data"]["k"] = json!("w");
        fake.insert("/api/v1/namespaces/ns/configmaps/b", b);
        let api: Api<ConfigMap> = Api::namespaced(fake.client("ns"), "ns");
        let names = |l: kube::core::ObjectList<ConfigMap>| {
            l.items
                .into_iter()
                .map(|c| c.metadata.name.unwrap())
                .collect::<Vec<_>>()
        };
        let lp = |f: &str| kube::api::ListParams::default().fields(f);
        assert_eq!(names(api.list(&lp("data.k=w")).await.unwrap()), ["b"]);
        assert_eq!(
            names(api.list(&lp("metadata.name=a")).await.unwrap()),
            ["a"]
        );
        assert!(
            api.list(&lp("data.k=w,metadata.name=a"))
                .await
                .unwrap()
                .items
                .is_empty()
        );
        assert_eq!(api.list(&lp("")).await.unwrap().items.len(), 2);

        let mut st = fake.state.lock().unwrap();
        let mut rx = st.watch(
            "/api/v1/namespaces/ns/configmaps",
            &Query::parse("watch=true&resourceVersion=0&fieldSelector=data.k%3Dw"),
        );
        drop(st);
        let event: Value = serde_json::from_slice(&rx.try_recv().unwrap()).unwrap();
        assert_eq!(event["object"]["metadata"]["name"], "b");
        assert!(rx.try_recv().is_err(), "a is not selected");
        fake.delete(CM);
        assert!(rx.try_recv().is_err(), "a's deletion is not selected");
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
