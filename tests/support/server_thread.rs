//! What every scripted fake server (the LLM for OpenCode, the Anthropic and Responses APIs for
//! the hosts) runs on: a listener on 127.0.0.1:0 and a thread of its own with a current-thread
//! tokio runtime, so the fakes work from sync and async tests alike. Dropping the handle stops
//! the server; dropping the runtime cancels every connection task.

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};

/// A running fake server.
pub struct ServerThread {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerThread {
    /// Binds 127.0.0.1:0 and serves every connection with `handle`, in a task of its own, on a
    /// thread named `name` until dropped. Panics (naming the fake) if the machine cannot give it
    /// a socket or a thread.
    pub fn serve_connections<F, Fut>(name: &str, handle: F) -> Self
    where
        F: Fn(TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let label = name.to_string();
        Self::start(name, move |listener| async move {
            super::http::accept_loop(listener, &label, handle).await
        })
    }

    /// Binds 127.0.0.1:0 and runs `serve` (its accept loop) on a thread named `name`.
    fn start<F, Fut>(name: &str, serve: F) -> Self
    where
        F: FnOnce(TcpListener) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("{name}: bind: {e}"));
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("{name}: set_nonblocking: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("{name}: local_addr: {e}"));
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let label = name.to_string();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap_or_else(|e| panic!("{label}: runtime: {e}"));
                runtime.block_on(async move {
                    let listener = TcpListener::from_std(listener)
                        .unwrap_or_else(|e| panic!("{label}: tokio listener: {e}"));
                    tokio::select! {
                        _ = serve(listener) => {}
                        _ = shutdown_rx => {}
                    }
                });
            })
            .unwrap_or_else(|e| panic!("{name}: spawn thread: {e}"));
        Self {
            addr,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
