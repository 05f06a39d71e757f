//! The chart as a user installs it, on the test node, from the images built from the
//! Dockerfile: `helm install` with the kind walkthrough's values
//! (`examples/kind/values.yaml`; its development S3 server from `examples/kind/s3.yaml`),
//! `kubectl apply -f examples/pricing/tools.yaml` (and the risk example's), and a ServiceAccount's token over HTTPS
//! through `kubectl port-forward`, the gateway's self-signed certificate as the CA.
//!
//! Checked here, all on real pods: the official Python SDK lists the tools and calls
//! `price_option` (a Job) and `get_quote` (a warm pool); the risk example's chart; a coding
//! task composing pricing and risk tools; a coding task with a scripted model
//! writes a CSV artifact that is read back, while the leading controller pod is deleted; a
//! cancelled call's pod is killed; the pods' hardening as seen from inside a container; an
//! image that does not exist; and every NetworkPolicy of the chart, enforced by kube-router
//! (a coding agent's pod reaches the gateway and DNS, not its model endpoint: the gateway
//! calls the model with the key only it holds).

use crate::coding_support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use coding_support::{Client, MODEL_ID, MODEL_KEY, call, call_in_trace, call_text, connect_with, structured, text_of};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Map, Value, json};
use tokio::process::{Child, Command};
use toolyard_api::ToolCall;
use toolyard_tests::local::TempDir;
use toolyard_tests::model_server::{Gate, ScriptedModel, Turn, wait_for_requests};
use toolyard_tests::traces::{ClientSpan, TraceStore};
use toolyard_tests::{TestEnv, User, chart, images, random_suffix, repo_path, wait_until};

/// One installation of the chart, serving one team namespace.
struct Install {
    /// The release: `toolyard-<random>`, so its objects are named `<release>-gateway` and so
    /// on, like the walkthrough's `toolyard-gateway`, and a release left by an earlier run of
    /// this test on the same cluster is no obstacle.
    release: String,
    /// The release namespace.
    ns: String,
    /// The namespace of the tools.
    team: String,
    /// `https://localhost:<port>`, forwarded to the gateway's Service.
    base: String,
    ca: reqwest::Certificate,
    ca_file: PathBuf,
    /// A token of ServiceAccount `quant` of the team namespace (audience `toolyard`).
    token: String,
    model: ScriptedModel,
    /// Seconds from `helm install` to the first successful tool call.
    install_to_first_call: Option<f64>,
    started: Instant,
    forward: Child,
    dir: TempDir,
}

fn kubectl(args: &[&str]) -> String {
    TestEnv::get().kubectl_as(User::Admin, args).unwrap_or_else(|e| panic!("{e:#}"))
}

