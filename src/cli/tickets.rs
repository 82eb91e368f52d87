//! `nimbus rotate-ticket-key`: the head makes a new ticket key, which
//! signs one lifetime (and a quarter) later and alone is accepted a
//! lifetime after that (`crate::transport`'s `ticket_keys.rs`). Nodes and
//! workers take it up as they renew their tickets: nothing restarts.

use anyhow::Result;
use clap::Args;

use super::head_args::HeadArgs;
use crate::transport::unix_now;

/// Options of `nimbus rotate-ticket-key`.
#[derive(Args)]
pub(crate) struct RotateArgs {
    #[command(flatten)]
    head: HeadArgs,
}

/// Runs `nimbus rotate-ticket-key`.
pub(crate) fn rotate(args: RotateArgs) -> Result<()> {
    let (switch_at, done_at) = args
        .head
        .with_client(async |client| Ok(client.rotate_ticket_key().await?))?;
    let now = unix_now();
    println!(
        "rotating the head's ticket key: the new key signs from {switch_at} (in {} s), the old one is accepted until {done_at} (in {} s; Unix seconds)",
        switch_at.saturating_sub(now),
        done_at.saturating_sub(now)
    );
    Ok(())
}
