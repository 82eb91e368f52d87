//! Certified identities: who a peer is, beyond holding the token.
//!
//! The token admits a process (TLS, `credentials.rs`), and every token
//! holder can make a certificate and call itself anything. So the head
//! certifies who each node is, and each node who its workers are:
//!
//! 1. **Proofs.** Every `Hello` carries a [`Proof`]: a token holder (a
//!    driver, the CLI, a node that has not joined yet) sends
//!    [`Proof::Token`], the HMAC-SHA256 of its own certificate's SHA-256
//!    keyed with the token ([`TOKEN_PROOF`] first); a certified process
//!    sends its [`Ticket`].
//! 2. **Node tickets.** The head makes an Ed25519 ticket key when it starts
//!    ([`TicketAuthority`]); the key never leaves the head's process. A
//!    node joins as a token holder; the head answers with a node ticket
//!    ([`NODE_TICKET`]): the node's identity, the SHA-256 of the
//!    certificate it connected with, and the public key the node signs its
//!    workers' tickets with. The node then presents the ticket on every
//!    connection ([`Endpoint::certify`](super::Endpoint::certify)).
//! 3. **Worker tickets.** A node starts each worker with a certificate it
//!    issued for it ([`Credentials::for_worker`](super::Credentials::for_worker)):
//!    a worker never holds the token, so it cannot prove it, cannot join,
//!    and cannot make itself another certificate. Its ticket
//!    ([`WORKER_TICKET`]) names the worker, its certificate, its node and
//!    its [`WorkerScope`] (the job it works for and the program it runs),
//!    signed by the node's key, with the node's ticket attached.
//! 4. **Checks** ([`Verifier`], on every accepted connection): a ticket must
//!    be signed by the head (a worker's by a key the head certified) and
//!    name the certificate the peer proved in TLS that it holds; a token
//!    proof must be that certificate's HMAC with this cluster's token; a
//!    failed proof closes the connection (close code 6). The handler gets a
//!    [`Caller`]: [`Standing::Certified`], [`Standing::TokenHolder`], or
//!    [`Standing::Unverified`] at a process that can check neither (a
//!    worker, which holds no token, or a node before it joined).
//! 5. **Acceptors too.** The acceptor's `HelloReply` carries its own
//!    proof, for the certificate it served TLS with; the dialer checks it
//!    with its [`Verifier`] as in step 4 ([`check_acceptor`]) and that the
//!    acceptor is the peer it meant to reach, else it closes the
//!    connection (close code 6): a certified worker or node cannot answer
//!    as another one.
//! 6. What each caller may ask is decided above this layer
//!    (`crate::node`'s `authorize.rs`).
//! 7. **Expiry and renewal.** A node ticket is valid for the head's ticket
//!    lifetime (`--ticket-lifetime-s`, a day by default); a
//!    worker's until its node's ticket expires. Past half its life a node
//!    asks for a new one with its next heartbeat (the head renews only a
//!    live member's) and a worker asks its node (`RenewTicket`); both
//!    present the new one on connections made from then on. A ticket is
//!    checked when a connection is made: one past its expiry (with a
//!    tenth of its lifetime, at most [`MAX_CLOCK_SKEW`], for clocks that
//!    differ between hosts) is refused. Each also names one incarnation,
//!    and the head refuses incarnations it declared dead or that left.
//! 8. **Head keys.** A node learns the public keys tickets may be signed
//!    by from its join and each renewal, a worker from its boot and each
//!    renewal; the head changes them when it rotates its key
//!    (`ticket_keys.rs`), and each process checks with the last it got.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde::{Deserialize, Serialize};

use crate::wire::{
    self, HelloReply, IssuerTicket, NodeIdentity, PeerIdentity, PeerRole, Proof, Ticket,
};

use super::CredentialError;

/// Signed before a node ticket's claims.
pub const NODE_TICKET: &[u8] = b"nimbus node ticket v2\0";
/// Signed before a worker ticket's claims.
pub const WORKER_TICKET: &[u8] = b"nimbus worker ticket v2\0";
/// The most a ticket is accepted past its expiry, for hosts whose clocks
/// differ (a tenth of its lifetime when that is less; step 7).
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(60);
/// MACed before a token holder's certificate hash.
pub const TOKEN_PROOF: &[u8] = b"nimbus token proof v1\0";

