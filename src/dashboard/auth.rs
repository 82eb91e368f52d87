//! Who may look: a dashboard's sessions, opened with the dashboard
//! credential beyond loopback or with its own secret on loopback (a plain
//! state machine, time passed in; the HTTP layer in `api.rs` reads and
//! sets the cookie).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use base64::Engine;

/// The cookie that carries a session id.
pub(crate) const COOKIE: &str = "nimbus_session";
/// A session ends this long after its login.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// At most this many sessions live at once; a login past it ends the
/// oldest.
pub(crate) const MAX_SESSIONS: usize = 1024;

/// The sessions of one dashboard.
pub(crate) struct Sessions {
    /// What a login must present: the cluster token, or a loopback
    /// dashboard's secret.
    token: String,
    /// Session id to the instant it expires.
    live: HashMap<String, Instant>,
}

impl Sessions {
    /// No sessions yet; a login must present `token`.
    pub(crate) fn new(token: String) -> Self {
        Sessions {
            token,
            live: HashMap::new(),
        }
    }

    /// A new session id if `presented` is the cluster token, else `None`.
    /// The comparison takes the same time wherever the texts differ.
    pub(crate) fn login(&mut self, presented: &str, now: Instant) -> Option<String> {
        if !same(presented.trim().as_bytes(), self.token.as_bytes()) {
            return None;
        }
        Some(self.open(now))
    }

    /// A new session id, for a caller that has shown what a login must
    /// present (a loopback dashboard's secret, in its URL).
    pub(crate) fn open(&mut self, now: Instant) -> String {
        self.live.retain(|_, expires| *expires > now);
        if self.live.len() >= MAX_SESSIONS {
            if let Some(oldest) = self
                .live
                .iter()
                .min_by_key(|(_, expires)| **expires)
                .map(|(id, _)| id.clone())
            {
                self.live.remove(&oldest);
            }
        }
        let id = new_session_id();
        self.live.insert(id.clone(), now + SESSION_TTL);
        id
    }

    /// Whether `presented` is what a login must present (the comparison
    /// takes the same time wherever the texts differ).
    pub(crate) fn is_key(&self, presented: &str) -> bool {
        same(presented.as_bytes(), self.token.as_bytes())
    }

    /// Whether `id` is a live session.
    pub(crate) fn check(&self, id: &str, now: Instant) -> bool {
        self.live.get(id).is_some_and(|expires| *expires > now)
    }

    /// Ends session `id`.
    pub(crate) fn logout(&mut self, id: &str) {
        self.live.remove(id);
    }
}

/// The value of cookie `name` in a `Cookie` header.
pub(crate) fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|pair| {
        let (key, value) = pair.trim().split_once('=')?;
        (key == name).then_some(value)
    })
}

/// A loopback dashboard's secret: 32 random bytes, URL-safe base64.
pub(crate) fn new_secret() -> String {
    new_session_id()
}

/// 32 random bytes from the operating system, URL-safe base64.
fn new_session_id() -> String {
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// `a == b`, comparing every byte whatever the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_token_opens_a_session_and_it_expires() {
        let now = Instant::now();
        let mut sessions = Sessions::new("nimbus1-secret".into());
        assert_eq!(sessions.login("nimbus1-secreT", now), None);
        assert_eq!(sessions.login("", now), None);
        let id = sessions.login(" nimbus1-secret\n", now).unwrap();
        assert!(sessions.check(&id, now));
        assert!(!sessions.check("forged", now));
        assert!(!sessions.check(&id, now + SESSION_TTL));
        sessions.logout(&id);
        assert!(!sessions.check(&id, now));
    }

    #[test]
    fn sessions_are_bounded() {
        let now = Instant::now();
        let mut sessions = Sessions::new("t".into());
        let first = sessions.login("t", now).unwrap();
        for i in 1..=MAX_SESSIONS as u64 {
            sessions.login("t", now + Duration::from_millis(i)).unwrap();
        }
        assert_eq!(sessions.live.len(), MAX_SESSIONS);
        assert!(!sessions.check(&first, now));
    }

    #[test]
    fn cookies_are_found_by_name() {
        let header = "a=1; nimbus_session=abc; b=2";
        assert_eq!(cookie(header, COOKIE), Some("abc"));
        assert_eq!(cookie(header, "c"), None);
    }
}
