//! The front door's metrics: requests by instance and HTTP status
//! (`kvdir_frontend_requests_total`), time from request to the engine's first body byte
//! (`kvdir_frontend_time_to_first_byte_seconds`) and tokenization time
//! (`kvdir_frontend_tokenization_seconds`). Errors answered before any instance was chosen
//! count under `instance=""`; engines that could not be reached under `status="unreachable"`.
//! The cache audit's families (`kvdir_frontend_cache_audit_*`) come from [`super::audit`].

use std::collections::BTreeMap;
use std::sync::Mutex;

use kvdir::metrics::{Exposition, Histogram, Kind};

use super::FrontError;

/// Counters and histograms of the front door.
#[derive(Debug, Default)]
pub struct FrontMetrics {
    requests: Mutex<BTreeMap<(String, String), u64>>,
    /// Request start to the engine's first body byte.
    pub time_to_first_byte: Histogram,
    /// Template rendering and tokenization.
    pub tokenization: Histogram,
    /// The cache-truth audit of forwarded answers.
    pub audit: std::sync::Arc<super::audit::CacheAudit>,
}

impl FrontMetrics {
    fn add(&self, instance: &str, status: String) {
        let mut m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry((instance.to_string(), status)).or_default() += 1;
    }

    /// An engine answered `instance` with `status`.
    pub fn count_status(&self, instance: &str, status: u16) {
        self.add(instance, status.to_string());
    }

    /// `instance` could not be reached.
    pub fn count_failed(&self, instance: &str) {
        self.add(instance, "unreachable".into());
    }

    /// kvdir answered with an error.
    pub fn count(&self, instance: Option<&str>, e: &FrontError) {
        let status = actix_web::ResponseError::status_code(e).as_u16();
        self.add(instance.unwrap_or_default(), status.to_string());
    }

    /// Appends the families to `e`.
    pub fn render(&self, e: &mut Exposition) {
        let help = "Front door requests by chosen instance and HTTP status.";
        e.family("kvdir_frontend_requests_total", Kind::Counter, help);
        let m = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        for ((instance, status), n) in m.iter() {
            let labels = [("instance", instance.as_str()), ("status", status.as_str())];
            e.sample("kvdir_frontend_requests_total", &labels, *n as f64);
        }
        let help = "Front door: request start to the engine's first body byte.";
        e.family("kvdir_frontend_time_to_first_byte_seconds", Kind::Histogram, help);
        let ttfb = self.time_to_first_byte.snapshot();
        e.histogram("kvdir_frontend_time_to_first_byte_seconds", &[], &ttfb);
        let help = "Front door: chat template rendering and tokenization.";
        e.family("kvdir_frontend_tokenization_seconds", Kind::Histogram, help);
        e.histogram("kvdir_frontend_tokenization_seconds", &[], &self.tokenization.snapshot());
        self.audit.render(e);
    }
}
