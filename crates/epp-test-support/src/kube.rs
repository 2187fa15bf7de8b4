//! A real kube-apiserver (with etcd) for tests, started through
//! `scripts/kube-env.sh`, and helpers that create the objects Kubernetes
//! discovery reads: namespaces, InferencePools, pods with a status set
//! through the status subresource (there is no kubelet), RBAC.
//!
//! The control plane is built once into a cache outside the checkout
//! (`scripts/kube-env.sh build`, a few minutes cold); a test that needs it
//! builds it when missing rather than skipping.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::{Value, json};

fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the crate is two levels under the checkout")
        .to_path_buf()
}

fn script() -> PathBuf {
    checkout().join("scripts/kube-env.sh")
}

fn run_script(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .env("EPP_KUBE_OWNER_PID", std::process::id().to_string())
        .output()
        .expect("cannot run scripts/kube-env.sh");
    assert!(
        out.status.success(),
        "scripts/kube-env.sh {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Builds the control plane once per process (a no-op when cached).
fn ensure_built() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let t = Instant::now();
        run_script(&["build"]);
        if t.elapsed() > Duration::from_secs(5) {
            eprintln!("built the test control plane in {:?}", t.elapsed());
        }
    });
}

/// A running etcd + kube-apiserver, stopped on drop.
#[derive(Debug)]
pub struct KubeCluster {
    /// Its state directory (etcd data, certificates, logs, kubeconfigs).
    pub dir: PathBuf,
    /// The admin's kubeconfig.
    pub kubeconfig: PathBuf,
}

impl KubeCluster {
    /// Starts a control plane of its own (for tests that stop the API server).
    pub fn start(tag: &str) -> Self {
        ensure_built();
        let dir = std::env::temp_dir().join(format!(
            "epp-kube-{tag}-{}-{:08x}",
            std::process::id(),
            rand_u32()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let out = run_script(&["start", dir.to_str().expect("utf-8 temp dir")]);
        let kubeconfig = PathBuf::from(
            out.lines()
                .last()
                .expect("start prints the kubeconfig")
                .trim(),
        );
        assert!(
            kubeconfig.is_file(),
            "no kubeconfig at {}",
            kubeconfig.display()
        );
        Self { dir, kubeconfig }
    }

    /// One control plane shared by the tests of this process that leave the
    /// API server running (each works in a namespace of its own).
    pub fn shared() -> &'static Self {
        static SHARED: OnceLock<KubeCluster> = OnceLock::new();
        SHARED.get_or_init(|| Self::start("shared"))
    }

    /// The kubeconfig of a test ServiceAccount user
    /// (`system:serviceaccount:default:<sa>`; `epp`, `epp-b`, `restricted`).
    pub fn kubeconfig_for(&self, sa: &str) -> PathBuf {
        self.dir.join(format!("kubeconfig-{sa}"))
    }

    /// Writes a kubeconfig for `user` authenticating with `token` (e.g. one
    /// from [`Ns::token_of_service_account`]) into `dir`; returns its path.
    pub fn kubeconfig_with_token(&self, dir: &Path, user: &str, token: &str) -> PathBuf {
        let server = std::fs::read_to_string(self.dir.join("server")).expect("the server's URL");
        let ca = self.dir.join("pki/ca.crt");
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "epp-test", "cluster": {
                "server": server.trim(),
                "certificate-authority": ca.to_str().expect("utf-8 path"),
            }}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": user, "context": {"cluster": "epp-test", "user": user}}],
            "current-context": user,
        });
        let path = dir.join(format!("kubeconfig-{user}"));
        // JSON is YAML: kubeconfig readers take it.
        std::fs::write(&path, config.to_string()).expect("write kubeconfig");
        path
    }

    /// A client authenticating with `token`.
    pub async fn client_with_token(&self, dir: &Path, user: &str, token: &str) -> Client {
        let path = self.kubeconfig_with_token(dir, user, token);
        let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("token kubeconfig");
        Client::try_from(config).expect("token client")
    }

    /// The admin's bearer token (`system:masters`: may do anything,
    /// reading epp's metrics port included).
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.dir.join("admin.token"))
            .expect("admin.token")
            .trim()
            .to_owned()
    }

    /// A client with the admin token.
    pub async fn admin(&self) -> Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("admin kubeconfig");
        Client::try_from(config).expect("admin client")
    }

    /// Stops the API server (etcd stays).
    pub fn stop_apiserver(&self) {
        run_script(&["apiserver-stop", self.dir.to_str().expect("utf-8")]);
    }

    /// Starts the API server again on the same port; returns once ready.
    pub fn start_apiserver(&self) {
        run_script(&["apiserver-start", self.dir.to_str().expect("utf-8")]);
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .args(["stop", self.dir.to_str().unwrap_or_default()])
            .output();
        // `stop` keeps the logs and kubeconfigs for a failed test's reader;
        // a test that passed leaves nothing behind (a hundred such
        // directories piled up in /tmp over a day of test runs).
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn rand_u32() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish() as u32
}

