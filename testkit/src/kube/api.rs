//! What a test does through the API server, as the admin: namespaces, the `kvdir` user's
//! Role and RoleBinding, and Pods, whose status it writes through the `pods/status`
//! subresource as a kubelet would (there is none). Every call panics with the method, path,
//! status and body when the server refuses it, and is bounded by [`REQUEST_TIMEOUT`].

use std::fs;
use std::path::Path;

use serde_json::{json, Value};
use ureq::http::Request;
use ureq::tls::{parse_pem, Certificate, PemItem, RootCerts, TlsConfig};
use ureq::Agent;

use super::{KubeApiServer, User, REQUEST_TIMEOUT};

/// A status as a kubelet would write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodStatus {
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    pub phase: String,
    /// The pod IP, if it has one.
    pub ip: Option<String>,
    /// The `Ready` condition.
    pub ready: bool,
}

impl PodStatus {
    /// Running and Ready at `ip`.
    pub fn running(ip: &str) -> PodStatus {
        PodStatus { phase: "Running".into(), ip: Some(ip.into()), ready: true }
    }
}

/// One answer of the API server.
#[derive(Debug, Clone)]
pub struct ApiResponse {
    /// HTTP status.
    pub status: u16,
    /// The body (JSON for every API answer; `Value::Null` when empty or not JSON).
    pub json: Value,
    /// The body as text.
    pub text: String,
}

/// An HTTPS client trusting only the certificate authority in `ca` (PEM), bounded by
/// [`REQUEST_TIMEOUT`] per request.
pub fn client(ca: &Path) -> Agent {
    let pem = fs::read(ca).unwrap_or_else(|e| panic!("cannot read {}: {e}", ca.display()));
    let roots: Vec<Certificate<'static>> = parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(PemItem::Certificate(cert)) => Some(cert),
            _ => None,
        })
        .collect();
    assert!(!roots.is_empty(), "{} holds no certificate", ca.display());
    let tls = TlsConfig::builder().root_certs(RootCerts::new_with_certs(&roots)).build();
    Agent::config_builder()
        .tls_config(tls)
        .timeout_global(Some(REQUEST_TIMEOUT))
        .http_status_as_error(false)
        .build()
        .into()
}

impl KubeApiServer {
    /// One request as `user`, straight to the server (not through the gate); `body` is sent
    /// as `content_type` (JSON text). Panics only on a transport error.
    pub fn request_as(
        &self,
        user: User,
        method: &str,
        path: &str,
        body: Option<(&str, &Value)>,
    ) -> ApiResponse {
        let url = format!("{}{path}", self.direct_url());
        let request = Request::builder()
            .method(method)
            .uri(&url)
            .header("Authorization", format!("Bearer {}", self.token(user)));
        let sent = match body {
            Some((content_type, body)) => self
                .client
                .run(request.header("Content-Type", content_type).body(body.to_string()).unwrap()),
            None => self.client.run(request.body(()).unwrap()),
        };
        let mut response =
            sent.unwrap_or_else(|e| panic!("{method} {url} as {}: {e}", user.name()));
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let json = serde_json::from_str(&text).unwrap_or(Value::Null);
        ApiResponse { status, json, text }
    }

    /// A request as the admin that must answer one of `ok`; the body as JSON.
    fn admin(&self, method: &str, path: &str, body: Option<(&str, &Value)>, ok: &[u16]) -> Value {
        let r = self.request_as(User::Admin, method, path, body);
        if !ok.contains(&r.status) {
            panic!("{method} {path} answered {}: {}", r.status, r.text);
        }
        r.json
    }

    /// Creates a namespace (one that exists already is fine).
    pub fn create_namespace(&self, name: &str) {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        self.admin("POST", "/api/v1/namespaces", Some(("application/json", &ns)), &[201, 409]);
    }

