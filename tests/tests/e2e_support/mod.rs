//! The whole platform on the test cluster, as the chart deploys it, with nothing stubbed:
//! the real `toolyard-gateway serve` and `toolyard-controller` binaries, each running as its
//! chart ServiceAccount with exactly the chart's RBAC (tokens from the TokenRequest API), the
//! real S3 server, and the test node running Job pods from the real images (init container
//! `cp` of the runner from the runner image, then the tool's command under
//! `toolyard-runner call`). The gateway and controller run as processes on this host: pods
//! reach the gateway's internal API on the host's address on the node's network. The chart's
//! NetworkPolicies for run pods are not applied here (they admit only gateway pods;
//! `e2e_node` installs the whole chart and checks them enforced).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use rmcp::model::ClientConfig;
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient};
use tokio::process::{Child, Command};
use toolyard_api::McpTool;
use toolyard_tests::local::{TempDir, binary};
use toolyard_tests::{TestEnv, User, images, random_suffix, repo_path, wait_until};

/// A running platform serving one namespace.
pub struct Platform {
    /// The namespace whose tools are served.
    pub ns: String,
    /// The release namespace (ServiceAccounts, Lease).
    pub release_ns: String,
    /// The Helm release name: the chart's objects are `<release>-toolyard-*`.
    pub release: String,
    /// `https://127.0.0.1:<port>` of the public MCP listener (TLS with a certificate from
    /// the platform's own test CA; [`Platform::http`] trusts it).
    pub base: String,
    /// The internal API URL.
    pub internal: String,
    /// `http://127.0.0.1:<port>` of the gateway's ops listener.
    pub gateway_ops: String,
    gateway: Child,
    controller: Option<Child>,
    dir: TempDir,
    gateway_args: Vec<String>,
    gateway_env: Vec<(String, String)>,
    controller_env: Vec<(String, String)>,
    controller_ops: String,
    controller_starts: usize,
    replicas: Vec<Child>,
    ca: reqwest::Certificate,
}

/// The `toolyard_*` metric families a PromQL query reads (`_total`, `_bucket`, `_sum` and
/// `_count` series belong to the family named without them).
fn metric_names(query: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = query;
    while let Some(at) = rest.find("toolyard_") {
        let name: String =
            rest[at..].chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect();
        rest = &rest[at + name.len()..];
        let family = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name)
            .to_owned();
        names.push(family);
    }
    names
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// Templates of the chart for release `release` (the chart names its objects
/// `<release>-toolyard-*`; a release per platform keeps the cluster-scoped bindings of
/// concurrent tests apart), serving namespace `ns`.
fn helm_template(env: &TestEnv, release: &str, release_ns: &str, ns: &str, templates: &[&str]) -> String {
    let out = std::process::Command::new(env.bin_dir().join("helm"))
        .args(["template", release, repo_path("charts/toolyard").to_str().expect("utf-8"), "-n", release_ns])
        .args([
            "--kube-version",
            "1.34.4",
            "-f",
            repo_path("charts/toolyard/ci/test-values.yaml").to_str().expect("utf-8"),
        ])
        .args(["--set", &format!("watchNamespaces={{{ns}}}"), "--set", "gateway.auth.apiKeys.existingSecret="])
        .args(templates.iter().flat_map(|t| ["--show-only", t]))
        .output()
        .expect("helm runs");
    assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8")
}

async fn service_account_kubeconfig(env: &TestEnv, ns: &str, sa: &str, dir: &Path) -> PathBuf {
    let sas: Api<ServiceAccount> = Api::namespaced(env.client(User::Admin).await, ns);
    let request = TokenRequest {
        spec: TokenRequestSpec { audiences: vec![], expiration_seconds: Some(3600), ..Default::default() },
        ..Default::default()
    };
    let token: TokenRequest =
        sas.create_subresource("token", sa, &PostParams::default(), &request).await.expect("TokenRequest");
    let token = token.status.expect("token status").token;
    let path = dir.join(format!("{sa}.kubeconfig"));
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
         users:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\n\
         current-context: c\n",
        env.api_url(),
        env.var("TOOLYARD_TEST_CA")
    );
    std::fs::write(&path, kubeconfig).expect("write kubeconfig");
    path
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl").current_dir(dir).args(args).output().expect("running openssl");
    assert!(out.status.success(), "openssl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// A test CA and a serving certificate for 127.0.0.1 and localhost signed by it, as
/// cert-manager would put them in the gateway's TLS Secret: `ca.crt`, `tls.crt`, `tls.key`.
fn make_pki(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=toolyard-e2e-ca"]);
    openssl(dir, &ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend(["-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=localhost"]);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("tls.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n\
         extendedKeyUsage=serverAuth\n",
    )
    .expect("write tls.ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "tls.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "tls.crt",
            "-days",
            "1",
            "-extfile",
            "tls.ext",
        ],
    );
}

fn spawn(program: &Path, args: &[String], env: &[(String, String)], log: &Path) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()))
}

