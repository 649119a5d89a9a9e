//! The live status page, `GET /`: one self-contained HTML file (markup, CSS and vanilla JS,
//! `status_page.html`) compiled into the binary.
//!
//! The page is static and holds no data, so it is served without `X-Internal-Token`. Its script
//! polls the internal endpoints every second (`GET /v1/internal/streams`,
//! `POST /v1/internal/kv-cache/query` with no tokens and `"list": "all"` for every stream's
//! synchronization and residency, whatever the fleet's size, `GET /v1/internal/route/recent`,
//! `GET /v1/internal/instances`) and sends the token it reads
//! from the URL fragment `#token=...`, which browsers never send to the server (so it stays out
//! of access logs). A 401 shows how to set it. The Content-Security-Policy allows nothing but
//! the page itself and requests to this service.

use actix_web::HttpResponse;

/// The page.
const PAGE: &str = include_str!("status_page.html");

/// Inline script and style only, data only from this origin, nothing else from anywhere.
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";

/// `GET /`.
pub async fn page() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("Cache-Control", "no-store"))
        .insert_header(("Content-Security-Policy", CSP))
        .insert_header(("Referrer-Policy", "no-referrer"))
        .body(PAGE)
}
