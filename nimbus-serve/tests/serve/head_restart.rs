//! Serving across a head restart, in a cluster of its own (the head this
//! test kills must not be the one the other tests run on): this binary
//! started again as that cluster's driver.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use nimbus::cluster::NodeState;
use nimbus_serve::{HttpOptions, Serve, ServeStatus};

use crate::tests::{post, probe, registry};

/// Set: this process is [`head_restart_driver`].
pub const HEAD_RESTART_DRIVER: &str = "NIMBUS_SERVE_TEST_HEAD_RESTART_DRIVER";

/// Runs [`head_restart_driver`] in a process of its own; fails if it does.
pub async fn serving_rides_out_a_head_restart(_: &mut nimbus::Driver) {
    let out = tokio::process::Command::new(std::env::current_exe().unwrap())
        .env(HEAD_RESTART_DRIVER, "1")
        .env("NIMBUS_HEAD_GRACE_S", "20")
        .env_remove("NIMBUS_ADDRESS")
        .env_remove("NIMBUS_TOKEN")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let summary = stdout.lines().find(|l| l.starts_with("summary: "));
    println!(
        "{}",
        summary.unwrap_or_else(|| panic!("{stdout}\n{stderr}"))
    );
}

/// The replicas of every application.
fn replicas(status: &ServeStatus) -> BTreeSet<nimbus::cluster::ActorId> {
    status
        .applications
        .iter()
        .flat_map(|app| app.replicas.iter().map(|replica| replica.id))
        .collect()
}

/// An application's two replicas on a member with a `member` resource;
/// the head is killed: the member's ingress answers every request while
/// the head is down; the head is restarted: the controller (restarted
/// elsewhere if it ran on the head) answers with the same replicas, starts
/// a new ingress on the restarted head, and runs a new version, which
/// both ingresses serve.
pub fn head_restart_driver() {
    let mut driver = nimbus::init_with(registry(), nimbus::InitOptions::private(2))
        .expect("a private local cluster starts");
    actix::System::new().block_on(async {
        driver.connect().await.unwrap();
        let cluster = driver.local_cluster().expect("a local cluster");
        let member = cluster
            .add_node(&["--resources", r#"{"member": 4}"#])
            .unwrap();
        let member = cluster.node(member).unwrap().name().to_string();
        let client = cluster.client().await.unwrap();
        client
            .wait_for_status("the member", Duration::from_secs(30), |s| {
                s.alive().any(|n| n.id == member)
            })
            .await
            .unwrap();
        drop(client);
        let serve = Serve::start(HttpOptions::default().port(0)).await.unwrap();
        let app = |version: &str| {
            probe(version)
                .num_cpus(0.1)
                .num_replicas(2)
                .resource("member", 1.0)
        };
        serve.run(app("v1")).await.unwrap();
        let status = serve.status().await.unwrap();
        let before = replicas(&status);
        let ingress = status
            .ingresses
            .iter()
            .find(|ingress| ingress.node == member)
            .expect("the member's ingress")
            .address;
        let url = format!("http://{ingress}/probe");
        assert_eq!(post(url.clone(), "{}".into()).await.status, 200);
        let old_head = status
            .ingresses
            .iter()
            .find(|ingress| ingress.node == "head")
            .expect("the head's ingress")
            .address;

        cluster.kill(0).unwrap();
        let mut answered = 0;
        for _ in 0..20 {
            let answer = post(url.clone(), "{}".into()).await;
            assert_eq!(answer.status, 200, "with the head down: {answer:?}");
            answered += 1;
        }

        let restarted = Instant::now();
        cluster.restart(0).unwrap();
        let client = cluster.client().await.unwrap();
        client
            .wait_for_status("the members back", Duration::from_secs(30), |s| {
                ["node-1", member.as_str()].iter().all(|name| {
                    s.node(name)
                        .is_some_and(|n| n.state == NodeState::Alive && !n.rejoining)
                })
            })
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match serve.status().await {
                Ok(status) if replicas(&status) == before => break,
                Ok(status) => assert!(
                    Instant::now() < deadline,
                    "the controller does not list the same replicas: {status:?}"
                ),
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "the controller does not answer after the head's restart: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let controller_back = restarted.elapsed();
        // The head's ingress died with it: a new one is started there.
        let deadline = Instant::now() + Duration::from_secs(30);
        let on_head = loop {
            let status = serve.status().await.unwrap();
            let fresh = status
                .ingresses
                .iter()
                .find(|ingress| ingress.node == "head" && ingress.address != old_head);
            if let Some(ingress) = fresh {
                break ingress.address;
            }
            assert!(
                Instant::now() < deadline,
                "no new ingress on the restarted head: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let controller = client
            .actors()
            .await
            .unwrap()
            .into_iter()
            .find(|actor| {
                actor.type_name == <nimbus_serve::Controller as nimbus::actor::RemoteActor>::NAME
            })
            .expect("the controller's record");
        serve.run(app("v2")).await.unwrap();
        for url in [url, format!("http://{on_head}/probe")] {
            let answer = post(url, "{}".into()).await;
            assert_eq!(answer.reply().version, "v2", "{answer:?}");
        }
        serve.shutdown().await.unwrap();
        println!(
            "summary: answered_while_head_down={answered} controller_back_ms={} controller_on={} controller_restarts={}",
            controller_back.as_millis(),
            controller.node.name,
            controller.restarts
        );
    });
}
