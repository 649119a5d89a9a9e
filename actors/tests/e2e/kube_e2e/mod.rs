//! Pod discovery against a real Kubernetes API server (`kvdir_testkit::kube`: kube-apiserver
//! 1.20 built by `scripts/kube-apiserver.sh`, with its own etcd; a missing binary fails the
//! test with the fix, never skips it). The harness itself is checked first ([`harness`]), then
//! kvdir's pod discovery ([`smoke`]).

mod harness;
mod smoke;
