//! The head's ticket keys over time: which one signs node tickets, and
//! which ones a ticket may be signed by (`tickets.rs`, steps 2 and 8).
//!
//! A rotation, asked for at `t0` (`nimbus rotate-ticket-key`), with the
//! head's ticket lifetime `L`; [`TicketAuthority`] decides each phase from
//! the time it is given:
//! 1. **Announced** from `t0`: a new key is made (and kept in the head's
//!    store); the old one still signs and both are accepted. Every renewal
//!    hands out both public keys, and every node and worker renews at
//!    least once per half lifetime, its node first: by `t0 + L` every
//!    process accepts the new key.
//! 2. **Switched** at `t0 + L` and [`SWITCH_MARGIN`] of it (for renewals
//!    a heartbeat late): the new key signs; both are still accepted, for
//!    the tickets the old one signed.
//! 3. **Done** a lifetime and its clock allowance after the switch, when
//!    every ticket the old key signed has expired: only the new key is
//!    accepted, and renewals hand out only it.
//!
//! A rotation asked for before the last one is done is refused, naming
//! when it will be.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ring::signature::{Ed25519KeyPair, KeyPair};
use serde::{Deserialize, Serialize};

use super::tickets::{sign, CertificateHash, Claims, MAX_CLOCK_SKEW, NODE_TICKET};
use super::CredentialError;
use crate::wire::{NodeIdentity, PeerIdentity, PeerRole, Ticket};

/// How long a node ticket is valid unless the head is told otherwise
/// (`--ticket-lifetime-s`; `tickets.rs`, step 7).
pub const DEFAULT_TICKET_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// The share of a lifetime past `t0 + L` the new key waits before it
/// signs (step 2): 1/4.
pub const SWITCH_MARGIN: u32 = 4;

/// A new random Ed25519 key, PKCS#8-encoded: what a head keeps in its
/// store (`head/store.rs`) so that a restarted head certifies as before.
pub fn generate_pkcs8() -> Result<Vec<u8>, CredentialError> {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng)
        .map_err(|_| CredentialError::Tls("cannot generate the head's ticket key".into()))?;
    Ok(pkcs8.as_ref().to_vec())
}

/// A rotation under way, as the head's store keeps it (steps 1–3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rotation {
    /// The new key, PKCS#8-encoded.
    #[serde(with = "serde_bytes")]
    pub next: Vec<u8>,
    /// When it signs (step 2), in seconds since the Unix epoch.
    pub switch_at: u64,
    /// When the old key stops being accepted (step 3).
    pub done_at: u64,
}

/// Why a rotation was not started.
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    /// One is under way.
    #[error("a rotation of the ticket key is under way: the old key is accepted until {done_at} (Unix seconds, {in_s} s from now); ask again after that")]
    UnderWay {
        /// When it is done.
        done_at: u64,
        /// How long from now.
        in_s: u64,
    },
    /// The new key could not be made.
    #[error(transparent)]
    Key(#[from] CredentialError),
}

/// A key and its PKCS#8 encoding.
struct SigningKey {
    pair: Ed25519KeyPair,
    pkcs8: Vec<u8>,
}

impl SigningKey {
    fn from_pkcs8(pkcs8: &[u8]) -> Result<Self, CredentialError> {
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8)
            .map_err(|e| CredentialError::Tls(format!("the head's ticket key: {e}")))?;
        Ok(SigningKey {
            pair,
            pkcs8: pkcs8.to_vec(),
        })
    }

    fn public(&self) -> Vec<u8> {
        self.pair.public_key().as_ref().to_vec()
    }
}

/// The keys: the one signing before any rotation, and the rotation under
/// way (its times) if any.
struct KeyRing {
    current: SigningKey,
    rotation: Option<(SigningKey, u64, u64)>,
}

impl KeyRing {
    /// Forgets the old key of a rotation done by `now` (step 3).
    fn settle(&mut self, now: u64) {
        if self
            .rotation
            .as_ref()
            .is_some_and(|(_, _, done)| now >= *done)
        {
            if let Some((next, _, _)) = self.rotation.take() {
                self.current = next;
            }
        }
    }

