//! Shared helpers: clusters of real processes and deadlines on every test.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use nimbus::local::LocalCluster;
use nimbus::testing::ExitWatch;

/// The heartbeat timeout the tests run with.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a dropped cluster's processes get to be gone.
const LEAK_WAIT: Duration = Duration::from_secs(15);

/// A cluster of `nodes` processes of this build's `nimbus` binary.
pub fn cluster(nodes: usize) -> Cluster {
    Cluster(Some(
        LocalCluster::builder()
            .program(env!("CARGO_BIN_EXE_nimbus"))
            .nodes(nodes)
            .heartbeat_timeout(HEARTBEAT_TIMEOUT)
            .start()
            .expect("local cluster starts"),
    ))
}

/// A cluster of `nodes` processes with `env` in every node's environment.
pub fn cluster_with_env(nodes: usize, env: &[(&str, &str)]) -> Cluster {
    let mut builder = LocalCluster::builder()
        .program(env!("CARGO_BIN_EXE_nimbus"))
        .nodes(nodes)
        .heartbeat_timeout(HEARTBEAT_TIMEOUT);
    for (key, value) in env {
        builder = builder.env(key, *value);
    }
    Cluster(Some(builder.start().expect("local cluster starts")))
}

/// A local cluster whose drop fails the test if any of its node or worker
/// processes is left running.
pub struct Cluster(Option<LocalCluster>);

impl Deref for Cluster {
    type Target = LocalCluster;

    fn deref(&self) -> &LocalCluster {
        self.0.as_ref().expect("the cluster lives until dropped")
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut LocalCluster {
        self.0.as_mut().expect("the cluster lives until dropped")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let Some(cluster) = self.0.take() else {
            return;
        };
        let watch = ExitWatch::cluster(&cluster);
        drop(cluster);
        if let Err(left) = watch.wait(LEAK_WAIT) {
            if !std::thread::panicking() {
                panic!("{left}");
            }
        }
    }
}

/// Runs `test` with a deadline, so a hang fails the test instead of CI.
pub async fn within<T>(deadline: Duration, test: impl Future<Output = T>) -> T {
    tokio::time::timeout(deadline, test)
        .await
        .unwrap_or_else(|_| panic!("test did not finish within {deadline:?}"))
}
