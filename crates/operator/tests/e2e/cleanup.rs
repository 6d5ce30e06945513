//! Scenario 6 on the [`stack`](crate::stack): what nobody claims is reported, and removed only after
//! the safety window; a deleted Node releases what it held.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use lvms_api::{LVMVolumeGroup, LVMVolumeGroupNodeStatus, topolvm::LogicalVolume};
use serde_json::json;

use crate::{
    scenarios::{CLASS, POOL, ready_cluster, scenario},
    stack::{self, NAMESPACE, NODE, SLOW, Stack},
    support::{self, consistently, eventually},
};

/// The safety window the collectors get here, in seconds.
const WINDOW: u64 = 30;
/// How often they look, in seconds.
const PERIOD: u64 = 5;

/// The value of the sample `name` (with its labels, as printed) in a Prometheus text exposition.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `/metrics` of a process on this machine.
async fn scrape(port: u16) -> String {
    let out = tokio::process::Command::new("curl")
        .args(["-sf", &format!("http://127.0.0.1:{port}/metrics")])
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The Warning events with `reason` about the object named `name` (core/v1 and events.k8s.io
/// events are one store).
async fn warnings(client: &Client, name: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::all(client.clone())
        .list(&ListParams::default().fields(&format!(
            "involvedObject.name={name},reason={reason},type=Warning"
        )))
        .await
        .unwrap()
        .items
}

/// Waits until `gone` says the volume is gone, asserting that it stays until the window has nearly
/// passed since `reported`; the seconds from the report to its removal.
async fn removed_after_the_window<F, Fut>(what: &str, reported: Instant, mut gone: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    // Removed no earlier than a window after the sweep that first saw it, which came before the
    // report was seen: keep checking until a sweep period before that.
    let keep = Duration::from_secs(WINDOW - PERIOD).saturating_sub(reported.elapsed());
    consistently(&format!("{what} is kept inside the window"), keep, || {
        let gone = gone();
        async move {
            if gone.await {
                Err("removed early".to_owned())
            } else {
                Ok(())
            }
        }
    })
    .await;
    eventually(&format!("{what} is removed"), SLOW, || {
        let gone = gone();
        async move {
            if gone.await {
                Ok(())
            } else {
                Err("still there".to_owned())
            }
        }
    })
    .await;
    reported.elapsed().as_secs_f64()
}

#[tokio::test]
async fn stack_unclaimed_volumes_go_after_the_window_and_a_deleted_node_releases_its_hold() {
    let Some(mut guard) = stack::stack(
        "stack_unclaimed_volumes_go_after_the_window_and_a_deleted_node_releases_its_hold",
    )
    .await
    else {
        return;
    };
    let stack = guard.as_mut().unwrap();
    let (client, ns) = scenario(stack, "lvms-e2e-gc").await;
    let (period, window) = (
        format!("--gc-period={PERIOD}"),
        format!("--gc-delete-after={WINDOW}"),
    );
    let gc = [period.as_str(), window.as_str()];
    stack.restart_with("csi-controller", &gc);
    stack.start_agent_with(&gc).await;

    unclaimed_logical_volume(stack, &client).await;
    orphaned_lv(stack, &client).await;

    // The Node goes (its machine was removed): nobody runs its agent any more.
    stack.kill_agent().await;
    stack.restart_with("csi-controller", &[]);
    node_removal_releases_the_node(stack, &client).await;

    // The machine joins again; its agent finds its volume group and holds it again.
    stack.register_kubelet(&client).await;
    let finalizer = format!("cleanup.vgmanager.node.topolvm.io/{NODE}");
    eventually("the agent's cleanup finalizer is back", SLOW, || {
        let vgs = Api::<LVMVolumeGroup>::namespaced(client.clone(), NAMESPACE);
        let finalizer = finalizer.clone();
        async move {
            let vg = vgs.get(CLASS).await.map_err(|e| e.to_string())?;
            vg.finalizers()
                .contains(&finalizer)
                .then_some(())
                .ok_or(format!("{:?}", vg.finalizers()))
        }
    })
    .await;
    ready_cluster(&client, stack).await;
    ns.delete().await;
}

/// A `LogicalVolume` nobody provisioned (no PersistentVolume refers to it): the CSI controller
/// reports it and deletes it after the window, and the agent then removes its LV.
async fn unclaimed_logical_volume(stack: &Stack, client: &Client) {
    let name = format!("lvms-e2e-unclaimed-{}", support::suffix());
    let objects = Api::<LogicalVolume>::all(client.clone());
    let object: LogicalVolume = serde_json::from_value(json!({
        "apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
        "metadata": {"name": name},
        "spec": {"name": name, "nodeName": NODE, "deviceClass": CLASS, "size": "64Mi"},
    }))
    .unwrap();
    objects
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating the LogicalVolume: {e}"));
    let lv = eventually("the agent makes its LV", SLOW, || {
        let objects = objects.clone();
        let name = name.clone();
        async move {
            let o = objects.get(&name).await.map_err(|e| e.to_string())?;
            match o.status.as_ref().map(|s| s.volume_id.clone()) {
                Some(id) if !id.is_empty() => Ok(id),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    assert!(stack.vm.lvs(CLASS).await.contains(&lv), "{lv} in lvs");

    let event = eventually("a Warning event on the LogicalVolume", SLOW, || async {
        let found = warnings(client, &name, "OrphanedLogicalVolume").await;
        found
            .into_iter()
            .next()
            .ok_or_else(|| "no event yet".to_owned())
    })
    .await;
    let reported = Instant::now();
    let note = event.message.unwrap_or_default();
    assert!(
        note.contains(&format!("deleted after {WINDOW} s")),
        "the event says when it goes: {note}"
    );
    let port = stack.controller_metrics;
    eventually("the CSI controller counts it", SLOW, || async move {
        let text = scrape(port).await;
        (sample(&text, "lvms_unclaimed_logical_volumes") >= Some(1.0))
            .then_some(())
            .ok_or(text)
    })
    .await;

    let took = removed_after_the_window("the unclaimed LogicalVolume", reported, || {
        let objects = objects.clone();
        let name = name.clone();
        async move { objects.get_opt(&name).await.unwrap().is_none() }
    })
    .await;
    println!("the unclaimed LogicalVolume went {took:.0} s after it was reported");
    eventually("its LV is removed", SLOW, || {
        let lv = lv.clone();
        async move {
            let lvs = stack.vm.lvs(CLASS).await;
            (!lvs.contains(&lv)).then_some(()).ok_or(format!("{lvs:?}"))
        }
    })
    .await;
    let text = scrape(port).await;
    assert!(
        sample(&text, "lvms_unclaimed_logical_volumes_removed_total") >= Some(1.0),
        "{text}"
    );
}

/// An LV of ours that no `LogicalVolume` names (a controller crashed after the agent made it): the
/// agent reports it on the Node and removes it after the window.
async fn orphaned_lv(stack: &Stack, client: &Client) {
    let lv = format!("csi-{}", "orphan".repeat(5).get(..26).unwrap());
    stack
        .vm
        .ok(&format!(
            "lvm lvcreate -qq -y -T {CLASS}/{POOL} -V 32m -n {lv} --addtag {}",
            lvms_core::config::VG_OWNER_TAG
        ))
        .await;
    let event = eventually("a Warning event on the Node", SLOW, || async {
        let found = warnings(client, NODE, "OrphanedVolume").await;
        found
            .into_iter()
            .find(|e| e.message.as_deref().unwrap_or_default().contains(&lv))
            .ok_or_else(|| "no event yet".to_owned())
    })
    .await;
    let reported = Instant::now();
    println!("the agent said: {}", event.message.unwrap_or_default());
    let metrics = || async { stack.vm.ok("curl -sf http://127.0.0.1:8081/metrics").await };
    let text = metrics().await;
    assert!(
        sample(&text, "lvms_orphaned_volumes") >= Some(1.0),
        "the agent counts it: {text}"
    );
    let took = removed_after_the_window("the orphaned LV", reported, || {
        let lv = lv.clone();
        async move { !stack.vm.lvs(CLASS).await.contains(&lv) }
    })
    .await;
    println!("the orphaned LV went {took:.0} s after it was reported");
    let text = metrics().await;
    assert!(
        sample(&text, "lvms_orphaned_volumes_removed_total") >= Some(1.0),
        "{text}"
    );
}

/// Deleting the Node: the operator's node-removal controller deletes its node status and removes
/// its cleanup finalizer from the volume group, which nobody else would ever do.
async fn node_removal_releases_the_node(stack: &Stack, client: &Client) {
    let statuses = Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), NAMESPACE);
    let vgs = Api::<LVMVolumeGroup>::namespaced(client.clone(), NAMESPACE);
    let finalizer = format!("cleanup.vgmanager.node.topolvm.io/{NODE}");
    assert!(statuses.get_opt(NODE).await.unwrap().is_some());
    assert!(
        vgs.get(CLASS)
            .await
            .unwrap()
            .finalizers()
            .contains(&finalizer)
    );
    let before = sample(
        &scrape(stack.operator_metrics).await,
        "lvms_operator_node_cleanups_total",
    )
    .unwrap_or(0.0);

    Api::<Node>::all(client.clone())
        .delete(NODE, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the node's status is deleted", SLOW, || async {
        match statuses.get_opt(NODE).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(s) => Err(format!("{:?}", s.metadata)),
        }
    })
    .await;
    let vg = vgs.get(CLASS).await.unwrap();
    assert!(
        !vg.finalizers().contains(&finalizer),
        "{:?}",
        vg.finalizers()
    );
    let port = stack.operator_metrics;
    eventually("the operator counts the release", SLOW, || async move {
        let text = scrape(port).await;
        (sample(&text, "lvms_operator_node_cleanups_total") > Some(before))
            .then_some(())
            .ok_or(text)
    })
    .await;
}
