//! Same-host channels (`src/transport/local.rs`): between two processes
//! of one host ordered channels and plain requests run over the
//! acceptor's Unix-domain socket, admitted by the key its QUIC handshake gave; QUIC where that is
//! off or packet faults are injected; never past its connection; and a
//! caller without the key is dropped.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use nimbus::cluster::{ControlReply, ControlRequest, MembershipReply, MembershipRequest};
use nimbus::transport::faults::PACKET_FAULTS_ENV;
use nimbus::transport::{
    Channel, Connection, Credentials, Endpoint, PacketFaults, RequestError, RequestOptions,
    TransportConfig,
};
use nimbus::wire::{Incarnation, NodeIdentity, PeerIdentity, PeerRole};

use crate::support::{cluster, within};

/// A client endpoint with `config`, connected to `cluster`'s head.
async fn connect(cluster: &crate::support::Cluster, config: TransportConfig) -> Connection {
    let name = "same-host-test";
    let me = PeerIdentity {
        role: PeerRole::Client,
        identity: NodeIdentity {
            name: name.into(),
            incarnation: Incarnation::fresh(),
        },
    };
    let credentials = Credentials::issue(cluster.token(), name).unwrap();
    let endpoint = Endpoint::client(me, &credentials, config).unwrap();
    endpoint.connect(cluster.address(), None).await.unwrap()
}

/// An `Echo`, which every node answers (`Status` is the head's).
fn echo_request() -> Vec<u8> {
    rmp_serde::to_vec_named(&ControlRequest::Echo(nimbus::cluster::Echo(vec![7; 64]))).unwrap()
}

fn status_request() -> Vec<u8> {
    rmp_serde::to_vec_named(&ControlRequest::from(MembershipRequest::Status)).unwrap()
}

/// Sends `count` status requests on one channel without waiting, then
/// checks every answer.
async fn pipelined_status(connection: &Connection, count: usize) {
    let channel = connection.open_channel().await.unwrap();
    let mut pending = Vec::new();
    for _ in 0..count {
        let sent = channel.send_request(status_request(), RequestOptions::control());
        pending.push(sent.await.unwrap());
    }
    for reply in pending {
        let reply: ControlReply = nimbus::wire::decode(&reply.wait().await.unwrap()).unwrap();
        assert!(
            matches!(reply, ControlReply::Membership(MembershipReply::Status(_))),
            "{reply:?}"
        );
    }
}

/// `count` plain status requests, each answered.
async fn plain_status(connection: &Connection, count: usize) {
    for _ in 0..count {
        let request = MembershipRequest::Status;
        let reply = nimbus::client::call(connection, request, RequestOptions::control()).await;
        assert!(matches!(reply, Ok(MembershipReply::Status(_))), "{reply:?}");
    }
}

/// A connection to `cluster`'s node-1 over its same-host socket, and a
/// channel on it that has answered one echo.
async fn node_1_channel(cluster: &crate::support::Cluster) -> (Connection, Channel) {
    let client = cluster.client().await.unwrap();
    let status = client.status().await.unwrap();
    let node = status.node("node-1").unwrap();
    let connection = client.connect_node(node).await.unwrap();
    assert!(connection.local_socket().is_some());
    let channel = connection.open_channel().await.unwrap();
    channel
        .request(echo_request(), RequestOptions::control())
        .await
        .unwrap();
    (connection, channel)
}

/// QUIC STREAM frames `connection` sent so far.
fn quic_stream_frames(connection: &Connection) -> u64 {
    connection.stats().frame_tx.stream
}

