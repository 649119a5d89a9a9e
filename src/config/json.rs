//! A small reader over `serde_json` objects that collects every problem instead of stopping at
//! the first, so an operator sees all mistakes of a config file in one run.

use serde_json::{Map, Value};

/// Collects errors while fields are read from one JSON object.
pub(crate) struct Fields<'a> {
    path: String,
    obj: &'a Map<String, Value>,
    allowed: &'static [&'static str],
    pub errors: &'a mut Vec<String>,
}

impl<'a> Fields<'a> {
    /// Reads `value` as an object at `path` with the given allowed keys; unknown keys are errors.
    pub fn new(
        path: &str,
        value: &'a Value,
        allowed: &'static [&'static str],
        errors: &'a mut Vec<String>,
    ) -> Option<Self> {
        let Some(obj) = value.as_object() else {
            errors.push(format!("{}: expected an object, found {}", display(path), kind(value)));
            return None;
        };
        for key in obj.keys() {
            if !allowed.contains(&key.as_str()) {
                errors.push(format!(
                    "{}: unknown field {key:?}; allowed fields are {}",
                    display(path),
                    allowed.join(", ")
                ));
            }
        }
        Some(Fields { path: path.to_string(), obj, allowed, errors })
    }

    fn name(&self, key: &str) -> String {
        debug_assert!(self.allowed.contains(&key));
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The raw value of a key, if present and not null.
    pub fn raw(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    /// An integer in `min..=max`, or `default` when absent.
    pub fn int(&mut self, key: &str, default: u64, min: u64, max: u64) -> u64 {
        let Some(v) = self.raw(key) else { return default };
        match v.as_u64() {
            Some(n) if (min..=max).contains(&n) => n,
            Some(n) => {
                let name = self.name(key);
                self.errors.push(range_msg(&name, &n.to_string(), min, max));
                default
            }
            None => {
                let name = self.name(key);
                let shown = v.to_string();
                self.errors.push(range_msg(&name, &shown, min, max));
                default
            }
        }
    }

    /// A string, or `default` when absent.
    pub fn string(&mut self, key: &str, default: &str) -> String {
        match self.raw(key) {
            None => default.to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => {
                let msg = format!("{}: expected a string, found {}", self.name(key), kind(v));
                self.errors.push(msg);
                default.to_string()
            }
        }
    }

    /// A required string; missing or empty is an error naming the key.
    pub fn required_string(&mut self, key: &str, hint: &str) -> String {
        if self.raw(key).is_none() {
            let msg = format!("{}: missing; {hint}", self.name(key));
            self.errors.push(msg);
            return String::new();
        }
        let s = self.string(key, "");
        if s.is_empty() {
            let msg = format!("{}: must not be empty; {hint}", self.name(key));
            self.errors.push(msg);
        }
        s
    }

    /// A boolean, or `default` when absent.
    pub fn boolean(&mut self, key: &str, default: bool) -> bool {
        match self.raw(key) {
            None => default,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                let msg = format!("{}: expected true or false, found {}", self.name(key), kind(v));
                self.errors.push(msg);
                default
            }
        }
    }
}

fn display(path: &str) -> &str {
    if path.is_empty() {
        "config"
    } else {
        path
    }
}

fn range_msg(name: &str, value: &str, min: u64, max: u64) -> String {
    if max == u64::MAX {
        format!("{name} = {value} is not an integer >= {min}")
    } else {
        format!("{name} = {value} is outside the allowed range {min}..={max}")
    }
}

/// A JSON value's type, as error messages name it ("a string", "an array", ...).
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
