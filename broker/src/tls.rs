//! TLS for the broker protocol: rustls on the `ring` provider, with
//! certificates and keys read from PEM files.
//!
//! `ring` rather than `aws-lc-rs`: it builds with the C compiler alone,
//! where `aws-lc-sys` wants cmake (and NASM on some targets) and takes
//! several times longer to compile. The provider is passed explicitly, so
//! a process that links both never has to pick a default.
//!
//! The server side ([`server_config`]) takes a certificate chain, its key
//! and, for mutual TLS, the CAs whose client certificates it accepts. The
//! client side ([`ClientTls`]) trusts the CAs it is given and checks the
//! server's name; [`crate::client::Connection::connect_tls`] uses it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file is missing, unreadable or holds nothing usable.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// rustls refused the configuration (a key that doesn't match the
    /// certificate, a CA that doesn't parse).
    #[error("TLS configuration refused: {0}")]
    Config(String),
    /// The server name is not a valid DNS name or IP address.
    #[error("invalid TLS server name {0:?}")]
    ServerName(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file, in file order (the leaf first for a chain).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |reason: String| TlsError::Pem {
        path: path.to_path_buf(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(e.to_string()))?;
    if certs.is_empty() {
        return Err(pem("no CERTIFICATE section".into()));
    }
    Ok(certs)
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::Pem {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn root_store(certs: Vec<CertificateDer<'static>>) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots
            .add(c)
            .map_err(|e| TlsError::Config(format!("a CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// A server configuration from PEM files: the certificate chain, its key
/// and, when given, the CAs a client certificate must chain to (mutual
/// TLS: a client without one is refused during the handshake).
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    server_config_from_der(
        load_certs(cert)?,
        load_key(key)?,
        client_ca.map(load_certs).transpose()?,
    )
}

/// [`server_config`] from certificates and a key already in memory.
pub fn server_config_from_der(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_cas: Option<Vec<CertificateDer<'static>>>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let cfg = |e: rustls::Error| TlsError::Config(e.to_string());
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(cfg)?;
    let builder = match client_cas {
        Some(cas) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(root_store(cas)?),
                provider(),
            )
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder.with_single_cert(chain, key).map_err(cfg)?;
    Ok(Arc::new(config))
}

/// How a client connects over TLS: whom it trusts, the name it expects
/// the server's certificate to carry and, for mutual TLS, its own
/// certificate.
#[derive(Clone)]
pub struct ClientTls {
    pub(crate) config: Arc<rustls::ClientConfig>,
    pub(crate) server_name: ServerName<'static>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Trusts the CA certificates of a PEM file; the server's certificate
    /// must name `server_name` (a DNS name or an IP address).
    pub fn from_ca_file(ca: &Path, server_name: &str) -> Result<ClientTls, TlsError> {
        ClientTls::from_roots(root_store(load_certs(ca)?)?, server_name, None)
    }

    /// Trusts `roots` (the system's store, a private CA); with `client_auth`,
    /// presents that certificate chain and key (mutual TLS).
    pub fn from_roots(
        roots: rustls::RootCertStore,
        server_name: &str,
        client_auth: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    ) -> Result<ClientTls, TlsError> {
        let server_name = ServerName::try_from(server_name.to_string())
            .map_err(|_| TlsError::ServerName(server_name.into()))?;
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_root_certificates(roots);
        let config = match client_auth {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| TlsError::Config(e.to_string()))?,
            None => builder.with_no_client_auth(),
        };
        Ok(ClientTls {
            config: Arc::new(config),
            server_name,
        })
    }

    /// Trusts the CAs of `ca` and presents the chain of `cert` with `key`.
    pub fn with_client_cert_files(
        ca: &Path,
        server_name: &str,
        cert: &Path,
        key: &Path,
    ) -> Result<ClientTls, TlsError> {
        ClientTls::from_roots(
            root_store(load_certs(ca)?)?,
            server_name,
            Some((load_certs(cert)?, load_key(key)?)),
        )
    }
}

/// A root store of the given certificates (for [`ClientTls::from_roots`]).
pub fn roots_of(certs: Vec<CertificateDer<'static>>) -> Result<rustls::RootCertStore, TlsError> {
    root_store(certs)
}