/// A fresh namespace, with helpers for the objects discovery reads.
#[derive(Clone)]
pub struct Ns {
    /// An admin client.
    pub client: Client,
    /// The namespace's name.
    pub name: String,
}

impl std::fmt::Debug for Ns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ns")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The InferencePool API of GIE v1 (group, version).
pub const POOL_V1: (&str, &str) = ("inference.networking.k8s.io", "v1");
/// The older x-k8s.io InferencePool API (group, version).
pub const POOL_V1ALPHA2: (&str, &str) = ("inference.networking.x-k8s.io", "v1alpha2");

impl Ns {
    /// Creates a namespace named `<prefix>-<random>`.
    pub async fn create(cluster: &KubeCluster, prefix: &str) -> Self {
        let client = cluster.admin().await;
        let name = format!("{prefix}-{:08x}", rand_u32());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("create namespace");
        Self { client, name }
    }

    /// Pods of this namespace.
    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// InferencePools of this namespace in API `(group, version)`.
    pub fn pools(&self, (group, version): (&str, &str)) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk(group, version, "InferencePool");
        Api::namespaced_with(
            self.client.clone(),
            &self.name,
            &ApiResource::from_gvk_with_plural(&gvk, "inferencepools"),
        )
    }

    /// Custom objects of `kind` (`plural`) in this namespace.
    pub fn custom(
        &self,
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
    ) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk(group, version, kind);
        Api::namespaced_with(
            self.client.clone(),
            &self.name,
            &ApiResource::from_gvk_with_plural(&gvk, plural),
        )
    }

    /// Creates (or replaces the spec of) a v1 InferencePool.
    pub async fn apply_pool(&self, name: &str, match_labels: &[(&str, &str)], ports: &[u16]) {
        let labels: BTreeMap<_, _> = match_labels.iter().copied().collect();
        let ports: Vec<Value> = ports.iter().map(|p| json!({"number": p})).collect();
        let spec = json!({
            "selector": {"matchLabels": labels},
            "targetPorts": ports,
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
        });
        self.apply_object(self.pools(POOL_V1), "InferencePool", POOL_V1, name, spec)
            .await;
    }

    /// Creates or replaces the spec of any namespaced custom object.
    pub async fn apply_object(
        &self,
        api: Api<DynamicObject>,
        kind: &str,
        (group, version): (&str, &str),
        name: &str,
        spec: Value,
    ) {
        let obj = json!({
            "apiVersion": format!("{group}/{version}"),
            "kind": kind,
            "metadata": {"name": name},
            "spec": spec,
        });
        api.patch(
            name,
            &PatchParams::apply("epp-tests").force(),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
    }

    /// Applies any manifest (server-side apply, as `kubectl apply
    /// --server-side` would): its kind is looked up in the API server's
    /// discovery, a namespaced object goes to this namespace, a cluster-scoped
    /// one to the cluster. Panics naming the object when the server refuses it.
    pub async fn apply_manifest(&self, obj: &Value) {
        let api_version = obj["apiVersion"]
            .as_str()
            .expect("a manifest has an apiVersion");
        let kind = obj["kind"].as_str().expect("a manifest has a kind");
        let name = obj["metadata"]["name"]
            .as_str()
            .expect("a manifest has a name");
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (ar, caps) = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .unwrap_or_else(|e| panic!("{api_version} {kind} is not served: {e}"));
        let api: Api<DynamicObject> = match caps.scope {
            kube::discovery::Scope::Namespaced => {
                if let Some(ns) = obj["metadata"]["namespace"].as_str() {
                    assert_eq!(ns, self.name, "{kind} {name} is for another namespace");
                }
                Api::namespaced_with(self.client.clone(), &self.name, &ar)
            }
            kube::discovery::Scope::Cluster => Api::all_with(self.client.clone(), &ar),
        };
        api.patch(
            name,
            &PatchParams::apply("epp-tests").force(),
            &Patch::Apply(obj),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
    }

    /// Deletes a v1 InferencePool.
    pub async fn delete_pool(&self, name: &str) {
        self.pools(POOL_V1)
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete pool");
    }

    /// Creates a pod and sets its status: Running with `ip`, Ready as given.
    /// `node` set makes deletion graceful (the pod stays, terminating, as
    /// no kubelet confirms it).
    pub async fn pod(&self, name: &str, labels: &[(&str, &str)], ip: &str, ready: bool) {
        self.pod_on(name, labels, ip, ready, None).await;
    }

    /// [`Self::pod`], scheduled on `node` when given.
    pub async fn pod_on(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        ip: &str,
        ready: bool,
        node: Option<&str>,
    ) {
        let labels: BTreeMap<_, _> = labels.iter().copied().collect();
        let mut spec = json!({"containers": [{"name": "model", "image": "vllm"}]});
        if let Some(node) = node {
            spec["nodeName"] = json!(node);
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": spec,
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("create pod {name}: {e}"));
        self.set_status(name, ip, ready).await;
    }

    /// Sets a pod's status through the status subresource.
    pub async fn set_status(&self, name: &str, ip: &str, ready: bool) {
        let status = json!({"status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
        }});
        self.pods()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap_or_else(|e| panic!("set status of pod {name}: {e}"));
    }

    /// Flips a pod's Ready condition, keeping its IP.
    pub async fn set_ready(&self, name: &str, ready: bool) {
        let pod = self.pods().get(name).await.expect("get pod");
        let ip = pod
            .status
            .and_then(|s| s.pod_ip)
            .expect("the pod has an IP");
        self.set_status(name, &ip, ready).await;
    }

    /// Deletes a pod.
    pub async fn delete_pod(&self, name: &str) {
        self.pods()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete pod {name}: {e}"));
    }

    /// Grants a test ServiceAccount user exactly the rules `docs/kubernetes.md`
    /// lists: discovery's, in this namespace, and the reviews the metrics
    /// port's authentication creates (cluster-wide).
    pub async fn grant_discovery(&self, sa: &str, binding: &str) {
        self.bind_cluster_role(
            "epp-metrics-auth",
            json!([
                {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
                {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
            ]),
            &format!("{}-{binding}-metrics-auth", self.name),
            json!({"kind": "User", "name": format!("system:serviceaccount:default:{sa}")}),
        )
        .await;
        let role = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "epp-discovery"},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["inference.networking.k8s.io", "inference.networking.x-k8s.io"],
                 "resources": ["inferencepools"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["inference.networking.x-k8s.io", "llm-d.ai"],
                 "resources": ["inferenceobjectives", "inferencemodelrewrites"],
                 "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                 "verbs": ["get", "create", "update"]},
            ],
        });
        self.apply_raw(
            "rbac.authorization.k8s.io",
            "v1",
            "Role",
            "roles",
            "epp-discovery",
            role,
        )
        .await;
        let rb = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "epp-discovery"},
            "subjects": [{"kind": "User", "name": format!("system:serviceaccount:default:{sa}")}],
        });
        self.apply_raw(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            binding,
            rb,
        )
        .await;
    }

    /// Creates (or updates) the ClusterRole `role` with `rules` and binds it
    /// to `subject` (an RBAC subject) with the ClusterRoleBinding `binding`.
    pub async fn bind_cluster_role(&self, role: &str, rules: Value, binding: &str, subject: Value) {
        let cluster_role = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": rules,
        });
        self.apply_cluster_raw("ClusterRole", "clusterroles", role, cluster_role)
            .await;
        let crb = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [subject],
        });
        self.apply_cluster_raw("ClusterRoleBinding", "clusterrolebindings", binding, crb)
            .await;
    }

    /// Creates the ServiceAccount `name` in this namespace and returns a
    /// token for it from the TokenRequest API (valid for an hour, for the
    /// API server's audience), as a pod would have mounted.
    pub async fn service_account_token(&self, name: &str) -> String {
        use k8s_openapi::api::core::v1::ServiceAccount;
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &self.name);
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        api.create(&PostParams::default(), &sa)
            .await
            .unwrap_or_else(|e| panic!("create ServiceAccount {name}: {e}"));
        self.token_of_service_account(name).await
    }

    /// A token of the existing ServiceAccount `name` of this namespace from
    /// the TokenRequest API (valid for an hour, for the API server's
    /// audience), as the kubelet mounts one into a pod.
    pub async fn token_of_service_account(&self, name: &str) -> String {
        use k8s_openapi::api::{
            authentication::v1::{TokenRequest, TokenRequestSpec},
            core::v1::ServiceAccount,
        };
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &self.name);
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            },
            ..TokenRequest::default()
        };
        api.create_token_request(name, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| panic!("token for ServiceAccount {name}: {e}"))
            .status
            .expect("a TokenRequest answers with a status")
            .token
    }

    async fn apply_cluster_raw(&self, kind: &str, plural: &str, name: &str, obj: Value) {
        let gvk = GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind);
        Api::<DynamicObject>::all_with(
            self.client.clone(),
            &ApiResource::from_gvk_with_plural(&gvk, plural),
        )
        .patch(
            name,
            &PatchParams::apply("epp-tests").force(),
            &Patch::Apply(&obj),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
    }

    /// Deletes the role binding `binding` (what `grant_discovery` made).
    pub async fn revoke(&self, binding: &str) {
        self.custom(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
        )
        .delete(binding, &DeleteParams::default())
        .await
        .expect("delete rolebinding");
    }

    async fn apply_raw(
        &self,
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        name: &str,
        obj: Value,
    ) {
        self.custom(group, version, kind, plural)
            .patch(
                name,
                &PatchParams::apply("epp-tests").force(),
                &Patch::Apply(&obj),
            )
            .await
            .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
    }
}

/// Polls `check` every 20 ms until it is true, at most `timeout`; returns how
/// long it took.
pub async fn until<F: FnMut() -> bool>(what: &str, timeout: Duration, mut check: F) -> Duration {
    let start = Instant::now();
    loop {
        if check() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