/// Largest claims a ticket may carry: an identity, a hash and a key.
const MAX_CLAIMS: usize = 4 << 10;

/// The SHA-256 of a DER certificate: what a ticket or token proof binds to.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CertificateHash(pub [u8; 32]);

impl CertificateHash {
    /// The hash of `der`.
    pub fn of(der: &[u8]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, der);
        let mut hash = [0u8; 32];
        hash.copy_from_slice(digest.as_ref());
        CertificateHash(hash)
    }
}

impl fmt::Debug for CertificateHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in &self.0[..8] {
            write!(f, "{byte:02x}")?;
        }
        f.write_str("…")
    }
}

/// What a ticket states.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(super) struct Claims {
    /// Who holds the certificate.
    pub(super) subject: PeerIdentity,
    /// The certificate's SHA-256.
    #[serde(with = "serde_bytes")]
    pub(super) certificate: Vec<u8>,
    /// The node the subject runs on (a node: itself).
    pub(super) host: NodeIdentity,
    /// A node's: the Ed25519 public key its workers' tickets are signed
    /// with (empty in a worker's).
    #[serde(with = "serde_bytes")]
    pub(super) signs_workers: Vec<u8>,
    /// A worker's: what it works for (`None` in a node's).
    #[serde(default)]
    pub(super) scope: Option<WorkerScope>,
    /// When it was signed, in seconds since the Unix epoch.
    pub(super) issued_at: u64,
    /// When it stops being accepted (step 7), in seconds since the Unix
    /// epoch.
    pub(super) expires_at: u64,
}

impl Claims {
    /// Whether it is still accepted at `now` (step 7).
    fn valid_at(&self, now: u64) -> Result<(), TicketError> {
        let life = self.expires_at.saturating_sub(self.issued_at);
        let skew = (life / 10).min(MAX_CLOCK_SKEW.as_secs());
        match now <= self.expires_at.saturating_add(skew) {
            true => Ok(()),
            false => Err(TicketError::Expired {
                ago_s: now - self.expires_at,
            }),
        }
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// When the holder of `ticket` (its own, read without checking) asks for a
/// new one: half-way through its life (step 7); `None` if it cannot be
/// read.
pub fn renewal_due_at(ticket: &Ticket) -> Option<u64> {
    let claims: Claims = wire::decode(&ticket.claims).ok()?;
    let life = claims.expires_at.saturating_sub(claims.issued_at);
    Some(claims.issued_at + life / 2)
}

/// What a worker's ticket confines it to: the job whose actor it hosts and
/// the program it runs. What a worker may do with them is decided above
/// this layer (`crate::node`'s `authorize.rs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerScope {
    /// The job (driver program run) its actor belongs to.
    pub job: String,
    /// Hex SHA-256 of the program binary it runs.
    pub binary: String,
}

/// Why a proof does not hold.
#[derive(Debug, thiserror::Error)]
pub enum TicketError {
    /// A signature does not verify.
    #[error("its {0} is not signed by this cluster's head (a ticket of another cluster or head, or forged)")]
    BadSignature(&'static str),
    /// The ticket names another certificate.
    #[error(
        "its ticket names another certificate than the one it connected with (a copied ticket)"
    )]
    OtherCertificate,
    /// The claims are not a ticket's.
    #[error("its ticket is malformed: {0}")]
    Malformed(String),
    /// A worker ticket signed by something other than a node, or a node
    /// ticket presented by a worker.
    #[error("its ticket is for a {found}, but it came as a {expected}")]
    WrongRole {
        /// What the ticket needs.
        expected: &'static str,
        /// What it names.
        found: &'static str,
    },
    /// The token proof does not match.
    #[error("its token proof is wrong (another cluster's token?)")]
    BadTokenProof,
    /// The Hello names someone else than the ticket.
    #[error("it announced itself as {announced} with a ticket for {certified}")]
    NotItsTicket {
        /// From the Hello.
        announced: PeerIdentity,
        /// From the ticket.
        certified: PeerIdentity,
    },
    /// The ticket is past its expiry (step 7): its holder did not renew it.
    #[error("its ticket expired {ago_s} s ago (not renewed: is its holder cut off from its node or the head, or is this host's clock wrong?)")]
    Expired {
        /// How long ago.
        ago_s: u64,
    },
    /// It offered no proof to a process that requires one.
    #[error("it offered no proof of identity (a worker's certificate without its ticket?)")]
    NoProof,
}

