//! Shared helpers for the cluster test tier (`#[ignore = "needs cluster"]` tests).
//!
//! The cluster is started by `tests/cluster/up.sh`, which writes a shell-sourceable
//! `env` file. [`ClusterEnv::load`] finds it, in this order:
//! 1. `$TESTCLUSTER_ENV` (path of the env file itself),
//! 2. `$TESTCLUSTER_WORK/env`,
//! 3. `<repo>/target/testcluster/env` (up.sh's default WORKDIR).
//!
//! Every test gets its own [`TestCluster`]: a client, a unique name prefix derived
//! from the test name, and a fresh namespace, so tests can run in parallel against
//! one cluster. Nothing is deleted afterwards: the cluster is throw-away (up.sh
//! starts from an empty etcd each time) and without kube-controller-manager a
//! deleted namespace would stay `Terminating` anyway.
#![allow(dead_code)] // each test crate uses a different subset

pub mod agent;
pub mod apiserver_load;
pub mod controller;
pub mod hosts;
pub mod nodes;
pub mod process;

use std::collections::BTreeMap;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Generous default for waits: the test machines have 2 cores shared with compilers.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Label put on every namespace a test creates (value: the test's name prefix).
pub const TEST_LABEL: &str = "hwaccel.io/test";

/// What `tests/cluster/up.sh` wrote into its `env` file.
#[derive(Debug, Clone)]
pub struct ClusterEnv {
    /// Path of the env file that was read.
    pub env_file: PathBuf,
    /// Admin kubeconfig (client cert in `system:masters`).
    pub kubeconfig: PathBuf,
    /// The cluster's work dir (logs, pki, run state).
    pub work: PathBuf,
    /// Dir with the binaries (kubectl, kube-apiserver, etcd; with the full tier also
    /// kube-controller-manager, kube-scheduler, helm, kwok, kwokctl).
    pub bin: PathBuf,
    /// True when kube-controller-manager, kube-scheduler and kwok run too.
    pub full: bool,
    /// `https://127.0.0.1:<port>`.
    pub apiserver: String,
    /// The cluster CA (signs the serving cert and client certs).
    pub ca_crt: PathBuf,
    /// The CA's private key (to mint more client certs, e.g. `system:node:<name>`).
    pub ca_key: PathBuf,
    /// Every variable in the file, verbatim.
    pub vars: BTreeMap<String, String>,
}

impl ClusterEnv {
    /// Locate and parse the env file (see the module docs for the search order).
    pub fn load() -> Result<Self> {
        let path = Self::env_file_path();
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "no test cluster: cannot read {} — start one with `tests/cluster/up.sh` \
                 (or `tests/cluster/up.sh --full`), or point TESTCLUSTER_ENV / TESTCLUSTER_WORK at it",
                path.display()
            )
        })?;
        Self::parse(&path, &text)
    }

    /// Where the env file is expected.
    pub fn env_file_path() -> PathBuf {
        if let Some(p) = std::env::var_os("TESTCLUSTER_ENV").filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
        if let Some(w) = std::env::var_os("TESTCLUSTER_WORK").filter(|p| !p.is_empty()) {
            return PathBuf::from(w).join("env");
        }
        Path::new(env!("CARGO_MANIFEST_DIR")).join("target/testcluster/env")
    }

    /// Parse `export KEY='value'` / `KEY=value` lines (the subset up.sh writes).
    pub fn parse(path: &Path, text: &str) -> Result<Self> {
        let mut vars = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let line = line.strip_prefix("export ").unwrap_or(line);
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            vars.insert(k.trim().to_string(), unquote(v.trim()));
        }
        let get = |k: &str| -> Result<String> {
            vars.get(k)
                .cloned()
                .ok_or_else(|| anyhow!("{} has no {k}; re-run tests/cluster/up.sh", path.display()))
        };
        Ok(Self {
            env_file: path.to_path_buf(),
            kubeconfig: get("KUBECONFIG")?.into(),
            work: get("TESTCLUSTER_WORK")?.into(),
            bin: get("TESTCLUSTER_BIN")?.into(),
            full: get("TESTCLUSTER_FULL")? == "1",
            apiserver: get("TESTCLUSTER_APISERVER")?,
            ca_crt: get("TESTCLUSTER_CA_CRT")?.into(),
            ca_key: get("TESTCLUSTER_CA_KEY")?.into(),
            vars,
        })
    }

    /// An admin client (from the env's kubeconfig).
    pub async fn admin_client(&self) -> Result<Client> {
        let kc = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("reading {}", self.kubeconfig.display()))?;
        client_from_kubeconfig(kc).await
    }

    /// A client that authenticates with a bearer token (e.g. a ServiceAccount token
    /// from a TokenRequest) instead of the admin certificate.
    pub async fn client_with_token(&self, token: &str) -> Result<Client> {
        let kc = Kubeconfig::read_from(&self.kubeconfig)?;
        let mut v = serde_json::to_value(&kc)?;
        let users = v
            .get_mut("users")
            .and_then(|u| u.as_array_mut())
            .ok_or_else(|| anyhow!("kubeconfig has no users"))?;
        for u in users.iter_mut() {
            u["user"] = serde_json::json!({ "token": token });
        }
        client_from_kubeconfig(serde_json::from_value(v)?).await
    }
}

