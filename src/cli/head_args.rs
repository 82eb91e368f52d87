//! Reaching a running cluster's head from the command line.

use std::time::Duration;

use crate::client::ClusterClient;
use crate::transport::TransportConfig;
use anyhow::{Context, Result};
use clap::Args;

use super::{start::token_from, state};

/// How a command finds and authenticates to the head.
#[derive(Args)]
pub(crate) struct HeadArgs {
    /// The head's HOST:PORT (default: the head started on this machine).
    #[arg(long)]
    address: Option<String>,
    /// The cluster's token (default: $NIMBUS_TOKEN, then this machine's token file).
    #[arg(long, conflicts_with = "token_file")]
    token: Option<String>,
    /// A file holding the cluster's token.
    #[arg(long, value_name = "PATH")]
    token_file: Option<std::path::PathBuf>,
    /// Seconds to wait for each node.
    #[arg(long, default_value_t = 5)]
    timeout_s: u64,
}

impl HeadArgs {
    /// Runs `work` with a client of the head, on a runtime of its own.
    pub(crate) fn with_client<T>(
        &self,
        work: impl AsyncFnOnce(ClusterClient) -> Result<T>,
    ) -> Result<T> {
        let address = match &self.address {
            Some(address) => address.clone(),
            None => {
                state::load_head()
                    .context("no --address given and no head was started on this machine")?
                    .address
            }
        };
        let token = token_from(self.token.as_deref(), self.token_file.as_deref())?;
        let config = TransportConfig {
            connect_timeout: Duration::from_secs(self.timeout_s),
            ..TransportConfig::default()
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let client = ClusterClient::connect_with(&address, &token, config).await?;
            work(client).await
        })
    }
}
