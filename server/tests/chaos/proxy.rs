//! A TCP proxy in the harness's own process, one per (node, NATS server):
//! the node is given the proxies' addresses instead of the servers', so
//! the harness can cut the node off the cluster.
//!
//! Blackholing stops forwarding bytes in both directions without closing
//! anything: the node's socket stays open, its writes pile up in the
//! kernel's buffers and nothing comes back — what a dead switch port or a
//! partition looks like from inside the node. Lifting it forwards what was
//! held. A connection whose far side closes (a server killed) is closed on
//! the other side too, so the node reconnects as it would to the server
//! itself. Dropping the proxy closes every connection it carries.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub struct Proxy {
    addr: SocketAddr,
    blackholed: Arc<watch::Sender<bool>>,
    stop: CancellationToken,
}

impl Proxy {
    /// Listen on a free loopback port and forward every connection to
    /// `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy port");
        let addr = listener.local_addr().expect("proxy address");
        let blackholed = Arc::new(watch::Sender::new(false));
        let stop = CancellationToken::new();
        {
            let (blackholed, stop) = (blackholed.clone(), stop.clone());
            tokio::spawn(async move {
                loop {
                    let accepted = tokio::select! {
                        _ = stop.cancelled() => return,
                        a = listener.accept() => a,
                    };
                    let Ok((down, _)) = accepted else { continue };
                    let (gate, stop) = (blackholed.subscribe(), stop.child_token());
                    tokio::spawn(async move {
                        // A refused upstream (the server is down) closes the
                        // client's connection at once, as the server would.
                        let Ok(up) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let _ = down.set_nodelay(true);
                        let _ = up.set_nodelay(true);
                        carry(down, up, gate, stop).await;
                    });
                }
            });
        }
        Proxy {
            addr,
            blackholed,
            stop,
        }
    }

    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// Stop (or resume) forwarding in both directions, closing nothing.
    pub fn set_blackholed(&self, on: bool) {
        self.blackholed.send_replace(on);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Pump both directions until either side closes (or the proxy stops).
async fn carry(
    down: TcpStream,
    up: TcpStream,
    gate: watch::Receiver<bool>,
    stop: CancellationToken,
) {
    let (dr, dw) = down.into_split();
    let (ur, uw) = up.into_split();
    let done = stop.child_token();
    let a = tokio::spawn(pump(dr, uw, gate.clone(), done.clone()));
    let b = tokio::spawn(pump(ur, dw, gate, done.clone()));
    let _ = a.await;
    let _ = b.await;
}

/// One direction: read, wait while blackholed, write. Either direction
/// ending ends both (dropping the halves closes the sockets).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: watch::Receiver<bool>,
    done: CancellationToken,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // Nothing is read while blackholed: the sender's kernel buffers
        // fill and its writes stall, as on a dead link.
        tokio::select! {
            _ = done.cancelled() => return,
            r = gate.wait_for(|b| !*b) => if r.is_err() { return },
        }
        let n = tokio::select! {
            _ = done.cancelled() => return,
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => { done.cancel(); return }
                Ok(n) => n,
            },
        };
        // Bytes read just before a blackhole are held until it lifts.
        tokio::select! {
            _ = done.cancelled() => return,
            r = gate.wait_for(|b| !*b) => if r.is_err() { return },
        }
        let wrote = tokio::select! {
            _ = done.cancelled() => return,
            r = to.write_all(&buf[..n]) => r,
        };
        if wrote.is_err() {
            done.cancel();
            return;
        }
    }
}
