//! Who may read the page: whoever holds the address printed at start.
//!
//! The page lists what agents did in the user's repositories, so it is not open to every
//! process or web page that can reach loopback:
//! - a random token (128 bits from the OS) is part of every URL; a request without it, or with
//!   another, is refused before anything is read, and the comparison takes the same time
//!   whatever the guess (only the page's constant script and style sheet are served without);
//! - the `Host` header must name loopback and the page's own port, so a site that rebinds its
//!   DNS name to 127.0.0.1 cannot read the page from a browser tab (its requests carry its own
//!   name);
//! - answers forbid framing and sniffing, and the page's content policy runs only its own
//!   script, so an agent's text shown on it stays text;
//! - the requests that act (cancel, and a probe of a worker, which runs `ssh`) are `POST`s that
//!   must come from the page itself ([`Access::same_origin_for`]): its `Origin` is the page's, the browser says it is
//!   same-origin when it says anything, and it carries a header no plain form or cross-site
//!   request without the page's consent can send.

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The token and the port that requests must name.
#[derive(Clone, Debug)]
pub struct Access {
    pub token: String,
    pub port: u16,
}

impl Access {
    /// A fresh random token for a page on `port`.
    pub fn new(port: u16) -> Result<Self, String> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| format!("no randomness for the token: {e}"))?;
        let token = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self { token, port })
    }

    /// Whether `offered` is the token, compared in constant time.
    fn token_matches(&self, offered: &str) -> bool {
        let (a, b) = (self.token.as_bytes(), offered.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    /// Whether a `Host` header names this page on loopback.
    fn host_matches(&self, host: &str) -> bool {
        let port = self.port.to_string();
        ["127.0.0.1", "localhost", "[::1]"]
            .iter()
            .any(|name| host == format!("{name}:{port}"))
    }
}

/// The header the page's own script sends with an action, naming it. A cross-site page cannot add it
/// without a CORS preflight, which this server never grants.
pub const ACTION_HEADER: &str = "x-opencode-mcp-dashboard";

impl Access {
    /// Whether a request for `action` comes from this page: its `Origin` names this page
    /// (loopback, this port), `Sec-Fetch-Site` is `same-origin` when the browser sends it, and
    /// it carries [`ACTION_HEADER`] naming `action`.
    pub fn same_origin_for(&self, headers: &axum::http::HeaderMap, action: &str) -> bool {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let origin_ok = text("origin")
            .and_then(|o| o.strip_prefix("http://"))
            .is_some_and(|host| self.host_matches(host));
        let fetch_site_ok = text("sec-fetch-site").is_none_or(|s| s == "same-origin");
        origin_ok && fetch_site_ok && text(ACTION_HEADER) == Some(action)
    }
}

/// The token from the query string (`token=`), the one place the page's URLs carry it.
fn token_of(query: Option<&str>) -> Option<&str> {
    query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("token="))
}

/// Refuses a request without the token or from another host name; adds the headers every
/// answer carries.
pub async fn guard(State(access): State<Access>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if !access.host_matches(host) {
        return (
            StatusCode::FORBIDDEN,
            "this page answers on its loopback address only\n",
        )
            .into_response();
    }
    // The script and the style sheet are the binary's own constant files, holding no data:
    // the page loads them by plain URLs. Everything else needs the token.
    let asset = matches!(request.uri().path(), "/app.js" | "/style.css");
    let offered = token_of(request.uri().query()).unwrap_or("");
    if !asset && !access.token_matches(offered) {
        return (
            StatusCode::FORBIDDEN,
            "this page needs the address `opencode-mcp dashboard` printed (it holds a token)\n",
        )
            .into_response();
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_token_and_the_pages_own_host_pass() {
        let a = Access::new(4242).expect("token");
        assert_eq!(a.token.len(), 32);
        assert!(a.token_matches(&a.token.clone()));
        assert!(!a.token_matches(""));
        assert!(!a.token_matches(&a.token[..31]));
        assert!(!a.token_matches(&format!("{}0", a.token)));
        assert_ne!(Access::new(4242).expect("token").token, a.token);
        assert!(a.host_matches("127.0.0.1:4242"));
        assert!(a.host_matches("localhost:4242"));
        assert!(!a.host_matches("evil.example:4242"));
        assert!(!a.host_matches("127.0.0.1:4243"));
        assert!(!a.host_matches(""));
        assert_eq!(token_of(Some("id=x&token=abc")), Some("abc"));
        assert_eq!(token_of(Some("id=x")), None);
        assert_eq!(token_of(None), None);
    }

    #[test]
    fn only_the_pages_own_requests_may_cancel() {
        use axum::http::HeaderMap;
        let a = Access::new(4242).expect("token");
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, HeaderValue::from_str(v).expect("a header value"));
            }
            h
        };
        let own = [
            ("origin", "http://127.0.0.1:4242"),
            ("sec-fetch-site", "same-origin"),
            (ACTION_HEADER, "cancel"),
        ];
        assert!(a.same_origin_for(&headers(&own), "cancel"));
        assert!(
            !a.same_origin_for(&headers(&own), "probe"),
            "the header names the action"
        );
        // Without Sec-Fetch-Site (an older browser, or a client that is no browser).
        assert!(a.same_origin_for(&headers(&[own[0], own[2]]), "cancel"));
        for bad in [
            vec![own[1], own[2]],
            vec![("origin", "http://evil.example"), own[1], own[2]],
            vec![("origin", "http://127.0.0.1:4243"), own[1], own[2]],
            vec![("origin", "https://127.0.0.1:4242"), own[1], own[2]],
            vec![("origin", "null"), own[2]],
            vec![own[0], ("sec-fetch-site", "cross-site"), own[2]],
            vec![own[0], ("sec-fetch-site", "same-site"), own[2]],
            vec![own[0], own[1]],
            vec![own[0], own[1], (ACTION_HEADER, "other")],
        ] {
            assert!(!a.same_origin_for(&headers(&bad), "cancel"), "{bad:?}");
        }
    }
}
