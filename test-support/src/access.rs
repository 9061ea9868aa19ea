//! How the test clients reach a service that asks for a secret or speaks TLS (PROTOCOL.md §15):
//! the bearer secret they present, the certificate they trust, and a self-signed certificate
//! made on the spot (rcgen), so no key is ever checked in.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

/// A secret of the accepted length for tests that need one.
pub const TEST_SECRET: &str = "test-secret-0123456789abcdef";

/// What a client presents and trusts; the default presents nothing over plain HTTP.
#[derive(Clone, Default)]
pub struct Credentials {
    /// Sent as `Authorization: Bearer <secret>`.
    pub secret: Option<String>,
    /// Speak TLS, trusting these roots.
    pub tls: Option<Arc<ClientConfig>>,
}

impl Credentials {
    pub fn bearer(secret: &str) -> Credentials {
        Credentials {
            secret: Some(secret.to_string()),
            tls: None,
        }
    }

    /// An awc client that presents the secret on every request and handshake, without awc's
    /// 5 s limit on a request (see [`crate::client::http_client`]).
    pub fn client(&self) -> awc::Client {
        let builder = awc::Client::builder().disable_timeout();
        let builder = match &self.secret {
            Some(s) => builder.add_default_header(("authorization", format!("Bearer {s}"))),
            None => builder,
        };
        match &self.tls {
            Some(tls) => builder
                .connector(awc::Connector::new().rustls_0_23(tls.clone()))
                .finish(),
            None => builder.finish(),
        }
    }

    /// `https` or `http`.
    pub fn http(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// `wss` or `ws`.
    pub fn ws(&self) -> &'static str {
        if self.tls.is_some() {
            "wss"
        } else {
            "ws"
        }
    }

    /// The credentials a service started with `args` asks for: its `--secret`, if any.
    pub fn for_args(args: &[&str]) -> Credentials {
        let secret = args
            .windows(2)
            .find(|w| w[0] == "--secret")
            .map(|w| w[1].to_string());
        Credentials { secret, tls: None }
    }
}

/// A self-signed certificate for `localhost` and 127.0.0.1, written as PEM files into a
/// temporary folder (removed on drop).
pub struct TestCert {
    pub dir: tempfile::TempDir,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub pem: String,
}

impl TestCert {
    pub fn localhost() -> TestCert {
        let made = rcgen::generate_simple_self_signed(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ])
        .expect("make a self-signed certificate");
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let pem = made.cert.pem();
        std::fs::write(&cert, &pem).expect("write cert");
        std::fs::write(&key, made.key_pair.serialize_pem()).expect("write key");
        TestCert {
            dir,
            cert,
            key,
            pem,
        }
    }

    /// `--tls-cert X --tls-key Y` for the service.
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            self.cert.display().to_string(),
            "--tls-key".into(),
            self.key.display().to_string(),
        ]
    }

    /// A server configuration serving this certificate (for a fake that speaks TLS).
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let chain = CertificateDer::pem_slice_iter(self.pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("PEM certificate");
        let key = PrivateKeyDer::from_pem_file(&self.key).expect("PEM key");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("certificate and key");
        Arc::new(config)
    }

    /// A client configuration that trusts this certificate only (ALPN http/1.1).
    pub fn client_config(&self) -> Arc<ClientConfig> {
        trusting(&self.pem)
    }
}

/// A client configuration that trusts the PEM certificates in `pem` only (ALPN http/1.1).
pub fn trusting(pem: &str) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        roots.add(cert.expect("PEM certificate")).expect("root");
    }
    let mut config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}
