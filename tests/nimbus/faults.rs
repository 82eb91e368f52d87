//! Packet faults injected in the QUIC socket layer: QUIC's loss recovery
//! carries requests through a lossy network, and a partition is detected
//! and ends in a new incarnation.

use std::sync::atomic::Ordering;
use std::time::Duration;

use nimbus::client::ClusterClient;
use nimbus::cluster::{ClusterEventKind, NodeState, ProcessClass};
use nimbus::transport::faults::PACKET_FAULTS_ENV;
use nimbus::transport::{PacketFaults, PacketRule, RequestOptions, TransportConfig};

use crate::support::{cluster, within, HEARTBEAT_TIMEOUT};

fn lossy(seed: u64) -> PacketFaults {
    PacketFaults {
        seed,
        workers: false,
        rules: vec![PacketRule {
            drop: 0.1,
            duplicate: 0.05,
            reorder: 0.05,
            delay: 0.05,
            delay_ms: 5,
            ..PacketRule::default()
        }],
    }
}

#[tokio::test]
async fn requests_and_membership_survive_a_lossy_network() {
    within(Duration::from_secs(90), async {
        let mut cluster = cluster(2);
        let plan = serde_json::to_string(&lossy(11)).unwrap();
        cluster
            .add_node_with_env(&[], &[(PACKET_FAULTS_ENV, plan)])
            .unwrap();
        let config = TransportConfig {
            packet_faults: Some(lossy(42)),
            ..TransportConfig::default()
        };
        let client =
            ClusterClient::connect_with(&cluster.address().to_string(), cluster.token(), config)
                .await
                .unwrap();
        let seen = client.last_event_seq().await.unwrap();
        let status = client.status().await.unwrap();
        assert_eq!(status.alive().count(), 3);
        for target in ["node-1", "node-2"] {
            let node = client
                .connect_node(status.node(target).unwrap())
                .await
                .unwrap();
            for size in [1 << 10, 64 << 10] {
                for i in 0..50u8 {
                    let payload = vec![i; size];
                    let echoed = client
                        .echo(&node, payload.clone(), RequestOptions::control())
                        .await
                        .unwrap();
                    assert_eq!(echoed, payload);
                }
            }
        }
        let faults = client.endpoint().fault_counters().unwrap();
        println!("client socket: {faults}");
        for counter in [
            &faults.dropped,
            &faults.duplicated,
            &faults.reordered,
            &faults.delayed,
        ] {
            assert!(counter.load(Ordering::Relaxed) > 0, "{faults}");
        }
        // The lossy node kept its membership all along; what it published
        // is its own count of the faults its socket injected.
        let events = client.events(seen, Duration::ZERO).await.unwrap();
        let (reports, changes): (Vec<_>, Vec<_>) = events
            .iter()
            .partition(|e| matches!(e.kind, ClusterEventKind::PacketFaults { .. }));
        assert!(changes.is_empty(), "membership changed: {changes:?}");
        assert!(
            reports.iter().any(|e| matches!(&e.kind,
                ClusterEventKind::PacketFaults { class: ProcessClass::Node, counts, .. }
                    if counts.faulted() > 0)),
            "the lossy node reported its faults: {reports:?}"
        );
        assert_eq!(client.status().await.unwrap().alive().count(), 3);
    })
    .await
}

#[tokio::test]
async fn a_partitioned_node_is_declared_dead_and_exits_when_the_partition_heals() {
    within(Duration::from_secs(90), async {
        let mut cluster = cluster(1);
        let cut_from = 1_000;
        let cut_until = cut_from + 3 * HEARTBEAT_TIMEOUT.as_millis() as u64;
        let plan = PacketFaults {
            seed: 3,
            workers: false,
            rules: vec![PacketRule {
                peers: vec![cluster.address()],
                from_ms: cut_from,
                until_ms: Some(cut_until),
                partition: true,
                ..PacketRule::default()
            }],
        };
        let plan = serde_json::to_string(&plan).unwrap();
        let node = cluster
            .add_node_with_env(&[], &[(PACKET_FAULTS_ENV, plan)])
            .unwrap();
        let client = cluster.client().await.unwrap();
        client
            .wait_for_status(
                "the partitioned node declared dead",
                4 * HEARTBEAT_TIMEOUT,
                |s| s.node("node-1").is_some_and(|n| n.state == NodeState::Dead),
            )
            .await
            .unwrap();
        let status = cluster.wait_exit(node, Duration::from_secs(30)).unwrap();
        let status = status.expect("the node exits once it hears it was declared dead");
        assert!(!status.success());
        let log = cluster.log(node);
        assert!(
            log.contains("no longer counts this node as a member"),
            "{log}"
        );
        assert!(log.contains("PACKET FAULT INJECTION IS ON"), "{log}");
    })
    .await
}

#[tokio::test]
async fn a_bandwidth_cap_slows_a_link_and_requests_still_complete() {
    within(Duration::from_secs(90), async {
        let cluster = cluster(2);
        // 512 KB/s from this client to everyone.
        let capped = PacketFaults {
            seed: 1,
            workers: false,
            rules: vec![PacketRule {
                bandwidth_bytes_per_s: Some(512 << 10),
                ..PacketRule::default()
            }],
        };
        let config = TransportConfig {
            packet_faults: Some(capped),
            ..TransportConfig::default()
        };
        let client =
            ClusterClient::connect_with(&cluster.address().to_string(), cluster.token(), config)
                .await
                .unwrap();
        let status = client.status().await.unwrap();
        let node = client
            .connect_node(status.node("node-1").unwrap())
            .await
            .unwrap();
        let started = std::time::Instant::now();
        for i in 0..4u8 {
            let payload = vec![i; 256 << 10];
            let echoed = client
                .echo(&node, payload.clone(), RequestOptions::bulk())
                .await
                .unwrap();
            assert_eq!(echoed, payload);
        }
        // 1 MiB sent through a 512 KiB/s link takes at least 2 s (a lower
        // bound: a busy machine only makes it slower).
        let took = started.elapsed();
        println!("1 MiB through 512 KiB/s: {took:?}");
        assert!(took >= Duration::from_millis(1900), "{took:?}");
        let faults = client.endpoint().fault_counters().unwrap();
        assert!(faults.delayed.load(Ordering::Relaxed) > 0, "{faults}");
    })
    .await
}