#[tokio::test]
async fn channels_on_one_host_use_the_unix_socket_unless_off_or_faulty() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(1);
        let local = connect(&cluster, TransportConfig::default()).await;
        let socket = local.local_socket().expect("a same-host route");
        assert!(socket.starts_with("nimbus-"), "{socket}");
        let before = quic_stream_frames(&local);
        pipelined_status(&local, 50).await;
        plain_status(&local, 50).await;
        assert!(local.local_socket().is_some(), "the socket was reachable");
        assert_eq!(
            quic_stream_frames(&local),
            before,
            "100 requests, none of them on QUIC"
        );

        let off = TransportConfig {
            same_host_channels: false,
            ..TransportConfig::default()
        };
        let quic = connect(&cluster, off).await;
        assert_eq!(quic.local_socket(), None);
        let before = quic_stream_frames(&quic);
        pipelined_status(&quic, 50).await;
        plain_status(&quic, 50).await;
        assert!(
            quic_stream_frames(&quic) >= before + 50,
            "a stream per plain request at least"
        );

        let faulty = TransportConfig {
            packet_faults: Some(PacketFaults {
                seed: 7,
                ..PacketFaults::default()
            }),
            ..TransportConfig::default()
        };
        let faulty = connect(&cluster, faulty).await;
        assert_eq!(faulty.local_socket(), None, "packet faults need QUIC");
        pipelined_status(&faulty, 5).await;
    })
    .await
}

/// Queues `count` echoes of distinct payloads on `channel`, sends them
/// with one more request (`then_flush`: with a flush instead), and checks
/// that each is answered with its own payload.
async fn queued_echoes(channel: &Channel, count: u8, then_flush: bool) {
    let echo = |i: u8| {
        rmp_serde::to_vec_named(&ControlRequest::Echo(nimbus::cluster::Echo(vec![i; 64]))).unwrap()
    };
    let mut pending = Vec::new();
    for i in 0..count {
        let queued = channel.queue_request(echo(i), RequestOptions::control());
        pending.push((i, queued.await.unwrap()));
    }
    if then_flush {
        channel.flush(RequestOptions::control()).await.unwrap();
    } else {
        let sent = channel.send_request(echo(count), RequestOptions::control());
        pending.push((count, sent.await.unwrap()));
    }
    for (i, reply) in pending {
        let reply: ControlReply = nimbus::wire::decode(&reply.wait().await.unwrap()).unwrap();
        assert!(
            matches!(&reply, ControlReply::Echo(nimbus::cluster::Echo(payload)) if payload == &vec![i; 64]),
            "echo {i}: {reply:?}"
        );
    }
}

#[tokio::test]
async fn queued_requests_go_out_with_the_next_request_or_a_flush() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(1);
        let off = TransportConfig {
            same_host_channels: false,
            ..TransportConfig::default()
        };
        for config in [TransportConfig::default(), off] {
            let connection = connect(&cluster, config).await;
            let channel = connection.open_channel().await.unwrap();
            queued_echoes(&channel, 20, false).await;
            queued_echoes(&channel, 20, true).await;
            // More than one buffer's worth goes out without a flush.
            let big = |i: u8| {
                rmp_serde::to_vec_named(&ControlRequest::Echo(nimbus::cluster::Echo(vec![i; 40_000]))).unwrap()
            };
            let first = channel.queue_request(big(1), RequestOptions::control());
            let first = first.await.unwrap();
            let second = channel.queue_request(big(2), RequestOptions::control());
            let second = second.await.unwrap();
            for (i, reply) in [(1, first), (2, second)] {
                let reply: ControlReply =
                    nimbus::wire::decode(&reply.wait().await.unwrap()).unwrap();
                assert!(
                    matches!(&reply, ControlReply::Echo(nimbus::cluster::Echo(p)) if p == &vec![i; 40_000]),
                    "{reply:?}"
                );
            }
        }
    })
    .await
}