fn kubectl_apply(ns: &str, yaml: &str) {
    let dir = TempDir::new("apply");
    let file = dir.path().join("objects.yaml");
    std::fs::write(&file, yaml).expect("write manifest");
    kubectl(&["-n", ns, "apply", "-f", file.to_str().expect("utf-8")]);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

impl Install {
    async fn start() -> Install {
        let env = TestEnv::get();
        let ns = env.namespace("toolyard").await.expect("namespace");
        let team = env.namespace("team").await.expect("namespace");
        for n in [&ns, &team] {
            kubectl(&["label", "namespace", n, "pod-security.kubernetes.io/enforce=restricted"]);
        }
        let dir = TempDir::new("e2e-node");
        let model = ScriptedModel::start_on(env.host_ip(), MODEL_KEY, vec![]).await;
        // The model's key is the gateway's (a Secret of the release namespace): no pod of the
        // team's namespace ever holds it.
        kubectl(&[
            "-n",
            &ns,
            "create",
            "secret",
            "generic",
            "model-key",
            &format!("--from-literal=api-key={MODEL_KEY}"),
        ]);

        // The development S3 server of the walkthrough, in this release's namespace.
        chart::deploy_dev_s3(&ns).unwrap_or_else(|e| panic!("{e:#}"));

        let store = TraceStore::get();
        let started = Instant::now();
        let sets = [
            "model.profiles[0].name=scripted".to_owned(),
            format!("model.profiles[0].model={MODEL_ID}"),
            format!("model.profiles[0].baseUrl={}", model.base_url()),
            "model.profiles[0].apiKeySecret.name=model-key".to_owned(),
            "model.profiles[0].apiKeySecret.key=api-key".to_owned(),
            // Traces to the test's trace store on the host, which run pods may reach.
            format!("tracing.otlpEndpoint={}", store.otlp_endpoint),
            "tracing.env.OTEL_BSP_SCHEDULE_DELAY=200".to_owned(),
            format!("networkPolicy.collectorTo[0].ipBlock.cidr={}/32", env.host_ip()),
            format!("networkPolicy.collectorPort={}", store.otlp_port()),
        ];
        let release = chart::install(&ns, &team, &sets).unwrap_or_else(|e| {
            dump(&ns, &team);
            panic!("{e:#}")
        });
        let release = release.name;

        // The tools, as the README says, and the test's probes.
        for file in
            ["examples/pricing/tools.yaml", "examples/risk/tools.yaml", "tests/fixtures/misbehaving/probes.yaml"]
        {
            kubectl(&["-n", &team, "apply", "-f", repo_path(file).to_str().expect("utf-8")]);
        }
        chart::wait_tools_ready(&team).await.unwrap_or_else(|e| {
            dump(&ns, &team);
            panic!("{e:#}")
        });

        // A caller: ServiceAccount quant with the chart's user roles.
        kubectl(&["-n", &team, "create", "serviceaccount", "quant"]);
        for role in ["tool-caller", "task-runner"] {
            kubectl(&[
                "-n",
                &team,
                "create",
                "rolebinding",
                &format!("quant-{role}"),
                &format!("--clusterrole={release}-{role}"),
                &format!("--serviceaccount={team}:quant"),
            ]);
        }
        let token = kubectl(&["-n", &team, "create", "token", "quant", "--audience", "toolyard"]).trim().to_owned();

        // The gateway's self-signed certificate is the CA; port-forward as the walkthrough does.
        let tls = Api::<Secret>::namespaced(env.client(User::Admin).await, &ns)
            .get(&format!("{release}-gateway-tls"))
            .await
            .expect("TLS Secret");
        let cert = tls.data.expect("data")["tls.crt"].0.clone();
        let ca_file = dir.path().join("toolyard.crt");
        std::fs::write(&ca_file, &cert).expect("write CA");
        let ca = reqwest::Certificate::from_pem(&cert).expect("PEM");
        let port = free_port();
        let forward = Command::new(env.kubectl())
            .arg("--kubeconfig")
            .arg(env.kubeconfig(User::Admin))
            .args(["-n", &ns, "port-forward", &format!("service/{release}-gateway"), &format!("{port}:443")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("kubectl port-forward");
        let base = format!("https://localhost:{port}");
        let http = reqwest::Client::builder().tls_certs_only([ca.clone()]).build().expect("client");
        wait_until(Duration::from_secs(30), "the port-forward", || {
            let (http, url) = (http.clone(), format!("{base}/mcp"));
            async move { Ok(http.get(url).send().await.is_ok()) }
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
        Install {
            release,
            ns,
            team,
            base,
            ca,
            ca_file,
            token,
            model,
            install_to_first_call: None,
            started,
            forward,
            dir,
        }
    }

    fn http(&self) -> reqwest::Client {
        reqwest::Client::builder().tls_certs_only([self.ca.clone()]).build().expect("HTTPS client")
    }

    async fn client(&self) -> Client {
        connect_with(self.http(), &format!("{}/mcp", self.base), &self.token, false).await
    }

    /// Pods of a namespace whose name starts with `prefix`.
    async fn pods(&self, ns: &str, prefix: &str) -> Vec<Pod> {
        let pods = Api::<Pod>::namespaced(TestEnv::get().client(User::Admin).await, ns);
        let list = pods.list(&ListParams::default()).await.expect("pods").items;
        list.into_iter().filter(|p| p.metadata.name.as_deref().is_some_and(|n| n.starts_with(prefix))).collect()
    }

    async fn pod_ip(&self, ns: &str, prefix: &str) -> String {
        let pods = self.pods(ns, prefix).await;
        let ip = pods.iter().find_map(|p| p.status.as_ref().and_then(|s| s.pod_ip.clone()));
        ip.unwrap_or_else(|| panic!("no running pod {prefix}* in {ns}"))
    }

    /// What a plain pod (no Toolyard labels) in `ns` with `labels` sees connecting to `targets`.
    async fn probe_from_pod(&self, ns: &str, labels: &[(&str, &str)], targets: &[String]) -> Map<String, Value> {
        let pods = Api::<Pod>::namespaced(TestEnv::get().client(User::Admin).await, ns);
        let name = format!("probe-{}", random_suffix(6));
        let mut command: Vec<String> = vec![
            "python3".into(),
            "-c".into(),
            format!(
                "import json, sys, misbehaving; print(json.dumps(misbehaving.connect(sys.argv[1:], settle={SETTLE})))"
            ),
        ];
        command.extend(targets.iter().cloned());
        let mut pod = toolyard_tests::restricted_pod(&name, images::MISBEHAVING, command);
        pod.metadata.labels = Some(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
        pods.create(&PostParams::default(), &pod).await.expect("create probe pod");
        wait_until(Duration::from_secs(120), "the probe pod to finish", || {
            let (pods, name) = (pods.clone(), name.clone());
            async move {
                let phase = pods.get(&name).await?.status.and_then(|s| s.phase).unwrap_or_default();
                Ok(phase == "Succeeded" || phase == "Failed")
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
        let logs = pods.logs(&name, &LogParams::default()).await.expect("probe logs");
        match serde_json::from_str::<Value>(logs.lines().last().unwrap_or_default()) {
            Ok(Value::Object(map)) => map,
            _ => panic!("probe pod printed no result: {logs}"),
        }
    }

    async fn lease_holder(&self) -> Option<String> {
        let leases: Api<Lease> = Api::namespaced(TestEnv::get().client(User::Admin).await, &self.ns);
        let lease = leases.get_opt(&format!("{}-controller", self.release)).await.ok().flatten()?;
        lease.spec?.holder_identity
    }

    fn dump(&self) {
        dump(&self.ns, &self.team);
    }

    async fn stop(mut self) {
        let _ = self.forward.start_kill();
        chart::Release { name: self.release.clone(), ns: self.ns.clone() }.uninstall();
        drop(self.dir);
    }
}

/// Prints what a failure needs: the pods, calls, tasks and events of both namespaces, and
/// the gateway's and controller's logs.
fn dump(ns: &str, team: &str) {
    for (ns, what) in [(ns, "pods"), (team, "pods,mcptools,toolcalls,codingtasks")] {
        let got = TestEnv::get().kubectl_as(User::Admin, &["-n", ns, "get", what, "-o", "wide"]);
        eprintln!("----- {ns}: {what} -----\n{}", got.unwrap_or_else(|e| format!("{e:#}")));
        let warnings =
            TestEnv::get().kubectl_as(User::Admin, &["-n", ns, "get", "events", "--field-selector=type=Warning"]);
        eprintln!("----- {ns}: warnings -----\n{}", warnings.unwrap_or_else(|e| format!("{e:#}")));
    }
    for component in ["gateway", "controller"] {
        let selector = format!("app.kubernetes.io/component={component}");
        let logs = TestEnv::get()
            .kubectl_as(User::Admin, &["-n", ns, "logs", "-l", &selector, "--tail=80", "--prefix"])
            .unwrap_or_else(|e| format!("{e:#}"));
        eprintln!("----- {component} logs -----\n{logs}");
    }
}

/// Runs the official Python SDK against the installation: lists tools and makes `calls`.
fn python_sdk(install: &Install, calls: &[(&str, Value)]) -> Value {
    python_sdk_calls(install, calls.iter().map(|(tool, args)| json!([tool, args])).collect())
}

/// [`python_sdk`] with the calls as `mcp_sdk_calls.py` takes them (`[tool, args, options]`).
fn python_sdk_calls(install: &Install, calls: Vec<Value>) -> Value {
    let python = std::env::var("TOOLYARD_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(python)
        .arg(repo_path("tests/fixtures/python/mcp_sdk_calls.py"))
        .arg(format!("{}/mcp", install.base))
        .arg(&install.ca_file)
        .arg(Value::Array(calls).to_string())
        .env("MCP_TOKEN", &install.token)
        .output()
        .expect("python runs");
    assert!(out.status.success(), "the Python SDK client failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// Seconds a probe waits before it connects: kube-router learns of a new pod (and puts its
/// address in the policies' sets) a moment after the pod starts. Until then the pod's traffic
/// is not yet subject to the policies, in either direction.
const SETTLE: u32 = 5;

fn is_open(outcome: &Map<String, Value>, target: &str) -> bool {
    outcome.get(target).and_then(Value::as_str) == Some("open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_chart_installed_with_helm_serves_tools_on_the_real_node() {
    let mut node = toolyard_tests::claim_node(toolyard_tests::NodeShare::Whole).await;
    let mut install = timed("install", Install::start()).await;
    node.empty_at_end(&install.ns);
    node.empty_at_end(&install.team);
    let result = std::panic::AssertUnwindSafe(scenario(&mut install));
    let outcome = futures::FutureExt::catch_unwind(result).await;
    if outcome.is_err() {
        install.dump();
    }
    timed("stop", install.stop()).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn scenario(install: &mut Install) {
    // The official Python SDK, over HTTPS with a ServiceAccount token: a Job and a warm pool.
    let seen = timed("first_calls", async {
        python_sdk(
            install,
            &[
                (
                    "price_option",
                    json!({"spot": 100, "strike": 100, "time_to_expiry": 1, "volatility": 0.2, "rate": 0.05}),
                ),
                ("get_quote", json!({"symbol": "aapl"})),
            ],
        )
    })
    .await;
    install.install_to_first_call = Some(install.started.elapsed().as_secs_f64());
    let tools: Vec<&str> = seen["tools"].as_array().expect("tools").iter().filter_map(Value::as_str).collect();
    for tool in ["price_option", "calc_greeks", "get_quote", "get_quote_fresh", "run_coding_task", "read_artifact"] {
        assert!(tools.contains(&tool), "{tool} missing from {tools:?}");
    }
    let priced = &seen["results"][0];
    assert_eq!(priced["isError"], false, "{priced}");
    let price = priced["structuredContent"]["price"].as_f64().expect("price");
    assert!((price - 10.4506).abs() < 1e-4, "{price}");
    let quote = &seen["results"][1];
    assert_eq!(quote["isError"], false, "{quote}");
    assert_eq!(quote["structuredContent"]["symbol"], "AAPL", "{quote}");
    assert_eq!(quote["structuredContent"]["last"], 227.5, "{quote}");
    // The gateway publishes its warm-pool calls in flight in a Lease of its own, which the
    // chart lets it write: other replicas count them against the user's limit.
    let leases = kubectl(&["-n", &install.ns, "get", "leases", "-l", "toolyard.dev/gateway-load", "-o", "name"]);
    assert_eq!(leases.lines().count(), 1, "one load Lease per gateway replica: {leases}");
    // The gateway sends pool calls to the pool's ready pods, which it follows in the
    // EndpointSlices Kubernetes makes for the pool's Service (they carry its labels), with the
    // read access the chart gives it.
    let selector = "toolyard.dev/component=pool,kubernetes.io/service-name=get-quote-pool";
    let slices = kubectl(&["-n", &install.team, "get", "endpointslices", "-l", selector, "-o", "name"]);
    assert_eq!(slices.lines().count(), 1, "the pool Service's EndpointSlice: {slices}");
    let logs = kubectl(&["-n", &install.ns, "logs", &format!("deployment/{}-gateway", install.release)]);
    assert!(!logs.contains("EndpointSlice watch failed"), "{logs}");
    eprintln!(
        "helm install to the first successful call: {:.1} s (price_option {:.2} s, get_quote {:.2} s)",
        install.install_to_first_call.unwrap_or_default(),
        priced["seconds"].as_f64().unwrap_or_default(),
        quote["seconds"].as_f64().unwrap_or_default()
    );

    timed("progress", async { progress(install) }).await;
    // `toolyard check` takes the S3 server and the controllers away for a while: alone.
    timed("cli", cli(install)).await;
    // The steps below use different tools and objects. Those that script the model (it has
    // one script at a time) run one after another, beside the others.
    let scripted = async {
        timed("risk_with_pricing", risk_with_pricing(install)).await;
        timed("network_policies", network_policies(install)).await;
        timed("model_written_code_reaches_no_credential", model_written_code_reaches_no_credential(install)).await;
    };
    let unscripted = async {
        timed("traces", traces(install)).await;
        timed("hardening", hardening(install)).await;
        timed("mcp_server_in_the_cluster", mcp_server_in_the_cluster(install)).await;
        timed("missing_image", missing_image(install)).await;
        timed("cancellation_kills_the_pod", cancellation_kills_the_pod(install)).await;
        timed("pool_of_two_pods", pool_of_two_pods(install)).await;
    };
    tokio::join!(scripted, unscripted);
    // Deletes the leading controller pod: last, alone.
    timed("coding_task_outlives_the_leading_controller", coding_task_outlives_the_leading_controller(install)).await;
}

/// Runs one step of the scenario and prints how long it took (shown on a failure, or with
/// `--nocapture`).
async fn timed<T>(step: &str, run: impl Future<Output = T>) -> T {
    let started = Instant::now();
    let output = run.await;
    eprintln!("e2e_node: {step} took {:.1} s", started.elapsed().as_secs_f64());
    output
}

/// The risk example's image (numpy, pandas and matplotlib pip-installed at build time) on the
/// node: its chart comes back as MCP image content, and a coding task composes the pricing
/// and risk tools, the chart a tool returned becoming one of the task's artifacts.
async fn risk_with_pricing(install: &Install) {
    let client = install.client().await;
    let book = json!({"us_equity": 1_000_000, "us_treasury_10y": 500_000});
    let charted = call(&client, "pnl_chart", json!({"positions": book})).await;
    let chart = structured(&charted);
    assert_eq!(chart["image"], "pnl.png", "{chart}");
    let images: Vec<_> = charted.content.iter().filter_map(|c| c.as_image()).collect();
    assert_eq!(images.iter().map(|i| i.mime_type.as_str()).collect::<Vec<_>>(), ["image/png"], "{charted:?}");

    let failures = install.model.failures().len();
    install.model.set_script(vec![
        Turn::code(
            "option = price_option(spot=100, strike=100, time_to_expiry=1, volatility=0.2, rate=0.05)\n\
             book = {'us_equity': 1_000_000, 'us_treasury_10y': 500_000}\n\
             var = historical_var(positions=book)\n\
             stress = stress_test(positions=book)\n\
             chart = pnl_chart(positions=book)\n\
             print('COMPOSED', round(option['price'], 2), round(var['var']), stress['worst'], chart['image'])",
        ),
        Turn::code(
            "final_answer({'task_type': 'analysis', 'summary': 'option priced, book risk measured', \
             'metrics': {'option_price': option['price'], 'var_99': var['var']}, \
             'assumptions': ['two years of bundled history']})",
        )
        .expecting("COMPOSED 10.45 ")
        .expecting(" liquidity_shock pnl.png")
        .expecting("[pnl_chart returned pnl.png (image/png, "),
    ]);
    let result = structured(
        &call(
            &client,
            "run_coding_task",
            json!({"task": "price the option and measure the book's risk",
                   "tools": ["price_option", "historical_var", "stress_test", "pnl_chart"]}),
        )
        .await,
    );
    assert_eq!(result["status"], "success", "{result}");
    assert_eq!(install.model.failures()[failures..], [] as [String; 0], "the model saw what the script expects");
    assert_eq!(result["metrics"]["var_99"], chart["var"], "the task's VaR is the chart's: {result}");
    let artifacts: Vec<&str> =
        result["artifacts"].as_array().expect("artifacts").iter().filter_map(|a| a["name"].as_str()).collect();
    assert!(
        artifacts.len() == 1 && artifacts[0].starts_with("pnl-chart-") && artifacts[0].ends_with("/pnl.png"),
        "the chart the tool returned is the task's artifact: {artifacts:?}"
    );
}

/// One trace from the client through the gateway's pod, the controller's reconcile and the
/// runner in the Job's pod (and in a warm pool's pod), read back from the trace store.
async fn traces(install: &Install) {
    const GATEWAY: &str = "toolyard-gateway";
    const RUNNER: &str = "toolyard-runner";
    const FUNCTION: &str = "toolyard-function";
    let store = TraceStore::get();
    let client = install.client().await;
    let wait = Duration::from_secs(90);

    let job = ClientSpan::new();
    let atm = json!({"spot": 100, "strike": 100, "time_to_expiry": 1, "volatility": 0.2, "rate": 0.05});
    structured(&call_in_trace(&client, "price_option", atm, &job.traceparent).await);
    let expected = [
        (GATEWAY, "tools/call price_option"),
        ("toolyard-controller", "reconcile ToolCall"),
        (RUNNER, "call"),
        (RUNNER, "function.call"),
        (RUNNER, "upload"),
    ];
    let trace = store.wait_for(&job.trace_id, &expected, wait).await.unwrap_or_else(|e| panic!("{e:#}"));
    let root = trace.one(GATEWAY, "tools/call price_option");
    assert_eq!(root.parent.as_deref(), Some(job.span_id.as_str()), "\n{}", trace.tree());
    let execute = trace.one(GATEWAY, "execute");
    assert_eq!(trace.parent(execute).id, root.id, "\n{}", trace.tree());
    for reconcile in trace.named("toolyard-controller", "reconcile ToolCall") {
        assert_eq!(trace.parent(reconcile).id, execute.id, "reconciles under execute:\n{}", trace.tree());
    }
    let runner = trace.one(RUNNER, "call");
    assert_eq!(trace.parent(runner).id, execute.id, "the Job's runner under execute:\n{}", trace.tree());
    assert_eq!(trace.parent(trace.one(RUNNER, "function.call")).id, runner.id, "\n{}", trace.tree());

    let pooled = ClientSpan::new();
    structured(&call_in_trace(&client, "get_quote", json!({"symbol": "msft"}), &pooled.traceparent).await);
    let trace = store
        .wait_for(&pooled.trace_id, &[(GATEWAY, "tools/call get_quote"), (RUNNER, "call")], wait)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let execute = trace.one(GATEWAY, "execute");
    assert_eq!(trace.parent(trace.one(RUNNER, "call")).id, execute.id, "the pool pod's runner:\n{}", trace.tree());

    // The Python function's own span, from a tool image that has OpenTelemetry's SDK
    // (`toolyard[tracing]`: the misbehaving fixtures' image has it, the pricing example's not).
    let function = ClientSpan::new();
    let args = json!({"n": 1, "pause": 0.0});
    structured(&call_in_trace(&client, "progress_steps", args, &function.traceparent).await);
    let expected = [(GATEWAY, "tools/call progress_steps"), (RUNNER, "function.call"), (FUNCTION, "misbehaving.steps")];
    let trace = store.wait_for(&function.trace_id, &expected, wait).await.unwrap_or_else(|e| panic!("{e:#}"));
    let python = trace.one(FUNCTION, "misbehaving.steps");
    assert_eq!(trace.parent(python).id, trace.one(RUNNER, "function.call").id, "\n{}", trace.tree());
}

/// A function in a Job pod on the node reports progress: the Python SDK client that asked for
/// it gets `notifications/progress` over HTTPS, in order, before the answer.
fn progress(install: &Install) {
    let seen = python_sdk_calls(install, vec![json!(["progress_steps", {"n": 3, "pause": 1.0}, {"progress": true}])]);
    let result = &seen["results"][0];
    assert_eq!(result["structuredContent"], json!({"n": 3}), "{result}");
    let reports = result["progress"].as_array().expect("progress");
    assert!(!reports.is_empty(), "no progress notification: {result}");
    let values: Vec<f64> = reports.iter().filter_map(|r| r[0].as_f64()).collect();
    assert!(values.windows(2).all(|w| w[1] > w[0]), "progress only grows: {reports:?}");
    for report in reports {
        assert_eq!(report[1], 1.0, "the total is 1: {reports:?}");
        let step = (report[0].as_f64().expect("value") * 3.0).round();
        assert_eq!(report[2], format!("step {step} of 3"), "{reports:?}");
    }
    eprintln!("progress from a Job pod on the node: {}", Value::Array(reports.clone()));
}

/// The `toolyard` command against this install: the pricing suite passes over HTTPS; `check`
/// passes every line (the chart's certificate, the token, both handshakes, the tools, the
/// CRDs, the leading controller, the gateway and its storage, RBAC by
/// SelfSubjectAccessReview); an identity with no RoleBinding gets warnings that say which
/// binding is missing; with the controller scaled to zero its line fails, with what to run.
/// The gateway's image carries the command.
async fn cli(install: &Install) {
    use toolyard_tests::local::toolyard_with;
    let url = format!("{}/mcp", install.base);
    let ca = install.ca_file.to_str().expect("utf-8");
    let kubeconfig = TestEnv::get().kubeconfig(User::Admin);
    let vars = [("KUBECONFIG", kubeconfig.as_os_str())];
    let suite = repo_path("examples/pricing/tests/suite.yaml");
    let run = toolyard_with(
        &url,
        &install.token,
        &["test", suite.to_str().expect("utf-8"), "--ca-file", ca, "--jobs", "4"],
        &vars,
    )
    .await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("pricing: 9 passed, 0 failed"), "{}", run.stdout);

    let check = ["check", "--kube", "--namespace", &install.ns, "--ca-file", ca];
    let run = toolyard_with(&url, &install.token, &check, &vars).await;
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let status = |run: &toolyard_tests::local::CliRun, name: &str| {
        let line = run.stdout.lines().find(|l| l.get(6..).is_some_and(|r| r.split_whitespace().next() == Some(name)));
        line.unwrap_or_else(|| panic!("no {name} line:\n{}", run.stdout)).to_owned()
    };
    for name in [
        "crd.McpTool",
        "crd.ToolCall",
        "crd.CodingTask",
        "controller",
        "gateway",
        "storage",
        "access",
        "gateway.tls",
        "gateway.token",
        "mcp.2025-11-25",
        "mcp.2026-07-28",
        "tools",
    ] {
        assert!(status(&run, name).starts_with("PASS"), "{name}:\n{}", run.stdout);
    }
    assert!(status(&run, "controller").contains("leads (Lease renewed"), "{}", run.stdout);
    assert!(status(&run, "access").contains("price_option"), "{}", run.stdout);
    assert!(status(&run, "gateway.tls").contains("valid until"), "{}", run.stdout);
    // The gateway pod reaches the scripted model (on this host) with the profile's key.
    assert!(status(&run, "coding-tasks").contains("(reachable, HTTP 200)"), "{}", run.stdout);
    eprintln!("toolyard check on the node:\n{}", run.stdout);

    // A kubeconfig whose user may not read CRDs (bob): the CRD lines fail and say what to allow.
    let bob = TestEnv::get().kubeconfig(User::Bob);
    let run = toolyard_with(&url, &install.token, &check, &[("KUBECONFIG", bob.as_os_str())]).await;
    assert_eq!(run.code, 1, "{}", run.stdout);
    let crd = status(&run, "crd.McpTool");
    assert!(crd.starts_with("FAIL") && crd.contains("forbidden"), "{}", run.stdout);
    assert!(run.stdout.contains("allow this identity to get customresourcedefinitions"), "{}", run.stdout);

    // A token the cluster never issued: the token line fails, the handshakes are skipped.
    let run = toolyard_with(&url, "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln", &check, &vars).await;
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(status(&run, "gateway.token").starts_with("FAIL"), "{}", run.stdout);
    assert!(status(&run, "mcp.2025-11-25").starts_with("SKIP"), "{}", run.stdout);

    // Without the CA the TLS line fails and says to pass it.
    let run = toolyard_with(&url, &install.token, &["check"], &vars).await;
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(status(&run, "gateway.tls").starts_with("FAIL") && run.stdout.contains("--ca-file"), "{}", run.stdout);

    // An identity nobody bound: authenticated, allowed nothing, told what to bind.
    kubectl(&["-n", &install.team, "create", "serviceaccount", "nobody"]);
    let nobody =
        kubectl(&["-n", &install.team, "create", "token", "nobody", "--audience", "toolyard"]).trim().to_owned();
    let run = toolyard_with(&url, &nobody, &check, &vars).await;
    assert!(status(&run, "gateway.token").starts_with("PASS"), "{}", run.stdout);
    for name in ["tools", "access"] {
        let line = status(&run, name);
        assert!(line.starts_with("WARN"), "{name}:\n{}", run.stdout);
    }
    assert!(run.stdout.contains("toolyard-tool-caller"), "{}", run.stdout);

    // No storage: the development S3 server scaled away. It stops on its image's stop signal
    // (not killed at the end of its grace period). The gateway stops being ready and the
    // storage line says why, from the gateway's own log.
    let s3_pods = Api::<Pod>::namespaced(TestEnv::get().client(User::Admin).await, &install.ns);
    let s3_selector = "app.kubernetes.io/name=toolyard-s3";
    let listed = s3_pods.list(&ListParams::default().labels(s3_selector)).await.expect("S3 pods");
    let since = listed.metadata.resource_version.expect("a list's resourceVersion");
    kubectl(&["-n", &install.ns, "scale", "deployment/toolyard-s3", "--replicas=0"]);
    let watch = WatchParams::default().labels(s3_selector).timeout(120);
    let mut events = s3_pods.watch(&watch, &since).await.expect("watch S3 pods").boxed();
    let exit_code = loop {
        match events.try_next().await.expect("S3 pod events") {
            Some(WatchEvent::Deleted(pod)) => {
                let statuses = pod.status.and_then(|s| s.container_statuses).unwrap_or_default();
                break statuses.first().and_then(|c| c.state.as_ref()?.terminated.as_ref()).map(|t| t.exit_code);
            }
            Some(WatchEvent::Error(e)) => panic!("watching the S3 pod: {e:?}"),
            Some(_) => {}
            None => panic!("the S3 pod was not deleted within 120 s"),
        }
    };
    assert_eq!(exit_code, Some(0), "s3s-fs exits on its own when stopped (137: killed at the end of its grace period)");
    let deadline = Instant::now() + Duration::from_secs(120);
    let run = loop {
        let run = toolyard_with(&url, &install.token, &check, &vars).await;
        if status(&run, "storage").starts_with("FAIL") || Instant::now() > deadline {
            break run;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    };
    assert_eq!(run.code, 1, "{}", run.stdout);
    let storage = status(&run, "storage");
    assert!(storage.starts_with("FAIL") && storage.contains("storage health check"), "{}", run.stdout);
    assert!(status(&run, "gateway").starts_with("FAIL"), "{}", run.stdout);
    assert!(status(&run, "gateway.storage").starts_with("FAIL"), "{}", run.stdout);
    assert!(run.stdout.contains("gateway.storage.s3"), "{}", run.stdout);
    kubectl(&["-n", &install.ns, "scale", "deployment/toolyard-s3", "--replicas=1"]);
    kubectl(&["-n", &install.ns, "rollout", "status", "deployment/toolyard-s3", "--timeout=120s"]);
    let gateway = format!("deployment/{}-gateway", install.release);
    kubectl(&["-n", &install.ns, "wait", "--for=condition=Available", &gateway, "--timeout=120s"]);

    // No controller: its line fails with what to look at; back to two replicas after.
    let controller = format!("deployment/{}-controller", install.release);
    kubectl(&["-n", &install.ns, "scale", &controller, "--replicas=0"]);
    kubectl(&[
        "-n",
        &install.ns,
        "wait",
        "--for=delete",
        "pod",
        "-l",
        "app.kubernetes.io/component=controller",
        "--timeout=120s",
    ]);
    let run = toolyard_with(&url, &install.token, &check, &vars).await;
    assert_eq!(run.code, 1, "{}", run.stdout);
    let line = status(&run, "controller");
    assert!(line.starts_with("FAIL") && line.contains("no ready replica"), "{}", run.stdout);
    assert!(run.stdout.contains(&format!("logs {controller}")), "{}", run.stdout);
    kubectl(&["-n", &install.ns, "scale", &controller, "--replicas=2"]);
    kubectl(&["-n", &install.ns, "rollout", "status", &controller, "--timeout=180s"]);
    // The Lease names a running pod again (not one of the replicas scaled away).
    let pods = Api::<Pod>::namespaced(TestEnv::get().client(User::Admin).await, &install.ns);
    wait_until(Duration::from_secs(120), "a controller leads again", || async {
        Ok(match install.lease_holder().await.filter(|h| !h.is_empty()) {
            Some(holder) => pods.get_opt(&holder).await?.is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
            None => false,
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));

    // The release image carries the command.
    let version = kubectl(&[
        "-n",
        &install.ns,
        "exec",
        &format!("deployment/{}-gateway", install.release),
        "--",
        "toolyard",
        "--version",
    ]);
    assert!(version.starts_with("toolyard 0."), "{version}");
}

/// The hardening of run pods, as the function sees it from inside its container.
async fn hardening(install: &Install) {
    let client = install.client().await;
    let seen = structured(&call(&client, "sandbox", json!({})).await);
    assert_eq!((seen["uid"].as_i64(), seen["gid"].as_i64()), (Some(65532), Some(65532)), "{seen}");
    assert_eq!(seen["root_writable"], false, "the root filesystem is read-only: {seen}");
    assert_eq!(seen["app_writable"], false, "the image's files are read-only: {seen}");
    assert_eq!(seen["tmp_writable"], true, "/tmp is the tool's scratch space: {seen}");
    assert_eq!(seen["service_account_token"], false, "no ServiceAccount token is mounted: {seen}");
    assert_eq!(seen["no_new_privs"], "1", "{seen}");
    assert_eq!(seen["seccomp"], "2", "seccomp filter (RuntimeDefault): {seen}");
    assert_eq!(seen["cap_eff"], "0000000000000000", "no capabilities: {seen}");
    assert_eq!(seen["cap_bnd"], "0000000000000000", "no capabilities to gain: {seen}");
    let environment: Vec<&str> =
        seen["environment"].as_array().expect("env").iter().filter_map(Value::as_str).collect();
    for secret in ["TOOLYARD_TOKEN", "TOOLYARD_GATEWAY_URL"] {
        assert!(!environment.contains(&secret), "{secret} reached the function: {environment:?}");
    }

    // Writing outside the temporary folder fails clearly; inside it works.
    let outside = call(&client, "write_file", json!({"path": "/app/pricing/injected.py", "text": "x"})).await;
    assert_eq!(outside.is_error, Some(true), "{}", text_of(&outside));
    assert!(text_of(&outside).contains("Read-only file system"), "{}", text_of(&outside));
    let inside = call(&client, "write_file", json!({"path": "/tmp/scratch.txt", "text": "hello"})).await;
    assert_eq!(structured(&inside), json!({"written": 5}), "{}", text_of(&inside));
}

/// An McpServer Toolyard runs: the official Python SDK's fixture server speaking stdio, in a
/// hardened pod of its own behind `toolyard-runner bridge`. The gateway connects once the
/// controller reports a pod available and serves its tools; a plain pod cannot reach it; when
/// its pod is replaced the gateway connects to the new one.
async fn mcp_server_in_the_cluster(install: &Install) {
    let team = install.team.clone();
    kubectl_apply(
        &team,
        &format!(
            "apiVersion: toolyard.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: desk}}\nspec:\n  runtime:\n    \
             image: {}\n    command: [python3, /app/upstream_server.py, stdio, /tmp]\n  reconnectDelaysSeconds: [2]\n",
            images::MCP_PYTHON
        ),
    );
    let client = install.client().await;
    let c = &client;
    let answers = move || async move { Ok(desk_quote(c).await == Some(json!({"ticker": "ACME", "price": 12.5}))) };
    wait_until(Duration::from_secs(180), "desk_get_quote to answer through the gateway", answers)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));

    let server: Value = serde_json::from_str(&kubectl(&["-n", &team, "get", "mcpserver", "desk", "-o", "json"]))
        .expect("McpServer JSON");
    let status = &server["status"];
    assert_eq!(status["conditions"][0]["type"], "Ready", "{status}");
    assert_eq!(status["conditions"][0]["status"], "True", "{status}");
    assert_eq!(status["conditions"][0]["reason"], "ServerAvailable", "{status}");
    assert_eq!(status["connections"][0]["state"], "Connected", "{status}");
    assert!(status["connections"][0]["tools"].as_i64().unwrap_or_default() >= 5, "{status}");

    let pods = install.pods(&team, "desk-mcp-").await;
    let pod = pods.first().expect("the server's pod");
    let spec = pod.spec.as_ref().expect("pod spec");
    assert_eq!(spec.automount_service_account_token, Some(false));
    let container = &spec.containers[0];
    let security = container.security_context.as_ref().expect("security context");
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(security.capabilities.as_ref().and_then(|c| c.drop.clone()), Some(vec!["ALL".to_owned()]));
    assert_eq!(container.command.as_ref().expect("command")[..2], ["/toolyard/bin/toolyard-runner", "bridge"]);

    // Only the gateway reaches the server's pod.
    let address = format!("{}:8080", install.pod_ip(&team, "desk-mcp-").await);
    let plain = install.probe_from_pod(&team, &[("app", "not-a-run")], std::slice::from_ref(&address)).await;
    assert!(!is_open(&plain, &address), "a pod that is not the gateway reached the MCP server: {plain:?}");

    // Its pod is replaced: the gateway connects to the new one.
    let old = pod.metadata.name.clone().expect("pod name");
    kubectl(&["-n", &team, "delete", "pod", &old, "--wait=false"]);
    let (old, team_ref) = (old.as_str(), team.as_str());
    let replaced = move || async move {
        let pods = install.pods(team_ref, "desk-mcp-").await;
        let gone = pods.iter().all(|p| p.metadata.name.as_deref() != Some(old));
        Ok(gone && desk_quote(c).await == Some(json!({"ticker": "ACME", "price": 12.5})))
    };
    wait_until(Duration::from_secs(180), "desk_get_quote to answer from the new pod", replaced)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    kubectl(&["-n", &team, "delete", "mcpserver", "desk"]);
}

/// The structured answer of `desk_get_quote` for ACME, if the call succeeds.
async fn desk_quote(client: &Client) -> Option<Value> {
    let params = rmcp::model::CallToolRequestParams::new("desk_get_quote")
        .with_arguments(json!({"ticker": "ACME"}).as_object().expect("object").clone());
    client.call_tool(params).await.ok().filter(|r| r.is_error != Some(true)).and_then(|r| r.structured_content)
}

/// A tool whose image does not exist: the call fails with ImagePullFailed.
async fn missing_image(install: &Install) {
    kubectl_apply(
        &install.team,
        "apiVersion: toolyard.dev/v1alpha1\nkind: McpTool\nmetadata:\n  name: missing-image\nspec:\n  name: missing_image\n  \
         description: A tool whose image does not exist.\n  inputSchema: {type: object}\n  runtime:\n    \
         image: registry.invalid/toolyard/missing:1\n    command: [\"true\"]\n",
    );
    let client = install.client().await;
    let failed = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let result = call(&client, "missing_image", json!({})).await;
            // The tool may not be listed yet: the catalog follows the McpTool.
            if !text_of(&result).contains("unknown tool") && !text_of(&result).contains("not found") {
                return result;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await
    .expect("the call ends");
    assert_eq!(failed.is_error, Some(true), "{}", text_of(&failed));
    let calls = Api::<ToolCall>::namespaced(TestEnv::get().client(User::Admin).await, &install.team);
    let call = calls.list(&Default::default()).await.expect("calls").items;
    let call = call.iter().find(|c| c.spec.tool == "missing-image").expect("the ToolCall");
    let condition = toolyard_api::conditions::find(
        &call.status.as_ref().expect("status").conditions,
        toolyard_api::conditions::SUCCEEDED,
    )
    .expect("Succeeded condition");
    assert_eq!(condition.reason, toolyard_api::conditions::reason::IMAGE_PULL_FAILED, "{}", text_of(&failed));
}

/// A warm pool of two pods of one slot and no queue each: calls made two at a time are all
/// answered. The gateway finds the pods in the EndpointSlice Kubernetes keeps for the pool's
/// Service, sends each call to a pod with room, and a pod that is full passes the call on.
/// (Through the Service, the two calls' connections could both reach one pod, which would
/// refuse one of them as busy.)
async fn pool_of_two_pods(install: &Install) {
    kubectl_apply(
        &install.team,
        "apiVersion: toolyard.dev/v1alpha1\nkind: McpTool\nmetadata:\n  name: hold-pair\nspec:\n  name: hold_pair\n  \
         description: Sleep, on a pool of two pods of one slot each.\n  inputSchema:\n    type: object\n    \
         properties: {seconds: {type: number}}\n  runtime:\n    image: ghcr.io/toolyard/test-misbehaving:0.1.0\n    \
         command: [python3, -m, toolyard.run, \"misbehaving:hang\"]\n  execution:\n    mode: Pool\n    \
         timeoutSeconds: 60\n    pool: {replicas: 2, concurrency: 1, queue: 0, reuseProcess: true}\n",
    );
    let slices = Api::<EndpointSlice>::namespaced(TestEnv::get().client(User::Admin).await, &install.team);
    let listed = ListParams::default().labels("kubernetes.io/service-name=hold-pair-pool,toolyard.dev/component=pool");
    wait_until(Duration::from_secs(180), "two ready pods in the pool's EndpointSlice", || async {
        let ready = slices
            .list(&listed)
            .await?
            .items
            .iter()
            .flat_map(|s| &s.endpoints)
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .count();
        Ok(ready == 2)
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let (one, two) = (install.client().await, install.client().await);
    let hold = |seconds: f64| json!({"seconds": seconds});
    // The catalog and the gateway's EndpointSlice watch follow the objects: a first call may
    // find the tool not listed yet.
    wait_until(Duration::from_secs(60), "a first call of hold_pair answered", || async {
        Ok(call_text(&one, "hold_pair", hold(0.0)).await.contains("slept"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    for _ in 0..3 {
        let (a, b) = tokio::join!(call(&one, "hold_pair", hold(1.0)), call(&two, "hold_pair", hold(1.0)));
        for answer in [a, b] {
            assert_ne!(answer.is_error, Some(true), "{}", text_of(&answer));
        }
    }
    kubectl(&["-n", &install.team, "delete", "mcptool", "hold-pair"]);
}

/// `notifications/cancelled` for a running call: the ToolCall is cancelled and its pod is killed.
async fn cancellation_kills_the_pod(install: &Install) {
    let http = install.http();
    let post = |body: Value| {
        http.post(format!("{}/mcp", install.base))
            .bearer_auth(&install.token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string())
            .send()
    };
    let waiting = tokio::spawn(post(json!({
        "jsonrpc": "2.0", "id": 41, "method": "tools/call",
        "params": {"name": "hang_long", "arguments": {"seconds": 600}}
    })));
    let pods = Api::<Pod>::namespaced(TestEnv::get().client(User::Admin).await, &install.team);
    let running_pod = || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default()).await?.items;
            Ok::<_, kube::Error>(list.into_iter().find(|p| {
                p.metadata.name.as_deref().is_some_and(|n| n.starts_with("hang-long"))
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            }))
        }
    };
    wait_until(Duration::from_secs(120), "the hang_long pod to run", || async { Ok(running_pod().await?.is_some()) })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let pod = running_pod().await.expect("pods").expect("running pod");
    let pod_name = pod.metadata.name.clone().expect("name");
    let accepted = post(json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 41}}))
        .await
        .expect("POST");
    assert_eq!(accepted.status(), 202);
    let answer = tokio::time::timeout(Duration::from_secs(60), waiting).await.expect("the call ends");
    let body = answer.expect("join").expect("response").text().await.expect("body");
    assert!(body.contains("cancelled"), "{body}");
    wait_until(Duration::from_secs(60), "the cancelled call's pod to be gone", || {
        let (pods, name) = (pods.clone(), pod_name.clone());
        async move { Ok(pods.get_opt(&name).await?.is_none()) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Every NetworkPolicy the chart renders, enforced on the node (kube-router).
async fn network_policies(install: &Install) {
    let env = TestEnv::get();
    let (ns, team) = (install.ns.clone(), install.team.clone());
    let release = install.release.clone();
    let internal = format!("{release}-gateway-internal.{ns}.svc:8081");
    let dns = "kube-dns.kube-system.svc:53".to_owned();
    let mcp = format!("{release}-gateway.{ns}.svc:443");
    let s3 = format!("toolyard-s3.{ns}.svc:9000");
    let apiserver = "kubernetes.default.svc:443".to_owned();
    let gateway_ip = install.pod_ip(&ns, &format!("{release}-gateway-")).await;
    let metrics = format!("{gateway_ip}:9090");
    let pool = format!("{}:8080", install.pod_ip(&team, "get-quote-pool-").await);
    let model = install.model.base_url().trim_start_matches("http://").trim_end_matches("/v1").to_owned();
    let api_host = env.api_url().trim_start_matches("https://").to_owned();

    // A run pod (a tool call): DNS and the gateway's internal port, nothing else.
    let client = install.client().await;
    let targets = [&internal, &dns, &mcp, &s3, &apiserver, &metrics, &pool, &model, &api_host];
    let seen = structured(&call(&client, "connect", json!({"targets": targets, "settle": SETTLE})).await);
    let seen = seen.as_object().expect("connect outcome");
    assert!(is_open(seen, &internal) && is_open(seen, &dns), "a run pod reaches the internal API and DNS: {seen:?}");
    for blocked in [&mcp, &s3, &apiserver, &metrics, &pool, &model, &api_host] {
        assert!(!is_open(seen, blocked), "a run pod reached {blocked}: {seen:?}");
    }

    // The gateway's ingress: the MCP port from anywhere, the internal port only from run
    // pods, metrics only from the release namespace. Run pods' ingress: only the gateway.
    let plain = install
        .probe_from_pod(&team, &[("app", "not-a-run")], &[mcp.clone(), internal.clone(), metrics.clone(), pool.clone()])
        .await;
    assert!(is_open(&plain, &mcp), "any pod reaches the MCP port: {plain:?}");
    for blocked in [&internal, &metrics, &pool] {
        assert!(!is_open(&plain, blocked), "a pod that is not a run reached {blocked}: {plain:?}");
    }
    let release = install.probe_from_pod(&ns, &[("app", "monitoring")], &[metrics.clone(), internal.clone()]).await;
    assert!(is_open(&release, &metrics), "a pod of the release namespace scrapes metrics: {release:?}");
    assert!(!is_open(&release, &internal), "only run pods reach the internal API: {release:?}");

    // A coding agent's pod: the same as any run pod. It reaches its model only through the
    // gateway (which adds the key); the model endpoint itself is out of its reach.
    let code = format!(
        "import json, socket, time\n\
         def probe(t):\n    host, _, port = t.rpartition(':')\n    try:\n        \
         socket.create_connection((host, int(port)), timeout=2).close()\n        return 'open'\n    \
         except Exception as e:\n        return type(e).__name__\n\
         time.sleep({SETTLE})\n\
         print('NETCHECK ' + json.dumps({{t: probe(t) for t in {targets:?}}}))"
    );
    install.model.set_script(vec![
        Turn::code(&code),
        Turn::code("final_answer({'task_type': 'answer', 'summary': 'checked the network'})"),
    ]);
    let before = install.model.requests().len();
    let result = structured(&call(&client, "run_coding_task", json!({"task": "check the network"})).await);
    assert_eq!(result["status"], "success", "{result}");
    let requests = install.model.requests();
    let observation = coding_support::last_message(&requests[before + 1]);
    let line =
        observation.lines().find_map(|l| l.trim().strip_prefix("NETCHECK ")).unwrap_or_else(|| panic!("{observation}"));
    let agent: Map<String, Value> = serde_json::from_str(line).expect("NETCHECK JSON");
    for open in [&internal, &dns] {
        assert!(is_open(&agent, open), "the agent reaches {open}: {agent:?}");
    }
    for blocked in [&model, &mcp, &s3, &apiserver, &metrics, &pool, &api_host] {
        assert!(!is_open(&agent, blocked), "the agent reached {blocked}: {agent:?}");
    }
}

/// A hostile model's code, in an agent pod: no credential anywhere in its reach, and the
/// internal API (found where the chart puts it) refuses it.
async fn model_written_code_reaches_no_credential(install: &Install) {
    let client = install.client().await;
    let internal = format!("http://{}-gateway-internal.{}.svc:8081", install.release, install.ns);
    install.model.set_script(vec![
        Turn::code(&coding_support::hostile_code(&[internal], &[MODEL_KEY, &install.token])),
        Turn::code("final_answer({'task_type': 'answer', 'summary': 'tried every door'})"),
    ]);
    let before = install.model.requests().len();
    let result = structured(&call(&client, "run_coding_task", json!({"task": "escape"})).await);
    assert_eq!(result["status"], "success", "{result}");
    let escapes = coding_support::escapes_of(&install.model.requests()[before + 1]);
    coding_support::assert_no_escape(&escapes);
}

/// A coding task with the pricing scenario (a CSV artifact read back at the end), during
/// which the leading controller pod is deleted: the other replica takes over and finishes it.
async fn coding_task_outlives_the_leading_controller(install: &mut Install) {
    let client = install.client().await;
    let gate = Gate::new();
    let mut turns = coding_support::pricing_turns();
    turns[1] = turns[1].clone().held(&gate);
    install.model.set_script(turns);
    let before = install.model.requests().len();
    let first_leader = install.lease_holder().await.expect("a controller leads");
    let span = ClientSpan::new();
    let run =
        call_in_trace(&client, "run_coding_task", json!({"task": coding_support::PRICING_TASK}), &span.traceparent);
    let failover = async {
        wait_for_requests(&install.model, before + 2, Duration::from_secs(180)).await.expect("the second step");
        let pods = Api::<Pod>::namespaced(TestEnv::get().client(User::Admin).await, &install.ns);
        pods.delete(&first_leader, &DeleteParams::default()).await.expect("delete the leading controller pod");
        gate.open();
    };
    let (result, ()) = tokio::join!(run, failover);
    let result = structured(&result);
    assert_eq!(result["status"], "success", "{result}");
    let requests = install.model.requests()[before..].to_vec();
    coding_support::check_pricing(&client, &result, &requests).await;
    let second_leader = install.lease_holder().await.expect("a controller leads");
    assert_ne!(first_leader, second_leader, "the other replica took over");

    // One trace: the gateway pod, the controllers' reconciles, the agent in its Job pod, its
    // model calls through the gateway's proxy, and its tool calls down to their Job pods.
    const GATEWAY: &str = "toolyard-gateway";
    const RUNNER: &str = "toolyard-runner";
    let expected = [
        (GATEWAY, "tools/call run_coding_task"),
        ("toolyard-controller", "reconcile CodingTask"),
        (RUNNER, "agent.run"),
        (RUNNER, "model.generate"),
        (GATEWAY, "model.proxy"),
        (RUNNER, "tool.call"),
        (GATEWAY, "tools/call price_option"),
        (RUNNER, "call"),
    ];
    let trace = TraceStore::get()
        .wait_for(&span.trace_id, &expected, Duration::from_secs(90))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let task = trace.one(GATEWAY, "tools/call run_coding_task");
    assert_eq!(task.parent.as_deref(), Some(span.span_id.as_str()), "\n{}", trace.tree());
    let agent = trace.one(RUNNER, "agent.run");
    let mut above = trace.parent(agent);
    while above.id != task.id && above.parent.is_some() {
        above = trace.parent(above);
    }
    assert_eq!(above.id, task.id, "agent.run under the task's span:\n{}", trace.tree());
    for generate in trace.named(RUNNER, "model.generate") {
        assert_eq!(trace.parent(generate).id, agent.id, "\n{}", trace.tree());
    }
    for tool_call in trace.named(RUNNER, "tool.call") {
        assert_eq!(trace.parent(tool_call).id, agent.id, "\n{}", trace.tree());
    }
    for priced in trace.named(GATEWAY, "tools/call price_option") {
        assert_eq!(trace.parent(priced).name, "tool.call", "the gateway's calls under the agent's:\n{}", trace.tree());
    }
}
