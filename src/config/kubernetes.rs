//! The config file's `kubernetes` key: engines are the pods that a label selector picks in a
//! namespace (or in every namespace kvdir may see), read from the Kubernetes API. How a pod
//! becomes an engine is `crate::discovery::pods`; the service lists and watches.
//!
//! What is checked here, without I/O: the namespace is a namespace name or `"*"`, the selector
//! is a label selector as the API server parses it, and a given kubeconfig path is not empty.
//! Whether the kubeconfig exists, and which namespace kvdir runs in, the service finds out at
//! start.

use serde_json::Value;

use super::json::Fields;

const FIELDS: &[&str] = &["namespace", "selector", "kubeconfig"];

/// The selector used when none is given: llm-d's label of inference pods.
pub const DEFAULT_SELECTOR: &str = "llm-d.ai/inference-serving=true";

/// Which namespace's pods are watched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodNamespace {
    /// The one kvdir runs in (in a cluster, its service account's), else `default`.
    Own,
    /// This one.
    Named(String),
    /// Every namespace kvdir may see (`"*"`).
    All,
}

/// `kubernetes`: where engine pods are found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesConfig {
    /// The namespace watched.
    pub namespace: PodNamespace,
    /// The label selector of engine pods.
    pub selector: String,
    /// A kubeconfig file; `None`: in-cluster config when present, else `$KUBECONFIG`, else
    /// `~/.kube/config`.
    pub kubeconfig: Option<String>,
}

/// Parses the `kubernetes` object.
pub(crate) fn parse_kubernetes(v: &Value, errors: &mut Vec<String>) -> Option<KubernetesConfig> {
    let mut f = Fields::new("kubernetes", v, FIELDS, errors)?;
    let namespace = match f.raw("namespace") {
        None => PodNamespace::Own,
        Some(v) if !v.is_string() => {
            f.string("namespace", ""); // reports the type
            PodNamespace::Own
        }
        Some(_) => {
            let ns = f.string("namespace", "");
            match ns.as_str() {
                "*" => PodNamespace::All,
                _ if is_label_name(&ns) => PodNamespace::Named(ns),
                _ => {
                    f.errors.push(format!(
                        "kubernetes.namespace = {ns:?}: not a namespace name (at most 63 \
                         lowercase letters, digits and '-', starting and ending with a letter or \
                         digit); name the engines' namespace, use \"*\" for every namespace kvdir \
                         may see, or leave it out for kvdir's own"
                    ));
                    PodNamespace::Own
                }
            }
        }
    };
    let selector = f.string("selector", DEFAULT_SELECTOR);
    if let Err(e) = check_selector(&selector) {
        f.errors.push(format!(
            "kubernetes.selector = {selector:?}: {e}; give a label selector such as \
             \"{DEFAULT_SELECTOR}\" or \"app=vllm,tier!=canary\""
        ));
    }
    let kubeconfig = f.raw("kubeconfig").map(|_| f.string("kubeconfig", ""));
    if kubeconfig.as_deref() == Some("") {
        f.errors.push(
            "kubernetes.kubeconfig: must not be empty; give the path of a kubeconfig file, or \
             leave it out for the in-cluster config ($KUBECONFIG or ~/.kube/config outside one)"
                .into(),
        );
    }
    Some(KubernetesConfig { namespace, selector, kubeconfig })
}

/// A DNS-1123 label: 1..=63 of `[a-z0-9-]`, starting and ending with a letter or digit.
fn is_label_name(s: &str) -> bool {
    let ok = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&s.len())
        && s.bytes().all(|c| ok(c) || c == b'-')
        && s.bytes().next().is_some_and(ok)
        && s.bytes().last().is_some_and(ok)
}

/// Checks a label selector as the API server parses it: requirements separated by commas, each
/// `key`, `!key`, `key=v`, `key==v`, `key!=v`, `key in (v, ...)`, `key notin (v, ...)`, or
/// `key > n`, `key < n`. An empty selector (every pod) is refused: name the engine pods.
pub fn check_selector(selector: &str) -> Result<(), String> {
    if selector.trim().is_empty() {
        return Err("an empty selector picks every pod, not only engines".into());
    }
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                check_requirement(selector[start..i].trim())?;
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err("unbalanced parentheses".into());
        }
    }
    if depth != 0 {
        return Err("unbalanced parentheses".into());
    }
    check_requirement(selector[start..].trim())
}

