//! Request semantics: deadlines and fire-and-forget.

use std::time::{Duration, Instant};

use nimbus::client::ClientError;
use nimbus::cluster::{ClusterEventKind, ControlRequest, FaultRequest};
use nimbus::transport::{RequestError, RequestOptions};

use crate::support::{cluster, within};

#[tokio::test]
async fn a_request_to_a_stalled_node_times_out_at_its_deadline() {
    within(Duration::from_secs(60), async {
        let mut cluster = cluster(2);
        let client = cluster.client().await.unwrap();
        let node = client.status().await.unwrap().node("node-1").unwrap().clone();
        let connection = client.connect_node(&node).await.unwrap();
        cluster.suspend(1).unwrap();
        let deadline = Duration::from_millis(300);
        let sent = Instant::now();
        let err = client
            .echo(&connection, vec![1; 8], RequestOptions::control().with_deadline(deadline))
            .await
            .unwrap_err();
        let waited = sent.elapsed();
        cluster.resume(1).unwrap();
        assert!(
            matches!(err, ClientError::Request(RequestError::Timeout { after, .. }) if after == deadline),
            "{err}"
        );
        assert!(waited >= deadline && waited < deadline * 10, "{waited:?}");
        // The node answers again once it runs.
        client.echo(&connection, vec![2], RequestOptions::control()).await.unwrap();
    })
    .await
}

#[tokio::test]
async fn a_one_way_message_is_delivered_without_a_reply() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(2);
        let client = cluster.client().await.unwrap();
        let seen = client.last_event_seq().await.unwrap();
        let recovered = ClusterEventKind::Recovered {
            what: "a one-way report".into(),
            target: "requests test".into(),
            took_ms: 7,
        };
        let report = rmp_serde::to_vec_named(&ControlRequest::from(FaultRequest::ReportRecovery {
            what: "a one-way report".into(),
            target: "requests test".into(),
            took_ms: 7,
        }))
        .unwrap();
        client
            .head()
            .await
            .unwrap()
            .notify(report, RequestOptions::control())
            .await
            .unwrap();
        let events = client.events(seen, Duration::from_secs(10)).await.unwrap();
        assert!(events.iter().any(|e| e.kind == recovered), "{events:?}");
    })
    .await
}

#[tokio::test]
async fn the_last_event_number_is_the_latest_with_more_than_a_page_kept() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(1);
        let client = cluster.client().await.unwrap();
        let head = client.head().await.unwrap();
        // More events than one answer holds (512): the first page of the
        // history is not the latest.
        let reports = 600;
        for i in 0..reports {
            let report = FaultRequest::ReportRecovery {
                what: "a numbered report".into(),
                target: format!("report {i}"),
                took_ms: 1,
            };
            let reply = nimbus::client::call(&head, report, RequestOptions::control()).await;
            assert!(
                matches!(reply, Ok(nimbus::cluster::FaultReply::Ack)),
                "{reply:?}"
            );
        }
        let last = client.last_event_seq().await.unwrap();
        let latest = client.events(last - 1, Duration::ZERO).await.unwrap();
        let seqs: Vec<u64> = latest.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [last], "the events after the one before the last");
        assert!(
            matches!(&latest[0].kind, ClusterEventKind::Recovered { target, .. }
                if *target == format!("report {}", reports - 1)),
            "{latest:?}"
        );
        assert!(client
            .events(last, Duration::ZERO)
            .await
            .unwrap()
            .is_empty());
    })
    .await
}

#[tokio::test]
async fn dropping_a_local_cluster_leaves_no_process_behind() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(3);
        let pids: Vec<u32> = cluster.nodes().iter().map(|n| n.pid()).collect();
        drop(cluster);
        for pid in pids {
            assert!(
                !std::path::Path::new(&format!("/proc/{pid}")).exists(),
                "node process {pid} outlived its cluster"
            );
        }
    })
    .await
}