fn unquote(v: &str) -> String {
    if v.len() >= 2 && v.starts_with('\'') && v.ends_with('\'') {
        // up.sh writes 'a'\''b' for a value containing a single quote.
        v[1..v.len() - 1].replace("'\\''", "'")
    } else if v.len() >= 2 && v.starts_with('"') && v.ends_with('"') {
        v[1..v.len() - 1].to_string()
    } else {
        v.to_string()
    }
}

async fn client_from_kubeconfig(kc: Kubeconfig) -> Result<Client> {
    let mut cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    cfg.connect_timeout = Some(Duration::from_secs(10));
    cfg.read_timeout = Some(Duration::from_secs(120));
    Ok(Client::try_from(cfg)?)
}

/// One test's view of the shared test cluster.
pub struct TestCluster {
    env: ClusterEnv,
    client: Client,
    prefix: String,
    namespace: String,
    counter: AtomicU32,
}

impl TestCluster {
    /// Connect to the cluster from the env file and create this test's namespace.
    pub async fn new() -> Result<Self> {
        let env = ClusterEnv::load()?;
        let client = env.admin_client().await?;
        let prefix = unique_prefix();
        let namespace = prefix.clone();
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(namespace.clone()),
                labels: Some([(TEST_LABEL.to_string(), prefix.clone())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| {
                format!(
                    "creating namespace {namespace} on {} (is the cluster up? tests/cluster/up.sh)",
                    env.apiserver
                )
            })?;
        Ok(Self {
            env,
            client,
            prefix,
            namespace,
            counter: AtomicU32::new(0),
        })
    }

    /// Admin client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// This test's namespace (fresh, empty).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// This test's unique prefix (also the namespace name).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A name no other test (or earlier call) uses: `<prefix>-<what>-<n>`; a valid
    /// DNS-1123 label when `what` is.
    pub fn unique_name(&self, what: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{}-{}-{n}", self.prefix, sanitize(what, 20))
    }

    /// The parsed env file.
    pub fn env(&self) -> &ClusterEnv {
        &self.env
    }

    /// Whether the full tier (kcm, scheduler, kwok) is running.
    pub fn full(&self) -> bool {
        self.env.full
    }

    /// Path of a binary in the cluster's bin dir (`kubectl`, `helm`, `kwokctl`, ...).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.env.bin.join(name)
    }

    /// Run `kubectl --kubeconfig <admin> -n <namespace> ARGS...` from the bin dir and
    /// return its output (not checked; see [`TestCluster::kubectl_ok`]).
    pub async fn kubectl(&self, args: &[&str]) -> Result<Output> {
        let mut cmd = std::process::Command::new(self.bin("kubectl"));
        cmd.arg("--kubeconfig")
            .arg(&self.env.kubeconfig)
            .arg("-n")
            .arg(&self.namespace);
        cmd.args(args);
        let shown = format!("kubectl {}", args.join(" "));
        tokio::task::spawn_blocking(move || cmd.output())
            .await?
            .with_context(|| format!("running {shown}"))
    }

