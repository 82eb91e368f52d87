//! Bulk stream tickets (`bulk.rs`, step 2): one-time, bound to the
//! certificate of the caller they were granted to, lapsing after
//! [`TICKET_TTL`], at most [`MAX_GRANTS`] waiting. Each has an admission
//! tag ([`BulkTicket::admission`]) that the dialer sends before its TLS
//! handshake: the listener starts a handshake (a signature) only for a
//! tag of a waiting grant, once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::tickets::CertificateHash;

/// How long a granted ticket waits for its stream.
pub const TICKET_TTL: Duration = Duration::from_secs(10);
/// The most tickets waiting at once.
pub const MAX_GRANTS: usize = 1024;

/// What the admission tag of a ticket is the hash of, with the ticket.
const ADMISSION_LABEL: &[u8] = b"nimbus bulk admission v1";

/// A one-time permission to open one bulk stream (step 2).
#[derive(Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct BulkTicket(pub [u8; 16]);

impl BulkTicket {
    /// The tag the dialer sends in the clear before its TLS handshake
    /// (`bulk.rs`, step 3): the first 16 bytes of SHA-256(label ‖
    /// ticket). It shows that the dialer was granted a stream, not the
    /// ticket, which only the TLS session carries.
    pub fn admission(&self) -> [u8; 16] {
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        context.update(ADMISSION_LABEL);
        context.update(&self.0);
        let digest = context.finish();
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&digest.as_ref()[..16]);
        tag
    }
}

impl std::fmt::Debug for BulkTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BulkTicket(<redacted>)")
    }
}

/// The tickets a server granted and not yet honoured, with what each
/// grants (`G`).
pub struct BulkGrants<G> {
    pub(super) port: u16,
    pub(super) waiting: Arc<Mutex<HashMap<BulkTicket, Granted<G>>>>,
}

/// What a waiting ticket grants, to whom, since when.
pub(super) struct Granted<G> {
    what: G,
    grantee: CertificateHash,
    at: Instant,
    /// Its ticket's admission tag, until a connection presents it.
    admission: Option<[u8; 16]>,
}

impl<G> Clone for BulkGrants<G> {
    fn clone(&self) -> Self {
        BulkGrants {
            port: self.port,
            waiting: self.waiting.clone(),
        }
    }
}

impl<G> BulkGrants<G> {
    /// The port of the listener the tickets are for.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A ticket for one stream carrying `what` to the holder of the
    /// certificate `grantee` (step 2).
    pub fn grant(&self, what: G, grantee: CertificateHash) -> BulkTicket {
        let mut ticket = [0u8; 16];
        rand::fill(&mut ticket);
        let ticket = BulkTicket(ticket);
        let now = Instant::now();
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.retain(|_, granted| now.duration_since(granted.at) < TICKET_TTL);
        if waiting.len() >= MAX_GRANTS {
            let oldest = waiting
                .iter()
                .min_by_key(|(_, granted)| granted.at)
                .map(|(t, _)| *t);
            if let Some(oldest) = oldest {
                waiting.remove(&oldest);
            }
        }
        let granted = Granted {
            what,
            grantee,
            at: now,
            admission: Some(ticket.admission()),
        };
        waiting.insert(ticket, granted);
        ticket
    }

    /// Whether `tag` is the admission tag of a waiting, fresh ticket whose
    /// tag no connection presented yet (it is then spent): a connection
    /// without one is closed before its TLS handshake.
    pub(super) fn admit(&self, tag: &[u8; 16]) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let found = waiting.values_mut().find(|granted| {
            granted.admission.as_ref() == Some(tag) && granted.at.elapsed() < TICKET_TTL
        });
        found.map(|granted| granted.admission.take()).is_some()
    }

    /// What `ticket` grants the holder of `presented`, once: nothing when
    /// it was never granted, has lapsed, or is another certificate's (it
    /// is spent all the same).
    pub(super) fn redeem(&self, ticket: &BulkTicket, presented: CertificateHash) -> Option<G> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        let granted = waiting.remove(ticket)?;
        let fresh = granted.at.elapsed() < TICKET_TTL;
        (fresh && granted.grantee == presented).then_some(granted.what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tickets_admission_tag_admits_one_connection() {
        let grants = BulkGrants {
            port: 1,
            waiting: Arc::default(),
        };
        let holder = CertificateHash([1; 32]);
        let ticket = grants.grant("object 7", holder);
        assert!(!grants.admit(&[0; 16]), "a stranger's tag");
        assert!(!grants.admit(&ticket.0), "the ticket itself is not the tag");
        assert!(grants.admit(&ticket.admission()));
        assert!(!grants.admit(&ticket.admission()), "spent");
        assert_eq!(grants.redeem(&ticket, holder), Some("object 7"));
    }

    #[test]
    fn tickets_lapse_and_are_bounded() {
        let grants: BulkGrants<usize> = BulkGrants {
            port: 1,
            waiting: Arc::default(),
        };
        let holder = CertificateHash([1; 32]);
        let first = grants.grant(0, holder);
        for i in 1..=MAX_GRANTS {
            grants.grant(i, holder);
        }
        assert_eq!(grants.waiting.lock().unwrap().len(), MAX_GRANTS);
        assert_eq!(
            grants.redeem(&first, holder),
            None,
            "the oldest lapsed first"
        );
        let late = grants.grant(99, holder);
        grants.waiting.lock().unwrap().get_mut(&late).unwrap().at = Instant::now() - TICKET_TTL;
        assert_eq!(grants.redeem(&late, holder), None, "a ticket past its time");
        let taken = grants.grant(7, holder);
        let other = CertificateHash([2; 32]);
        assert_eq!(
            grants.redeem(&taken, other),
            None,
            "another certificate's ticket"
        );
        assert_eq!(
            grants.redeem(&taken, holder),
            None,
            "spent by the wrong holder"
        );
        let right = grants.grant(8, holder);
        assert_eq!(grants.redeem(&right, holder), Some(8));
    }
}
