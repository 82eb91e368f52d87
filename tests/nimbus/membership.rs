//! Joining, listing, failure detection and incarnations.

use std::time::{Duration, Instant};

use nimbus::client::{self, ClientError};
use nimbus::cluster::MembershipRequest;
use nimbus::cluster::{
    ClusterEventKind, ControlRequest, JobState, JobSubmission, NodeState, ResourceSet,
};
use nimbus::transport::{ConnectError, RequestError, RequestOptions, TransportConfig};
use nimbus::wire::{CloseCode, RemoteErrorKind};

use crate::support::{cluster, cluster_with_env, within, HEARTBEAT_TIMEOUT};

#[tokio::test]
async fn three_nodes_join_and_are_listed_with_their_resources() {
    within(Duration::from_secs(60), async {
        let mut cluster = cluster(2);
        let custom = r#"{"accelerator_type:H200": 1}"#;
        cluster
            .add_node(&["--num-cpus", "5", "--num-gpus", "0", "--resources", custom])
            .unwrap();
        let client = cluster.client().await.unwrap();
        let status = client.status().await.unwrap();
        let names: Vec<&str> = status.nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(names, ["head", "node-1", "node-2"]);
        assert!(status.nodes.iter().all(|n| n.state == NodeState::Alive));
        assert!(status.nodes[0].head && !status.nodes[1].head);
        let node2 = status.node("node-2").unwrap();
        assert_eq!(node2.resources.total.amount("CPU"), 5.0);
        assert_eq!(node2.resources.total.amount("accelerator_type:H200"), 1.0);
        assert_eq!(node2.address, cluster.node(2).unwrap().address());
        assert_eq!(node2.incarnation, cluster.node(2).unwrap().incarnation().0);
    })
    .await
}

#[tokio::test]
async fn sigkill_is_detected_within_the_timeout_and_pending_requests_fail_with_node_lost() {
    within(Duration::from_secs(60), async {
        let mut cluster = cluster(3);
        let client = cluster.client().await.unwrap();
        let status = client.status().await.unwrap();
        let victim = status.node("node-2").unwrap().clone();
        let connection = client.connect_node(&victim).await.unwrap();
        let echoed = client
            .echo(&connection, b"alive?".to_vec(), RequestOptions::control())
            .await
            .unwrap();
        assert_eq!(echoed, b"alive?");

        // Stall it first so the request below cannot be answered, then kill it.
        cluster.suspend(2).unwrap();
        let killed_at = Instant::now();
        let pending = async move {
            let request = ControlRequest::Echo(nimbus::cluster::Echo(vec![7; 64]));
            let options = RequestOptions::control().with_deadline(Duration::from_secs(60));
            let result = client::call(&connection, request, options).await;
            (result, killed_at.elapsed())
        };
        let detection = async {
            let status = client
                .wait_for_status("node-2 declared dead", 3 * HEARTBEAT_TIMEOUT, |s| {
                    s.node("node-2").is_some_and(|n| n.state == NodeState::Dead)
                })
                .await
                .unwrap();
            (status, killed_at.elapsed())
        };
        cluster.kill(2).unwrap();
        let ((result, lost_after), (status, detected_after)) = tokio::join!(pending, detection);

        let err = result.unwrap_err();
        assert!(
            matches!(err, ClientError::Request(RequestError::NodeLost { ref peer, .. }) if peer.name == "node-2"),
            "{err}"
        );
        println!("pending request failed after {lost_after:?}; death detected after {detected_after:?}");
        let idle_timeout = TransportConfig::default().idle_timeout;
        assert!(lost_after <= idle_timeout + Duration::from_secs(1));
        assert!(detected_after <= HEARTBEAT_TIMEOUT + Duration::from_secs(1));
        assert!(status.node("node-2").unwrap().death_reason.as_deref().unwrap().contains("no heartbeat"));
        assert_eq!(status.alive().count(), 2);
    })
    .await
}

