//! Identities bound to certificates: a token holder cannot speak for a
//! node, and a node's ticket holds only with the certificate it names
//! (`src/transport/tickets.rs`, `src/node/authorize.rs`). A worker's side
//! is in `tests/actors` (`actor_code_cannot_speak_for_the_head_or_another_actor`).

use std::time::Duration;

use nimbus::client;
use nimbus::cluster::{
    MembershipReply, MembershipRequest, NodeRegistration, NodeState, ResourceSet,
};
use nimbus::transport::{ConnectError, Credentials, Endpoint, RequestOptions, TransportConfig};
use nimbus::wire::{CloseCode, Incarnation, NodeIdentity, PeerIdentity, PeerRole};

use crate::support::{cluster, within};

fn identity(name: &str, incarnation: u64) -> NodeIdentity {
    NodeIdentity {
        name: name.into(),
        incarnation: Incarnation(incarnation),
    }
}

/// Before tickets, any token holder's `Leave` in a member's (or the head's)
/// name was taken, and its heartbeats kept a dead member listed alive.
#[tokio::test]
async fn a_token_holder_cannot_evict_a_member_or_heartbeat_for_it() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(2);
        let client = cluster.client().await.unwrap();
        let before = client.status().await.unwrap();
        assert_eq!(before.alive().count(), 2);
        for node in &before.nodes {
            let node = identity(&node.id, node.incarnation);
            let leave = MembershipRequest::Leave { node: node.clone() };
            let beat = MembershipRequest::Heartbeat {
                node: node.clone(),
                used: ResourceSet::default(),
                host: None,
                renew: None,
            };
            for (request, name) in [(leave, "Leave"), (beat, "Heartbeat")] {
                let refused = client.call(request).await.unwrap_err();
                assert!(
                    refused
                        .to_string()
                        .contains(&format!("may not send {name}")),
                    "{name} for {node}: {refused}"
                );
            }
        }
        let after = client.status().await.unwrap();
        let states: Vec<_> = after
            .nodes
            .iter()
            .map(|n| (&n.id, n.incarnation, n.state))
            .collect();
        let expected: Vec<_> = before
            .nodes
            .iter()
            .map(|n| (&n.id, n.incarnation, NodeState::Alive))
            .collect();
        assert_eq!(states, expected, "every member is still there, alive");
    })
    .await
}

/// A node joins as a token holder and gets a ticket for the certificate it
/// joined with: with it, the node heartbeats and leaves as itself; the same
/// ticket presented with another certificate is refused at the handshake.
#[tokio::test]
async fn a_nodes_ticket_holds_only_with_the_certificate_it_names() {
    within(Duration::from_secs(60), async {
        let cluster = cluster(1);
        let head = cluster.address();
        let token = cluster.token().clone();
        let me = identity("outsider", Incarnation::fresh().0);
        let peer = PeerIdentity {
            role: PeerRole::Node,
            identity: me.clone(),
        };
        let config = TransportConfig::default();
        let credentials = Credentials::issue(&token, "outsider").unwrap();
        let node = Endpoint::client(peer.clone(), &credentials, config.clone()).unwrap();
        let join = MembershipRequest::Join {
            registration: NodeRegistration {
                node: me.clone(),
                address: node.local_addr(),
                resources: ResourceSet::default(),
                versions: nimbus::cluster::Versions::here(),
            },
            signs_workers: Vec::new(),
        };
        let connection = node.connect(head, None).await.unwrap();
        let joined = client::call(&connection, join, RequestOptions::control()).await;
        let Ok(MembershipReply::Joined {
            ticket, head_keys, ..
        }) = joined
        else {
            panic!("join: {joined:?}");
        };
        // As a token holder it may not heartbeat yet, even as itself.
        let beat = MembershipRequest::Heartbeat {
            node: me.clone(),
            used: ResourceSet::default(),
            host: None,
            renew: None,
        };
        let uncertified = client::call(&connection, beat.clone(), RequestOptions::control())
            .await
            .expect_err("an uncertified node's heartbeat is refused")
            .to_string();
        assert!(
            uncertified.contains("may not send Heartbeat: a node heartbeats only as itself"),
            "{uncertified}"
        );
        node.certify(ticket.clone(), head_keys.clone());
        let connection = node.connect(head, None).await.unwrap();
        client::call(&connection, beat, RequestOptions::control())
            .await
            .expect("a certified node heartbeats as itself");

        let copier = Endpoint::client(
            peer,
            &Credentials::issue(&token, "outsider").unwrap(),
            config,
        )
        .unwrap();
        copier.certify(ticket, head_keys);
        let Err(refused) = copier.connect(head, None).await else {
            panic!("a copied ticket was taken");
        };
        assert!(
            matches!(
                &refused,
                ConnectError::Refused {
                    code: Some(CloseCode::Unauthenticated),
                    ..
                }
            ),
            "{refused}"
        );
        assert!(
            refused.to_string().contains("another certificate"),
            "{refused}"
        );

        let leave = MembershipRequest::Leave { node: me };
        client::call(&connection, leave, RequestOptions::control())
            .await
            .expect("a certified node leaves as itself");
    })
    .await
}

/// Answers every request with its body.
struct Echo;

impl nimbus::transport::RequestHandler for Echo {
    fn handle(
        &self,
        _: nimbus::transport::Caller,
        body: Vec<u8>,
    ) -> futures::future::BoxFuture<'static, Result<Vec<u8>, nimbus::transport::HandlerError>> {
        Box::pin(async move { Ok(body) })
    }
}

