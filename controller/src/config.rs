//! Command-line and environment configuration of the controller.
//!
//! Every flag has a `TOOLYARD_*` environment fallback and a default that works in the Helm
//! chart. Tests build a [`Config`] with [`Config::try_parse_from`] like the binary does.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser};

/// Configuration of one controller process.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "toolyard-controller",
    version,
    about = "Runs Toolyard's ToolCalls and CodingTasks as Kubernetes Jobs.",
    args_override_self = true
)]
pub struct Config {
    /// Image holding `/toolyard-runner`; an init container copies it into every run's pod.
    #[arg(long, env = "TOOLYARD_RUNNER_IMAGE", default_value = concat!("ghcr.io/toolyard/runner:", env!("CARGO_PKG_VERSION")))]
    pub runner_image: String,

    /// Image of the coding agent (Python with the `toolyard` package).
    #[arg(long, env = "TOOLYARD_AGENT_IMAGE", default_value = concat!("ghcr.io/toolyard/agent:", env!("CARGO_PKG_VERSION")))]
    pub agent_image: String,

    /// RuntimeClass of coding-agent pods (e.g. gVisor); empty: the cluster's default runtime.
    #[arg(long, env = "TOOLYARD_AGENT_RUNTIME_CLASS")]
    pub agent_runtime_class: Option<String>,

    /// Base URL of the gateway's internal API, as runner pods reach it.
    #[arg(
        long,
        env = "TOOLYARD_GATEWAY_INTERNAL_URL",
        default_value = "http://toolyard-gateway-internal.toolyard.svc:8081"
    )]
    pub gateway_internal_url: String,

    /// File holding the shared HMAC key that signs runner tokens (the gateway verifies with it).
    #[arg(long, env = "TOOLYARD_TOKEN_KEY_FILE", default_value = "/etc/toolyard/token-key/key")]
    pub token_key_file: PathBuf,

    /// Namespaces to watch (comma-separated); empty means every namespace.
    #[arg(long, env = "TOOLYARD_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,

    /// Timing of runs: retention, graces, Job TTL.
    #[command(flatten)]
    pub timing: Timing,

    /// Default resources of tool and agent containers.
    #[command(flatten)]
    pub resources: ResourceDefaults,

    /// Leader election.
    #[command(flatten)]
    pub leader: LeaderElection,

    /// Address of the `/metrics`, `/healthz` and `/readyz` listener.
    #[arg(long, env = "TOOLYARD_METRICS_ADDR", default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,

    /// Most reconciles running at once, per resource kind and namespace scope.
    #[arg(long, env = "TOOLYARD_CONCURRENCY", default_value_t = 256)]
    pub concurrency: u16,

    /// Log as JSON lines instead of text (`RUST_LOG` sets the filter).
    #[arg(long, env = "TOOLYARD_LOG_JSON", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub log_json: bool,

    /// The `OTEL_*` variables of the controller's own environment that every run pod gets
    /// too (the collector's address, sampling, batching), read at start; see [`run_telemetry_env`].
    #[arg(skip = run_telemetry_env(std::env::vars()))]
    pub run_telemetry_env: Vec<(String, String)>,
}

/// The `OTEL_*` variables of `vars` that run pods get: all but `OTEL_SERVICE_NAME` (each
/// process names itself) and `*_HEADERS` (collector credentials never enter a run pod, whose
/// image and code may be a tenant's), sorted by name.
pub fn run_telemetry_env(vars: impl Iterator<Item = (String, String)>) -> Vec<(String, String)> {
    let mut kept: Vec<(String, String)> = vars
        .filter(|(name, _)| name.starts_with("OTEL_") && name != "OTEL_SERVICE_NAME" && !name.ends_with("_HEADERS"))
        .collect();
    kept.sort();
    kept
}

/// Timing of runs.
#[derive(Clone, Debug, Args)]
pub struct Timing {
    /// `ttlSecondsAfterFinished` of run Jobs.
    #[arg(long, env = "TOOLYARD_JOB_TTL_SECONDS", default_value_t = 300)]
    pub job_ttl_seconds: i32,

    /// Finished ToolCalls are deleted this long after they finished.
    #[arg(long, env = "TOOLYARD_TOOLCALL_RETENTION_SECONDS", default_value_t = 3600)]
    pub toolcall_retention_seconds: u64,

    /// Finished CodingTasks are deleted this long after they finished; unset keeps them
    /// (they are the user's task history).
    #[arg(long, env = "TOOLYARD_CODINGTASK_RETENTION_SECONDS")]
    pub codingtask_retention_seconds: Option<u64>,

    /// A pod that no node can take for this long ends its run as `Unschedulable`.
    #[arg(long, env = "TOOLYARD_UNSCHEDULABLE_GRACE_SECONDS", default_value_t = 60)]
    pub unschedulable_grace_seconds: u64,

    /// A pod whose image pull fails (`ErrImagePull`, `ImagePullBackOff`) or whose container
    /// cannot be configured (a missing Secret) for this long ends as `ImagePullFailed` / `Failed`.
    /// `InvalidImageName` ends the run at once.
    #[arg(long, env = "TOOLYARD_IMAGE_PULL_GRACE_SECONDS", default_value_t = 5)]
    pub image_pull_grace_seconds: u64,
}

impl Timing {
    /// The graces as durations, for the pure pod-state mapping.
    pub fn graces(&self) -> crate::outcome::Graces {
        crate::outcome::Graces {
            image_pull: Duration::from_secs(self.image_pull_grace_seconds),
            unschedulable: Duration::from_secs(self.unschedulable_grace_seconds),
        }
    }
}