#[tokio::test]
async fn a_write_cut_off_by_its_deadline_breaks_the_channel() {
    within(Duration::from_secs(60), async {
        let mut cluster = cluster(2);
        let (connection, channel) = node_1_channel(&cluster).await;
        // A stopped peer reads nothing: once the channel's shared-memory
        // ring is full (64 MiB: 7 requests of 8 MiB), 8 MiB cannot all be
        // written to the socket, and the write is cut off partway at its
        // deadline.
        cluster.suspend(1).unwrap();
        let big = rmp_serde::to_vec_named(&ControlRequest::Echo(nimbus::cluster::Echo(vec![7; 8 << 20]))).unwrap();
        let short = RequestOptions::control().with_deadline(Duration::from_millis(300));
        let mut cut = Ok(());
        for _ in 0..10 {
            if let Err(e) = channel.send_request(big.clone(), short).await {
                cut = Err(e);
                break;
            }
        }
        cluster.resume(1).unwrap();
        assert!(
            matches!(cut, Err(RequestError::Timeout { .. })),
            "{:?}",
            cut.err()
        );
        // Nothing may follow a partial frame: the channel is broken, and a
        // request on it fails at once instead of confusing the peer.
        assert!(!channel.is_open());
        let after = channel
            .request(echo_request(), RequestOptions::control())
            .await;
        assert!(
            matches!(&after, Err(RequestError::Rejected { reason, .. }) if reason.contains("cancelled partway")),
            "{after:?}"
        );
        // The connection and a new channel still work.
        let fresh = connection.open_channel().await.unwrap();
        fresh
            .request(echo_request(), RequestOptions::control())
            .await
            .unwrap();
    })
    .await
}

#[tokio::test]
async fn a_node_with_packet_faults_offers_no_unix_socket() {
    within(Duration::from_secs(60), async {
        let mut cluster = cluster(1);
        let plan = serde_json::to_string(&PacketFaults::default()).unwrap();
        let index = cluster
            .add_node_with_env(&[], &[(PACKET_FAULTS_ENV, plan)])
            .unwrap();
        let client = cluster.client().await.unwrap();
        let name = cluster.node(index).unwrap().name().to_string();
        let status = client.status().await.unwrap();
        let faulty = status.node(&name).expect("the node joined");
        let connection = client.connect_node(faulty).await.unwrap();
        assert_eq!(connection.local_socket(), None, "packet faults need QUIC");
        let head = client
            .connect_node(status.node("head").unwrap())
            .await
            .unwrap();
        assert!(head.local_socket().is_some(), "the head offers its socket");
        let before = quic_stream_frames(&connection);
        connection
            .request(echo_request(), RequestOptions::control())
            .await
            .unwrap();
        assert!(quic_stream_frames(&connection) > before);
    })
    .await
}

#[tokio::test]
async fn a_same_host_channel_ends_with_its_connection() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(1);
        let connection = connect(&cluster, TransportConfig::default()).await;
        assert!(connection.local_socket().is_some());
        let channel = connection.open_channel().await.unwrap();
        channel
            .request(status_request(), RequestOptions::control())
            .await
            .unwrap();
        plain_status(&connection, 1).await;
        connection.close("the test is done with it");
        let failed = channel
            .request(status_request(), RequestOptions::control())
            .await;
        assert!(failed.is_err(), "{failed:?}");
        assert!(!channel.is_open());
        let request = MembershipRequest::Status;
        let failed = nimbus::client::call(&connection, request, RequestOptions::control()).await;
        assert!(failed.is_err(), "{failed:?}");
    })
    .await
}

#[tokio::test]
async fn a_killed_peer_fails_its_same_host_requests_at_once_with_node_lost() {
    within(Duration::from_secs(60), async {
        let mut cluster = cluster(2);
        let (connection, channel) = node_1_channel(&cluster).await;
        connection
            .request(echo_request(), RequestOptions::control())
            .await
            .unwrap();
        cluster.kill(1).unwrap();
        // The sockets end with the process; QUIC alone would wait out its
        // idle timeout.
        for failed in [
            channel
                .request(echo_request(), RequestOptions::control())
                .await,
            connection
                .request(echo_request(), RequestOptions::control())
                .await,
        ] {
            match failed {
                Err(RequestError::NodeLost { peer, reason }) => {
                    assert_eq!(peer.name, "node-1");
                    assert!(reason.contains("same-host socket"), "{reason}");
                }
                other => panic!("expected NodeLost, got {other:?}"),
            }
        }
        // Its socket's name is free for any process of the host to bind:
        // the connection's later channels use QUIC (#51, medium 8).
        assert_eq!(connection.local_socket(), None, "the route is dropped");
    })
    .await
}

