#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use http::{Method, StatusCode};
use lvms_testkit::fake_api::FakeApi;
use serde_json::json;
use tokio::sync::watch;

use super::*;

const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/lvms/leases/lvms-operator";

/// Short timings: the Lease's duration is whole seconds.
const FAST: Timings = Timings {
    duration: Duration::from_secs(2),
    renew_deadline: Duration::from_millis(800),
    retry: Duration::from_millis(100),
};

fn replica(api: &FakeApi, me: &str) -> HeldLease {
    FAST.lease(api.client("lvms"), "lvms", "lvms-operator", me)
}

/// A replica's leadership as the test sees it: whether it leads, whether its work still runs.
#[derive(Clone, Default)]
struct Seen {
    leading: Arc<AtomicBool>,
    working: Arc<AtomicBool>,
}

/// Work that runs until `stop`, marking `seen.working` while it runs (also when dropped mid-way).
async fn work(seen: Seen, mut stop: watch::Receiver<bool>) {
    struct Running(Arc<AtomicBool>);
    impl Drop for Running {
        fn drop(&mut self) {
            self.0.store(false, Ordering::SeqCst);
        }
    }
    seen.working.store(true, Ordering::SeqCst);
    let _running = Running(seen.working.clone());
    let _ = stop.wait_for(|s| *s).await;
}

/// A started replica: its stop switch, what it does, and its end.
type Started = (
    watch::Sender<bool>,
    Seen,
    tokio::task::JoinHandle<Result<(), Lost>>,
);

/// Starts replica `me`.
fn start(api: &FakeApi, me: &str) -> Started {
    let (stop, stopped) = watch::channel(false);
    let seen = Seen::default();
    let lease = replica(api, me);
    let task = tokio::spawn({
        let seen = seen.clone();
        async move {
            let mut on_stop = stopped.clone();
            let leading = seen.leading.clone();
            lead(
                &lease,
                FAST,
                work(seen, stopped),
                async move {
                    let _ = on_stop.wait_for(|s| *s).await;
                },
                move || leading.store(true, Ordering::SeqCst),
            )
            .await
        }
    });
    (stop, seen, task)
}

/// [`start`], waiting until `me` leads (the first replica of a Lease does at once).
async fn start_leading(api: &FakeApi, me: &str) -> Started {
    let started = start(api, me);
    until(&format!("{me} leads"), Duration::from_secs(5), || {
        started.1.working.load(Ordering::SeqCst)
    })
    .await;
    started
}

async fn until(what: &str, within: Duration, check: impl Fn() -> bool) -> Duration {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < within, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

fn holder(api: &FakeApi) -> serde_json::Value {
    api.get(PATH).unwrap()["spec"]["holderIdentity"].clone()
}

#[tokio::test]
async fn one_replica_leads_and_the_other_takes_over_at_once_when_it_stops() {
    let api = FakeApi::new();
    let (stop_a, a, task_a) = start_leading(&api, "a").await;
    let (stop_b, b, task_b) = start(&api, "b");
    // b stands by while a renews, past the Lease's duration.
    tokio::time::sleep(FAST.duration + Duration::from_millis(500)).await;
    assert!(!b.leading.load(Ordering::SeqCst) && !b.working.load(Ordering::SeqCst));
    assert_eq!(holder(&api), "a");

    stop_a.send(true).unwrap();
    task_a.await.unwrap().unwrap();
    assert!(!a.working.load(Ordering::SeqCst));
    // Handed back: b need not wait for the duration.
    let took = until("b leads", FAST.duration, || {
        b.working.load(Ordering::SeqCst)
    })
    .await;
    assert!(took < FAST.duration, "{took:?}");
    assert_eq!(holder(&api), "b");
    assert_eq!(api.get(PATH).unwrap()["spec"]["leaseTransitions"], 1);

    stop_b.send(true).unwrap();
    task_b.await.unwrap().unwrap();
    assert!(holder(&api).is_null(), "handed back: {:?}", api.get(PATH));
}

#[tokio::test]
async fn a_killed_leader_is_replaced_once_its_lease_expired() {
    let api = FakeApi::new();
    let (_stop_a, _, task_a) = start_leading(&api, "a").await;
    let (_stop_b, b, _task_b) = start(&api, "b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Killed: nothing is handed back.
    task_a.abort();
    let _ = task_a.await;
    assert_eq!(holder(&api), "a");
    // The last renewal was at most one retry before the kill: b waits out the rest.
    tokio::time::sleep(FAST.duration - FAST.retry * 3).await;
    assert!(!b.leading.load(Ordering::SeqCst), "b took over early");
    until("b leads", FAST.duration, || {
        b.working.load(Ordering::SeqCst)
    })
    .await;
    assert_eq!(holder(&api), "b");
}

#[tokio::test]
async fn a_leader_that_cannot_renew_stops_its_work_by_the_renew_deadline() {
    let api = FakeApi::new();
    let (_stop, a, task) = start_leading(&api, "a").await;
    let cut = Instant::now();
    api.fail(Method::GET, PATH, StatusCode::INTERNAL_SERVER_ERROR, 1000);
    let lost = task.await.unwrap().unwrap_err();
    let after = cut.elapsed();
    assert!(!a.working.load(Ordering::SeqCst), "its work was dropped");
    assert!(lost.for_ >= FAST.renew_deadline, "{lost:?}");
    // Stopped before anyone else could take over.
    assert!(after < FAST.duration, "{after:?}");
    assert!(lost.to_string().contains("lvms-operator"), "{lost}");
}

#[tokio::test]
async fn a_leader_whose_lease_another_holds_stops_at_once() {
    let api = FakeApi::new();
    let (_stop, a, task) = start_leading(&api, "a").await;
    let mut lease = api.get(PATH).unwrap();
    lease["spec"]["holderIdentity"] = json!("b");
    api.insert(PATH, lease);
    let lost = task.await.unwrap().unwrap_err();
    assert!(!a.working.load(Ordering::SeqCst));
    assert!(lost.for_ < FAST.renew_deadline, "{lost:?}");
    assert!(lost.last_error.contains("b holds it now"), "{lost}");
    // Its stand-in is not disturbed.
    assert_eq!(holder(&api), "b");
}

#[tokio::test]
async fn a_replica_stopped_while_standing_by_never_runs_its_work() {
    let api = FakeApi::new();
    let (_stop_a, _, _task_a) = start_leading(&api, "a").await;
    let (stop_b, b, task_b) = start(&api, "b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_b.send(true).unwrap();
    task_b.await.unwrap().unwrap();
    assert!(!b.leading.load(Ordering::SeqCst));
    assert_eq!(holder(&api), "a", "a standby's stop hands nothing back");
}