/// Who sent a request, as far as this process could check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The peer: from its ticket when certified, else as it announced.
    pub peer: PeerIdentity,
    /// The SHA-256 of the certificate it connected with.
    pub certificate: CertificateHash,
    /// How far `peer` is proven.
    pub standing: Standing,
}

/// How far a caller's identity is proven.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// A node or worker with a valid ticket; `host` is its node (a node:
    /// itself).
    Certified {
        /// The node it runs on.
        host: NodeIdentity,
        /// A worker's job and program (`None` for a node).
        scope: Option<WorkerScope>,
    },
    /// It proved it holds the token, nothing more: a driver, the CLI, a
    /// node before it joined.
    TokenHolder,
    /// This process can check no proof (it holds neither the token nor
    /// the head's key): the caller holds a cluster certificate, nothing
    /// more is known.
    Unverified,
}

impl Caller {
    /// Whether this is the certified node `node` (name and incarnation).
    pub fn is_node(&self, node: &NodeIdentity) -> bool {
        self.certified_as(PeerRole::Node) && self.peer.identity == *node
    }

    /// Whether the caller holds a ticket for `role`.
    pub fn certified_as(&self, role: PeerRole) -> bool {
        matches!(self.standing, Standing::Certified { .. }) && self.peer.role == role
    }

    /// A certified worker's scope: the job and program it is confined to
    /// (`None` for any other caller).
    pub fn worker_scope(&self) -> Option<&WorkerScope> {
        match &self.standing {
            Standing::Certified { scope, .. } if self.peer.role == PeerRole::Worker => {
                scope.as_ref()
            }
            _ => None,
        }
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let standing = match &self.standing {
            Standing::Certified { .. } => "certified",
            Standing::TokenHolder => "token holder",
            Standing::Unverified => "unverified",
        };
        write!(f, "{} ({standing})", self.peer)
    }
}

/// A node's key for its workers' tickets (step 3).
pub struct WorkerSigner {
    key: Ed25519KeyPair,
    node: NodeIdentity,
    /// The node's ticket and when it expires.
    ticket: Option<(Ticket, u64)>,
}

impl WorkerSigner {
    /// A new random key for node `node`; it signs nothing until the node
    /// is certified ([`WorkerSigner::set_ticket`]).
    pub fn generate(node: &NodeIdentity) -> Result<Self, CredentialError> {
        let pkcs8 = super::ticket_keys::generate_pkcs8()?;
        let key = Ed25519KeyPair::from_pkcs8(&pkcs8)
            .map_err(|e| CredentialError::Tls(format!("a node's worker-ticket key: {e}")))?;
        Ok(WorkerSigner {
            key,
            node: node.clone(),
            ticket: None,
        })
    }

    /// The public key the node's ticket must name.
    pub fn public_key(&self) -> Vec<u8> {
        self.key.public_key().as_ref().to_vec()
    }

    /// The node's ticket, attached to every worker ticket; a worker's
    /// expires with it.
    pub fn set_ticket(&mut self, ticket: Ticket) {
        let expires_at = wire::decode::<Claims>(&ticket.claims).map_or(0, |c| c.expires_at);
        self.ticket = Some((ticket, expires_at));
    }

    /// The node's ticket, once it has one.
    pub fn ticket(&self) -> Option<&Ticket> {
        self.ticket.as_ref().map(|(ticket, _)| ticket)
    }

