//! The HTTP/1.1 server side the scripted fakes share: accepting connections and reading one
//! request at a time (head, then a `Content-Length` or chunked body, keep-alive included). Each
//! fake writes its own answers, which is where they differ.

use std::future::Future;
use std::io;

use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::{TcpListener, TcpStream};

const MAX_HEAD: usize = 64 * 1024;
const MAX_BODY: usize = 64 * 1024 * 1024;

/// One request as read off the wire. Header names are lower-cased.
pub struct HttpRequest {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpRequest {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The path without its query.
    pub fn route(&self) -> &str {
        self.path.split('?').next().unwrap_or("")
    }

    /// The body as JSON: `Null` when empty, a JSON string holding the text when it is not
    /// JSON (so a test can still see what came).
    pub fn json(&self) -> Value {
        if self.body.is_empty() {
            return Value::Null;
        }
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&self.body).into_owned()))
    }
}

/// Accepts connections forever, each served by `handle` in a task of its own.
pub async fn accept_loop<F, Fut>(listener: TcpListener, name: &str, handle: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(handle(stream));
            }
            Err(e) => eprintln!("{name}: accept failed: {e}"),
        }
    }
}

/// Reads one request; `pending` holds bytes read past the previous request on this connection
/// (start each connection with an empty one). `None` when the client closed the connection
/// between requests.
pub async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
    pending: &mut Vec<u8>,
) -> io::Result<Option<HttpRequest>> {
    let head_end = loop {
        if let Some(pos) = find(pending, b"\r\n\r\n") {
            break pos;
        }
        if pending.len() > MAX_HEAD {
            return Err(invalid("request head too large"));
        }
        if fill(reader, pending).await? == 0 {
            return if pending.is_empty() {
                Ok(None)
            } else {
                Err(invalid("connection closed inside the request head"))
            };
        }
    };
    let head = String::from_utf8_lossy(&pending[..head_end]).into_owned();
    pending.drain(..head_end + 4);
    let mut lines = head.split("\r\n");
    let mut parts = lines.next().unwrap_or("").split(' ');
    let method = parts.next().unwrap_or("").to_owned();
    let path = parts.next().unwrap_or("").to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut request = HttpRequest {
        method,
        path,
        headers,
        body: Vec::new(),
    };
    let chunked = request
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    request.body = if chunked {
        read_chunked(reader, pending).await?
    } else {
        let len = match request.header("content-length") {
            Some(v) => v
                .parse::<usize>()
                .map_err(|_| invalid("bad content-length"))?,
            None => 0,
        };
        if len > MAX_BODY {
            return Err(invalid("body too large"));
        }
        while pending.len() < len {
            need(reader, pending).await?;
        }
        pending.drain(..len).collect()
    };
    Ok(Some(request))
}

async fn read_chunked<R: AsyncRead + Unpin>(
    reader: &mut R,
    pending: &mut Vec<u8>,
) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(pos) = find(pending, b"\r\n") {
                break pos;
            }
            need(reader, pending).await?;
        };
        let size_text = String::from_utf8_lossy(&pending[..line_end]).into_owned();
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16).map_err(|_| invalid("bad chunk size"))?;
        pending.drain(..line_end + 2);
        if body.len() + size > MAX_BODY {
            return Err(invalid("body too large"));
        }
        while pending.len() < size + 2 {
            need(reader, pending).await?;
        }
        body.extend_from_slice(&pending[..size]);
        pending.drain(..size + 2);
        if size == 0 {
            return Ok(body);
        }
    }
}

async fn fill<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut chunk = [0u8; 16 * 1024];
    let n = reader.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

async fn need<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut Vec<u8>) -> io::Result<()> {
    if fill(reader, buf).await? == 0 {
        return Err(invalid("connection closed inside a request"));
    }
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}
