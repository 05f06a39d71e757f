//! TLS serving from certificate files (made with openssl: a test CA and leaf
//! certificates), reloaded when the files change as cert-manager rotates them; a broken
//! new pair keeps the old certificate in service. The gateway's server serves it; a real
//! HTTPS client (reqwest trusting only the test CA) reads the certificate the server presents.

use crate::auth_support;

use std::path::Path;
use std::time::Duration;

use auth_support::{openssl, temp_dir};
use axum::Router;
use axum::routing::get;
use sha2::Digest;
use tokio_util::sync::CancellationToken;
use toolyard_gateway::server::{self, Drain, Listener, ServerSettings, ShutdownTokens};
use toolyard_gateway::tls::{TlsFiles, reloading_config};
use toolyard_tests::wait_until;

/// A CA and leaf certificates for 127.0.0.1 signed by it.
struct Pki {
    dir: toolyard_tests::local::TempDir,
}

impl Pki {
    fn new() -> Self {
        let dir = temp_dir("tls");
        openssl(
            &dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=toolyard-test-ca",
            ],
        );
        std::fs::write(
            dir.join("leaf.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .expect("ext");
        Self { dir }
    }

    /// Makes `<name>.key` and `<name>.crt`; returns the certificate's SHA-256 fingerprint.
    fn leaf(&self, name: &str) -> String {
        let (key, csr, crt, der) =
            (format!("{name}.key"), format!("{name}.csr"), format!("{name}.crt"), format!("{name}.der"));
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                "/CN=localhost",
            ],
        );
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "1",
                "-extfile",
                "leaf.ext",
            ],
        );
        openssl(&self.dir, &["x509", "-in", &crt, "-outform", "DER", "-out", &der]);
        fingerprint(&std::fs::read(self.dir.join(der)).expect("der"))
    }

    /// Installs `<name>` as the served pair the way a Secret volume update does: new files
    /// written aside, then renamed into place.
    fn install(&self, serving: &Path, cert_of: &str, key_of: &str) {
        for (from, to) in [(format!("{key_of}.key"), "tls.key"), (format!("{cert_of}.crt"), "tls.crt")] {
            let staged = serving.join(format!(".{to}.new"));
            std::fs::copy(self.dir.join(from), &staged).expect("stage");
            std::fs::rename(&staged, serving.join(to)).expect("swap");
        }
    }

    fn ca(&self) -> reqwest::Certificate {
        reqwest::Certificate::from_pem(&std::fs::read(self.dir.join("ca.crt")).expect("ca")).expect("ca pem")
    }
}

fn fingerprint(der: &[u8]) -> String {
    sha2::Sha256::digest(der).iter().map(|b| format!("{b:02x}")).collect()
}

/// The fingerprint of the certificate a fresh connection is served.
async fn served(ca: &reqwest::Certificate, url: &str) -> anyhow::Result<String> {
    let client = reqwest::Client::builder()
        .tls_certs_only([ca.clone()])
        .tls_info(true)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()?;
    let response = client.get(url).send().await?;
    anyhow::ensure!(response.status().is_success(), "status {}", response.status());
    let info = response.extensions().get::<reqwest::tls::TlsInfo>().ok_or_else(|| anyhow::anyhow!("no TLS info"))?;
    let der = info.peer_certificate().ok_or_else(|| anyhow::anyhow!("no peer certificate"))?;
    Ok(fingerprint(der))
}

#[tokio::test]
async fn a_rotated_certificate_is_served_and_a_broken_one_is_not() {
    let pki = Pki::new();
    let first = pki.leaf("first");
    let second = pki.leaf("second");
    let serving = temp_dir("tls-serving");
    pki.install(&serving, "first", "first");
    let files = TlsFiles { cert: serving.join("tls.crt"), key: serving.join("tls.key") };

    let shutdown = CancellationToken::new();
    let tls = reloading_config(files, Duration::from_millis(100), shutdown.clone()).await.expect("tls");
    let status = tls.status.clone();
    let socket = server::bind("public", "127.0.0.1:0").expect("bind");
    let url = format!("https://{}/", socket.local_addr().expect("addr"));
    let router = Router::new().route("/", get(|| async { "hello" }));
    let listeners = vec![Listener { name: "public", socket, router, tls: Some(tls.config), drain: Drain::First }];
    let settings = ServerSettings { shutdown_grace: Duration::from_secs(1), ..ServerSettings::default() };
    let tokens = ShutdownTokens::default();
    let server = tokio::spawn({
        let tokens = tokens.clone();
        async move { server::serve(listeners, &settings, tokens).await }
    });

    let ca = pki.ca();
    wait_until(Duration::from_secs(10), "the server to answer", || {
        let (ca, url) = (ca.clone(), url.clone());
        async move { Ok(served(&ca, &url).await.is_ok()) }
    })
    .await
    .expect("serving");
    assert_eq!(served(&ca, &url).await.expect("served"), first);

    // cert-manager rotates the Secret.
    pki.install(&serving, "second", "second");
    wait_until(Duration::from_secs(20), "the rotated certificate to be served", || {
        let (ca, url, second) = (ca.clone(), url.clone(), second.clone());
        async move { Ok(served(&ca, &url).await? == second) }
    })
    .await
    .expect("rotation picked up");
    assert_eq!(status.reloads(), 1);

    // A broken pair (the key does not match the certificate) is refused; the old pair stays.
    let failures = status.failures();
    pki.install(&serving, "first", "second");
    wait_until(Duration::from_secs(20), "the broken pair to be refused", || {
        let status = status.clone();
        async move { Ok(status.failures() > failures) }
    })
    .await
    .expect("broken pair noticed");
    assert_eq!(served(&ca, &url).await.expect("still serving"), second);
    assert_eq!(status.reloads(), 1);

    // Fixing it (matching key arrives) is picked up again.
    pki.install(&serving, "first", "first");
    wait_until(Duration::from_secs(20), "the repaired pair to be served", || {
        let (ca, url, first) = (ca.clone(), url.clone(), first.clone());
        async move { Ok(served(&ca, &url).await? == first) }
    })
    .await
    .expect("repair picked up");

    tokens.trigger.cancel();
    shutdown.cancel();
    server.await.expect("join").expect("server stopped cleanly");
}

#[tokio::test]
async fn a_pair_that_does_not_load_at_start_is_an_error_naming_the_file() {
    let pki = Pki::new();
    pki.leaf("only");
    let serving = temp_dir("tls-serving");
    std::fs::write(serving.join("tls.crt"), "-----BEGIN NOTHING-----\n").expect("write");
    std::fs::copy(pki.dir.join("only.key"), serving.join("tls.key")).expect("key");
    let files = TlsFiles { cert: serving.join("tls.crt"), key: serving.join("tls.key") };
    let e =
        reloading_config(files.clone(), Duration::from_secs(1), CancellationToken::new()).await.expect_err("no cert");
    assert!(e.to_string().contains(&files.cert.display().to_string()), "{e}");

    let missing = TlsFiles { cert: serving.join("absent.crt"), key: files.key };
    let e = reloading_config(missing, Duration::from_secs(1), CancellationToken::new()).await.expect_err("absent");
    assert!(e.to_string().contains("absent.crt"), "{e}");
}
