//! The decoders fuzzed, with valid inputs to start from. Each reads what a
//! peer, a worker, a file or a person wrote: frames and envelopes off a
//! QUIC stream, control requests and replies, actor calls, fault plans,
//! custom resources (nimbus-train fuzzes checkpoint manifests).

use std::net::SocketAddr;
use std::sync::OnceLock;

use nimbus::actor::ActorCall;
use nimbus::chaos::ChaosPlan;
use nimbus::cluster::faults::ActorFault;
use nimbus::cluster::{
    ActorId, ClusterEvent, ClusterEventKind, ControlReply, ControlRequest, DeathCause, EventReply,
    EventRequest, HostLoad, JobRequest, MembershipReply, MembershipRequest, NodeRegistration,
    ObjectId, ObjectReply, ObjectRequest, ResourceSet, WorkerReply,
};
use nimbus::transport::{
    unix_now, CertificateHash, JoinToken, PacketFaults, TicketAuthority, Verifier, WorkerScope,
    WorkerSigner,
};
use nimbus::wire::{
    self, Hello, HelloReply, Incarnation, IssuerTicket, NodeIdentity, PeerIdentity, PeerRole,
    Proof, RemoteError, RemoteErrorKind, Request, Response, Ticket,
};
use serde::{Deserialize, Serialize};

use crate::{Outcome, Target};

pub const ALL: &[Target] = &[
    Target {
        name: "frame",
        seeds: frames,
        decode: frame,
    },
    Target {
        name: "envelope",
        seeds: envelopes,
        decode: envelope,
    },
    Target {
        name: "control_request",
        seeds: control_requests,
        decode: decodes::<ControlRequest>,
    },
    Target {
        name: "control_reply",
        seeds: control_replies,
        decode: decodes::<ControlReply>,
    },
    Target {
        name: "actor_call",
        seeds: actor_calls,
        decode: actor_call,
    },
    Target {
        name: "fault_plans",
        seeds: fault_plans,
        decode: fault_plan,
    },
    Target {
        name: "custom_resources",
        seeds: custom_resources,
        decode: custom_resource,
    },
    Target {
        name: "hello_proof",
        seeds: hello_proofs,
        decode: hello_proof,
    },
];

fn node(name: &str) -> NodeIdentity {
    NodeIdentity {
        name: name.into(),
        incarnation: Incarnation(1_733_000_000_000_000),
    }
}

fn address() -> SocketAddr {
    "10.0.0.7:7000".parse().unwrap()
}

fn msgpack<T: Serialize>(value: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(value).unwrap()
}

fn decodes<T: serde::de::DeserializeOwned>(input: &[u8]) -> Outcome {
    wire::decode::<T>(input)
        .map(drop)
        .map_err(|e| e.to_string())
}

fn text(input: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(input).map_err(|e| e.to_string())
}

fn request(body: Vec<u8>) -> Request {
    Request {
        id: 7,
        to: Some(Incarnation(3)),
        deadline_ms: 10_000,
        one_way: false,
        ordered: true,
        body,
    }
}

/// A stream's bytes: the preamble, then frames, as a node reads them.
fn frames() -> Vec<Vec<u8>> {
    let leave = ControlRequest::Membership(MembershipRequest::Leave { node: node("b") });
    let mut stream = wire::preamble(wire::PROTOCOL_VERSION).to_vec();
    stream.extend(wire::encode(&request(msgpack(&leave)), 1 << 16).unwrap());
    vec![stream]
}

fn frame(input: &[u8]) -> Outcome {
    let Some((preamble, mut rest)) = input.split_first_chunk::<{ wire::PREAMBLE_LEN }>() else {
        return Err("short".into());
    };
    wire::read_preamble(*preamble).map_err(|e| e.to_string())?;
    let read = nimbus::transport::read_frame(&mut rest, wire::DEFAULT_MAX_FRAME_BYTES);
    let body = futures::executor::block_on(read).map_err(|e| e.to_string())?;
    decodes::<Request>(&body)
}

/// One envelope of each kind; the first byte says which.
fn envelopes() -> Vec<Vec<u8>> {
    let hello = Hello {
        from: PeerIdentity {
            role: PeerRole::Worker,
            identity: node("w"),
        },
        expect: Some(node("b")),
        proof: Proof::Ticket(ticket()),
    };
    let token_holder = Hello {
        from: PeerIdentity {
            role: PeerRole::Client,
            identity: node("cli"),
        },
        expect: None,
        proof: Proof::Token(vec![9; 32]),
    };
    let failed = Response {
        id: 7,
        result: Err(RemoteError::new(RemoteErrorKind::BadRequest, "no")),
    };
    let answered = Response {
        id: 8,
        result: Ok(serde_bytes::ByteBuf::from(vec![1, 2, 3])),
    };
    let tagged = |tag: u8, body: Vec<u8>| [vec![tag], body].concat();
    vec![
        tagged(0, msgpack(&hello)),
        tagged(0, msgpack(&token_holder)),
        tagged(
            1,
            msgpack(&HelloReply {
                node: node("b"),
                proof: Proof::Ticket(ticket()),
                local: None,
            }),
        ),
        tagged(2, msgpack(&request(vec![0x90]))),
        tagged(3, msgpack(&failed)),
        tagged(3, msgpack(&answered)),
    ]
}

