//! Apply only what changed: what the operator last applied of each object, so a periodic reconcile
//! over objects nobody touched writes nothing (issue 39: before this, 6 server-side applies in
//! every idle minute, measured from the API server's audit log).
//!
//! After an apply the operator keeps a hash of what it sent and the object's version as the API
//! server answered it. The next time it would send the same body it reads the object first; if the
//! version is unchanged and the labels and annotations it sets are all still there, nothing is
//! sent. Anything else (another spec, an object edited or deleted by someone else, a restarted
//! operator with an empty memo) applies as before, so drift is still corrected.
//!
//! The version is `metadata.generation` for kinds with a status (a DaemonSet's or an
//! `LVMVolumeGroup`'s status changes its `resourceVersion` all the time, never its generation) and
//! `metadata.resourceVersion` for the others (StorageClass, VolumeSnapshotClass, CSIDriver have no
//! status, and no generation to rely on).

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Debug,
    hash::{DefaultHasher, Hash, Hasher},
    sync::Mutex,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{
    Api, Resource,
    api::{Patch, PatchParams},
};
use lvms_api::OPERATOR_FIELD_MANAGER;
use serde::{Serialize, de::DeserializeOwned};

use super::{Result, kube_err};

/// Which field of an object's metadata says that someone changed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// `metadata.generation`: kinds with a status subresource.
    Generation,
    /// `metadata.resourceVersion`: kinds without.
    ResourceVersion,
}

impl Version {
    fn of(self, meta: &ObjectMeta) -> Option<String> {
        match self {
            Version::Generation => meta.generation.map(|g| g.to_string()),
            Version::ResourceVersion => meta.resource_version.clone(),
        }
    }
}

/// What was last applied of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    /// Hash of the JSON body sent.
    body: u64,
    /// Its [`Version`] in the API server's answer.
    version: String,
}

/// The memo, per `kind/namespace/name`.
#[derive(Debug, Default)]
pub struct Applied {
    stamps: Mutex<HashMap<String, Stamp>>,
}

fn key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

/// Whether every entry of `wanted` is in `live`.
fn contains(
    live: Option<&BTreeMap<String, String>>,
    wanted: Option<&BTreeMap<String, String>>,
) -> bool {
    wanted
        .into_iter()
        .flatten()
        .all(|(k, v)| live.and_then(|l| l.get(k)) == Some(v))
}

/// Whether `live` is still what the operator applied as `stamp` of `wanted`.
fn unchanged<K: Resource>(stamp: &Stamp, version: Version, wanted: &K, live: &K) -> bool {
    let (wanted, live) = (wanted.meta(), live.meta());
    version.of(live).as_ref() == Some(&stamp.version)
        && contains(live.labels.as_ref(), wanted.labels.as_ref())
        && contains(live.annotations.as_ref(), wanted.annotations.as_ref())
}

impl Applied {
    fn stamp(&self, key: &str) -> Option<Stamp> {
        self.stamps.lock().ok()?.get(key).cloned()
    }

    fn remember(&self, key: String, stamp: Option<Stamp>) {
        if let Ok(mut stamps) = self.stamps.lock() {
            match stamp {
                Some(s) => stamps.insert(key, s),
                None => stamps.remove(&key),
            };
        }
    }

    /// Server-side applies `obj` (field manager [`OPERATOR_FIELD_MANAGER`], forced) unless the
    /// same body was applied before and the object is unchanged since (see the module's
    /// documentation).
    pub async fn apply<K>(&self, api: &Api<K>, obj: &K, version: Version) -> Result<()>
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
    {
        let name = obj.meta().name.clone().unwrap_or_default();
        let body = serde_json::to_vec(obj).map_or(0, |json| {
            let mut h = DefaultHasher::new();
            json.hash(&mut h);
            h.finish()
        });
        let key = key(obj);
        if let Some(stamp) = self.stamp(&key).filter(|s| s.body == body) {
            let live = api
                .get_opt(&name)
                .await
                .map_err(kube_err(format!("reading {} {name}", K::kind(&()))))?;
            if live.is_some_and(|live| unchanged(&stamp, version, obj, &live)) {
                return Ok(());
            }
        }
        let applied = api
            .patch(
                &name,
                &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
                &Patch::Apply(obj),
            )
            .await;
        match applied {
            Ok(answer) => {
                let stamp = version
                    .of(answer.meta())
                    .map(|version| Stamp { body, version });
                self.remember(key, stamp);
                Ok(())
            }
            Err(e) => {
                self.remember(key, None);
                Err(kube_err(format!("applying {} {name}", K::kind(&())))(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::StorageClass;

    fn class(rv: &str, labels: &[(&str, &str)]) -> StorageClass {
        let mut sc = StorageClass {
            provisioner: "topolvm.io".into(),
            ..Default::default()
        };
        sc.metadata.name = Some("lvms-vg1".into());
        sc.metadata.resource_version = Some(rv.into());
        sc.metadata.generation = Some(1);
        sc.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        sc
    }

    #[test]
    fn an_object_is_unchanged_only_with_its_version_and_every_label_the_operator_set() {
        let stamp = Stamp {
            body: 1,
            version: "7".into(),
        };
        let wanted = class("", &[("owned-by", "lvms")]);
        let same = class("7", &[("owned-by", "lvms"), ("other", "x")]);
        assert!(unchanged(&stamp, Version::ResourceVersion, &wanted, &same));
        let edited = class("8", &[("owned-by", "lvms")]);
        assert!(!unchanged(
            &stamp,
            Version::ResourceVersion,
            &wanted,
            &edited
        ));
        let label_gone = class("7", &[("other", "x")]);
        assert!(!unchanged(
            &stamp,
            Version::ResourceVersion,
            &wanted,
            &label_gone
        ));
        let label_changed = class("7", &[("owned-by", "someone")]);
        assert!(!unchanged(
            &stamp,
            Version::ResourceVersion,
            &wanted,
            &label_changed
        ));
        // By generation, a new resourceVersion alone (a status update) is no change.
        let stamp = Stamp {
            body: 1,
            version: "1".into(),
        };
        assert!(unchanged(&stamp, Version::Generation, &wanted, &edited));
        let mut respecced = edited.clone();
        respecced.metadata.generation = Some(2);
        assert!(!unchanged(&stamp, Version::Generation, &wanted, &respecced));
    }
}