/// Default container resources. A tool that declares `runtime.resources` gets exactly those.
#[derive(Clone, Debug, Args)]
pub struct ResourceDefaults {
    /// CPU request of a tool container.
    #[arg(long, env = "TOOLYARD_TOOL_CPU_REQUEST", default_value = "100m")]
    pub tool_cpu_request: String,
    /// Memory request of a tool container.
    #[arg(long, env = "TOOLYARD_TOOL_MEMORY_REQUEST", default_value = "128Mi")]
    pub tool_memory_request: String,
    /// Memory limit of a tool container.
    #[arg(long, env = "TOOLYARD_TOOL_MEMORY_LIMIT", default_value = "512Mi")]
    pub tool_memory_limit: String,
    /// CPU request of an agent container.
    #[arg(long, env = "TOOLYARD_AGENT_CPU_REQUEST", default_value = "250m")]
    pub agent_cpu_request: String,
    /// Memory request of an agent container.
    #[arg(long, env = "TOOLYARD_AGENT_MEMORY_REQUEST", default_value = "256Mi")]
    pub agent_memory_request: String,
    /// Memory limit of an agent container.
    #[arg(long, env = "TOOLYARD_AGENT_MEMORY_LIMIT", default_value = "1Gi")]
    pub agent_memory_limit: String,
    /// Size limit of the writable `/tmp` of every run.
    #[arg(long, env = "TOOLYARD_TMP_SIZE_LIMIT", default_value = "256Mi")]
    pub tmp_size_limit: String,
}

/// Leader election through a `coordination.k8s.io` Lease.
#[derive(Clone, Debug, Args)]
pub struct LeaderElection {
    /// Reconcile only while holding the Lease (set false for a single replica without a Lease).
    #[arg(long = "leader-elect", env = "TOOLYARD_LEADER_ELECT", default_value_t = true, action = ArgAction::Set)]
    pub enabled: bool,
    /// Name of the Lease.
    #[arg(long = "lease-name", env = "TOOLYARD_LEASE_NAME", default_value = "toolyard-controller")]
    pub lease_name: String,
    /// Namespace of the Lease; defaults to the controller's own namespace (`POD_NAMESPACE`).
    #[arg(long = "lease-namespace", env = "TOOLYARD_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Seconds a Lease stays valid after its last renewal.
    #[arg(long = "lease-duration-seconds", env = "TOOLYARD_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub duration_seconds: u64,
    /// The holder renews this many seconds before the Lease expires.
    #[arg(long = "lease-grace-seconds", env = "TOOLYARD_LEASE_GRACE_SECONDS", default_value_t = 5)]
    pub grace_seconds: u64,
    /// Identity of this replica in the Lease and in Events; defaults to `POD_NAME`, then the
    /// host name plus a random suffix.
    #[arg(long = "identity", env = "TOOLYARD_IDENTITY")]
    pub identity: Option<String>,
}

impl LeaderElection {
    /// The namespace the Lease lives in.
    pub fn namespace(&self) -> String {
        self.lease_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok().filter(|s| !s.is_empty()))
            .or_else(|| {
                std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                    .ok()
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "default".to_owned())
    }
}

/// Whom the controller watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (needs a ClusterRole).
    Cluster,
    /// One namespace (a Role in it is enough).
    Namespace(String),
}

impl Config {
    /// Parses flags as the binary does (the first item is the program name); for embedding
    /// and tests. Environment fallbacks apply.
    pub fn from_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        <Self as Parser>::try_parse_from(args)
    }

    /// The watch scopes: one per configured namespace, or the whole cluster.
    pub fn scopes(&self) -> Vec<Scope> {
        let mut namespaces: Vec<String> =
            self.namespaces.iter().map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()).collect();
        namespaces.sort();
        namespaces.dedup();
        if namespaces.is_empty() {
            vec![Scope::Cluster]
        } else {
            namespaces.into_iter().map(Scope::Namespace).collect()
        }
    }

    /// This replica's identity.
    pub fn identity(&self) -> String {
        if let Some(id) = self.leader.identity.clone().filter(|s| !s.is_empty()) {
            return id;
        }
        if let Ok(pod) = std::env::var("POD_NAME")
            && !pod.is_empty()
        {
            return pod;
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "toolyard-controller".to_owned());
        format!("{host}-{}", crate::labels::short_hash(&format!("{:?}", std::time::SystemTime::now()), 6))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn run_pods_get_the_tracing_settings_but_no_collector_credentials() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer secret"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-key=secret"),
            ("OTEL_SERVICE_NAME", "toolyard-controller"),
            ("OTEL_TRACES_SAMPLER", "always_on"),
            ("RUST_LOG", "info"),
        ];
        let kept = super::run_telemetry_env(vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let names: Vec<&str> = kept.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_SAMPLER"]);
    }

    use super::*;

    #[test]
    fn defaults_parse_and_namespaces_split() {
        let c = Config::try_parse_from(["toolyard-controller", "--namespaces", "b,a, ,a"]).unwrap();
        assert_eq!(c.scopes(), vec![Scope::Namespace("a".into()), Scope::Namespace("b".into())]);
        assert!(c.leader.enabled);
        assert_eq!(c.timing.job_ttl_seconds, 300);
        assert_eq!(c.timing.codingtask_retention_seconds, None);
        let all = Config::try_parse_from(["toolyard-controller"]).unwrap();
        assert_eq!(all.scopes(), vec![Scope::Cluster]);
    }

    #[test]
    fn leader_election_can_be_switched_off() {
        let c = Config::try_parse_from(["x", "--leader-elect", "false", "--identity", "me"]).unwrap();
        assert!(!c.leader.enabled);
        assert_eq!(c.identity(), "me");
    }
}