    /// A ticket for worker `worker` with `certificate`, confined to
    /// `scope`, signed at `now` (seconds since the Unix epoch) and valid
    /// as long as the node's; `None` before the node has its own ticket.
    pub fn certify_worker(
        &self,
        worker: &NodeIdentity,
        certificate: CertificateHash,
        scope: WorkerScope,
        now: u64,
    ) -> Option<Ticket> {
        let (node, expires_at) = self.ticket.as_ref()?;
        let claims = Claims {
            subject: PeerIdentity {
                role: PeerRole::Worker,
                identity: worker.clone(),
            },
            certificate: certificate.0.to_vec(),
            host: self.node.clone(),
            signs_workers: Vec::new(),
            scope: Some(scope),
            issued_at: now.min(*expires_at),
            expires_at: *expires_at,
        };
        let claims = rmp_serde::to_vec_named(&claims).unwrap_or_default();
        let signature = sign(&self.key, WORKER_TICKET, &claims);
        Some(Ticket {
            claims,
            signature,
            issuer: Some(IssuerTicket {
                claims: node.claims.clone(),
                signature: node.signature.clone(),
            }),
        })
    }
}

/// What this process can check (step 4): the token's MAC key, the head's
/// public key, both or neither.
#[derive(Clone, Default)]
pub struct Verifier {
    token: Option<ring::hmac::Key>,
    /// The head's public keys (step 8); none: tickets cannot be checked.
    head: Vec<Vec<u8>>,
}

impl Verifier {
    /// What a node of the cluster of `token`, whose head's public ticket
    /// keys are `head_keys`, checks.
    pub fn for_cluster(token: &super::JoinToken, head_keys: Vec<Vec<u8>>) -> Self {
        let mut verifier = Verifier::with_token(token.mac_key());
        verifier.set_head_keys(head_keys);
        verifier
    }

    /// Checks token proofs with `token` (the MAC key derived from it).
    pub(super) fn with_token(token: ring::hmac::Key) -> Self {
        Verifier {
            token: Some(token),
            head: Vec::new(),
        }
    }

    /// Also checks tickets, with the head's public keys (step 8).
    pub(super) fn set_head_keys(&mut self, keys: Vec<Vec<u8>>) {
        self.head = keys;
    }

    /// Who the peer that sent `hello` with the certificate `certificate`
    /// is, or why its proof fails, now.
    pub fn check(
        &self,
        announced: &PeerIdentity,
        proof: &Proof,
        certificate: CertificateHash,
    ) -> Result<Caller, TicketError> {
        self.check_at(announced, proof, certificate, unix_now())
    }

    /// [`Verifier::check`] at `now` (seconds since the Unix epoch).
    pub(super) fn check_at(
        &self,
        announced: &PeerIdentity,
        proof: &Proof,
        certificate: CertificateHash,
        now: u64,
    ) -> Result<Caller, TicketError> {
        let caller = |peer: PeerIdentity, standing| Caller {
            peer,
            certificate,
            standing,
        };
        match proof {
            Proof::Ticket(ticket) => match self.head.as_slice() {
                [] => Ok(caller(announced.clone(), Standing::Unverified)),
                head => {
                    let claims = verify_ticket(head, ticket, certificate, now)?;
                    if claims.subject != *announced {
                        return Err(TicketError::NotItsTicket {
                            announced: announced.clone(),
                            certified: claims.subject,
                        });
                    }
                    let standing = Standing::Certified {
                        host: claims.host,
                        scope: claims.scope,
                    };
                    Ok(caller(claims.subject, standing))
                }
            },
            Proof::Token(mac) => match &self.token {
                Some(key) => {
                    ring::hmac::verify(key, &proof_message(certificate), mac)
                        .map_err(|_| TicketError::BadTokenProof)?;
                    Ok(caller(announced.clone(), Standing::TokenHolder))
                }
                None => Ok(caller(announced.clone(), Standing::Unverified)),
            },
            Proof::None if self.token.is_some() || !self.head.is_empty() => {
                Err(TicketError::NoProof)
            }
            Proof::None => Ok(caller(announced.clone(), Standing::Unverified)),
        }
    }
}

/// The SHA-256 of the leaf certificate the peer of `quic` proved in TLS
/// that it holds, if it presented one.
pub(super) fn peer_certificate(quic: &quinn::Connection) -> Option<CertificateHash> {
    let chain = quic
        .peer_identity()?
        .downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
        .ok()?;
    chain.first().map(|leaf| CertificateHash::of(leaf))
}