    /// Like [`TestCluster::kubectl`] but fails unless kubectl exits 0; returns stdout.
    pub async fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl(args).await?;
        if !out.status.success() {
            bail!(
                "kubectl {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Stop, start or restart the cluster's kube-apiserver (same flags, port and etcd)
    /// via `tests/cluster/apiserver.sh`. `start` returns once `/readyz` answers.
    /// Tests in one test binary run in parallel and share the apiserver: put a test
    /// that uses this in its own `tests/*.rs` file (cargo runs test binaries one at a time).
    pub async fn apiserver_ctl(&self, action: &str) -> Result<()> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/apiserver.sh");
        let mut cmd = std::process::Command::new(&script);
        cmd.arg(action).arg(&self.env.work);
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await?
            .with_context(|| format!("running {}", script.display()))?;
        if !out.status.success() {
            bail!(
                "apiserver.sh {action} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    /// A client authenticating with a bearer token.
    pub async fn client_with_token(&self, token: &str) -> Result<Client> {
        self.env.client_with_token(token).await
    }
}

/// True when the scale harness asked for the expensive measurements (`SCALE_RUN` set, as
/// `scripts/scale.sh` sets it); otherwise says on stderr that `what` was skipped, so a plain
/// `make cluster-test` does not pay for it.
pub fn scale_run(what: &str) -> bool {
    if std::env::var_os("SCALE_RUN").is_some() {
        return true;
    }
    eprintln!("skipped: set SCALE_RUN=1 (scripts/scale.sh does) to {what}");
    false
}

/// Poll `check` every 250 ms until it returns `Ok(Some(v))`; fail after `timeout`
/// with the last error (if any). `Ok(None)` means "not yet".
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let start = Instant::now();
    let mut last_err = None;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) => last_err = Some(e),
        }
        if start.elapsed() >= timeout {
            return Err(match last_err {
                Some(e) => e.context(format!("timed out after {timeout:?} waiting for {what}")),
                None => anyhow!("timed out after {timeout:?} waiting for {what}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `<test-name>-<6 hex>`: readable in `kubectl get`, unique across parallel tests
/// and runs. The test name comes from the thread name that libtest gives each test
/// (`#[tokio::test]` runs on that thread).
fn unique_prefix() -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("test");
    let test = test.rsplit("::").next().unwrap_or(test);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.write_u32(std::process::id());
    h.write_u32(SEQ.fetch_add(1, Ordering::Relaxed));
    format!("{}-{:06x}", sanitize(test, 30), h.finish() & 0xff_ffff)
}

/// Lowercase alphanumerics and single dashes, starting with a letter, at most `max` chars.
fn sanitize(s: &str, max: usize) -> String {
    let mut out = String::new();
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
        if out.len() >= max {
            break;
        }
    }
    let out = out.trim_end_matches('-').to_string();
    match out.chars().next() {
        Some(c) if c.is_ascii_alphabetic() => out,
        Some(_) => format!("t{}", &out[..out.len().min(max - 1)]),
        None => "t".to_string(),
    }
}

/// Waits until CRD `name` is Established (`kubectl wait` fails outright while a new CRD has
/// no conditions yet, so this polls).
pub async fn wait_crd_established(client: &Client, name: &str) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    wait_for(DEFAULT_TIMEOUT, &format!("CRD {name} established"), || {
        let crds = crds.clone();
        async move {
            let established = crds
                .get(name)
                .await?
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            Ok(established.then_some(()))
        }
    })
    .await
}

/// Installs (or updates) the project's generated CRDs by server-side apply and waits until
/// each is Established. Safe to call from every test: re-applying the same CRD is a no-op.
pub async fn install_crds(client: &Client) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Patch, PatchParams};
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in hwaccel::api::crds::all() {
        let name = crd.metadata.name.clone().context("CRD without a name")?;
        crds.patch(
            &name,
            &PatchParams::apply("hwaccel-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("installing CRD {name}"))?;
        wait_crd_established(client, &name).await?;
    }
    Ok(())
}

/// The minor version of the apiserver (37 for 1.37, 35 on the compat tier).
pub async fn apiserver_minor(client: &Client) -> Result<u32> {
    let info = client.apiserver_version().await?;
    info.minor
        .trim_end_matches('+')
        .parse()
        .with_context(|| format!("apiserver minor version {:?}", info.minor))
}

/// The versions of `resource.k8s.io` the apiserver serves DeviceTaintRules in, in the
/// controller's order of preference (none on a stock 1.35 or 1.36: gated there).
pub async fn served_rule_versions(client: &Client) -> Vec<&'static str> {
    let mut served = Vec::new();
    for version in hwaccel::controller::taints::core::RULES_VERSIONS {
        let group_version = format!("resource.k8s.io/{version}");
        if let Ok(list) = client.list_api_group_resources(&group_version).await
            && list.resources.iter().any(|r| r.name == "devicetaintrules")
        {
            served.push(version);
        }
    }
    served
}