impl Platform {
    /// Starts everything for a fresh namespace. `gateway_env` adds gateway settings (model
    /// profiles for coding tasks).
    pub async fn start(gateway_env: &[(&str, &str)]) -> Platform {
        let env = TestEnv::get();
        env.install_crds().await.expect("CRDs");
        let release_ns = env.namespace("e2e-system").await.expect("ns");
        let ns = env.namespace("e2e").await.expect("ns");
        let dir = TempDir::new("e2e");

        // Run pods must pass the restricted Pod Security Standard, as in a hardened cluster.
        env.kubectl_as(User::Admin, &["label", "namespace", &ns, "pod-security.kubernetes.io/enforce=restricted"])
            .expect("label namespace");

        // The chart's ServiceAccounts and RBAC, bound to this namespace.
        let rbac = dir.path().join("rbac.yaml");
        let release = format!("ty{}", random_suffix(6));
        let templates = [
            "templates/gateway/rbac.yaml",
            "templates/gateway/serviceaccount.yaml",
            "templates/users/roles.yaml",
            "templates/controller/rbac.yaml",
            "templates/controller/serviceaccount.yaml",
        ];
        std::fs::write(&rbac, helm_template(env, &release, &release_ns, &ns, &templates)).expect("write rbac");
        let policies = helm_template(env, &release, &release_ns, &ns, &["templates/runs/networkpolicy.yaml"]);
        std::fs::write(dir.path().join("networkpolicy.yaml"), policies).expect("write policies");
        env.kubectl_as(User::Admin, &["apply", "-f", rbac.to_str().expect("utf-8")]).expect("apply chart RBAC");
        let gateway_kc =
            service_account_kubeconfig(env, &release_ns, &format!("{release}-toolyard-gateway"), dir.path()).await;
        let controller_kc =
            service_account_kubeconfig(env, &release_ns, &format!("{release}-toolyard-controller"), dir.path()).await;

        let key = dir.path().join("token-key");
        std::fs::write(&key, format!("{}{}", random_suffix(32), random_suffix(32))).expect("key");
        let (public, internal, ops, controller_ops) = (free_port(), free_port(), free_port(), free_port());
        let base = format!("https://127.0.0.1:{public}");
        let pki = dir.path().join("pki");
        std::fs::create_dir_all(&pki).expect("pki dir");
        make_pki(&pki);
        let ca = reqwest::Certificate::from_pem(&std::fs::read(pki.join("ca.crt")).expect("ca.crt")).expect("CA PEM");
        let (tls_cert, tls_key) = (pki.join("tls.crt"), pki.join("tls.key"));
        let host_ip = env.host_ip();
        let internal_url = format!("http://{host_ip}:{internal}");
        let s3 = env.s3();

        let gateway_args: Vec<String> = [
            "serve",
            "--tls-cert-file",
            tls_cert.to_str().expect("utf-8"),
            "--tls-key-file",
            tls_key.to_str().expect("utf-8"),
            "--listen",
            &format!("127.0.0.1:{public}"),
            "--internal-listen",
            &format!("{host_ip}:{internal}"),
            "--metrics-listen",
            &format!("127.0.0.1:{ops}"),
            "--namespaces",
            &ns,
            "--gateway-namespace",
            &release_ns,
            "--allowed-hosts",
            "127.0.0.1,localhost",
            "--s3-bucket",
            &s3.bucket,
            "--s3-endpoint",
            &s3.endpoint,
            "--s3-region",
            &s3.region,
            "--token-key-file",
            key.to_str().expect("utf-8"),
            "--tokenreview",
            "--tokenreview-audience",
            "toolyard",
            "--tokenreview-opaque-tokens",
            "--call-grace-seconds",
            "5",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let mut gateway_env_all: Vec<(String, String)> = vec![
            ("KUBECONFIG".into(), gateway_kc.display().to_string()),
            ("TOOLYARD_S3_ACCESS_KEY_ID".into(), s3.access_key.clone()),
            ("TOOLYARD_S3_SECRET_ACCESS_KEY".into(), s3.secret_key.clone()),
            ("RUST_LOG".into(), "info".into()),
        ];
        gateway_env_all.extend(gateway_env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let gateway_env = gateway_env_all;
        let gateway = spawn(&binary("toolyard-gateway"), &gateway_args, &gateway_env, &dir.path().join("gateway.log"));

        let controller_env: Vec<(String, String)> = vec![
            ("KUBECONFIG".into(), controller_kc.display().to_string()),
            ("TOOLYARD_NAMESPACES".into(), ns.clone()),
            ("TOOLYARD_RUNNER_IMAGE".into(), images::RUNNER.into()),
            ("TOOLYARD_AGENT_IMAGE".into(), images::AGENT.into()),
            ("TOOLYARD_GATEWAY_INTERNAL_URL".into(), internal_url.clone()),
            ("TOOLYARD_TOKEN_KEY_FILE".into(), key.display().to_string()),
            ("TOOLYARD_METRICS_ADDR".into(), format!("127.0.0.1:{controller_ops}")),
            ("TOOLYARD_LEASE_NAMESPACE".into(), release_ns.clone()),
            ("TOOLYARD_LEASE_NAME".into(), format!("{release}-toolyard-controller")),
            ("RUST_LOG".into(), "info".into()),
        ];
        let controller =
            spawn(&binary("toolyard-controller"), &[], &controller_env, &dir.path().join("controller.log"));

        let platform = Platform {
            ns,
            release_ns,
            release,
            base,
            internal: internal_url,
            gateway_ops: format!("http://127.0.0.1:{ops}"),
            gateway,
            controller: Some(controller),
            dir,
            gateway_args,
            gateway_env,
            controller_env,
            controller_ops: format!("http://127.0.0.1:{controller_ops}"),
            controller_starts: 1,
            replicas: Vec::new(),
            ca,
        };
        platform.wait_ready().await;
        platform.wait_controller_leads().await;
        platform
    }

    /// An HTTP client that trusts only the platform's test CA (what a user's MCP client
    /// does with the CA of the gateway's certificate).
    pub fn http(&self) -> reqwest::Client {
        reqwest::Client::builder().tls_certs_only([self.ca.clone()]).build().expect("HTTPS client")
    }

    /// The controller's log file of start number `n` (1-based).
    fn controller_log(n: usize) -> String {
        if n == 1 { "controller.log".to_owned() } else { format!("controller-{n}.log") }
    }

    /// Kills the controller process (SIGKILL: no Lease release, no cleanup), as a node
    /// failure or an OOM kill would. Runs already started go on; nothing reconciles until
    /// [`Platform::start_controller`].
    pub async fn kill_controller(&mut self) {
        if let Some(mut controller) = self.controller.take() {
            let _ = controller.start_kill();
            let _ = controller.wait().await;
        }
    }

    /// Starts the controller again with the same environment (a new log file) and waits
    /// until it holds the leader Lease (after the dead holder's Lease expired).
    pub async fn start_controller(&mut self) {
        assert!(self.controller.is_none(), "the controller is running");
        self.controller_starts += 1;
        let log = self.dir.path().join(Self::controller_log(self.controller_starts));
        self.controller = Some(spawn(&binary("toolyard-controller"), &[], &self.controller_env, &log));
        self.wait_controller_leads().await;
    }

    /// Lets `user` call every tool of the served namespace through the chart's `tool-caller`
    /// ClusterRole (a RoleBinding, as an operator grants it).
    pub fn grant_tool_caller(&self, user: &str) {
        let role = format!("--clusterrole={}-toolyard-tool-caller", self.release);
        TestEnv::get()
            .kubectl_as(
                User::Admin,
                &[
                    "-n",
                    &self.ns,
                    "create",
                    "rolebinding",
                    &format!("tool-caller-{user}"),
                    &role,
                    &format!("--user={user}"),
                ],
            )
            .expect("bind tool-caller");
    }

    /// An object of the chart as the platform rendered it (RBAC and user roles, applied; run
    /// NetworkPolicies, not applied), by kind and name without the `<release>-toolyard-` prefix.
    pub fn chart_object(&self, kind: &str, short_name: &str) -> serde_json::Value {
        let name = format!("{}-toolyard-{short_name}", self.release);
        let text = ["rbac.yaml", "networkpolicy.yaml"]
            .iter()
            .map(|f| std::fs::read_to_string(self.dir.path().join(f)).expect("rendered chart"))
            .collect::<Vec<_>>()
            .join("\n---\n");
        text.split("\n---")
            .filter(|doc| doc.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')))
            .filter_map(|doc| serde_saphyr::from_str::<serde_json::Value>(doc).ok())
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name.as_str())
            .unwrap_or_else(|| panic!("{kind} {name} is not in the rendered chart"))
    }

    /// Whether the chart's NetworkPolicy `short_name` (in the served namespace) applies to a
    /// pod with `labels`: its `podSelector` (matchLabels, matchExpressions) matches.
    pub fn policy_selects(&self, short_name: &str, labels: &std::collections::BTreeMap<String, String>) -> bool {
        let policy = self.chart_object("NetworkPolicy", short_name);
        assert_eq!(policy["metadata"]["namespace"], self.ns.as_str());
        let selector = &policy["spec"]["podSelector"];
        let by_labels = selector["matchLabels"]
            .as_object()
            .into_iter()
            .flatten()
            .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
        let by_expressions = selector["matchExpressions"].as_array().into_iter().flatten().all(|e| {
            let key = e["key"].as_str().expect("key");
            let values: Vec<&str> = e["values"].as_array().into_iter().flatten().filter_map(|v| v.as_str()).collect();
            match e["operator"].as_str() {
                Some("Exists") => labels.contains_key(key),
                Some("DoesNotExist") => !labels.contains_key(key),
                Some("In") => labels.get(key).is_some_and(|v| values.contains(&v.as_str())),
                Some("NotIn") => labels.get(key).is_none_or(|v| !values.contains(&v.as_str())),
                other => panic!("operator {other:?}"),
            }
        });
        by_labels && by_expressions
    }

    /// Kills the controller and starts it again.
    pub async fn restart_controller(&mut self) {
        self.kill_controller().await;
        self.start_controller().await;
    }

    /// Identity in the controller's leader Lease.
    pub async fn lease_holder(&self) -> Option<String> {
        let leases: Api<Lease> = Api::namespaced(TestEnv::get().client(User::Admin).await, &self.release_ns);
        let name = self.controller_env.iter().find(|(k, _)| k == "TOOLYARD_LEASE_NAME").map(|(_, v)| v.clone())?;
        leases.get_opt(&name).await.ok().flatten().and_then(|l| l.spec).and_then(|s| s.holder_identity)
    }

    async fn wait_controller_leads(&self) {
        let metrics = format!("{}/metrics", self.controller_ops);
        let result = wait_until(Duration::from_secs(90), "the controller to lead", || {
            let metrics = metrics.clone();
            async move {
                let Ok(response) = reqwest::get(&metrics).await else { return Ok(false) };
                let text = response.text().await.unwrap_or_default();
                Ok(text.lines().any(|l| l.trim() == "toolyard_controller_leader 1"))
            }
        })
        .await;
        if let Err(e) = result {
            self.dump_logs();
            panic!("{e:#}");
        }
    }

    async fn wait_ready(&self) {
        let ready = format!("{}/readyz", self.gateway_ops);
        let result = wait_until(Duration::from_secs(60), "the gateway to be ready", || {
            let ready = ready.clone();
            async move { Ok(reqwest::get(&ready).await.map(|r| r.status().is_success()).unwrap_or(false)) }
        })
        .await;
        if let Err(e) = result {
            self.dump_logs();
            panic!("{e:#}");
        }
    }

    /// Restarts the gateway process (same flags, same ports).
    pub async fn restart_gateway(&mut self) {
        let _ = self.gateway.start_kill();
        let _ = self.gateway.wait().await;
        self.gateway = spawn(
            &binary("toolyard-gateway"),
            &self.gateway_args,
            &self.gateway_env,
            &self.dir.path().join("gateway-2.log"),
        );
        self.wait_ready().await;
    }

    /// Starts a second gateway replica (same flags and key, its own ports) and returns its
    /// public base URL; it stops with the platform.
    pub async fn start_replica(&mut self) -> String {
        let (public, internal, ops) = (free_port(), free_port(), free_port());
        let mut args = self.gateway_args.clone();
        let host_ip = TestEnv::get().host_ip().to_string();
        for (flag, host, port) in [
            ("--listen", "127.0.0.1", public),
            ("--internal-listen", host_ip.as_str(), internal),
            ("--metrics-listen", "127.0.0.1", ops),
        ] {
            if let Some(i) = args.iter().position(|a| a == flag) {
                args[i + 1] = format!("{host}:{port}");
            }
        }
        let replica =
            spawn(&binary("toolyard-gateway"), &args, &self.gateway_env, &self.dir.path().join("gateway-replica.log"));
        self.replicas.push(replica);
        let ready = format!("http://127.0.0.1:{ops}/readyz");
        wait_until(Duration::from_secs(60), "the replica to be ready", || {
            let ready = ready.clone();
            async move { Ok(reqwest::get(&ready).await.map(|r| r.status().is_success()).unwrap_or(false)) }
        })
        .await
        .expect("replica ready");
        format!("https://127.0.0.1:{public}")
    }

    /// Stops the replicas started with [`Platform::start_replica`] as Kubernetes stops a pod
    /// (SIGTERM, then waiting for them to exit).
    pub async fn stop_replicas(&mut self) {
        for mut replica in self.replicas.drain(..) {
            if let Some(pid) = replica.id().and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM);
            }
            let _ = tokio::time::timeout(Duration::from_secs(60), replica.wait()).await;
        }
    }

