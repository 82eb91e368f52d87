//! The dashboard's TLS: a dashboard bound beyond loopback serves HTTPS
//! only, so that the sign-in credential and the session cookie never cross
//! the network in the clear.
//!
//! 1. With `--dashboard-tls-cert PEM --dashboard-tls-key PEM`, those (a
//!    certificate chain, leaf first, and its private key).
//! 2. Otherwise a self-signed ECDSA P-256 certificate for the names the
//!    dashboard is reached by, made at the first start and kept in
//!    [`SELF_SIGNED_DIR`] under `$NIMBUS_HOME` (`cert.pem`, `key.pem`,
//!    0600 in a 0700 directory) so that a browser's exception for it
//!    survives restarts. `nimbus start` prints its SHA-256 fingerprint,
//!    to compare with the one the browser shows.
//! 3. A client has `crate::metrics`' `HANDSHAKE_TIMEOUT` to finish the
//!    handshake, as it has `HEADER_READ_TIMEOUT` for its headers: an idle
//!    socket holds no connection slot for long.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use super::DashboardError;

/// Where the self-signed certificate is kept, under `$NIMBUS_HOME`.
pub const SELF_SIGNED_DIR: &str = "dashboard-tls";

/// Where the dashboard's certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsSource {
    /// A certificate chain and its key, PEM files (step 1).
    Files {
        /// The chain, leaf first.
        cert: PathBuf,
        /// Its private key.
        key: PathBuf,
    },
    /// A self-signed certificate kept in `dir` (step 2), made for `names`
    /// (DNS names or IP addresses) when there is none yet.
    SelfSigned {
        /// `$NIMBUS_HOME/dashboard-tls`.
        dir: PathBuf,
        /// What it is reached by.
        names: Vec<String>,
    },
}

/// The dashboard's TLS, ready to accept.
#[derive(Clone)]
pub struct DashboardTls {
    pub(super) acceptor: TlsAcceptor,
    /// The SHA-256 of the leaf certificate, `AB:CD:...`.
    pub fingerprint: String,
}

impl DashboardTls {
    /// Loads (or, for [`TlsSource::SelfSigned`], makes once) the
    /// certificate and key.
    pub fn load(source: &TlsSource) -> Result<Self, DashboardError> {
        let (chain, key) = match source {
            TlsSource::Files { cert, key } => (read_chain(cert)?, read_key(key)?),
            TlsSource::SelfSigned { dir, names } => self_signed(dir, names)?,
        };
        let fingerprint = chain
            .first()
            .map(|leaf| fingerprint(leaf))
            .ok_or_else(|| tls_error(source_path(source), "no certificate in it".into()))?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|e| tls_error(source_path(source), e.to_string()))?;
        Ok(DashboardTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            fingerprint,
        })
    }
}

fn source_path(source: &TlsSource) -> &Path {
    match source {
        TlsSource::Files { cert, .. } => cert,
        TlsSource::SelfSigned { dir, .. } => dir,
    }
}

fn tls_error(path: &Path, detail: String) -> DashboardError {
    DashboardError::Tls {
        path: path.to_path_buf(),
        detail,
    }
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, DashboardError> {
    CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| tls_error(path, format!("not a PEM certificate chain: {e}")))
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, DashboardError> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| tls_error(path, format!("not a PEM private key: {e}")))
}

/// Step 2: the kept certificate, or a new one for `names`, written first.
fn self_signed(
    dir: &Path,
    names: &[String],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), DashboardError> {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    if !cert.exists() || !key.exists() {
        let made = rcgen::generate_simple_self_signed(names.to_vec())
            .map_err(|e| tls_error(dir, format!("cannot make a certificate: {e}")))?;
        let write = |path: &Path, pem: String| {
            crate::host::files::write_private(path, pem.as_bytes())
                .map_err(|e| tls_error(path, format!("cannot write it: {e}")))
        };
        crate::host::files::private_dir(dir)
            .map_err(|e| tls_error(dir, format!("cannot create it: {e}")))?;
        write(&key, made.signing_key.serialize_pem())?;
        write(&cert, made.cert.pem())?;
        tracing::info!(
            "dashboard: made a self-signed certificate for {} in {}",
            names.join(", "),
            dir.display()
        );
    }
    Ok((read_chain(&cert)?, read_key(&key)?))
}

/// The SHA-256 of `cert`, as browsers show it: `AB:CD:...`.
fn fingerprint(cert: &CertificateDer<'_>) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, cert.as_ref());
    digest
        .as_ref()
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::dashboard::{DashboardConfig, DashboardListener};

    /// Step 3 of the dashboard: every address, no certificate: refused.
    #[test]
    fn a_bind_beyond_loopback_without_a_certificate_is_refused() {
        let config = DashboardConfig {
            host: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port: 0,
            tls: None,
        };
        let refused = DashboardListener::bind(config).err().unwrap();
        assert!(matches!(refused, DashboardError::NoTls(_)), "{refused}");
        assert!(refused.to_string().contains("cleartext"), "{refused}");
    }

    /// Step 2: made once (0600 files), the same one after.
    #[test]
    fn a_self_signed_certificate_is_made_once_and_kept() {
        let home = tempfile::TempDir::new().unwrap();
        let source = TlsSource::SelfSigned {
            dir: home.path().join(SELF_SIGNED_DIR),
            names: vec!["127.0.0.1".into(), "localhost".into()],
        };
        let first = DashboardTls::load(&source).unwrap();
        let again = DashboardTls::load(&source).unwrap();
        assert_eq!(first.fingerprint, again.fingerprint);
        assert_eq!(first.fingerprint.len(), 95, "{}", first.fingerprint);
        for file in ["cert.pem", "key.pem"] {
            let path = home.path().join(SELF_SIGNED_DIR).join(file);
            let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", path.display());
        }
        let files = TlsSource::Files {
            cert: home.path().join("none.pem"),
            key: home.path().join("none.key"),
        };
        let missing = DashboardTls::load(&files).err().unwrap();
        assert!(missing.to_string().contains("none.pem"), "{missing}");
    }
}