fn envelope(input: &[u8]) -> Outcome {
    match input.split_first() {
        Some((0, body)) => decodes::<Hello>(body),
        Some((1, body)) => decodes::<HelloReply>(body),
        Some((2, body)) => decodes::<Request>(body),
        Some((3, body)) => decodes::<Response>(body),
        _ => Err("no such envelope".into()),
    }
}

/// One cluster's head key and a node's worker signer, fixed for the run:
/// the seeds carry proofs that hold, so mutations start from inputs that
/// reach every check.
fn cluster_keys() -> &'static (JoinToken, TicketAuthority, WorkerSigner) {
    static KEYS: OnceLock<(JoinToken, TicketAuthority, WorkerSigner)> = OnceLock::new();
    KEYS.get_or_init(|| {
        let head = TicketAuthority::generate().unwrap();
        let mut signer = WorkerSigner::generate(&node("n")).unwrap();
        let ticket = head.certify_node(&node("n"), certificate(), &signer.public_key(), unix_now());
        signer.set_ticket(ticket);
        (JoinToken::generate(), head, signer)
    })
}

/// The certificate every fuzzed peer connected with.
fn certificate() -> CertificateHash {
    CertificateHash::of(b"the fuzzed peer's certificate")
}

/// Hellos whose tickets hold: a node's and a worker's.
fn hello_proofs() -> Vec<Vec<u8>> {
    let (_, head, signer) = cluster_keys();
    let peer = |role| PeerIdentity {
        role,
        identity: node("n"),
    };
    let node_ticket =
        head.certify_node(&node("n"), certificate(), &signer.public_key(), unix_now());
    let scope = WorkerScope {
        job: "job-1".into(),
        binary: "ab".into(),
    };
    let worker_ticket = signer
        .certify_worker(&node("n"), certificate(), scope, unix_now())
        .unwrap();
    [
        (peer(PeerRole::Node), node_ticket),
        (peer(PeerRole::Worker), worker_ticket),
    ]
    .into_iter()
    .map(|(from, ticket)| {
        msgpack(&Hello {
            from,
            expect: None,
            proof: Proof::Ticket(ticket),
        })
    })
    .collect()
}