fn check_requirement(req: &str) -> Result<(), String> {
    if req.is_empty() {
        return Err("an empty requirement (two commas, or one at an end)".into());
    }
    if let Some(key) = req.strip_prefix('!') {
        return check_key(key.trim());
    }
    for op in ["!=", "==", "="] {
        if let Some((key, value)) = req.split_once(op) {
            check_key(key.trim())?;
            return check_value(value.trim());
        }
    }
    for op in [">", "<"] {
        if let Some((key, n)) = req.split_once(op) {
            check_key(key.trim())?;
            return match n.trim().parse::<i64>() {
                Ok(_) => Ok(()),
                Err(_) => Err(format!("{op} takes an integer, not {:?}", n.trim())),
            };
        }
    }
    if let Some(open) = req.find('(') {
        let (head, set) = req.split_at(open);
        let mut words = head.split_whitespace();
        let (Some(key), Some("in" | "notin"), None) = (words.next(), words.next(), words.next())
        else {
            return Err(format!("{req:?} is not `key in (values)` nor `key notin (values)`"));
        };
        check_key(key)?;
        let Some(values) = set.strip_prefix('(').and_then(|s| s.strip_suffix(')')) else {
            return Err(format!("{req:?}: text after the closing parenthesis"));
        };
        if values.trim().is_empty() {
            return Err(format!("{req:?}: the set of values is empty"));
        }
        return values.split(',').try_for_each(|v| check_value(v.trim()));
    }
    check_key(req)
}

/// `[prefix/]name`: a DNS subdomain prefix of at most 253 characters, and a name.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let labels_ok = p.split('.').all(is_label_name);
        if p.is_empty() || p.len() > 253 || !labels_ok {
            return Err(format!("label key {key:?} has an invalid prefix {p:?} (a DNS name)"));
        }
    }
    if name.is_empty() || !is_label_value(name) {
        return Err(format!(
            "label key {key:?}: the name must be 1 to 63 letters, digits, '-', '_' or '.', \
             starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

fn check_value(value: &str) -> Result<(), String> {
    match is_label_value(value) {
        true => Ok(()),
        false => Err(format!(
            "label value {value:?} must be at most 63 letters, digits, '-', '_' or '.', starting \
             and ending with a letter or digit"
        )),
    }
}

/// A label value: empty, or 1..=63 of `[A-Za-z0-9-_.]` starting and ending alphanumeric.
fn is_label_value(s: &str) -> bool {
    let ok = |c: u8| c.is_ascii_alphanumeric();
    s.is_empty()
        || (s.len() <= 63
            && s.bytes().all(|c| ok(c) || b"-_.".contains(&c))
            && s.bytes().next().is_some_and(ok)
            && s.bytes().last().is_some_and(ok))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> (Option<KubernetesConfig>, Vec<String>) {
        let mut errors = Vec::new();
        (parse_kubernetes(&v, &mut errors), errors)
    }

    #[test]
    fn defaults_are_the_own_namespace_and_llm_d_label() {
        let (c, errors) = parse(json!({}));
        assert!(errors.is_empty(), "{errors:?}");
        let c = c.unwrap();
        assert_eq!(c.namespace, PodNamespace::Own);
        assert_eq!((c.selector.as_str(), c.kubeconfig), (DEFAULT_SELECTOR, None));
        let (c, _) = parse(json!({"namespace": "*", "kubeconfig": "/k"}));
        let c = c.unwrap();
        assert_eq!((c.namespace, c.kubeconfig.as_deref()), (PodNamespace::All, Some("/k")));
        let (c, _) = parse(json!({"namespace": "llm"}));
        assert_eq!(c.unwrap().namespace, PodNamespace::Named("llm".into()));
    }

    #[test]
    fn bad_values_name_the_value_and_the_fix() {
        let (_, errors) = parse(json!({
            "namespace": "LLM_prod", "selector": "app in ()", "kubeconfig": "", "watch": true
        }));
        let expect = [
            "kubernetes: unknown field \"watch\"",
            "kubernetes.namespace = \"LLM_prod\": not a namespace name",
            "kubernetes.selector = \"app in ()\": \"app in ()\": the set of values is empty; \
             give a label selector",
            "kubernetes.kubeconfig: must not be empty",
        ];
        assert_eq!(errors.len(), expect.len(), "{errors:#?}");
        for e in expect {
            assert!(errors.iter().any(|m| m.starts_with(e)), "missing {e:?} in {errors:#?}");
        }
        let (_, errors) = parse(json!({"namespace": 7}));
        assert_eq!(errors, ["kubernetes.namespace: expected a string, found a number"]);
        let (c, errors) = parse(json!([]));
        assert!(c.is_none());
        assert_eq!(errors, ["kubernetes: expected an object, found an array"]);
    }

    #[test]
    fn selectors_parse_as_the_api_server_does() {
        for good in [
            DEFAULT_SELECTOR,
            "app=vllm",
            "app==vllm,tier!=canary",
            " app = vllm , !legacy ",
            "model.aibrix.ai/kv-events-enabled=true",
            "env in (prod, staging),tier notin (canary)",
            "serving",
            "gen > 3, gen<10",
            "app=",
        ] {
            assert_eq!(check_selector(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "  ",
            "app=vllm,",
            ",app",
            "app=vllm!",
            "App_/x=1",
            "-app=1",
            "app in (a,b",
            "app in a,b)",
            "app in (a) x",
            "app within (a)",
            "gen > three",
            "a=b)c(",
            "Bad.Prefix/app=1",
        ] {
            assert!(check_selector(bad).is_err(), "{bad:?} accepted");
        }
        let long = "x".repeat(64);
        assert!(check_selector(&format!("app={long}")).is_err());
        assert!(check_selector(&format!("{long}=1")).is_err());
    }
}