#[tokio::test]
async fn a_restarted_node_is_a_new_incarnation_and_its_old_one_is_refused() {
    within(Duration::from_secs(60), async {
        let mut cluster = cluster(2);
        let client = cluster.client().await.unwrap();
        let old = client.status().await.unwrap().node("node-1").unwrap().clone();

        cluster.restart(1).unwrap();
        let status = client
            .wait_for_status("node-1 rejoined", Duration::from_secs(20), |s| {
                s.node("node-1").is_some_and(|n| n.incarnation != old.incarnation && n.state == NodeState::Alive)
            })
            .await
            .unwrap();
        let new = status.node("node-1").unwrap();
        assert!(new.incarnation > old.incarnation);
        assert_eq!(new.address, old.address, "same name, same recycled address");
        // The new incarnation was admitted once the old one was declared
        // dead (its name was not for the taking while it counted as alive).
        let events = client.events(0, Duration::ZERO).await.unwrap();
        let died = events.iter().position(|e| matches!(&e.kind,
            ClusterEventKind::NodeDead { node, reason } if *node == old.identity() && reason.contains("no heartbeat")));
        let joined = events.iter().position(|e| matches!(&e.kind,
            ClusterEventKind::NodeJoined { node, .. } if node.name == "node-1" && node.incarnation != old.identity().incarnation));
        assert!(died.is_some() && died < joined, "{events:?}");

        // A session meant for the old incarnation is refused...
        match client.connect_node(&old).await {
            Err(ClientError::Connect(ConnectError::Refused { code, reason, .. })) => {
                assert_eq!(code, Some(CloseCode::StaleIncarnation));
                assert!(reason.contains(&old.incarnation.to_string()), "{reason}");
            }
            Err(other) => panic!("expected a stale-incarnation refusal, got {other}"),
            Ok(_) => panic!("the old incarnation was accepted"),
        }
        // ...and so is a heartbeat in its name: from anyone but that node
        // it is forbidden (`tests/nimbus/identity.rs`); the old node itself
        // would be told `StaleIncarnation` (`head/membership/state.rs`).
        let heartbeat = MembershipRequest::Heartbeat {
            node: old.identity(),
            used: ResourceSet::default(),
            host: None,
            renew: None,
        };
        let err = client.call(heartbeat).await.unwrap_err();
        let ClientError::Request(err) = err else { panic!("{err}") };
        assert_eq!(err.remote().unwrap().kind, RemoteErrorKind::Forbidden);
        // The new incarnation serves.
        let connection = client.connect_node(new).await.unwrap();
        client.echo(&connection, vec![1], RequestOptions::control()).await.unwrap();
    })
    .await
}

#[tokio::test]
async fn a_stalled_node_that_comes_back_after_being_declared_dead_exits() {
    within(Duration::from_secs(60), async {
        let mut cluster = cluster(2);
        let client = cluster.client().await.unwrap();
        cluster.suspend(1).unwrap();
        client
            .wait_for_status("node-1 declared dead", 3 * HEARTBEAT_TIMEOUT, |s| {
                s.node("node-1").is_some_and(|n| n.state == NodeState::Dead)
            })
            .await
            .unwrap();
        cluster.resume(1).unwrap();
        let status = cluster.wait_exit(1, Duration::from_secs(20)).unwrap();
        let status = status.expect("the expelled node exits");
        assert!(!status.success());
        assert!(
            cluster
                .log(1)
                .contains("no longer counts this node as a member"),
            "{}",
            cluster.log(1)
        );
    })
    .await
}

#[tokio::test]
async fn bulk_traffic_does_not_starve_heartbeats() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(2);
        let client = cluster.client().await.unwrap();
        let seen = client.last_event_seq().await.unwrap();
        let head = client.head().await.unwrap();
        let flood_until = Instant::now() + 2 * HEARTBEAT_TIMEOUT;
        let mut workers = Vec::new();
        for _ in 0..8 {
            let head = head.clone();
            workers.push(tokio::spawn(async move {
                let mut sent = 0u64;
                while Instant::now() < flood_until {
                    let request =
                        ControlRequest::Echo(nimbus::cluster::Echo(vec![0xab; 256 << 10]));
                    client::call(&head, request, RequestOptions::bulk())
                        .await
                        .unwrap();
                    sent += 1;
                }
                sent
            }));
        }
        let mut sent = 0;
        for worker in workers {
            sent += worker.await.unwrap();
        }
        println!("flooded the head with {sent} x 256 KiB echoes");
        // A flood, not a trickle: at least 50 MiB each way in the window
        // (loopback moves that in well under a second here).
        assert!(sent >= 200, "only {sent} echoes of 256 KiB: no flood");
        let events = client.events(seen, Duration::ZERO).await.unwrap();
        assert!(
            events.is_empty(),
            "membership changed under load: {events:?}"
        );
        let status = client.status().await.unwrap();
        assert_eq!(status.alive().count(), 2);
    })
    .await
}

