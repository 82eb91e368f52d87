//! Shared helpers: clusters of real processes and deadlines on every test.

use std::future::Future;
use std::time::Duration;

use nimbus::local::LocalCluster;

/// The heartbeat timeout the tests run with.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);

/// A cluster of `nodes` processes of this build's `nimbus` binary.
pub fn cluster(nodes: usize) -> LocalCluster {
    LocalCluster::builder()
        .program(env!("CARGO_BIN_EXE_nimbus"))
        .nodes(nodes)
        .heartbeat_timeout(HEARTBEAT_TIMEOUT)
        .start()
        .expect("local cluster starts")
}

/// Runs `test` with a deadline, so a hang fails the test instead of CI.
pub async fn within<T>(deadline: Duration, test: impl Future<Output = T>) -> T {
    tokio::time::timeout(deadline, test)
        .await
        .unwrap_or_else(|_| panic!("test did not finish within {deadline:?}"))
}
