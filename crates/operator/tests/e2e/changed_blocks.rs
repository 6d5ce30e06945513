//! Changed-block tracking on the real control plane (ADR 0039): a backup client — the
//! external-snapshot-metadata release's own `snapshot-metadata-lister` — asks the sidecar for the
//! blocks of two VolumeSnapshots of one claim; the sidecar calls `lvms csi-controller`, which
//! forwards to the node agent in the VM over mutual TLS; the agent reads the thin pool's metadata.
//! The answer is compared with what the test wrote to the volume between the two snapshots.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ServiceAccount};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::{Value, json};

use crate::{
    scenarios::{CLASS, bound_claim, handle_of, ready_snapshot, scenario},
    stack::{self, Stack},
};

/// Writes `chunks` (each `chunk` bytes, random data) of `/dev/<CLASS>/<lv>` in the VM, synced.
async fn write_chunks(stack: &Stack, lv: &str, chunk: u64, chunks: &[u64]) {
    for c in chunks {
        stack
            .vm
            .ok(&format!(
                "dd if=/dev/urandom of=/dev/{CLASS}/{lv} bs={chunk} count=1 seek={c} \
                 oflag=direct conv=notrunc status=none"
            ))
            .await;
    }
}

/// The chunk size of the pool of `lv`, in bytes, as LVM reports it.
async fn chunk_size(stack: &Stack, lv: &str) -> u64 {
    let pool = stack
        .vm
        .ok(&format!(
            "lvm lvs --noheadings -o pool_lv {CLASS}/{lv} 2>/dev/null"
        ))
        .await;
    stack
        .vm
        .ok(&format!(
            "lvm lvs --noheadings --units b --nosuffix -o chunk_size {CLASS}/{} 2>/dev/null",
            pool.trim()
        ))
        .await
        .trim()
        .parse()
        .unwrap()
}

/// Every `(byte_offset, size_bytes)` in the lister's JSON output, whatever its nesting.
fn ranges(out: &str) -> Vec<(u64, u64)> {
    fn walk(v: &Value, out: &mut Vec<(u64, u64)>) {
        match v {
            Value::Object(m) => {
                let field = |a: &str, b: &str| m.get(a).or_else(|| m.get(b)).and_then(number);
                if let (Some(o), Some(l)) = (
                    field("byte_offset", "byteOffset"),
                    field("size_bytes", "sizeBytes"),
                ) {
                    out.push((o, l));
                }
                m.values().for_each(|v| walk(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    fn number(v: &Value) -> Option<u64> {
        v.as_u64().or_else(|| v.as_str()?.parse().ok())
    }
    let mut found = Vec::new();
    for value in serde_json::Deserializer::from_str(out).into_iter::<Value>() {
        walk(&value.unwrap_or_else(|e| panic!("{e}: {out}")), &mut found);
    }
    found
}

/// The chunks the ranges cover.
fn chunks(ranges: &[(u64, u64)], chunk: u64) -> BTreeSet<u64> {
    ranges
        .iter()
        .flat_map(|&(o, l)| (o / chunk)..(o + l).div_ceil(chunk))
        .collect()
}

/// `snapshot-metadata-lister` as a backup application runs it, with a token of ServiceAccount
/// `backup` of `ns`; its JSON output.
async fn lister(ns: &str, args: &[&str]) -> String {
    let assets = std::env::var_os("LVMS_K8S_ASSETS").unwrap();
    let out = tokio::process::Command::new(
        std::path::Path::new(&assets).join("snapshot-metadata-lister"),
    )
    .arg(format!(
        "-kubeconfig={}",
        std::env::var("KUBECONFIG").unwrap()
    ))
    .args(["-n", ns, "-o", "json", "-service-account", "backup"])
    .args(["-service-account-namespace", ns])
    .args(args)
    .output()
    .await
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "snapshot-metadata-lister {args:?}: {}\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

#[tokio::test]
async fn stack_a_backup_client_gets_the_blocks_changed_between_two_volume_snapshots() {
    let Some(guard) =
        stack::stack("stack_a_backup_client_gets_the_blocks_changed_between_two_volume_snapshots")
            .await
    else {
        return;
    };
    let stack = guard.as_ref().unwrap();
    if std::env::var_os("LVMS_E2E_VM_METADATA").is_none() {
        eprintln!("skipped: the harness forwards no changed-block tracking port");
        return;
    }
    let (client, ns) = scenario(stack, "lvms-e2e-cbt").await;

    // The backup application's ServiceAccount may read the namespace's VolumeSnapshots: what the
    // sidecar checks of the token it presents.
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), &ns.name);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "backup"}})).unwrap(),
        )
        .await
        .unwrap();
    for doc in [
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "backup", "namespace": ns.name},
               "rules": [{"apiGroups": ["snapshot.storage.k8s.io"],
                          "resources": ["volumesnapshots"], "verbs": ["get", "list"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "backup", "namespace": ns.name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "backup"},
               "subjects": [{"kind": "ServiceAccount", "name": "backup", "namespace": ns.name}]}),
    ] {
        stack::apply(&client, &doc).await;
    }

    let pv = bound_claim(&client, &ns.name, "data", "64Mi", None).await;
    let lv = handle_of(&client, &pv).await;
    let chunk = chunk_size(stack, &lv).await;
    let first = [2, 3, 4, 20, 40];
    write_chunks(stack, &lv, chunk, &first).await;
    let (snapshots, _) = ready_snapshot(&client, &ns.name, "before", "data").await;
    let second = [3, 9, 10, 11, 500 % (64 * 1024 * 1024 / chunk)];
    write_chunks(stack, &lv, chunk, &second).await;
    let (_, _) = ready_snapshot(&client, &ns.name, "after", "data").await;

    let delta = ranges(&lister(&ns.name, &["-s", "after", "-p", "before"]).await);
    assert_eq!(
        chunks(&delta, chunk),
        second.iter().copied().collect::<BTreeSet<_>>(),
        "changed ranges {delta:?} (chunk {chunk} bytes)"
    );
    let allocated = ranges(&lister(&ns.name, &["-s", "after"]).await);
    assert_eq!(
        chunks(&allocated, chunk),
        first
            .iter()
            .chain(&second)
            .copied()
            .collect::<BTreeSet<_>>(),
        "allocated ranges {allocated:?}"
    );

    // Cleanup: the pod at once (no kubelet confirms), the snapshots, the claim.
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .delete("data", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    for name in ["after", "before"] {
        snapshots
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name)
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    ns.delete().await;
}
