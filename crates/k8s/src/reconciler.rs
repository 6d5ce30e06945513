//! The setup every reconciler of lvms-rs shares: an event [`recorder`] named after its role, and
//! [`drive`], which runs a kube-runtime [`Controller`] until its watches end and logs the outcome
//! of each turn the same way.

use std::{fmt::Debug, future::Future, hash::Hash, sync::Arc};

use futures::StreamExt;
use kube::{
    Client, Resource,
    runtime::{
        Controller,
        controller::{self, Action},
        events::{Recorder, Reporter},
    },
};
use serde::de::DeserializeOwned;
use tracing::{debug, warn};

/// The environment variable that names the pod a role runs in (the Downward API sets it); events
/// carry it as their reporting instance.
pub const POD_NAME_ENV: &str = "POD_NAME";

/// An event recorder reporting as `controller`, from the pod [`POD_NAME_ENV`] names (if set).
pub fn recorder(client: Client, controller: &str) -> Recorder {
    Recorder::new(
        client,
        Reporter {
            controller: controller.to_owned(),
            instance: std::env::var(POD_NAME_ENV).ok(),
        },
    )
}

/// Runs `controller` with `reconcile` and `error_policy` over `ctx` until its watches end (or its
/// graceful shutdown fires). A reconciled object is logged at debug level as a `what`; a failed
/// reconcile is left to `error_policy` to log (it decides the retry); an object gone before its
/// turn is debug; a failing watch is a warning.
pub async fn drive<K, Ctx, Fut, E>(
    controller: Controller<K>,
    what: &'static str,
    reconcile: impl FnMut(Arc<K>, Arc<Ctx>) -> Fut,
    error_policy: impl Fn(Arc<K>, &E, Arc<Ctx>) -> Action,
    ctx: Arc<Ctx>,
) where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Debug + Eq + Hash + Clone + Unpin,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::error::Error + Send + 'static,
{
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(kind = what, name = %obj.name, "reconciled"),
                Err(controller::Error::ObjectNotFound(obj)) => {
                    debug!(kind = what, object = %obj, "gone before its turn");
                }
                Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(e) => warn!(kind = what, error = %e, "watching failed"),
            }
        })
        .await;
}