    fn signing(&self, now: u64) -> &SigningKey {
        match &self.rotation {
            Some((next, switch_at, _)) if now >= *switch_at => next,
            _ => &self.current,
        }
    }

    fn accepted(&self, now: u64) -> Vec<Vec<u8>> {
        let signing = self.signing(now);
        let mut keys = vec![signing.public()];
        if let Some((next, _, _)) = &self.rotation {
            let other = if std::ptr::eq(signing, next) {
                &self.current
            } else {
                next
            };
            keys.push(other.public());
        }
        keys
    }
}

/// The head's ticket keys: it certifies nodes (`tickets.rs`, step 2) for
/// its ticket lifetime (step 7) and rotates its key on request (this
/// module's steps).
pub struct TicketAuthority {
    ring: Mutex<KeyRing>,
    lifetime: Duration,
}

impl TicketAuthority {
    /// A new random key, for one head process.
    pub fn generate() -> Result<Self, CredentialError> {
        Self::from_pkcs8(&generate_pkcs8()?)
    }

    /// The key `pkcs8` encodes (from [`generate_pkcs8`]).
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<Self, CredentialError> {
        Ok(TicketAuthority {
            ring: Mutex::new(KeyRing {
                current: SigningKey::from_pkcs8(pkcs8)?,
                rotation: None,
            }),
            lifetime: DEFAULT_TICKET_LIFETIME,
        })
    }

    /// With the rotation its store kept, under way or done.
    pub fn with_rotation(self, rotation: Option<&Rotation>) -> Result<Self, CredentialError> {
        if let Some(rotation) = rotation {
            let next = SigningKey::from_pkcs8(&rotation.next)?;
            self.ring().rotation = Some((next, rotation.switch_at, rotation.done_at));
        }
        Ok(self)
    }

