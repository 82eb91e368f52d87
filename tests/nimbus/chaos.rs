//! Seeded chaos plans against real node processes.

use std::time::Duration;

use nimbus::chaos::{self, ChaosPlan, FaultAction, TimelineEntry};
use nimbus::local::LocalCluster;
use nimbus::transport::PacketRule;

use crate::support::{cluster, within, HEARTBEAT_TIMEOUT};

const PLAN: &str = r#"
seed = 5

[[faults]]
at_ms = 200
action = { kill_node = { node = "random" } }

[[faults]]
at_ms = 300
action = { stop_node = { node = "node-1", for_ms = 500 } }

[[faults]]
at_ms = 3500
action = { restart_node = { node = "random" } }
"#;

fn recovered(entries: &[TimelineEntry], what: &str) -> bool {
    entries
        .iter()
        .any(|e| matches!(e, TimelineEntry::Recovered { what: w, .. } if w == what))
}

#[tokio::test]
async fn the_same_seed_injects_the_same_faults_and_recoveries_are_reported() {
    within(Duration::from_secs(120), async {
        let plan = ChaosPlan::from_toml(PLAN).unwrap();
        let mut timelines = Vec::new();
        for _ in 0..2 {
            let mut cluster = cluster(4);
            let timeline = chaos::run(&mut cluster, &plan).await.unwrap();
            println!("{timeline}");
            assert!(recovered(&timeline.entries, "declared dead"), "{timeline}");
            assert!(
                recovered(&timeline.entries, "resumed (SIGCONT)"),
                "{timeline}"
            );
            assert!(
                recovered(&timeline.entries, "rejoined as a new incarnation"),
                "{timeline}"
            );
            assert_eq!(timeline.missed(), Vec::<String>::new(), "{timeline}");
            // A 500 ms stall is shorter than the heartbeat timeout: node-1 stays a member.
            let status = cluster.client().await.unwrap().status().await.unwrap();
            assert_eq!(status.node("node-1").unwrap().death_reason, None);
            timelines.push(timeline);
        }
        assert_eq!(timelines[0].injected(), timelines[1].injected());
        assert_eq!(timelines[0].injected().len(), 3);
    })
    .await
}

/// Partitions between named nodes cut exactly those nodes' traffic: node-2
/// cut off from the head for longer than the heartbeat timeout is declared
/// dead, while node-1, cut off only from node-2, keeps its membership; the
/// link from node-3 to the head capped at 1 byte/s (everything queued past
/// 200 ms dropped) loses node-3 too. Every rule expires on its own.
#[tokio::test]
async fn partitions_between_named_nodes_cut_only_those_nodes() {
    within(Duration::from_secs(60), async {
        let for_ms = 3 * HEARTBEAT_TIMEOUT.as_millis() as u64;
        let partition = |nodes: &str, from: &str| FaultAction::Partition {
            nodes: vec![nodes.into()],
            from: vec![from.into()],
            for_ms,
        };
        let crawl = FaultAction::DegradeLinks {
            nodes: vec!["node-3".into()],
            from: vec!["head".into()],
            for_ms,
            faults: PacketRule {
                bandwidth_bytes_per_s: Some(1),
                ..PacketRule::default()
            },
        };
        let plan = ChaosPlan::new(4)
            .at(Duration::from_millis(100), partition("node-1", "node-2"))
            .at(Duration::from_millis(200), partition("node-2", "head"))
            .at(Duration::from_millis(300), crawl);
        let mut builder = LocalCluster::builder()
            .program(env!("CARGO_BIN_EXE_nimbus"))
            .nodes(4)
            .heartbeat_timeout(HEARTBEAT_TIMEOUT);
        for (key, value) in plan.node_env() {
            builder = builder.env(key, value);
        }
        let mut cluster = builder.start().unwrap();
        let timeline = chaos::run(&mut cluster, &plan).await.unwrap();
        println!("{timeline}");
        assert_eq!(
            timeline.injected(),
            [
                ("after=100ms", "partition(6000ms)", "node-1|node-2"),
                ("after=200ms", "partition(6000ms)", "node-2|head"),
                (
                    "after=300ms",
                    "degrade_links(bandwidth=1B/s,6000ms)",
                    "node-3|head"
                ),
            ]
        );
        let healed = timeline
            .entries
            .iter()
            .filter(
                |e| matches!(e, TimelineEntry::Recovered { what, .. } if what == "links healed"),
            )
            .count();
        assert_eq!(healed, 3, "{timeline}");
        assert_eq!(
            timeline.missed(),
            Vec::<String>::new(),
            "every process got its rule: {timeline}"
        );
        let status = cluster.client().await.unwrap().status().await.unwrap();
        assert_eq!(status.node("node-1").unwrap().death_reason, None);
        for cut in ["node-2", "node-3"] {
            assert!(
                status.node(cut).unwrap().death_reason.is_some(),
                "{cut} was cut off from the head: {status:?}"
            );
        }
    })
    .await
}