    /// Prints the gateway's and controller's logs (on failure).
    pub fn dump_logs(&self) {
        let mut names: Vec<String> =
            ["gateway.log", "gateway-2.log", "gateway-replica.log"].iter().map(|s| (*s).to_owned()).collect();
        names.extend((1..=self.controller_starts).map(Self::controller_log));
        for name in names {
            if let Ok(text) = std::fs::read_to_string(self.dir.path().join(&name)) {
                let tail: Vec<&str> = text.lines().rev().take(60).collect();
                eprintln!("----- {name} (last lines) -----");
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }

    /// Applies a manifest file (as admin) into the served namespace and waits until every
    /// McpTool in it is Ready (set by the real controller).
    pub async fn apply_tools(&self, file: &str) {
        let env = TestEnv::get();
        env.kubectl_as(User::Admin, &["-n", &self.ns, "apply", "-f", repo_path(file).to_str().expect("utf-8")])
            .expect("apply tools");
        let api: Api<McpTool> = Api::namespaced(env.client(User::Admin).await, &self.ns);
        let result = wait_until(Duration::from_secs(60), "every McpTool Ready", || {
            let api = api.clone();
            async move {
                let tools = api.list(&Default::default()).await?.items;
                Ok(!tools.is_empty()
                    && tools
                        .iter()
                        .filter(|t| t.spec.execution.mode == toolyard_api::mcptool::ExecutionMode::Job)
                        .all(McpTool::is_ready))
            }
        })
        .await;
        if let Err(e) = result {
            self.dump_logs();
            panic!("{e:#}");
        }
    }

    /// An MCP client authenticated with `user`'s Kubernetes token.
    pub async fn client(&self, user: User) -> RunningService<RoleClient, ClientConfig> {
        let token = TestEnv::get().token(user).to_owned();
        let config = StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", self.base)).auth_header(token);
        let transport = StreamableHttpClientTransport::with_client(self.http(), config);
        ClientConfig::default()
            .serve_with_lifecycle(transport, ClientLifecycleMode::Initialize)
            .await
            .expect("MCP client connects")
    }

    /// The chart's dashboard and alerts against this platform: every `toolyard_*` series their
    /// queries read is one the running gateway and controller expose (an oversized request
    /// first makes an admission refusal), and `promtool check rules` accepts the alerts.
    pub async fn check_dashboard_and_alerts(&self) {
        let env = TestEnv::get();
        let oversized = self
            .http()
            .post(format!("{}/mcp", self.base))
            .bearer_auth(env.token(User::Alice))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(vec![b' '; 5 * 1024 * 1024])
            .send()
            .await;
        // The gateway answers 413 from the Content-Length and closes the connection: the
        // client may still be writing the body (a broken pipe, the answer unread).
        if let Ok(answer) = oversized {
            assert_eq!(answer.status(), reqwest::StatusCode::PAYLOAD_TOO_LARGE);
        }

        let mut exposed = std::collections::BTreeSet::new();
        for ops in [&self.gateway_ops, &self.controller_ops] {
            let text = reqwest::get(format!("{ops}/metrics")).await.expect("scrape").text().await.expect("body");
            exposed
                .extend(text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next().map(str::to_owned)));
        }

        let out = std::process::Command::new(env.bin_dir().join("helm"))
            .args(["template", "ty", repo_path("charts/toolyard").to_str().expect("utf-8"), "-n", "toolyard"])
            .args(["-f", repo_path("charts/toolyard/ci/test-values.yaml").to_str().expect("utf-8")])
            .args([
                "--set",
                "monitoring.grafanaDashboard.enabled=true",
                "--set",
                "monitoring.prometheusRule.enabled=true",
            ])
            .args(["--show-only", "templates/monitoring/dashboard.yaml"])
            .args(["--show-only", "templates/monitoring/prometheusrule.yaml"])
            .output()
            .expect("helm runs");
        assert!(out.status.success(), "helm template: {}", String::from_utf8_lossy(&out.stderr));
        let mut queries = Vec::new();
        let mut rules = None;
        for doc in String::from_utf8(out.stdout).expect("utf-8").split("\n---") {
            let doc: serde_json::Value = serde_saphyr::from_str(doc).expect("a rendered YAML document");
            match doc["kind"].as_str() {
                Some("ConfigMap") => {
                    let dashboard: serde_json::Value =
                        serde_json::from_str(doc["data"]["toolyard.json"].as_str().expect("the dashboard"))
                            .expect("the dashboard is JSON");
                    let panels = dashboard["panels"].as_array().expect("panels");
                    queries.extend(
                        panels
                            .iter()
                            .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
                            .filter_map(|t| t["expr"].as_str().map(str::to_owned)),
                    );
                    queries.extend(
                        dashboard["templating"]["list"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(|v| v["query"].as_str().filter(|q| q.contains('(')).map(str::to_owned)),
                    );
                }
                Some("PrometheusRule") => {
                    let groups = &doc["spec"]["groups"];
                    queries.extend(
                        groups
                            .as_array()
                            .into_iter()
                            .flatten()
                            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                            .filter_map(|r| r["expr"].as_str().map(str::to_owned)),
                    );
                    rules = Some(serde_json::json!({ "groups": groups }));
                }
                _ => {}
            }
        }
        assert!(queries.len() >= 10, "the dashboard and the alerts have queries: {queries:?}");
        let mut missing = Vec::new();
        for query in &queries {
            for name in metric_names(query) {
                if !exposed.contains(&name) {
                    missing.push(format!("{name} (in {query})"));
                }
            }
        }
        assert!(missing.is_empty(), "series no binary exposes:\n{}\nexposed: {exposed:?}", missing.join("\n"));

        let rules_file = self.dir.path().join("rules.json");
        std::fs::write(&rules_file, rules.expect("the PrometheusRule").to_string()).expect("rules file");
        let promtool = std::process::Command::new(env.bin_dir().join("promtool"))
            .args(["check", "rules"])
            .arg(&rules_file)
            .output()
            .expect("promtool runs");
        assert!(
            promtool.status.success(),
            "promtool check rules: {}{}",
            String::from_utf8_lossy(&promtool.stdout),
            String::from_utf8_lossy(&promtool.stderr)
        );
    }

    /// Stops everything.
    pub async fn stop(mut self) {
        let _ = self.gateway.start_kill();
        if let Some(controller) = &mut self.controller {
            let _ = controller.start_kill();
        }
        for replica in &mut self.replicas {
            let _ = replica.start_kill();
        }
    }
}
