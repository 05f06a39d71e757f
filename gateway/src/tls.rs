//! TLS for the gateway's listeners: rustls with the aws-lc-rs provider, certificate and
//! key from PEM files, reloaded when the files change on disk (cert-manager rotating a
//! Secret volume). The files are polled every few seconds by content, which also sees
//! the symlink swap of Kubernetes Secret volumes; a new pair that does not load (half
//! written, key not matching the certificate) is logged and the previous pair stays in use.
//!
//! [`reloading_config`] gives a [`TlsConfig`] for a listener (`server::Listener::tls`); each
//! new connection's handshake uses the pair current at that moment.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use clap::Args;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

/// Problems loading a certificate/key pair; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate file holds no usable PEM certificate.
    #[error("{path}: no PEM certificate found ({message})")]
    Certificate {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// The key file holds no usable PEM private key.
    #[error("{path}: no PEM private key found ({message})")]
    Key {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// rustls refused the pair (e.g. the key does not match the certificate).
    #[error("certificate {cert} with key {key}: {message}")]
    Pair {
        /// Certificate file.
        cert: PathBuf,
        /// Key file.
        key: PathBuf,
        /// Why.
        message: String,
    },
}

/// Certificate chain and private key files (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first (`tls.crt`).
    pub cert: PathBuf,
    /// Private key: PKCS#8, PKCS#1 or SEC1 (`tls.key`).
    pub key: PathBuf,
}

/// TLS flags (`TOOLYARD_*` environment fallbacks).
#[derive(Args, Clone, Debug)]
pub struct TlsArgs {
    /// Certificate chain PEM file.
    #[arg(long, env = "TOOLYARD_TLS_CERT_FILE", value_name = "PATH")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key PEM file.
    #[arg(long, env = "TOOLYARD_TLS_KEY_FILE", value_name = "PATH")]
    pub tls_key_file: Option<PathBuf>,
    /// How often the files are checked for a new certificate.
    #[arg(long, env = "TOOLYARD_TLS_RELOAD_SECONDS", default_value_t = 5)]
    pub tls_reload_seconds: u64,
    /// Serve plain HTTP (no TLS). Only for loopback or behind a TLS-terminating proxy.
    #[arg(long, env = "TOOLYARD_PLAIN_HTTP", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub plain_http: bool,
}

impl TlsArgs {
    /// The files to serve with, or `None` with `--plain-http`. Plain HTTP is never the
    /// silent default: without both files and without the flag this is an error.
    pub fn files(&self) -> anyhow::Result<Option<TlsFiles>> {
        match (&self.tls_cert_file, &self.tls_key_file, self.plain_http) {
            (Some(cert), Some(key), false) => Ok(Some(TlsFiles { cert: cert.clone(), key: key.clone() })),
            (None, None, true) => Ok(None),
            (Some(_), Some(_), true) => {
                anyhow::bail!("--plain-http and --tls-cert-file/--tls-key-file exclude each other")
            }
            (None, None, false) => {
                anyhow::bail!("set --tls-cert-file and --tls-key-file, or --plain-http to serve without TLS")
            }
            _ => anyhow::bail!("--tls-cert-file and --tls-key-file go together"),
        }
    }

    /// The poll interval.
    pub fn reload_interval(&self) -> Duration {
        Duration::from_secs(self.tls_reload_seconds.max(1))
    }
}

/// The aws-lc-rs crypto provider, passed explicitly to every config built here.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Makes aws-lc-rs the process-wide rustls provider, for code that builds rustls configs
/// without naming one. Call once at startup; a second call (or another provider already
/// installed) is harmless.
pub fn install_default_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// Builds a server config from PEM bytes (ALPN h2 and http/1.1).
fn server_config(files: &TlsFiles, cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Certificate { path: files.cert.clone(), message: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Certificate { path: files.cert.clone(), message: "the file is empty".into() });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| TlsError::Key { path: files.key.clone(), message: e.to_string() })?;
    let pair_err =
        |e: rustls::Error| TlsError::Pair { cert: files.cert.clone(), key: files.key.clone(), message: e.to_string() };
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(pair_err)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(pair_err)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

async fn read_pair(files: &TlsFiles) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    let read = |path: PathBuf| async move {
        tokio::fs::read(&path).await.map_err(|source| TlsError::Read { path: path.clone(), source })
    };
    Ok((read(files.cert.clone()).await?, read(files.key.clone()).await?))
}