/// A Hello, checked as a node of the cluster checks it.
fn hello_proof(input: &[u8]) -> Outcome {
    let (token, head, _) = cluster_keys();
    let hello: Hello = wire::decode(input).map_err(|e| e.to_string())?;
    Verifier::for_cluster(token, head.public_keys(unix_now()))
        .check(&hello.from, &hello.proof, certificate())
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A worker's ticket (signatures of the right length, not valid ones).
fn ticket() -> Ticket {
    Ticket {
        claims: vec![0x80; 40],
        signature: vec![1; 64],
        issuer: Some(IssuerTicket {
            claims: vec![0x80; 40],
            signature: vec![2; 64],
        }),
    }
}

fn control_requests() -> Vec<Vec<u8>> {
    let registration = NodeRegistration {
        node: node("c"),
        address: address(),
        resources: ResourceSet::of("CPU", 4.0).with("GPU", 1.0),
        versions: nimbus::cluster::Versions::here(),
    };
    [
        ControlRequest::Membership(MembershipRequest::Join {
            registration,
            signs_workers: vec![7; 32],
        }),
        ControlRequest::Membership(MembershipRequest::Heartbeat {
            node: node("c"),
            used: ResourceSet::of("CPU", 1.5),
            host: Some(HostLoad {
                cpu_percent: 37.5,
                memory_used: 1 << 30,
                memory_total: 4 << 30,
            }),
            renew: Some(vec![7; 32].into()),
        }),
        ControlRequest::Membership(MembershipRequest::Status),
        ControlRequest::Membership(MembershipRequest::RotateTicketKey),
        ControlRequest::Workers(nimbus::cluster::WorkerRequest::RenewTicket),
        ControlRequest::Events(EventRequest::Events {
            after: 12,
            wait_ms: 500,
        }),
        ControlRequest::Objects(ObjectRequest::ReadObject {
            id: ObjectId(99),
            offset: 0,
            len: 1 << 20,
            copy_at: None,
        }),
        ControlRequest::Echo(nimbus::cluster::Echo(vec![1, 2, 3])),
        ControlRequest::Jobs(JobRequest::DriverAlive {
            job: "job-1".into(),
            entrypoint: "train_mnist --epochs 1".into(),
            versions: Some(nimbus::cluster::Versions {
                libtorch: Some(nimbus::cluster::Torch {
                    version: Some("2.11.0+cu130".into()),
                    cuda: Some("13.0".into()),
                    directory: "/opt/torch/lib".into(),
                }),
                ..nimbus::cluster::Versions::here()
            }),
        }),
    ]
    .iter()
    .map(msgpack)
    .collect()
}

fn control_replies() -> Vec<Vec<u8>> {
    let died = ClusterEvent {
        seq: 4,
        time_ms: 0,
        kind: ClusterEventKind::ActorDied {
            actor: ActorId(5),
            incarnation: Incarnation(6),
            reason: DeathCause::RestartFailed {
                death: Box::new(DeathCause::Panicked {
                    message: "boom".into(),
                }),
                error: "no binary".into(),
            },
            restarting: false,
        },
    };
    let joined = ClusterEvent {
        seq: 5,
        time_ms: 0,
        kind: ClusterEventKind::NodeJoined {
            node: node("d"),
            address: address(),
        },
    };
    [
        ControlReply::from(EventReply::Events(vec![died, joined])),
        MembershipReply::Ack.into(),
        MembershipReply::Joined {
            heartbeat_interval_ms: 500,
            ticket: ticket(),
            head_keys: vec![vec![3; 32], vec![4; 32]].into(),
        }
        .into(),
        MembershipReply::Renewed {
            ticket: ticket(),
            head_keys: vec![vec![3; 32]].into(),
        }
        .into(),
        MembershipReply::TicketKeyRotating {
            switch_at: 1_700_000_000,
            done_at: 1_700_100_000,
        }
        .into(),
        ObjectReply::Ready {
            size: 10,
            job: Some("j1".into()),
        }
        .into(),
        ObjectReply::Failed {
            reason: "lost".into(),
            job: Some("j1".into()),
        }
        .into(),
        WorkerReply::NoCapacity("the node lacks CPU".into()).into(),
    ]
    .iter()
    .map(msgpack)
    .collect()
}

/// A user message: what a worker decodes an actor call's payload into.
#[derive(Serialize, Deserialize)]
enum Transfer {
    Credit { account: String, cents: i64 },
    Batch(Vec<(u32, f64)>),
    Note(Option<String>),
}

fn actor_calls() -> Vec<Vec<u8>> {
    [
        Transfer::Credit {
            account: "account-3".into(),
            cents: 1200,
        },
        Transfer::Batch(vec![(1, 0.5), (2, -3.0)]),
        Transfer::Note(None),
    ]
    .iter()
    .map(|message| {
        msgpack(&ActorCall {
            actor: ActorId(42),
            message: "examples.Transfer".into(),
            payload: msgpack(message),
        })
    })
    .collect()
}

fn actor_call(input: &[u8]) -> Outcome {
    let call = wire::decode::<ActorCall>(input).map_err(|e| e.to_string())?;
    rmp_serde::from_slice::<Transfer>(&call.payload)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// A chaos plan (TOML) and the JSON rules it hands to processes; the
/// first byte says which.
fn fault_plans() -> Vec<Vec<u8>> {
    let plan = include_str!("../../examples/faults/bank.toml");
    let nodes = include_str!("../../examples/faults/bank_nodes.toml");
    let actor_faults = r#"[{"actor_name":"account-2","message":"examples.Transfer","after_messages":15,"action":"kill"}]"#;
    let packet_faults = r#"{"seed":42,"rules":[{"peers":["127.0.0.1:7000"],"from_ms":100,"until_ms":1100,"partition":true,"drop":0.05,"duplicate":0.0,"reorder":0.0,"delay":0.0,"delay_ms":0,"bandwidth_bytes_per_s":null}],"workers":false}"#;
    let tagged = |tag: u8, text: &str| [vec![tag], text.as_bytes().to_vec()].concat();
    vec![
        tagged(0, plan),
        tagged(0, nodes),
        tagged(1, actor_faults),
        tagged(2, packet_faults),
    ]
}

fn fault_plan(input: &[u8]) -> Outcome {
    let json = |e: serde_json::Error| e.to_string();
    match input.split_first() {
        Some((0, toml)) => ChaosPlan::from_toml(text(toml)?)
            .map(drop)
            .map_err(|e| e.to_string()),
        Some((1, rules)) => serde_json::from_slice::<Vec<ActorFault>>(rules)
            .map(drop)
            .map_err(json),
        Some((2, plan)) => serde_json::from_slice::<PacketFaults>(plan)
            .map(drop)
            .map_err(json),
        _ => Err("no such plan".into()),
    }
}

fn custom_resources() -> Vec<Vec<u8>> {
    vec![
        br#"{"accelerator_type:H200": 1}"#.to_vec(),
        br#"{"special": 2.5, "disk_gb": 100}"#.to_vec(),
    ]
}

fn custom_resource(input: &[u8]) -> Outcome {
    ResourceSet::default()
        .merge_custom(text(input)?)
        .map_err(|e| e.to_string())
}
