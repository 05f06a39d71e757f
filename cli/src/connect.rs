//! How every subcommand reaches an MCP server: `--url` (or `TOOLYARD_URL`), the bearer token
//! from `--token-file` or `TOOLYARD_TOKEN` (never an argument, so it stays out of `ps`), and
//! `--ca-file` for a gateway whose certificate the system does not trust.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProgressNotificationParam, ProtocolVersion};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient};

/// The connection flags, on every subcommand.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Connection {
    /// MCP URL of the gateway, e.g. https://toolyard.example.com/mcp
    #[arg(long, env = "TOOLYARD_URL", global = true)]
    pub url: Option<String>,
    /// File holding the bearer token (else the TOOLYARD_TOKEN variable)
    #[arg(long, env = "TOOLYARD_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// PEM file of CA certificates to trust besides the system's (a self-signed gateway)
    #[arg(long, env = "TOOLYARD_CA_FILE", global = true)]
    pub ca_file: Option<PathBuf>,
    /// Protocol era: 2025-11-25 (`initialize`) or 2026-07-28 (`server/discover`)
    #[arg(long, global = true, default_value = "2025-11-25", value_parser = ["2025-11-25", "2026-07-28"])]
    pub protocol: String,
}

/// A connected MCP client.
pub type Client = RunningService<RoleClient, Handler>;

impl Connection {
    /// The URL, or what to do without one.
    pub fn url(&self) -> Result<&str> {
        match self.url.as_deref() {
            Some(url) if !url.is_empty() => Ok(url),
            _ => bail!("no server URL: pass --url https://HOST/mcp or set TOOLYARD_URL"),
        }
    }

    /// The bearer token: the first line of `--token-file`, else `TOOLYARD_TOKEN`, else none.
    pub fn token(&self) -> Result<Option<String>> {
        if let Some(file) = &self.token_file {
            let text =
                std::fs::read_to_string(file).with_context(|| format!("reading the token file {}", file.display()))?;
            let token = text.lines().next().unwrap_or_default().trim().to_owned();
            if token.is_empty() {
                bail!("the token file {} is empty", file.display());
            }
            return Ok(Some(token));
        }
        Ok(std::env::var("TOOLYARD_TOKEN").ok().filter(|t| !t.trim().is_empty()).map(|t| t.trim().to_owned()))
    }

    /// An HTTP client that trusts the system's CAs and `--ca-file`.
    pub fn http(&self) -> Result<reqwest::Client> {
        self.http_builder()?.build().context("building the HTTP client")
    }

    /// [`Connection::http`]'s builder.
    pub fn http_builder(&self) -> Result<reqwest::ClientBuilder> {
        let mut builder = reqwest::Client::builder().connect_timeout(std::time::Duration::from_secs(10));
        if let Some(file) = &self.ca_file {
            let pem = std::fs::read(file).with_context(|| format!("reading the CA file {}", file.display()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("{} holds no PEM certificate", file.display()))?;
            builder = builder.tls_certs_merge(certs);
        }
        Ok(builder)
    }

    /// Connects and completes the handshake of the chosen protocol era. Progress
    /// notifications are shown on stderr unless `quiet`.
    pub async fn connect(&self, quiet: bool) -> Result<Client> {
        let lifecycle = if self.protocol == "2026-07-28" {
            ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] }
        } else {
            ClientLifecycleMode::Initialize
        };
        self.connect_with(lifecycle, quiet).await
    }

    /// [`Connection::connect`] with the given lifecycle.
    pub async fn connect_with(&self, lifecycle: ClientLifecycleMode, quiet: bool) -> Result<Client> {
        let url = self.url()?;
        let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
        if let Some(token) = self.token()? {
            config = config.auth_header(token);
        }
        let transport = StreamableHttpClientTransport::with_client(self.http()?, config);
        let handler = Handler::new(quiet);
        handler.serve_with_lifecycle(transport, lifecycle).await.map_err(|e| {
            let detail = error_chain(&e);
            let hint = if detail.contains("Auth required") || detail.contains("401") {
                "the server refused the token: check --token-file or TOOLYARD_TOKEN"
            } else if detail.contains("403") {
                "the server refused the request (403): a wrong host name, or an Origin it does not allow"
            } else if detail.contains("certificate") || detail.contains("UnknownIssuer") {
                "the server's certificate is not trusted: pass its CA with --ca-file"
            } else if detail.contains("onnect") || detail.contains("error sending request") {
                "nothing answers at that URL: check --url and that the gateway runs"
            } else {
                "the MCP handshake failed"
            };
            anyhow::anyhow!("cannot connect to {url}: {hint}\n  ({detail})")
        })
    }
}

/// `e` and its sources, joined.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// The client side: shows progress notifications on stderr (one updating line on a
/// terminal, one line each otherwise).
#[derive(Clone)]
pub struct Handler {
    config: ClientConfig,
    quiet: bool,
    shown: Arc<AtomicBool>,
}

impl Handler {
    fn new(quiet: bool) -> Self {
        let config = ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("toolyard", env!("CARGO_PKG_VERSION")),
        );
        Self { config, quiet, shown: Arc::default() }
    }

    /// Ends an updating progress line, if one is shown.
    pub fn end_progress(&self) {
        if self.shown.swap(false, Ordering::Relaxed) {
            eprintln!();
        }
    }
}

/// `[ 40%] message` for a progress notification.
pub fn progress_line(p: &ProgressNotificationParam) -> String {
    let amount = match p.total {
        Some(total) if total > 0.0 => format!("{:>3.0}%", 100.0 * p.progress / total),
        _ => format!("{}", p.progress),
    };
    match p.message.as_deref() {
        Some(m) => format!("[{amount}] {m}"),
        None => format!("[{amount}]"),
    }
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        self.config.clone()
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        if self.quiet {
            return;
        }
        let line = progress_line(&params);
        let mut err = std::io::stderr().lock();
        if err.is_terminal() {
            let _ = write!(err, "\r\x1b[2K{line}");
            let _ = err.flush();
            self.shown.store(true, Ordering::Relaxed);
        } else {
            let _ = writeln!(err, "{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_show_a_percentage_and_the_message() {
        let mut p =
            ProgressNotificationParam::new(rmcp::model::ProgressToken(rmcp::model::NumberOrString::Number(1)), 0.4);
        p.total = Some(1.0);
        p.message = Some("step 2 of 5".into());
        assert_eq!(progress_line(&p), "[ 40%] step 2 of 5");
        p.total = None;
        p.message = None;
        assert_eq!(progress_line(&p), "[0.4]");
    }

    #[test]
    fn the_token_comes_from_the_file_before_the_environment() {
        let dir = std::env::temp_dir().join(format!("toolyard-cli-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "ty_abc\n").unwrap();
        let c = Connection { token_file: Some(file.clone()), ..Default::default() };
        assert_eq!(c.token().unwrap().as_deref(), Some("ty_abc"));
        std::fs::write(&file, "\n").unwrap();
        assert!(c.token().unwrap_err().to_string().contains("is empty"));
        let _ = std::fs::remove_dir_all(dir);
        assert!(Connection::default().url().unwrap_err().to_string().contains("TOOLYARD_URL"));
    }
}