/// Step 5: whether the acceptor that answered `reply` over `quic` is who
/// it says and the peer meant (`expect`), as far as `verifier` can check;
/// why not, if not.
pub(super) fn check_acceptor(
    verifier: &Verifier,
    quic: &quinn::Connection,
    expect: Option<&NodeIdentity>,
    reply: &HelloReply,
) -> Result<(), String> {
    let certificate = peer_certificate(quic).ok_or("it presented no certificate".to_string())?;
    let role = if reply.node.names_a_worker() {
        PeerRole::Worker
    } else {
        PeerRole::Node
    };
    let announced = PeerIdentity {
        role,
        identity: reply.node.clone(),
    };
    verifier
        .check(&announced, &reply.proof, certificate)
        .map_err(|e| format!("it answered as {announced} but is not: {e}"))?;
    match expect {
        Some(meant) if *meant != reply.node => Err(format!(
            "it answered as {announced}, not as {meant}, the peer meant"
        )),
        _ => Ok(()),
    }
}

/// The token proof for `certificate`, with the token's MAC key.
pub(super) fn token_proof(token: &ring::hmac::Key, certificate: CertificateHash) -> Proof {
    Proof::Token(
        ring::hmac::sign(token, &proof_message(certificate))
            .as_ref()
            .to_vec(),
    )
}

fn proof_message(certificate: CertificateHash) -> Vec<u8> {
    [TOKEN_PROOF, &certificate.0].concat()
}

pub(super) fn sign(key: &Ed25519KeyPair, domain: &[u8], claims: &[u8]) -> Vec<u8> {
    key.sign(&[domain, claims].concat()).as_ref().to_vec()
}

fn verify(
    public: &[u8],
    domain: &[u8],
    claims: &[u8],
    signature: &[u8],
    what: &'static str,
) -> Result<Claims, TicketError> {
    if claims.len() > MAX_CLAIMS {
        return Err(TicketError::Malformed(format!(
            "claims of {} bytes",
            claims.len()
        )));
    }
    UnparsedPublicKey::new(&ED25519, public)
        .verify(&[domain, claims].concat(), signature)
        .map_err(|_| TicketError::BadSignature(what))?;
    wire::decode(claims).map_err(|e| TicketError::Malformed(e.to_string()))
}

/// The claims of a node ticket signed by one of the head's keys `head`.
fn verify_by_head(
    head: &[Vec<u8>],
    claims: &[u8],
    signature: &[u8],
    what: &'static str,
) -> Result<Claims, TicketError> {
    let mut refused = TicketError::BadSignature(what);
    for key in head {
        match verify(key, NODE_TICKET, claims, signature, what) {
            Ok(claims) => return Ok(claims),
            Err(e) => refused = e,
        }
    }
    Err(refused)
}

/// The claims of `ticket` once every signature holds, it names
/// `certificate` and neither it nor the node ticket attached has expired
/// at `now`.
fn verify_ticket(
    head: &[Vec<u8>],
    ticket: &Ticket,
    certificate: CertificateHash,
    now: u64,
) -> Result<Claims, TicketError> {
    let claims = match &ticket.issuer {
        None => {
            let claims = verify_by_head(head, &ticket.claims, &ticket.signature, "ticket")?;
            expect_role(&claims, PeerRole::Node)?;
            claims
        }
        Some(node) => {
            let node = verify_by_head(head, &node.claims, &node.signature, "node ticket")?;
            expect_role(&node, PeerRole::Node)?;
            node.valid_at(now)?;
            let claims = verify(
                &node.signs_workers,
                WORKER_TICKET,
                &ticket.claims,
                &ticket.signature,
                "worker ticket's node",
            )?;
            expect_role(&claims, PeerRole::Worker)?;
            if claims.scope.is_none() {
                return Err(TicketError::Malformed(
                    "a worker ticket that names no job".into(),
                ));
            }
            if claims.host != node.subject.identity {
                return Err(TicketError::Malformed(format!(
                    "a worker ticket for a worker of {} signed by {}",
                    claims.host, node.subject.identity
                )));
            }
            claims
        }
    };
    if claims.certificate != certificate.0 {
        return Err(TicketError::OtherCertificate);
    }
    claims.valid_at(now)?;
    Ok(claims)
}

