//! The live page at `/` (PROTOCOL.md §11.2): one HTML file embedded in the binary, with its
//! script and style inline (no CDN, no build step), that reads `/status` and `/metrics` once a
//! second. It holds no data itself, so it is served to anyone who reaches the port, like the
//! probes; what it shows comes from `/status`, guarded as ever (§15): told that the service
//! wants a secret, the page asks for it and sends it as the bearer of its own requests.

use actix_web::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY};
use actix_web::HttpResponse;

use super::access::Mode;

const PAGE: &str = include_str!("page/index.html");

/// The page, telling its script whether `/status` wants the secret.
pub fn page(mode: &Mode) -> HttpResponse {
    let secret_required = matches!(mode, Mode::Secret(_));
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((CACHE_CONTROL, "no-store"))
        // Nothing but this page and the service's own endpoints: no outside resource can load.
        .insert_header((
            CONTENT_SECURITY_POLICY,
            "default-src 'none'; connect-src 'self'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; form-action 'none'; base-uri 'none'",
        ))
        .body(PAGE.replace("{{SECRET_REQUIRED}}", &secret_required.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_needs_nothing_from_outside() {
        for needle in [
            "http://",
            "https://",
            "//cdn",
            "<script src",
            "<link rel=\"stylesheet\"",
        ] {
            let outside = PAGE
                .lines()
                .filter(|l| l.contains(needle))
                .collect::<Vec<_>>();
            assert!(outside.is_empty(), "{needle}: {outside:?}");
        }
    }
}
