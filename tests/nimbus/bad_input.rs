//! Bad input from peers: garbage, truncated, oversized and unknown frames
//! close only that peer's connection; other versions and other tokens are
//! refused at the door.

use std::time::Duration;

use nimbus::client::{ClientError, ClusterClient};
use nimbus::cluster::NodeState;
use nimbus::transport::{ConnectError, JoinToken, RequestError, RequestOptions, TransportConfig};
use nimbus::wire::{self, CloseCode, Request};

use nimbus::testing::check::wait_until;

use crate::support::{cluster, within};

/// Sends `bytes` on a fresh authenticated connection to `node` and returns
/// the reason the node gave for closing it.
async fn close_reason_for(
    client: &ClusterClient,
    node: std::net::SocketAddr,
    bytes: &[u8],
) -> String {
    let endpoint = client.endpoint();
    let connection = endpoint.connect(node, None).await.unwrap();
    let _ = connection.send_raw(bytes).await;
    match connection.closed().await {
        RequestError::Rejected { reason, .. } => reason,
        other => panic!("expected the node to close the connection, got {other}"),
    }
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    frame
}

#[tokio::test]
async fn garbage_truncated_oversized_and_unknown_frames_close_only_that_connection() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(2);
        let client = cluster.client().await.unwrap();
        let target = cluster.node(1).unwrap().address();
        // A second, well-behaved peer that stays connected throughout.
        let bystander = ClusterClient::connect(&cluster.address().to_string(), cluster.token())
            .await
            .unwrap();
        let node = bystander
            .status()
            .await
            .unwrap()
            .node("node-1")
            .unwrap()
            .clone();
        let bystander_link = bystander.connect_node(&node).await.unwrap();

        let garbage: Vec<u8> = (0..64u32).map(|i| (i * 37 + 11) as u8).collect();
        let reason = close_reason_for(&client, target, &framed(&garbage)).await;
        assert!(reason.contains("undecodable"), "{reason}");

        let mut truncated = 100u32.to_be_bytes().to_vec();
        truncated.extend_from_slice(&[1; 10]);
        let reason = close_reason_for(&client, target, &truncated).await;
        assert!(reason.contains("truncated frame"), "{reason}");

        let oversized = (1u32 << 31).to_be_bytes();
        let reason = close_reason_for(&client, target, &oversized).await;
        assert!(reason.contains("exceeds the maximum"), "{reason}");

        let unknown = rmp_serde::to_vec_named(&serde_json::json!({"LaunchMissiles": 1})).unwrap();
        let request = Request {
            id: 1,
            to: None,
            deadline_ms: 1000,
            one_way: false,
            ordered: false,
            body: unknown,
        };
        let reason =
            close_reason_for(&client, target, &wire::encode(&request, 1 << 20).unwrap()).await;
        assert!(reason.contains("ControlRequest"), "{reason}");

        // The node still serves, the bystander's connection was never touched,
        // and the head still counts the node alive.
        assert!(bystander_link.is_open());
        let echoed = bystander
            .echo(
                &bystander_link,
                b"still here".to_vec(),
                RequestOptions::control(),
            )
            .await
            .unwrap();
        assert_eq!(echoed, b"still here");
        let status = bystander.status().await.unwrap();
        assert_eq!(status.node("node-1").unwrap().state, NodeState::Alive);
        assert!(cluster.log(1).contains("closing the connection"));
    })
    .await
}

#[tokio::test]
async fn a_peer_of_another_protocol_version_is_refused_with_both_versions_named() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(1);
        let config = TransportConfig {
            protocol_version: 999,
            ..TransportConfig::default()
        };
        let err =
            ClusterClient::connect_with(&cluster.address().to_string(), cluster.token(), config)
                .await
                .err()
                .expect("another version is refused");
        match err {
            ClientError::Connect(ConnectError::Refused { code, reason, .. }) => {
                assert_eq!(code, Some(CloseCode::VersionMismatch));
                let ours = format!("v{}", wire::PROTOCOL_VERSION);
                assert!(
                    reason.contains(&ours) && reason.contains("v999"),
                    "{reason}"
                );
            }
            other => panic!("expected a version refusal, got {other}"),
        }
        assert!(cluster.log(0).contains("v999"), "{}", cluster.log(0));
        // The head is unharmed.
        cluster.client().await.unwrap().status().await.unwrap();
    })
    .await
}