    /// Lets the `kvdir` user get, list and watch pods in `namespace` (a Role and a
    /// RoleBinding named `kvdir-pods`).
    pub fn grant_pod_reading(&self, namespace: &str) {
        let rbac = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}");
        let meta = json!({"name": "kvdir-pods", "namespace": namespace});
        let role = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
            "rules": [{"apiGroups": [""], "resources": ["pods"],
                       "verbs": ["get", "list", "watch"]}],
        });
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "kvdir-pods"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": User::Kvdir.name()}],
        });
        let json = "application/json";
        self.admin("POST", &format!("{rbac}/roles"), Some((json, &role)), &[201, 409]);
        self.admin("POST", &format!("{rbac}/rolebindings"), Some((json, &binding)), &[201, 409]);
    }

    /// Creates a Pod (status `Pending`, no IP) with these labels and annotations; its UID.
    pub fn create_pod(
        &self,
        namespace: &str,
        name: &str,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> String {
        let map = |pairs: &[(&str, &str)]| -> Value {
            pairs.iter().map(|(k, v)| (k.to_string(), json!(v))).collect()
        };
        self.create_pod_with(namespace, name, map(labels), map(annotations))
    }

    fn create_pod_with(&self, namespace: &str, name: &str, labels: Value, notes: Value) -> String {
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels, "annotations": notes},
            "spec": {"containers": [{"name": "engine", "image": "vllm"}]},
        });
        let path = format!("/api/v1/namespaces/{namespace}/pods");
        let created = self.admin("POST", &path, Some(("application/json", &pod)), &[201]);
        uid_of(&created)
    }

    /// The Pod as the API server has it, or `None` when there is none.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}");
        let pod = self.admin("GET", &path, None, &[200, 404]);
        (pod["kind"] == "Pod").then_some(pod)
    }

    /// Writes the Pod's phase, IP and `Ready` condition through `pods/status`.
    pub fn set_pod_status(&self, namespace: &str, name: &str, status: &PodStatus) {
        let ips: Vec<Value> = status.ip.iter().map(|ip| json!({"ip": ip})).collect();
        self.patch_status(
            namespace,
            name,
            json!({"phase": status.phase, "podIP": status.ip, "podIPs": ips,
                   "conditions": [ready_condition(status.ready)]}),
        );
    }

    /// Running and Ready at `ip` (as a kubelet reports a started, healthy pod).
    pub fn run_pod(&self, namespace: &str, name: &str, ip: &str) {
        self.set_pod_status(namespace, name, &PodStatus::running(ip));
    }

    /// Sets only the `Ready` condition (a readiness probe passing or failing).
    pub fn set_pod_ready(&self, namespace: &str, name: &str, ready: bool) {
        self.patch_status(namespace, name, json!({"conditions": [ready_condition(ready)]}));
    }

    /// Sets only the pod IP.
    pub fn set_pod_ip(&self, namespace: &str, name: &str, ip: &str) {
        self.patch_status(namespace, name, json!({"podIP": ip, "podIPs": [{"ip": ip}]}));
    }

    fn patch_status(&self, namespace: &str, name: &str, status: Value) {
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}/status");
        let patch = json!({ "status": status });
        self.admin("PATCH", &path, Some(("application/merge-patch+json", &patch)), &[200]);
    }

    /// Deletes the Pod at once (no kubelet runs it, so no grace period applies).
    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let path = format!("/api/v1/namespaces/{namespace}/pods/{name}?gracePeriodSeconds=0");
        self.admin("DELETE", &path, None, &[200]);
    }

    /// Deletes the Pod and creates it again under the same name with the same labels and
    /// annotations (status `Pending`, no IP, as a new pod starts); the new UID.
    pub fn recreate_pod(&self, namespace: &str, name: &str) -> String {
        let old = self
            .pod(namespace, name)
            .unwrap_or_else(|| panic!("no pod {namespace}/{name} to recreate"));
        self.delete_pod(namespace, name);
        let meta = &old["metadata"];
        self.create_pod_with(namespace, name, meta["labels"].clone(), meta["annotations"].clone())
    }
}

/// The `Ready` condition a kubelet writes.
fn ready_condition(ready: bool) -> Value {
    json!({"type": "Ready", "status": if ready { "True" } else { "False" }})
}

/// `metadata.uid` of an object the server returned.
fn uid_of(object: &Value) -> String {
    match object["metadata"]["uid"].as_str() {
        Some(uid) => uid.to_string(),
        None => panic!("the API server returned an object with no uid: {object}"),
    }
}
