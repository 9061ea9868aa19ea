//! TLS configuration (PROTOCOL.md §15, §4): the server side for `--tls-cert`/`--tls-key` (HTTPS
//! and `wss://` on `--port`), and the client side for a `wss://` change source (the system's
//! roots plus `--upstream-ca-file`).
//!
//! The server's certificate and key are re-read without a restart (PROTOCOL.md §15.1): its
//! configuration resolves every handshake's pair through [`LiveCert`], which reads the latest
//! pair the reloader published ([`crate::reload`]); a connection keeps the pair of its own
//! handshake, so open ones are not touched.
//!
//! Both sides use rustls with `ring` as the one crypto provider, named here rather than left to
//! a process-wide default, and TLS 1.2 or 1.3 only. Every file is read and checked here, so a
//! missing, unreadable or mismatched one stops the start with a message naming its flag, never
//! the first connection.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::sync::watch;

/// A TLS file or setting that cannot be used, and the flag it came from.
#[derive(Debug, thiserror::Error)]
#[error("--{flag}: {reason}")]
pub struct TlsError {
    /// The flag's long name, which is also its id with `-` for `_`.
    pub flag: &'static str,
    pub reason: String,
}

impl TlsError {
    fn new(flag: &'static str, reason: impl Into<String>) -> TlsError {
        TlsError {
            flag,
            reason: reason.into(),
        }
    }

    /// The clap id of the flag (for naming its environment variable).
    pub fn flag_id(&self) -> &'static str {
        match self.flag {
            "tls-cert" => "tls_cert",
            "tls-key" => "tls_key",
            _ => "upstream_ca_file",
        }
    }
}

/// The protocol versions served and spoken: TLS 1.3 and 1.2, nothing older.
const VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `--tls-cert` and `--tls-key`: both or neither (`None`).
pub fn server_files<'a>(
    cert: Option<&'a Path>,
    key: Option<&'a Path>,
) -> Result<Option<(&'a Path, &'a Path)>, TlsError> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(TlsError::new(
            "tls-key",
            "missing: --tls-cert needs its key",
        )),
        (None, Some(_)) => Err(TlsError::new(
            "tls-cert",
            "missing: --tls-key needs its certificate chain",
        )),
        (Some(c), Some(k)) => Ok(Some((c, k))),
    }
}

/// The certificate chain of `cert` and the key of `key`, read and checked to go together.
pub fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(cert, "tls-cert")?;
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
        TlsError::new(
            "tls-key",
            format!("no PEM private key read from {}: {e}", key.display()),
        )
    })?;
    CertifiedKey::from_der(chain, der, &provider()).map_err(|e| {
        TlsError::new(
            "tls-key",
            format!("does not go with --tls-cert {}: {e}", cert.display()),
        )
    })
}

/// Resolves every handshake to the pair last published on its channel (PROTOCOL.md §15.1).
#[derive(Debug)]
pub struct LiveCert(pub watch::Receiver<Arc<CertifiedKey>>);

impl ResolvesServerCert for LiveCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.borrow().clone())
    }
}

/// The server configuration whose handshakes use the pair `cert` publishes.
pub fn server_config(
    cert: watch::Receiver<Arc<CertifiedKey>>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(VERSIONS)
        .map_err(|e| TlsError::new("tls-cert", e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(LiveCert(cert)));
    Ok(Arc::new(config))
}

/// The client configuration for a `wss://` change source: the system's trusted roots, plus
/// those of `ca_file`. A system without readable roots is not an error while `ca_file` gives
/// some; with neither, no server could be verified, and that is.
pub fn upstream_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore::empty();
    let system = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(system.certs);
    if !system.errors.is_empty() {
        log::debug!("reading the system's trusted roots: {:?}", system.errors);
    }
    if let Some(path) = ca_file {
        let extra = certificates(path, "upstream-ca-file")?;
        let (ours, ignored) = roots.add_parsable_certificates(extra);
        if ours == 0 {
            return Err(TlsError::new(
                "upstream-ca-file",
                format!(
                    "{} holds no usable certificate ({ignored} ignored)",
                    path.display()
                ),
            ));
        }
        log::info!(
            "upstream TLS: {added} system roots and {ours} from {}",
            path.display()
        );
    } else if added == 0 {
        return Err(TlsError::new(
            "upstream-ca-file",
            "the system has no trusted roots to verify a wss:// change source; name some here",
        ));
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(VERSIONS)
        .map_err(|e| TlsError::new("upstream-ca-file", e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    // A websocket handshake is HTTP/1.1.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Every PEM certificate in `path` (at least one).
fn certificates(path: &Path, flag: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let unreadable = |e: &dyn std::fmt::Display| {
        TlsError::new(flag, format!("cannot read {}: {e}", path.display()))
    };
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| unreadable(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| unreadable(&e))?;
    if chain.is_empty() {
        return Err(TlsError::new(
            flag,
            format!("{} holds no PEM certificate", path.display()),
        ));
    }
    Ok(chain)
}
