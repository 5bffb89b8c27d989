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
//!   script, so an agent's text shown on it stays text.

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
}
