//! Same-host channels (`src/transport/local.rs`): between two processes
//! of one host an ordered channel runs over the acceptor's Unix-domain
//! socket, admitted by the key its QUIC handshake gave; QUIC where that is
//! off or packet faults are injected; never past its connection; and a
//! caller without the key is dropped.

use std::io::{Read, Write};
use std::time::Duration;

use nimbus::cluster::{ControlReply, ControlRequest, MembershipRequest};
use nimbus::transport::{
    Connection, Credentials, Endpoint, PacketFaults, RequestOptions, TransportConfig,
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

fn status() -> Vec<u8> {
    rmp_serde::to_vec_named(&ControlRequest::Membership(MembershipRequest::Status)).unwrap()
}

/// Sends `count` status requests on one channel without waiting, then
/// checks every answer.
async fn pipelined_status(connection: &Connection, count: usize) {
    let channel = connection.open_channel().await.unwrap();
    let mut pending = Vec::new();
    for _ in 0..count {
        let sent = channel.send_request(status(), RequestOptions::control());
        pending.push(sent.await.unwrap());
    }
    for reply in pending {
        let reply: ControlReply = nimbus::wire::decode(&reply.wait().await.unwrap()).unwrap();
        assert!(matches!(reply, ControlReply::Status(_)), "{reply:?}");
    }
}

#[tokio::test]
async fn channels_on_one_host_use_the_unix_socket_unless_off_or_faulty() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(1);
        let local = connect(&cluster, TransportConfig::default()).await;
        let socket = local.local_socket().expect("a same-host route");
        assert!(socket.starts_with("nimbus-"), "{socket}");
        pipelined_status(&local, 50).await;
        assert!(local.local_socket().is_some(), "the socket was reachable");

        let off = TransportConfig {
            same_host_channels: false,
            ..TransportConfig::default()
        };
        let quic = connect(&cluster, off).await;
        assert_eq!(quic.local_socket(), None);
        pipelined_status(&quic, 50).await;

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

#[tokio::test]
async fn a_same_host_channel_ends_with_its_connection() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(1);
        let connection = connect(&cluster, TransportConfig::default()).await;
        assert!(connection.local_socket().is_some());
        let channel = connection.open_channel().await.unwrap();
        channel
            .request(status(), RequestOptions::control())
            .await
            .unwrap();
        connection.close("the test is done with it");
        let failed = channel.request(status(), RequestOptions::control()).await;
        assert!(failed.is_err(), "{failed:?}");
        assert!(!channel.is_open());
    })
    .await
}

#[tokio::test]
async fn a_caller_without_the_key_is_dropped_from_the_unix_socket() {
    within(Duration::from_secs(60), async {
        use std::os::linux::net::SocketAddrExt;
        let cluster = cluster(1);
        let connection = connect(&cluster, TransportConfig::default()).await;
        let socket = connection.local_socket().expect("a same-host route");
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(socket.as_bytes()).unwrap();
        let read = tokio::task::spawn_blocking(move || {
            let mut stream = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            stream.write_all(&[0u8; 32]).unwrap();
            // A request frame after the wrong key: never answered.
            stream.write_all(&status()).unwrap();
            let mut back = Vec::new();
            stream.read_to_end(&mut back).map(|_| back)
        });
        // Closed unanswered: at the end of what it sent, or reset over the
        // request it left unread.
        match read.await.unwrap() {
            Ok(back) => assert!(back.is_empty(), "answered: {back:?}"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
        }
        // The connection's own channels still work.
        pipelined_status(&connection, 3).await;
    })
    .await
}