fn expect_role(claims: &Claims, expected: PeerRole) -> Result<(), TicketError> {
    let name = |role| match role {
        PeerRole::Node => "node",
        PeerRole::Worker => "worker",
        PeerRole::Client => "client",
    };
    match claims.subject.role == expected {
        true => Ok(()),
        false => Err(TicketError::WrongRole {
            expected: name(expected),
            found: name(claims.subject.role),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::TicketAuthority;
    use crate::wire::Incarnation;

    fn node(name: &str) -> NodeIdentity {
        NodeIdentity {
            name: name.into(),
            incarnation: Incarnation::fresh(),
        }
    }

    fn peer(role: PeerRole, identity: &NodeIdentity) -> PeerIdentity {
        PeerIdentity {
            role,
            identity: identity.clone(),
        }
    }

    fn verifier(head: &TicketAuthority) -> Verifier {
        let mut verifier =
            Verifier::with_token(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"k"));
        verifier.set_head_keys(head.public_keys(unix_now()));
        verifier
    }

    #[test]
    fn a_node_ticket_certifies_its_certificate_only() {
        let head = TicketAuthority::generate().unwrap();
        let n1 = node("n1");
        let cert = CertificateHash::of(b"n1's certificate");
        let ticket = head.certify_node(&n1, cert, b"", unix_now());
        let verifier = verifier(&head);
        let proof = Proof::Ticket(ticket);
        let caller = verifier
            .check(&peer(PeerRole::Node, &n1), &proof, cert)
            .unwrap();
        assert!(caller.is_node(&n1));
        let copied = verifier.check(
            &peer(PeerRole::Node, &n1),
            &proof,
            CertificateHash::of(b"another"),
        );
        assert!(matches!(copied, Err(TicketError::OtherCertificate)));
        let renamed = verifier.check(&peer(PeerRole::Node, &node("n2")), &proof, cert);
        assert!(matches!(renamed, Err(TicketError::NotItsTicket { .. })));
    }

    #[test]
    fn a_ticket_of_another_head_or_tampered_claims_are_refused() {
        let head = TicketAuthority::generate().unwrap();
        let other = TicketAuthority::generate().unwrap();
        let n1 = node("n1");
        let cert = CertificateHash::of(b"c");
        let foreign = Proof::Ticket(other.certify_node(&n1, cert, b"", unix_now()));
        let verifier = verifier(&head);
        let checked = verifier.check(&peer(PeerRole::Node, &n1), &foreign, cert);
        assert!(matches!(checked, Err(TicketError::BadSignature(_))));
        let mut ticket = head.certify_node(&n1, cert, b"", unix_now());
        let last = ticket.claims.len() - 1;
        ticket.claims[last] ^= 1;
        let tampered = verifier.check(&peer(PeerRole::Node, &n1), &Proof::Ticket(ticket), cert);
        assert!(matches!(tampered, Err(TicketError::BadSignature(_))));
    }

    #[test]
    fn a_worker_ticket_needs_a_certified_node_and_cannot_pass_as_one() {
        let head = TicketAuthority::generate().unwrap();
        let n1 = node("n1");
        let mut signer = WorkerSigner::generate(&n1).unwrap();
        let w = node("worker-7");
        let wcert = CertificateHash::of(b"w");
        let scope = WorkerScope {
            job: "job-1".into(),
            binary: "ab".into(),
        };
        assert!(signer
            .certify_worker(&w, wcert, scope.clone(), unix_now())
            .is_none());
        signer.set_ticket(head.certify_node(
            &n1,
            CertificateHash::of(b"n"),
            &signer.public_key(),
            unix_now(),
        ));
        let ticket = signer
            .certify_worker(&w, wcert, scope.clone(), unix_now())
            .unwrap();
        let verifier = verifier(&head);
        let caller = verifier
            .check(
                &peer(PeerRole::Worker, &w),
                &Proof::Ticket(ticket.clone()),
                wcert,
            )
            .unwrap();
        let certified = Standing::Certified {
            host: n1.clone(),
            scope: Some(scope.clone()),
        };
        assert_eq!(caller.standing, certified);
        assert!(caller.certified_as(PeerRole::Worker));
        assert_eq!(caller.worker_scope(), Some(&scope));
        // A worker's ticket with its node's attached ticket stripped off is
        // a node ticket signed by the wrong key.
        let mut stripped = ticket.clone();
        stripped.issuer = None;
        let checked = verifier.check(&peer(PeerRole::Worker, &w), &Proof::Ticket(stripped), wcert);
        assert!(matches!(checked, Err(TicketError::BadSignature(_))));
        // A node key the head did not certify signs nothing that holds.
        let rogue = WorkerSigner::generate(&n1).unwrap();
        let mut forged = ticket;
        let claims = Claims {
            subject: peer(PeerRole::Worker, &w),
            certificate: wcert.0.to_vec(),
            host: n1.clone(),
            signs_workers: Vec::new(),
            scope: Some(scope),
            issued_at: unix_now(),
            expires_at: unix_now() + 60,
        };
        forged.claims = rmp_serde::to_vec_named(&claims).unwrap();
        forged.signature = sign(&rogue.key, WORKER_TICKET, &forged.claims);
        let checked = verifier.check(&peer(PeerRole::Worker, &w), &Proof::Ticket(forged), wcert);
        assert!(matches!(checked, Err(TicketError::BadSignature(_))));
    }

    #[test]
    fn a_ticket_is_refused_past_its_expiry_and_a_workers_with_its_nodes() {
        let head = TicketAuthority::generate()
            .unwrap()
            .with_lifetime(Duration::from_secs(100));
        let n1 = node("n1");
        let cert = CertificateHash::of(b"n1");
        let t0 = 1_000_000;
        let ticket = head.certify_node(&n1, cert, b"", t0);
        assert_eq!(renewal_due_at(&ticket), Some(t0 + 50));
        let verifier = verifier(&head);
        let as_n1 = peer(PeerRole::Node, &n1);
        let proof = Proof::Ticket(ticket);
        // A tenth of the lifetime is allowed for clocks that differ.
        for now in [t0, t0 + 100, t0 + 110] {
            verifier.check_at(&as_n1, &proof, cert, now).unwrap();
        }
        let late = verifier.check_at(&as_n1, &proof, cert, t0 + 111);
        assert!(
            matches!(late, Err(TicketError::Expired { ago_s: 11 })),
            "{late:?}"
        );
        // A worker's ticket lasts as long as its node's, even when signed
        // later, and fails with it.
        let mut signer = WorkerSigner::generate(&n1).unwrap();
        signer.set_ticket(head.certify_node(&n1, cert, &signer.public_key(), t0));
        let w = node("worker-1");
        let wcert = CertificateHash::of(b"w");
        let scope = WorkerScope {
            job: "job-1".into(),
            binary: "ab".into(),
        };
        let worker = Proof::Ticket(signer.certify_worker(&w, wcert, scope, t0 + 90).unwrap());
        let as_w = peer(PeerRole::Worker, &w);
        verifier.check_at(&as_w, &worker, wcert, t0 + 100).unwrap();
        let late = verifier.check_at(&as_w, &worker, wcert, t0 + 111);
        assert!(matches!(late, Err(TicketError::Expired { .. })), "{late:?}");
    }

    #[test]
    fn a_token_proof_binds_the_token_to_the_certificate() {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"token");
        let verifier = Verifier::with_token(key.clone());
        let cert = CertificateHash::of(b"c");
        let me = peer(PeerRole::Client, &node("cli"));
        let proof = token_proof(&key, cert);
        let caller = verifier.check(&me, &proof, cert).unwrap();
        assert_eq!(caller.standing, Standing::TokenHolder);
        let replayed = verifier.check(&me, &proof, CertificateHash::of(b"d"));
        assert!(matches!(replayed, Err(TicketError::BadTokenProof)));
        let other = token_proof(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"x"), cert);
        assert!(matches!(
            verifier.check(&me, &other, cert),
            Err(TicketError::BadTokenProof)
        ));
        assert!(matches!(
            verifier.check(&me, &Proof::None, cert),
            Err(TicketError::NoProof)
        ));
        let worker_side = Verifier::default();
        let caller = worker_side.check(&me, &Proof::None, cert).unwrap();
        assert_eq!(caller.standing, Standing::Unverified);
    }
}