/// A head and node-1 that certify workers, as a cluster does
/// (`src/transport/tickets.rs`, steps 2 and 3).
struct Certifier {
    token: nimbus::transport::JoinToken,
    head: nimbus::transport::TicketAuthority,
    node: NodeIdentity,
    node_credentials: Credentials,
    node_ticket: nimbus::wire::Ticket,
    signer: nimbus::transport::WorkerSigner,
}

impl Certifier {
    /// The head's public ticket keys, as a node hands them to its workers.
    fn head_keys(&self) -> nimbus::wire::HeadKeys {
        self.head.public_keys(nimbus::transport::unix_now()).into()
    }

    fn new() -> Self {
        let token = nimbus::transport::JoinToken::generate();
        let head = nimbus::transport::TicketAuthority::generate().unwrap();
        let node = identity("node-1", Incarnation::fresh().0);
        let mut signer = nimbus::transport::WorkerSigner::generate(&node).unwrap();
        let node_credentials = Credentials::issue(&token, "node-1").unwrap();
        let node_ticket = head.certify_node(
            &node,
            node_credentials.certificate_hash(),
            &signer.public_key(),
            nimbus::transport::unix_now(),
        );
        signer.set_ticket(node_ticket.clone());
        Certifier {
            token,
            head,
            node,
            node_credentials,
            node_ticket,
            signer,
        }
    }

    /// A worker server announcing itself as `name`, with the credentials
    /// and ticket of worker `certified`, as a node starts one.
    fn worker(&self, name: &NodeIdentity, certified: &NodeIdentity) -> Endpoint {
        let credentials = Credentials::for_worker(&self.token, &certified.name).unwrap();
        let socket = Endpoint::bind_socket(([127, 0, 0, 1], 0).into()).unwrap();
        let me = PeerIdentity {
            role: PeerRole::Worker,
            identity: name.clone(),
        };
        let server =
            Endpoint::listen(socket, me, &credentials, TransportConfig::default()).unwrap();
        let scope = nimbus::transport::WorkerScope {
            job: "job-1".into(),
            binary: "0".repeat(64),
        };
        let ticket = self
            .signer
            .certify_worker(
                certified,
                credentials.certificate_hash(),
                scope,
                nimbus::transport::unix_now(),
            )
            .unwrap();
        server.certify(ticket, self.head_keys());
        server.serve(std::sync::Arc::new(Echo));
        server
    }

    /// A driver of the cluster: a token holder without a ticket.
    fn driver(&self) -> Endpoint {
        let client = PeerIdentity {
            role: PeerRole::Client,
            identity: identity("driver-1", Incarnation::fresh().0),
        };
        let credentials = Credentials::issue(&self.token, "driver-1").unwrap();
        Endpoint::client(client, &credentials, TransportConfig::default()).unwrap()
    }

    /// Node-1, certified by the head, as a dialer.
    fn node(&self) -> Endpoint {
        let me = PeerIdentity {
            role: PeerRole::Node,
            identity: self.node.clone(),
        };
        let endpoint =
            Endpoint::client(me, &self.node_credentials, TransportConfig::default()).unwrap();
        endpoint.certify(self.node_ticket.clone(), self.head_keys());
        endpoint
    }
}

/// A worker's certificate serves only as a worker's (#51, medium 7):
/// actor code that listens with its credentials where a client dials the
/// head (or any node) fails the client's TLS check, so it cannot answer as
/// one; dialled as the worker it is, it answers. Before, a worker's
/// certificate was a valid server certificate for every dial.
#[tokio::test]
async fn a_workers_certificate_cannot_answer_as_the_head_or_a_node() {
    within(Duration::from_secs(30), async {
        let cluster = Certifier::new();
        let worker = identity("worker-00000000000000ab", Incarnation::fresh().0);
        let server = cluster.worker(&worker, &worker);
        let dial = |expect: Option<NodeIdentity>| {
            let driver = cluster.driver();
            let address = server.local_addr();
            async move { driver.connect(address, expect.as_ref()).await }
        };
        let head = identity("head", worker.incarnation.0);
        for expect in [None, Some(head)] {
            let Err(refused) = dial(expect.clone()).await else {
                panic!("a worker's certificate answered as {expect:?}");
            };
            assert!(
                refused.to_string().contains("not valid for name"),
                "{refused}"
            );
        }
        dial(Some(worker))
            .await
            .expect("dialled as the worker it is, it answers");
    })
    .await;
}

/// A certified worker cannot answer as another worker (#51, medium 7):
/// the acceptor's `HelloReply` carries its ticket, and the dialer checks
/// it against the certificate the acceptor served TLS with and the peer
/// it meant to reach. Before, a worker listening with its own credentials
/// and ticket under another worker's name was taken for that worker.
#[tokio::test]
async fn a_worker_cannot_answer_as_another_worker() {
    within(Duration::from_secs(30), async {
        let cluster = Certifier::new();
        let a = identity("worker-000000000000000a", Incarnation::fresh().0);
        let b = identity("worker-000000000000000b", Incarnation::fresh().0);
        let impostor = cluster.worker(&b, &a);
        let honest = cluster.worker(&a, &a);
        let dialer = cluster.node();
        match dialer.connect(impostor.local_addr(), Some(&b)).await {
            Err(ConnectError::NotThePeer { reason, .. }) => {
                assert!(reason.contains("answered as worker"), "{reason}")
            }
            Err(other) => panic!("refused, but not for its ticket: {other}"),
            Ok(_) => panic!("worker a answered as worker b"),
        }
        dialer
            .connect(honest.local_addr(), Some(&a))
            .await
            .expect("dialled as the worker it is, it answers");
    })
    .await;
}