#[tokio::test]
async fn a_wrong_token_can_neither_join_nor_call() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(2);
        let wrong = JoinToken::generate();

        let err = ClusterClient::connect(&cluster.address().to_string(), &wrong)
            .await
            .err()
            .expect("a wrong token is refused");
        assert!(
            matches!(
                err,
                ClientError::Connect(ConnectError::Unauthenticated { .. })
            ),
            "{err}"
        );
        let said = err.to_string();
        assert!(
            said.contains(&cluster.address().to_string())
                && said.contains("refused our credentials or presented foreign ones")
                && said.contains("is the join token right?"),
            "{said}"
        );

        let intruder = std::process::Command::new(env!("CARGO_BIN_EXE_nimbus"))
            .args([
                "start",
                "--block",
                "--node-name",
                "intruder",
                "--node-ip-address",
                "127.0.0.1",
            ])
            .args([
                "--address",
                &cluster.address().to_string(),
                "--token",
                &wrong.to_string(),
            ])
            .env("NIMBUS_HOME", cluster.home())
            .output()
            .unwrap();
        assert!(!intruder.status.success());
        let stderr = String::from_utf8_lossy(&intruder.stderr);
        assert!(stderr.contains("is the join token right?"), "{stderr}");

        let status = cluster.client().await.unwrap().status().await.unwrap();
        assert!(status.node("intruder").is_none());
        assert_eq!(status.nodes.len(), 2);
        assert!(cluster
            .log(0)
            .contains("refused a connection: TLS handshake failed"));
    })
    .await
}

/// The resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024
}

/// Streams the stall test opens on one connection, and the body bytes it
/// sends on each (of a 15 MiB frame it never finishes).
const STALLED_STREAMS: usize = 32;
const STALLED_FRAME: usize = 15 << 20;
/// How long the sent bytes may take to reach the node.
const SENT_WITHIN: Duration = Duration::from_secs(30);

/// A token holder that opens many streams on one connection and sends
/// most of a large frame on each, never finishing, can make a node hold
/// only that connection's budget (4 frames) and flow-control window.
/// Before, the node read every stream's frame into memory: 32 streams made
/// it hold 480 MiB. The attacker's own endpoint is no nimbus node: its
/// send window (derived from its frame limit) does not hold it back.
#[tokio::test]
async fn a_peer_stalling_mid_frame_on_many_streams_holds_bounded_memory() {
    within(Duration::from_secs(90), async {
        let cluster = cluster(2);
        let unthrottled = TransportConfig {
            max_frame_bytes: 1 << 30,
            ..TransportConfig::default()
        };
        let address = cluster.address().to_string();
        let client = ClusterClient::connect_with(&address, cluster.token(), unthrottled)
            .await
            .unwrap();
        let node = cluster.node(1).unwrap();
        let before = rss_mib(node.pid());
        let connection = client
            .endpoint()
            .connect(node.address(), None)
            .await
            .unwrap();
        let mut frame = ((STALLED_FRAME + (1 << 20)) as u32).to_be_bytes().to_vec();
        frame.resize(4 + STALLED_FRAME, 7);
        let stalls = (0..STALLED_STREAMS)
            .map(|_| connection.send_raw_and_stall(&frame, Duration::from_secs(2)));
        let stalled: Vec<_> = futures::future::try_join_all(stalls).await.unwrap();
        let sent: usize = stalled.iter().map(|s| s.sent).sum();
        // What the sender took has left it, and the node acknowledged
        // packets after that (QUIC holds what it received in memory).
        wait_until("the node received what was sent", SENT_WITHIN, || async {
            (connection.stats().udp_tx.bytes >= sent as u64).then_some(())
        })
        .await
        .unwrap();
        let acks = connection.stats().frame_rx.acks;
        wait_until(
            "the node acknowledged later packets",
            SENT_WITHIN,
            || async { (connection.stats().frame_rx.acks > acks + 1).then_some(()) },
        )
        .await
        .unwrap();
        let grown = rss_mib(node.pid()).saturating_sub(before);
        assert!(
            grown < 250,
            "the node grew by {grown} MiB while {STALLED_STREAMS} streams stalled with {} MiB sent",
            sent >> 20
        );
        // It still answers, this connection's peer included.
        client.status().await.unwrap();
        drop(stalled);
    })
    .await
}
