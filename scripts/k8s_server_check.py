#!/usr/bin/env python3
"""The manifests of deploy/kubernetes against a real Kubernetes API server: every rendered object
is accepted by the server, and kvdir's service account may get, list and watch pods in its
namespace and do nothing else its Role could have granted by mistake.

    k8s_server_check.py KUBE_APISERVER RENDERED.yaml [RENDERED.yaml ...]

KUBE_APISERVER is the binary scripts/kube-apiserver.sh builds (1.20; the schemas of newer
versions are checked offline by k8s-validate.sh). It runs on 127.0.0.1 with its own etcd
(`etcd` on PATH) and token authentication, and is stopped at the end. Each rendering's objects
are created with a dry run; the last one's are then created for real, and its RoleBindings'
service accounts are asked about (SubjectAccessReview) what they may do. Needs openssl (the
service-account key) and PyYAML.
"""

import json
import os
import secrets
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

DEADLINE_S = 60
# What the service account must be allowed, and a sample of what it must not: other
# resources, writes, subresources, other namespaces, cluster-scoped reads. Each is (verb,
# group, resource, subresource, scope): scope "own" is the RoleBinding's namespace, "other"
# another one, "cluster" no namespace.
ALLOWED = [("get", "", "pods", "", "own"), ("list", "", "pods", "", "own"),
           ("watch", "", "pods", "", "own")]
DENIED = [("list", "", "secrets", "", "own"), ("get", "", "configmaps", "", "own"),
          ("create", "", "pods", "", "own"), ("delete", "", "pods", "", "own"),
          ("patch", "", "pods", "", "own"), ("get", "", "pods", "log", "own"),
          ("update", "", "pods", "status", "own"), ("list", "apps", "deployments", "", "own"),
          ("list", "", "pods", "", "other"), ("list", "", "nodes", "", "cluster")]

class Problem(Exception):
    """A manifest the server refused, or a permission that is wrong."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """etcd and kube-apiserver on loopback, in a temporary directory."""

    def __init__(self, binary):
        self.dir = tempfile.mkdtemp(prefix="kvdir-k8s-check-")
        self.token = secrets.token_hex(16)
        with open(f"{self.dir}/tokens.csv", "w") as f:
            f.write(f'{self.token},admin,admin-uid,"system:masters"\n')
        subprocess.run(["openssl", "genrsa", "-out", f"{self.dir}/sa.key", "2048"], check=True,
                       capture_output=True)
        etcd_port, peer_port, self.port = free_port(), free_port(), free_port()
        self.log = open(f"{self.dir}/log", "w")
        self.etcd = subprocess.Popen(
            ["etcd", "--data-dir", f"{self.dir}/etcd", "--name", "check",
             "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
             "--initial-cluster", f"check=http://127.0.0.1:{peer_port}"],
            stdout=self.log, stderr=self.log)
        self.api = subprocess.Popen(
            [binary, f"--etcd-servers=http://127.0.0.1:{etcd_port}", "--bind-address=127.0.0.1",
             "--advertise-address=127.0.0.1", f"--secure-port={self.port}", "--insecure-port=0",
             f"--cert-dir={self.dir}/certs", f"--token-auth-file={self.dir}/tokens.csv",
             "--authorization-mode=RBAC",
             "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
             f"--service-account-key-file={self.dir}/sa.key",
             f"--service-account-signing-key-file={self.dir}/sa.key",
             "--service-cluster-ip-range=10.0.0.0/24",
             # No controller manager makes the `default` service account, and no Service
             # reaches the server itself.
             "--disable-admission-plugins=ServiceAccount", "--endpoint-reconciler-type=none"],
            stdout=self.log, stderr=self.log)
        # The server's own self-signed certificate; what is checked here is not TLS.
        self.tls = ssl._create_unverified_context()
        self.wait_ready()

    def wait_ready(self):
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end:
            if self.api.poll() is not None:
                break
            try:
                if self.request("GET", "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise Problem(f"kube-apiserver was not ready within {DEADLINE_S} s; log:\n"
                      + open(f"{self.dir}/log").read()[-3000:])

    def request(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"https://127.0.0.1:{self.port}{path}", data=data,
                                     method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, context=self.tls, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self):
        for p in (self.api, self.etcd):
            p.kill()
            p.wait()
        self.log.close()
        subprocess.run(["rm", "-rf", self.dir], check=False)


def collection(o):
    """The API path that objects like `o` are created at."""
    group_version = o["apiVersion"]
    root = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    kind = o["kind"].lower()
    plural = kind + ("es" if kind.endswith("s") else "s")
    if o["kind"] in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
        return f"{root}/{plural}"
    return f"{root}/namespaces/{o['metadata'].get('namespace', 'default')}/{plural}"


def create(server, objects, dry_run):
    for ns in sorted({o["metadata"].get("namespace", "default") for o in objects}):
        status, body = server.request("POST", "/api/v1/namespaces",
                                      {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": ns}})
        if status not in (201, 409):
            raise Problem(f"namespace {ns}: {status} {body}")
    for o in objects:
        path = collection(o) + ("?dryRun=All" if dry_run else "")
        status, body = server.request("POST", path, o)
        if status != 201:
            raise Problem(f"{o['kind']} {o['metadata']['name']}: the server answered {status}: "
                          f"{body[:600]}")


def may(server, user, namespace, check):
    """Whether `user` (a service account) may do `check` (an entry of ALLOWED or DENIED)."""
    verb, group, resource, subresource, scope = check
    attributes = {"verb": verb, "group": group, "resource": resource,
                  "subresource": subresource}
    if scope != "cluster":
        attributes["namespace"] = namespace if scope == "own" else "kube-system"
    sa_namespace = user.split(":")[2]
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": user, "resourceAttributes": attributes,
                       "groups": ["system:serviceaccounts",
                                  f"system:serviceaccounts:{sa_namespace}",
                                  "system:authenticated"]}}
    status, body = server.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                                  review)
    if status != 201:
        raise Problem(f"SubjectAccessReview: {status} {body}")
    return json.loads(body)["status"].get("allowed", False)


def check_rbac(server, objects):
    """Every service account a RoleBinding names may do what ALLOWED says and none of DENIED."""
    bindings = [o for o in objects if o["kind"] == "RoleBinding"]
    if not bindings:
        raise Problem("no RoleBinding to check")
    for b in bindings:
        ns = b["metadata"]["namespace"]
        for s in b["subjects"]:
            user = f"system:serviceaccount:{s['namespace']}:{s['name']}"
            for check in ALLOWED + DENIED:
                allowed = may(server, user, ns, check)
                if allowed != (check in ALLOWED):
                    verb, group, resource, sub, scope = check
                    what = f"{verb} {group + '/' if group else ''}{resource}"
                    what += f"/{sub}" if sub else ""
                    where = {"own": f"in {ns}", "other": "in kube-system"}.get(scope, "(cluster)")
                    raise Problem(f"{user} may {'' if allowed else 'not '}{what} {where}; its "
                                  "Role should allow get, list and watch on pods, nothing more")
            print(f"{user}: get, list and watch pods in {ns}, none of {len(DENIED)} other "
                  "permissions checked")


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    renderings = [[o for o in yaml.safe_load_all(open(p)) if o] for p in argv[1:]]
    try:
        server = Server(argv[0])
    except Problem as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        for path, objects in zip(argv[1:], renderings):
            create(server, objects, dry_run=True)
            name = os.path.basename(path)
            print(f"{name}: {len(objects)} objects accepted by kube-apiserver (dry run)")
        create(server, renderings[-1], dry_run=False)
        check_rbac(server, renderings[-1])
    except Problem as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
