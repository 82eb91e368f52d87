//! Cluster credentials: the join token, and the certificates derived from it.
//!
//! `nimbus start --head` creates a [`JoinToken`]: 32 random bytes. Every
//! holder of the token derives the same Ed25519 key from it, and with that
//! key the same cluster CA. Each process then issues itself a fresh
//! certificate signed by that CA, and every QUIC connection is TLS 1.3 with
//! both certificates checked against the CA. A process without the token
//! cannot produce a certificate the others accept, so it can neither join
//! nor call anything: the TLS handshake fails before any nimbus byte is read.
//!
//! The CA key never leaves the process and is never written to disk; the
//! token is the only secret, so treat it like a password.
//!
//! A token holder also proves it holds the token in its `Hello` (an HMAC of
//! its certificate), so that a process with a certificate but no token (a
//! worker, whose certificate its node issued with
//! [`Credentials::for_worker`]) cannot pass for one (`tickets.rs`). Nor
//! can it serve as one: its certificate is valid only for the server name
//! [`WORKER_SERVER_NAME`], which a dialer asks for only when it means to
//! reach a worker ([`SERVER_NAME`] otherwise).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PKCS_ED25519,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde::{Deserialize, Serialize};

use super::tickets::{self, CertificateHash, Verifier};
use crate::wire::Proof;

/// The server name the certificates of token holders (nodes, the head,
/// drivers, the CLI) carry, which a dialer asks for unless it means to
/// reach a worker.
pub(crate) const SERVER_NAME: &str = "nimbus";
/// The server name a worker's certificate carries instead, and a dialer
/// asks for when it means to reach a worker: a worker's certificate is no
/// valid server certificate for anyone else, so actor code cannot answer
/// as the head or a node.
pub(crate) const WORKER_SERVER_NAME: &str = "worker.nimbus";
/// The ALPN protocol of nimbus connections.
pub(crate) const ALPN: &[u8] = b"nimbus";

const TOKEN_PREFIX: &str = "nimbus1-";
const TOKEN_SECRET_BYTES: usize = 32;
/// PKCS#8 v1 header of an Ed25519 private key; the 32-byte seed follows.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// Problems with credentials.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The token is not one `nimbus start --head` printed.
    #[error("invalid join token: {0} (expected the `token:` line `nimbus start --head` printed, `{TOKEN_PREFIX}...`)")]
    InvalidToken(&'static str),
    /// Certificate generation failed.
    #[error("cannot issue a node certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    /// The TLS configuration was refused.
    #[error("cannot build the TLS configuration: {0}")]
    Tls(String),
}

/// What the dashboard credential is the MAC of.
const DASHBOARD_CREDENTIAL_LABEL: &[u8] = b"nimbus dashboard credential v1";

/// The secret that admits a process to a cluster.
///
/// ```
/// use nimbus::transport::JoinToken;
/// let token = JoinToken::generate();
/// let again: JoinToken = token.to_string().parse().unwrap();
/// assert_eq!(token, again);
/// assert!("not-a-token".parse::<JoinToken>().is_err());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct JoinToken([u8; TOKEN_SECRET_BYTES]);

impl JoinToken {
    /// A new random token.
    pub fn generate() -> Self {
        let mut secret = [0u8; TOKEN_SECRET_BYTES];
        rand::fill(&mut secret);
        JoinToken(secret)
    }
}

impl fmt::Display for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.0);
        write!(f, "{TOKEN_PREFIX}{encoded}")
    }
}

impl fmt::Debug for JoinToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JoinToken(<redacted>)")
    }
}

impl FromStr for JoinToken {
    type Err = CredentialError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let encoded = s
            .trim()
            .strip_prefix(TOKEN_PREFIX)
            .ok_or(CredentialError::InvalidToken("missing prefix"))?;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(encoded)
            .map_err(|_| CredentialError::InvalidToken("not base64url"))?;
        let secret = bytes
            .try_into()
            .map_err(|_| CredentialError::InvalidToken("wrong length"))?;
        Ok(JoinToken(secret))
    }
}

impl JoinToken {
    /// The dashboard's sign-in credential beyond loopback
    /// (`crate::dashboard`, step 3), `nimbus-dashboard1-<base64url>`: the
    /// HMAC-SHA256 of a fixed label under this token, so one who holds it
    /// can look at the cluster but not derive the token.
    ///
    /// ```
    /// use nimbus::transport::JoinToken;
    /// let token = JoinToken::generate();
    /// let credential = token.dashboard_credential();
    /// assert!(credential.starts_with("nimbus-dashboard1-"));
    /// assert_eq!(credential, token.dashboard_credential());
    /// assert_ne!(credential, JoinToken::generate().dashboard_credential());
    /// ```
    pub fn dashboard_credential(&self) -> String {
        let mac = ring::hmac::sign(&self.mac_key(), DASHBOARD_CREDENTIAL_LABEL);
        let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.as_ref());
        format!("nimbus-dashboard1-{encoded}")
    }

    /// The key of this token's proofs (`tickets.rs`, step 1).
    pub(super) fn mac_key(&self) -> ring::hmac::Key {
        ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &self.0)
    }
}