/// Loads the pair once.
pub async fn load(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let (cert, key) = read_pair(files).await?;
    server_config(files, &cert, &key)
}

/// Counts of the reload task's outcomes (observable by tests and health checks).
#[derive(Debug, Default)]
pub struct ReloadStatus {
    reloads: AtomicU64,
    failures: AtomicU64,
}

impl ReloadStatus {
    /// Times a changed pair was loaded and swapped in.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Times a changed pair failed to load (the previous one stayed).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

/// A rustls server config that can be replaced while it is served: clones share it, a
/// replacement applies to the handshakes that start after it, and connections already open
/// keep the config they began with.
#[derive(Clone)]
pub struct TlsConfig(Arc<RwLock<Arc<ServerConfig>>>);

impl TlsConfig {
    /// Serves `config` until it is replaced.
    pub fn new(config: Arc<ServerConfig>) -> Self {
        TlsConfig(Arc::new(RwLock::new(config)))
    }

    /// The config for a handshake starting now.
    pub fn current(&self) -> Arc<ServerConfig> {
        // A poisoned lock still holds a whole `Arc`: the writer only swaps it.
        Arc::clone(&self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Serves `config` from the next handshake on.
    fn replace(&self, config: Arc<ServerConfig>) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = config;
    }
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TlsConfig").finish_non_exhaustive()
    }
}

/// A TLS config kept current from files.
#[derive(Clone, Debug)]
pub struct ReloadingTls {
    /// The config to serve with; reloads apply to new connections.
    pub config: TlsConfig,
    /// Reload outcomes.
    pub status: Arc<ReloadStatus>,
}

/// Loads the pair (failing if it does not load) and keeps the returned config current:
/// every `interval` the files are read, and a changed pair that loads replaces the served
/// one for new connections. Stops when `shutdown` fires.
pub async fn reloading_config(
    files: TlsFiles,
    interval: Duration,
    shutdown: CancellationToken,
) -> Result<ReloadingTls, TlsError> {
    let (cert, key) = read_pair(&files).await?;
    let config = TlsConfig::new(server_config(&files, &cert, &key)?);
    let status = Arc::new(ReloadStatus::default());
    let served = config.clone();
    let counts = Arc::clone(&status);
    tokio::spawn(async move {
        let mut current = (cert, key);
        let mut last_failed: Option<(Vec<u8>, Vec<u8>)> = None;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let pair = match read_pair(&files).await {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(error = %e, "TLS files unreadable; keeping the current certificate");
                    continue;
                }
            };
            if pair == current || last_failed.as_ref() == Some(&pair) {
                continue;
            }
            match server_config(&files, &pair.0, &pair.1) {
                Ok(new) => {
                    served.replace(new);
                    counts.reloads.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(cert = %files.cert.display(), "TLS certificate reloaded");
                    current = pair;
                    last_failed = None;
                }
                Err(e) => {
                    // Logged once per distinct broken content (a half-written pair usually
                    // becomes valid on the next poll).
                    tracing::warn!(error = %e, "new TLS files do not load; keeping the current certificate");
                    counts.failures.fetch_add(1, Ordering::Relaxed);
                    last_failed = Some(pair);
                }
            }
        }
    });
    Ok(ReloadingTls { config, status })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        tls: TlsArgs,
    }

    fn parse(args: &[&str]) -> TlsArgs {
        use clap::Parser;
        Cli::parse_from(std::iter::once("gw").chain(args.iter().copied())).tls
    }

    #[test]
    fn plain_http_must_be_asked_for() {
        assert!(parse(&[]).files().is_err());
        assert_eq!(parse(&["--plain-http"]).files().expect("plain"), None);
        assert!(parse(&["--tls-cert-file", "c"]).files().is_err());
        assert!(parse(&["--tls-cert-file", "c", "--tls-key-file", "k", "--plain-http"]).files().is_err());
        let both = parse(&["--tls-cert-file", "c", "--tls-key-file", "k"]);
        assert_eq!(both.files().expect("tls"), Some(TlsFiles { cert: "c".into(), key: "k".into() }));
        assert_eq!(both.reload_interval(), Duration::from_secs(5));
    }

    #[test]
    fn garbage_files_give_errors_naming_the_file() {
        let files = TlsFiles { cert: "/x/tls.crt".into(), key: "/x/tls.key".into() };
        let e = server_config(&files, b"not pem", b"not pem").expect_err("garbage").to_string();
        assert!(e.contains("/x/tls.crt"), "{e}");
    }
}
