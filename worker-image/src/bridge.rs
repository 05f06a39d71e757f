//! `toolyard-runner bridge -- CMD...`: the network side of an McpServer whose command speaks
//! MCP on stdio (see [`toolyard_api::protocol::bridge`]).
//!
//! Each TCP connection is one MCP session with one process of CMD. The bridge first sends a
//! random nonce line; the client must answer with the nonce's proof under the server's derived
//! key ([`SigningKey::prove`]), so only the gateway, which derives the key, starts processes.
//! From then on bytes pass unchanged both ways: the connection's into the process's stdin, its
//! stdout into the connection. Its stderr goes to the pod's log. The process (its whole group)
//! is killed when the connection closes, and the connection is closed when the process exits.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use toolyard_api::protocol::bridge;
use toolyard_api::token::SigningKey;
use toolyard_process::child::ProcessGroup;
use tracing::{info, warn};

/// How long a client has to answer the nonce.
const PROOF_TIMEOUT: Duration = Duration::from_secs(10);

/// Arguments of `toolyard-runner bridge`.
#[derive(clap::Args, Debug)]
pub struct BridgeArgs {
    /// Address to listen on.
    #[arg(long, env = "TOOLYARD_BRIDGE_HOST", default_value = "0.0.0.0")]
    pub host: IpAddr,
    /// Port to listen on (0: any free port, printed on stdout as `listening on ADDR`).
    #[arg(long, env = "TOOLYARD_BRIDGE_PORT", default_value_t = bridge::PORT)]
    pub port: u16,
    /// Sessions (each one process of CMD) at once; more connections are closed at once.
    #[arg(long, env = "TOOLYARD_BRIDGE_MAX_SESSIONS", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub max_sessions: u16,
    /// The server's command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Serves until SIGTERM or SIGINT, then kills every session's process.
pub async fn run(args: BridgeArgs) -> anyhow::Result<()> {
    let key = std::env::var(bridge::env::KEY)
        .map_err(|_| anyhow::anyhow!("no key: set {} (the McpServer's derived key, hex)", bridge::env::KEY))
        .and_then(|hex| SigningKey::from_hex(&hex).map_err(|e| anyhow::anyhow!("the bridge key is not usable: {e}")))?;
    let listener = TcpListener::bind(SocketAddr::new(args.host, args.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
    println!("listening on {}", listener.local_addr()?);
    info!(command = ?args.command, "bridging MCP sessions to the command's stdio");
    let command = Arc::new(args.command);
    let slots = Arc::new(Semaphore::new(usize::from(args.max_sessions)));
    let mut sessions = JoinSet::new();
    let shutdown = crate::serve::shutdown_signal(false);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    warn!(%peer, max = args.max_sessions, "refused a connection: every session slot is taken");
                    continue;
                };
                let (key, command) = (key.clone(), command.clone());
                sessions.spawn(async move {
                    if let Err(e) = session(stream, &key, &command).await {
                        warn!(%peer, error = %format!("{e:#}"), "session ended with an error");
                    }
                    drop(slot);
                });
            }
            Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
        }
    }
    // Dropping the sessions kills their processes.
    sessions.shutdown().await;
    Ok(())
}

/// One connection: the proof, then the process.
async fn session(stream: TcpStream, key: &SigningKey, command: &[String]) -> anyhow::Result<()> {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    write.write_all(format!("{nonce}\n").as_bytes()).await?;
    let mut reader = BufReader::new(read);
    let mut line = String::new();
    let limit = u64::try_from(bridge::MAX_KEY_LINE).unwrap_or(256);
    match tokio::time::timeout(PROOF_TIMEOUT, (&mut reader).take(limit).read_line(&mut line)).await {
        // A probe that only opens the connection, or a client that never answers.
        Ok(Ok(0)) | Err(_) => return Ok(()),
        Ok(Ok(_)) => {}
        Ok(Err(e)) => return Err(e.into()),
    }
    if !key.check_proof(&nonce, &line) {
        anyhow::bail!("refused: the answer to the nonce is not the server key's proof");
    }
    let mut child = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env_remove(bridge::env::KEY)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {:?}", command[0]))?;
    let group = ProcessGroup::new(child.id());
    let (Some(mut stdin), Some(mut stdout)) = (child.stdin.take(), child.stdout.take()) else {
        anyhow::bail!("the command's stdio is not piped");
    };
    info!(pid = child.id(), "session started");
    let outcome = tokio::select! {
        r = tokio::io::copy(&mut reader, &mut stdin) => format!("the client closed the connection ({} bytes in)", r.unwrap_or(0)),
        r = tokio::io::copy(&mut stdout, &mut write) => format!("the command closed its stdout ({} bytes out)", r.unwrap_or(0)),
    };
    info!(outcome, "session ended");
    let _ = write.shutdown().await;
    drop(group);
    Ok(())
}