/// Makes this process, which holds the token, undumpable
/// (`prctl(PR_SET_DUMPABLE, 0)`): other processes of its user, such as the
/// workers a node starts (user code), can then neither trace it nor read
/// its memory, environment or file descriptors through `/proc`, and it
/// writes no core dump. Root still can. A program it executes is dumpable
/// again (the kernel resets the flag on exec): its workers are unaffected.
pub fn undumpable() -> std::io::Result<()> {
    // SAFETY: prctl with PR_SET_DUMPABLE takes plain integers and touches
    // no memory of ours.
    match unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// A process's TLS identity in a cluster: the cluster CA and a certificate
/// signed by it, and the token's proof key when it holds the token.
pub struct Credentials {
    ca: CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivatePkcs8KeyDer<'static>,
    token: Option<ring::hmac::Key>,
}

/// A worker's credentials as its node hands them over (in the worker's
/// boot message): a certificate and its key, never the token.
#[derive(Clone, Serialize, Deserialize)]
pub struct WorkerCredentials {
    #[serde(with = "serde_bytes")]
    ca: Vec<u8>,
    #[serde(with = "serde_bytes")]
    certificate: Vec<u8>,
    #[serde(with = "serde_bytes")]
    key: Vec<u8>,
}

impl fmt::Debug for WorkerCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WorkerCredentials(<redacted>)")
    }
}

impl Credentials {
    /// Derives the cluster CA from `token` and issues a certificate for
    /// `subject` (a node or client name, for logs).
    pub fn issue(token: &JoinToken, subject: &str) -> Result<Self, CredentialError> {
        let mut credentials = Self::certified(token, subject, SERVER_NAME)?;
        credentials.token = Some(token.mac_key());
        Ok(credentials)
    }

    /// A certificate of the cluster of `token` for a worker `subject`,
    /// without the token: its holder cannot prove it holds the token, nor
    /// make another certificate, and it serves only as a worker (its
    /// server name is `worker.nimbus`).
    pub fn for_worker(token: &JoinToken, subject: &str) -> Result<Self, CredentialError> {
        Self::certified(token, subject, WORKER_SERVER_NAME)
    }

    /// A fresh certificate for `subject`, valid as a server named
    /// `server_name`, signed by the CA of `token`'s cluster.
    fn certified(
        token: &JoinToken,
        subject: &str,
        server_name: &str,
    ) -> Result<Self, CredentialError> {
        let seed = ring::digest::digest(
            &ring::digest::SHA256,
            &[b"nimbus cluster CA v1".as_slice(), &token.0].concat(),
        );
        let mut ca_pkcs8 = ED25519_PKCS8_PREFIX.to_vec();
        ca_pkcs8.extend_from_slice(seed.as_ref());
        let ca_key = KeyPair::from_pkcs8_der_and_sign_algo(
            &PrivatePkcs8KeyDer::from(ca_pkcs8),
            &PKCS_ED25519,
        )?;
        let ca_params = ca_params();
        let ca = ca_params.self_signed(&ca_key)?;

        let key = KeyPair::generate_for(&PKCS_ED25519)?;
        let mut params = CertificateParams::new(vec![server_name.to_string()])?;
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, subject.to_string());
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params.signed_by(&key, &Issuer::new(ca_params, ca_key))?;
        Ok(Credentials {
            ca: ca.der().clone(),
            chain: vec![cert.der().clone()],
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
            token: None,
        })
    }

    /// These credentials as a node hands them to its worker; refused for
    /// credentials that hold the token.
    pub fn to_worker(&self) -> Option<WorkerCredentials> {
        match self.token {
            Some(_) => None,
            None => Some(WorkerCredentials {
                ca: self.ca.to_vec(),
                certificate: self.chain[0].to_vec(),
                key: self.key.secret_pkcs8_der().to_vec(),
            }),
        }
    }

    /// A worker's credentials, as its node handed them over.
    pub fn from_worker(worker: WorkerCredentials) -> Self {
        Credentials {
            ca: CertificateDer::from(worker.ca),
            chain: vec![CertificateDer::from(worker.certificate)],
            key: PrivatePkcs8KeyDer::from(worker.key),
            token: None,
        }
    }

    /// The SHA-256 of this process's certificate, which tickets name.
    pub fn certificate_hash(&self) -> CertificateHash {
        CertificateHash::of(&self.chain[0])
    }

    /// What this process offers in its `Hello` before it has a ticket.
    pub(crate) fn proof(&self) -> Proof {
        match &self.token {
            Some(key) => tickets::token_proof(key, self.certificate_hash()),
            None => Proof::None,
        }
    }

    /// What this process can check of its callers' proofs.
    pub(crate) fn verifier(&self) -> Verifier {
        match &self.token {
            Some(key) => Verifier::with_token(key.clone()),
            None => Verifier::default(),
        }
    }

    /// TLS for accepting connections: clients must present a certificate of
    /// this cluster.
    pub(crate) fn server_tls(&self) -> Result<rustls::ServerConfig, CredentialError> {
        let provider = provider();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots()?,
            provider.clone(),
        )
        .build()
        .map_err(tls_error)?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_error)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                self.chain.clone(),
                PrivateKeyDer::Pkcs8(self.key.clone_key()),
            )
            .map_err(tls_error)?;
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(config)
    }

    /// TLS for dialing: the server must present a certificate of this
    /// cluster, and this process presents its own.
    pub(crate) fn client_tls(&self) -> Result<rustls::ClientConfig, CredentialError> {
        let mut config = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_error)?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(
                self.chain.clone(),
                PrivateKeyDer::Pkcs8(self.key.clone_key()),
            )
            .map_err(tls_error)?;
        config.alpn_protocols = vec![ALPN.to_vec()];
        Ok(config)
    }

    fn roots(&self) -> Result<Arc<rustls::RootCertStore>, CredentialError> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.clone()).map_err(tls_error)?;
        Ok(Arc::new(roots))
    }
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, "nimbus cluster CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_error(e: impl fmt::Display) -> CredentialError {
    CredentialError::Tls(e.to_string())
}