    /// Signs node tickets valid for `lifetime` (at least a second).
    pub fn with_lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime.max(Duration::from_secs(1));
        self
    }

    fn ring(&self) -> MutexGuard<'_, KeyRing> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The public keys a ticket may be signed by at `now`, the signing
    /// one first: what every node and worker checks tickets with.
    pub fn public_keys(&self, now: u64) -> Vec<Vec<u8>> {
        let mut ring = self.ring();
        ring.settle(now);
        ring.accepted(now)
    }

    /// Starts a rotation at `now` (step 1): the key to keep as the
    /// current one (PKCS#8) and the rotation, for the head's store.
    pub fn rotate(&self, now: u64) -> Result<(Vec<u8>, Rotation), RotationError> {
        let mut ring = self.ring();
        ring.settle(now);
        if let Some((_, _, done_at)) = &ring.rotation {
            return Err(RotationError::UnderWay {
                done_at: *done_at,
                in_s: done_at.saturating_sub(now),
            });
        }
        let next = SigningKey::from_pkcs8(&generate_pkcs8()?)?;
        let life = self.lifetime.as_secs();
        let switch_at = now + life + life / u64::from(SWITCH_MARGIN);
        let skew = (life / 10).min(MAX_CLOCK_SKEW.as_secs());
        let rotation = Rotation {
            next: next.pkcs8.clone(),
            switch_at,
            done_at: switch_at + life + skew,
        };
        ring.rotation = Some((next, rotation.switch_at, rotation.done_at));
        Ok((ring.current.pkcs8.clone(), rotation))
    }

    /// A ticket for node `node`, connected with `certificate`, whose
    /// workers' tickets `signs_workers` signs, valid from `now` (seconds
    /// since the Unix epoch) for the authority's lifetime, signed by the
    /// key that signs at `now`.
    pub fn certify_node(
        &self,
        node: &NodeIdentity,
        certificate: CertificateHash,
        signs_workers: &[u8],
        now: u64,
    ) -> Ticket {
        let claims = Claims {
            subject: PeerIdentity {
                role: PeerRole::Node,
                identity: node.clone(),
            },
            certificate: certificate.0.to_vec(),
            host: node.clone(),
            signs_workers: signs_workers.to_vec(),
            scope: None,
            issued_at: now,
            expires_at: now.saturating_add(self.lifetime.as_secs()),
        };
        let claims = rmp_serde::to_vec_named(&claims).unwrap_or_default();
        let mut ring = self.ring();
        ring.settle(now);
        let signature = sign(&ring.signing(now).pair, NODE_TICKET, &claims);
        Ticket {
            claims,
            signature,
            issuer: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::tickets::{TicketError, Verifier};
    use crate::wire::{Incarnation, Proof};

    fn verifier(keys: &[Vec<u8>]) -> Verifier {
        let mut verifier =
            Verifier::with_token(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"k"));
        verifier.set_head_keys(keys.to_vec());
        verifier
    }

    #[test]
    fn a_rotation_announces_the_new_key_then_signs_with_it_then_forgets_the_old_one() {
        let head = TicketAuthority::generate()
            .unwrap()
            .with_lifetime(Duration::from_secs(100));
        let n1 = NodeIdentity {
            name: "n1".into(),
            incarnation: Incarnation(1),
        };
        let as_n1 = PeerIdentity {
            role: PeerRole::Node,
            identity: n1.clone(),
        };
        let cert = CertificateHash::of(b"n1");
        let t0 = 1_000_000;
        let old = head.public_keys(t0);
        assert_eq!(old.len(), 1);
        let (current, rotation) = head.rotate(t0).unwrap();
        assert_eq!(rotation.switch_at, t0 + 125, "a lifetime and a quarter");
        assert_eq!(
            rotation.done_at,
            t0 + 125 + 100 + 10,
            "a lifetime and its allowance"
        );
        let again = head.rotate(t0 + 1);
        assert!(
            matches!(again, Err(RotationError::UnderWay { in_s: 234, .. })),
            "{again:?}"
        );
        // 1. Announced: the old key signs, both are handed out.
        let announced = head.public_keys(t0 + 1);
        assert_eq!(announced.len(), 2);
        assert_eq!(announced[0], old[0]);
        let new = announced[1].clone();
        let before = Proof::Ticket(head.certify_node(&n1, cert, b"", t0 + 120));
        verifier(&old)
            .check_at(&as_n1, &before, cert, t0 + 120)
            .unwrap();
        // 2. Switched: the new key signs; a process that still knew only
        // the old key would refuse its tickets, one that renewed accepts
        // both.
        let switch = rotation.switch_at;
        let after = Proof::Ticket(head.certify_node(&n1, cert, b"", switch));
        assert_eq!(head.public_keys(switch), vec![new.clone(), old[0].clone()]);
        let stale = verifier(&old).check_at(&as_n1, &after, cert, switch);
        assert!(
            matches!(stale, Err(TicketError::BadSignature(_))),
            "{stale:?}"
        );
        let renewed = verifier(&head.public_keys(switch));
        renewed.check_at(&as_n1, &after, cert, switch).unwrap();
        renewed.check_at(&as_n1, &before, cert, switch).unwrap();
        // 3. Done: the old key is forgotten; a restarted head, from what
        // its store kept, agrees at every phase.
        let restored = TicketAuthority::from_pkcs8(&current)
            .unwrap()
            .with_rotation(Some(&rotation))
            .unwrap()
            .with_lifetime(Duration::from_secs(100));
        for at in [t0 + 1, switch, rotation.done_at] {
            assert_eq!(restored.public_keys(at), head.public_keys(at), "at {at}");
        }
        let done = head.public_keys(rotation.done_at);
        assert_eq!(done, vec![new.clone()]);
        let forged_by_old = verifier(&done).check_at(&as_n1, &before, cert, t0 + 120);
        assert!(matches!(forged_by_old, Err(TicketError::BadSignature(_))));
        // The next rotation may begin.
        head.rotate(rotation.done_at).unwrap();
    }
}