#[tokio::test]
async fn a_caller_without_the_key_is_dropped_from_the_unix_socket() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(1);
        let connection = connect(&cluster, TransportConfig::default()).await;
        let socket = format!(
            "\0{}",
            connection.local_socket().expect("a same-host route")
        );
        let mut stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
        stream.write_all(&[0u8; 32]).await.unwrap();
        // Admitted, the node would answer one byte first.
        let mut back = Vec::new();
        match stream.read_to_end(&mut back).await {
            Ok(_) => assert!(back.is_empty(), "answered: {back:?}"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
        // The connection's own channels still work.
        pipelined_status(&connection, 3).await;
    })
    .await
}

/// #56: large requests and responses on a same-host channel travel
/// through its shared-memory rings (`src/transport/shm_ring.rs`) and
/// arrive whole and in order: one at a time, queued with small ones in
/// one region, and pipelined past what a ring holds (those fall back to
/// the socket); a channel of small requests never uses its ring.
#[tokio::test]
async fn large_frames_on_one_host_go_through_shared_memory_whole_and_in_order() {
    within(Duration::from_secs(120), async {
        let cluster = cluster(1);
        let connection = connect(&cluster, TransportConfig::default()).await;
        assert!(connection.local_socket().is_some());
        let channel = connection.open_channel().await.unwrap();
        let payload = |i: usize, len: usize| -> Vec<u8> {
            (0..len).map(|at| (at * 31 + i * 7) as u8).collect()
        };
        let echo = |bytes: Vec<u8>| {
            rmp_serde::to_vec_named(&ControlRequest::Echo(nimbus::cluster::Echo(bytes))).unwrap()
        };
        let check = |reply: Vec<u8>, expected: &[u8]| {
            let reply: ControlReply = nimbus::wire::decode(&reply).unwrap();
            match reply {
                ControlReply::Echo(nimbus::cluster::Echo(bytes)) => {
                    assert!(bytes == expected, "a payload came back changed")
                }
                other => panic!("{other:?}"),
            }
        };

        // Small requests: the socket only.
        pipelined_status(&connection, 5).await;
        for i in 0..3 {
            let small = payload(i, 100);
            let reply = channel
                .request(echo(small.clone()), RequestOptions::control())
                .await;
            check(reply.unwrap(), &small);
        }
        assert_eq!(
            channel.shared_regions().await,
            0,
            "small requests used the ring"
        );

        // One at a time, from 64 KiB to 12 MiB.
        for (i, len) in [64 << 10, 1 << 20, 12 << 20].into_iter().enumerate() {
            let large = payload(i, len);
            let reply = channel
                .request(echo(large.clone()), RequestOptions::control())
                .await;
            check(reply.unwrap(), &large);
        }
        assert_eq!(
            channel.shared_regions().await,
            3,
            "each large request in the ring"
        );

        // Small ones queued, then a large one: all in one region, in order.
        let mut pending = Vec::new();
        let mut sent = Vec::new();
        for i in 0..4 {
            let len = if i == 3 { 2 << 20 } else { 10 };
            let bytes = payload(100 + i, len);
            let queued = channel.queue_request(echo(bytes.clone()), RequestOptions::control());
            pending.push(queued.await.unwrap());
            sent.push(bytes);
        }
        channel.flush(RequestOptions::control()).await.unwrap();
        for (reply, bytes) in pending.into_iter().zip(&sent) {
            check(reply.wait().await.unwrap(), bytes);
        }
        assert_eq!(
            channel.shared_regions().await,
            4,
            "the batch went out as one region"
        );

        // Pipelined: 24 × 4 MiB is more than a ring holds while unanswered.
        let mut pending = Vec::new();
        let mut sent = Vec::new();
        for i in 0..24 {
            let bytes = payload(200 + i, 4 << 20);
            let request = channel.send_request(echo(bytes.clone()), RequestOptions::control());
            pending.push(request.await.unwrap());
            sent.push(bytes);
        }
        for (reply, bytes) in pending.into_iter().zip(&sent) {
            check(reply.wait().await.unwrap(), bytes);
        }
        let regions = channel.shared_regions().await;
        assert!(regions > 4, "pipelined requests used the ring: {regions}");
    })
    .await
}