/// The head survives its own restart (its store, `head/store.rs`):
/// SIGKILLed and started again with the same `NIMBUS_HOME` and port, it is
/// the same cluster (the same token), a member that rode the outage out
/// is back as the same incarnation (it never restarted), and a member that
/// died meanwhile is declared dead once the grace is over, saying why.
#[tokio::test]
async fn a_restarted_head_takes_its_members_back_and_declares_the_missing_dead() {
    within(Duration::from_secs(120), async {
        let grace = Duration::from_secs(12);
        let seconds = grace.as_secs().to_string();
        let mut cluster = cluster_with_env(3, &[("NIMBUS_HEAD_GRACE_S", &seconds)]);
        let token = cluster.token().clone();
        let before = cluster.client().await.unwrap().status().await.unwrap();
        let member = before.node("node-1").unwrap().clone();
        // A rotation of the ticket key under way is kept in the store.
        let rotation = cluster
            .client()
            .await
            .unwrap()
            .rotate_ticket_key()
            .await
            .unwrap();

        cluster.kill(0).unwrap();
        cluster.kill(2).unwrap();
        let restarted_at = Instant::now();
        cluster.restart(0).unwrap();
        assert!(
            *cluster.token() == token,
            "the restarted head has another token"
        );

        let client = cluster.client().await.unwrap();
        let back = client
            .wait_for_status("node-1 back after the head's restart", grace, |s| {
                s.node("node-1").is_some_and(|n| !n.rejoining)
            })
            .await
            .unwrap();
        let back_after = restarted_at.elapsed();
        let node1 = back.node("node-1").unwrap();
        assert_eq!(node1.state, NodeState::Alive);
        assert_eq!(node1.incarnation, member.incarnation, "node-1 restarted");
        assert_eq!(node1.resources.total, member.resources.total);
        let node2 = back.node("node-2").unwrap();
        assert!(
            node2.state == NodeState::Alive && node2.rejoining,
            "node-2 must wait for the grace: {node2:?}"
        );
        assert_ne!(
            back.nodes[0].incarnation, before.nodes[0].incarnation,
            "the head is a new incarnation"
        );

        let again = client.rotate_ticket_key().await.unwrap_err().to_string();
        let done_at = rotation.1.to_string();
        assert!(
            again.contains("a rotation of the ticket key is under way") && again.contains(&done_at),
            "the restarted head forgot the rotation {rotation:?}: {again}"
        );

        let dead = client
            .wait_for_status("node-2 declared dead after the grace", 2 * grace, |s| {
                s.node("node-2").is_some_and(|n| n.state == NodeState::Dead)
            })
            .await
            .unwrap();
        let reason = dead.node("node-2").unwrap().death_reason.clone().unwrap();
        assert!(reason.contains("did not come back within"), "{reason}");
        assert!(dead.node("node-1").unwrap().state == NodeState::Alive);
        println!(
            "node-1 back {back_after:?} after the head's restart; node-2 declared dead after {:?}",
            restarted_at.elapsed()
        );
    })
    .await
}

/// A head whose store does not read refuses to start (it never starts
/// empty over a cluster that may still run), naming the file and the
/// choices.
#[test]
fn a_head_with_a_damaged_store_refuses_to_start() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("head.redb"), vec![0x5a; 64 * 1024]).unwrap();
    let port = crate::cli::free_port().to_string();
    let args = [
        "start",
        "--head",
        "--block",
        "--port",
        &port,
        "--no-dashboard",
    ];
    crate::cli::fails_with(home.path(), &args, "head.redb");
    crate::cli::fails_with(home.path(), &args, "move it aside to start a new cluster");
}

