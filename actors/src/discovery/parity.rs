//! The parity check of a listed engine (`kvdir::discovery::parity`): when its process becomes
//! known and kvdir has a tokenizer (`--tokenizer_path`), kvdir renders a fixed chat with its
//! own template and tokenizer and compares the ids with the engine's `POST /tokenize`, and the
//! engine's block size and served models with its config, before any traffic. Each
//! disagreement is a WARN naming the values and the fix, `engine.parity` in
//! `/v1/internal/instances`, `kvdir_engine_parity_mismatch` in `/metrics` and a line on the
//! status page.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use kvdir::config::{Dialect, EngineSpec};
use kvdir::discovery::parity::{self, Parity, TokenParity};
use kvdir_text::TextModel;
use serde_json::json;

use super::messages::ParityChecked;
use super::DiscoveryActor;

/// Upper bound of each request of the check.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

impl DiscoveryActor {
    /// Starts the check of engine `name`, when kvdir has a tokenizer.
    pub(super) fn check_parity(&self, name: &str, ctx: &mut Context<Self>) {
        let (Some(text), Some(engine)) = (&self.text, self.engines.get(name)) else { return };
        let (spec, text) = (engine.spec.clone(), Arc::clone(text));
        let (http, me) = (self.http.clone(), ctx.address());
        actix::spawn(async move {
            let parity = check(&http, &spec, &text).await;
            me.do_send(ParityChecked { name: spec.name, parity });
        });
    }
}

impl Handler<ParityChecked> for DiscoveryActor {
    type Result = ();

    fn handle(&mut self, msg: ParityChecked, _: &mut Context<Self>) {
        let problems = msg.parity.problems();
        for problem in &problems {
            tracing::warn!(engine = %msg.name, "{problem}");
        }
        match &msg.parity.tokens {
            TokenParity::Match { tokens } if problems.is_empty() => {
                tracing::info!(engine = %msg.name, tokens, "tokenizer, block size and model agree")
            }
            TokenParity::Unchecked { reason } => {
                tracing::warn!(engine = %msg.name, %reason, "tokenizer parity not checked")
            }
            _ => {}
        }
        self.engines.set_parity(&msg.name, msg.parity);
    }
}

/// The check itself: kvdir's ids, the engine's, its block size and its models.
async fn check(http: &reqwest::Client, spec: &EngineSpec, text: &TextModel) -> Parity {
    let chat = parity::parity_chat();
    let ours = text.chat_prompt(&chat, None, true).and_then(|t| text.encode(&t, false));
    let body = json!({"model": spec.model, "messages": chat, "add_generation_prompt": true});
    let theirs = post(http, &format!("{}/tokenize", spec.url), &body)
        .await
        .and_then(|b| parity::engine_tokens(&b));
    let tokens = match (ours, theirs) {
        (Ok(a), Ok(b)) => parity::compare_tokens(&a, &b),
        (Err(e), _) => TokenParity::Unchecked { reason: format!("kvdir cannot render it: {e}") },
        (_, Err(e)) => TokenParity::Unchecked { reason: format!("POST /tokenize: {e}") },
    };
    let engine_block = match spec.dialect {
        Dialect::Vllm => {
            get(http, &spec.url, "/metrics").await.and_then(|m| parity::vllm_block_size(&m))
        }
        Dialect::Sglang => {
            get(http, &spec.url, "/server_info").await.and_then(|i| parity::sglang_page_size(&i))
        }
        Dialect::Xllm => None,
    };
    let block_ok = engine_block.is_none_or(|b| b == spec.block_size);
    let models = get(http, &spec.url, "/v1/models").await.map(|b| parity::served_models(&b));
    let models = models.filter(|m| !m.is_empty());
    let model_ok = spec.model.is_empty() || models.as_ref().is_none_or(|m| m.contains(&spec.model));
    Parity {
        tokens,
        block_size: parity::setting(spec.block_size, engine_block.map(|b| b.to_string()), block_ok),
        model: parity::setting(&spec.model, models.map(|m| m.join(", ")), model_ok),
    }
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> Result<String, String> {
    let r = http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(CHECK_TIMEOUT)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        return Err(format!("answered {}", r.status()));
    }
    r.text().await.map_err(|e| e.to_string())
}

async fn get(http: &reqwest::Client, base: &str, path: &str) -> Option<String> {
    let r = http.get(format!("{base}{path}")).timeout(CHECK_TIMEOUT).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.text().await.ok()
}
