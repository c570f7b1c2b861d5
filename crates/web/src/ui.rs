//! The UI's static files, embedded in the binary (no build step: edit `crates/web/ui/` and
//! rebuild).

/// One embedded file.
pub(crate) struct Asset {
    /// Its path in URLs.
    pub path: &'static str,
    /// Its content type.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static str,
}

const ASSETS: &[Asset] = &[
    Asset { path: "/index.html", content_type: "text/html; charset=utf-8", body: include_str!("../ui/index.html") },
    Asset { path: "/app.js", content_type: "text/javascript; charset=utf-8", body: include_str!("../ui/app.js") },
    Asset { path: "/style.css", content_type: "text/css; charset=utf-8", body: include_str!("../ui/style.css") },
];

/// The file served at `path` (`/` is `/index.html`).
pub(crate) fn asset(path: &str) -> Option<&'static Asset> {
    let path = if path == "/" { "/index.html" } else { path };
    ASSETS.iter().find(|a| a.path == path)
}

/// The Content-Security-Policy of the page: nothing from elsewhere, no inline scripts.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; img-src 'self' data:; script-src 'self'; \
     style-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";