/// A head started again with another `NIMBUS_HOME` is another cluster
/// (another token): its old members do not wait out the grace for it, they
/// stop at once, saying so.
#[tokio::test]
async fn a_member_of_a_head_started_as_another_cluster_stops_saying_so() {
    within(Duration::from_secs(90), async {
        let mut cluster = cluster(2);
        let port = cluster.address().port().to_string();
        cluster.kill(0).unwrap();
        let other_home = tempfile::tempdir().unwrap();
        let mut other = std::process::Command::new(env!("CARGO_BIN_EXE_nimbus"))
            .args([
                "start",
                "--head",
                "--block",
                "--no-dashboard",
                "--port",
                &port,
            ])
            .args(["--node-ip-address", "127.0.0.1"])
            .env("NIMBUS_HOME", other_home.path())
            .env_remove("NIMBUS_TOKEN")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let exited = cluster.wait_exit(1, Duration::from_secs(30)).unwrap();
        let _ = other.kill();
        let _ = other.wait();
        let status = exited.expect("node-1 stops within 30 s, long before its 60 s grace");
        assert!(!status.success(), "{status}");
        let log = cluster.log(1);
        assert!(log.contains("is another cluster now"), "{log}");
    })
    .await
}

/// Jobs survive the head's restart (`head/jobs.rs`): a job whose driver
/// runs on a member is still `RUNNING` after it, with the same record, and
/// ends as its driver does; a job whose driver ran on the head (it died
/// with it) ends `FAILED` at the restart, saying why.
#[tokio::test]
async fn jobs_outlive_a_head_restart_and_end_as_their_drivers_do() {
    within(Duration::from_secs(120), async {
        let mut cluster = cluster_with_env(2, &[("NIMBUS_HEAD_GRACE_S", "30")]);
        let dir = tempfile::tempdir().unwrap();
        let release = dir.path().join("release");
        let waits = format!(
            "while [ ! -e '{}' ]; do sleep 0.05; done",
            release.display()
        );
        let submission = |node: Option<&str>| JobSubmission {
            name: None,
            entrypoint: vec!["/bin/sh".into(), "-c".into(), waits.clone()],
            env: Vec::new(),
            working_dir: None,
            node: node.map(str::to_string),
        };
        let client = cluster.client().await.unwrap();
        let on_member = client
            .submit_job(submission(Some("node-1")), None)
            .await
            .unwrap();
        let on_head = client.submit_job(submission(None), None).await.unwrap();
        assert_eq!(on_member.state, JobState::Running);
        assert_eq!(on_head.state, JobState::Running);

        cluster.kill(0).unwrap();
        cluster.restart(0).unwrap();
        let client = cluster.client().await.unwrap();
        let seen = client.last_event_seq().await.unwrap();
        let kept = client.job(&on_member.id).await.unwrap();
        assert_eq!(kept, on_member, "the member's job as it was");
        let lost = client.job(&on_head.id).await.unwrap();
        assert_eq!(lost.state, JobState::Failed, "{lost:?}");
        assert!(lost.message.contains("was lost"), "{}", lost.message);

        std::fs::write(&release, b"").unwrap();
        wait_for_event(
            &client,
            seen,
            Duration::from_secs(30),
            |kind| matches!(kind, ClusterEventKind::JobEnded { job, .. } if *job == on_member.id),
        )
        .await;
        let ended = client.job(&on_member.id).await.unwrap();
        assert_eq!(ended.state, JobState::Succeeded, "{ended:?}");
        assert_eq!(ended.start_ms, on_member.start_ms);
    })
    .await
}

/// Waits up to `deadline` for an event after `seen` that `wanted` takes.
async fn wait_for_event(
    client: &nimbus::client::ClusterClient,
    mut seen: u64,
    deadline: Duration,
    wanted: impl Fn(&ClusterEventKind) -> bool,
) {
    let end = Instant::now() + deadline;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no such event within {deadline:?}");
        let events = client.events(seen, left).await.unwrap();
        if events.iter().any(|e| wanted(&e.kind)) {
            return;
        }
        seen = events.last().map_or(seen, |e| e.seq);
    }
}
