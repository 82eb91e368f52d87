//! Seeded chaos plans against real node processes.

use std::time::Duration;

use nimbus::chaos::{self, ChaosPlan, TimelineEntry};

use crate::support::{cluster, within};

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
            assert!(
                !timeline
                    .entries
                    .iter()
                    .any(|e| matches!(e, TimelineEntry::NotRecovered { .. })),
                "{timeline}"
            );
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
