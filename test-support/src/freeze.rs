//! A TCP proxy on an ephemeral loopback port that a test can freeze: while frozen, its
//! connections stay open but no byte crosses it in either direction, as with a proxy process
//! stopped by SIGSTOP, a black-holed route or a hung peer. New connections are accepted and held
//! the same way. Thawing lets everything held through again, in order.
//!
//! Used for the silent peers of PROTOCOL.md: a change source that stops answering, a change DB
//! behind a partition. Unlike [`crate::forward::Forward::cut`], nothing is closed: the silence
//! must be noticed by the side under test, by its own pings, keepalives and timeouts.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy; it stops accepting when dropped, and its open connections end with it.
pub struct FreezeProxy {
    pub addr: SocketAddr,
    frozen: watch::Sender<bool>,
    accept: actix_rt::task::JoinHandle<()>,
}

impl FreezeProxy {
    /// Listens on 127.0.0.1:0 and forwards each connection to `target`.
    pub async fn start(target: SocketAddr) -> FreezeProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind freeze proxy");
        let addr = listener.local_addr().expect("freeze proxy address");
        let (frozen, _) = watch::channel(false);
        let accept = actix_rt::spawn({
            let frozen = frozen.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    actix_rt::spawn(connection(client, target, frozen.subscribe()));
                }
            }
        });
        FreezeProxy {
            addr,
            frozen,
            accept,
        }
    }

    /// [`FreezeProxy::start`] on a runtime of its own thread, so that it forwards while the
    /// test's thread is busy or blocked in a wait (only a freeze holds up its bytes). For a
    /// peer the test drives from a blocking thread, such as a service process and its change DB.
    pub fn start_on_own_thread(target: SocketAddr) -> FreezeProxy {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let _ = tx.send(FreezeProxy::start(target).await);
                std::future::pending::<()>().await
            })
        });
        rx.recv().expect("the freeze proxy started")
    }

    /// From now on no byte crosses, on open connections and new ones; nothing is closed.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Lets bytes cross again.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    pub fn is_frozen(&self) -> bool {
        *self.frozen.borrow()
    }
}

impl Drop for FreezeProxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Every connection's task ends when the sender goes (`wait_thawed` sees it closed).
    }
}

/// Connects to `to` (once thawed) and copies both ways until either side ends.
async fn connection(client: TcpStream, to: SocketAddr, mut frozen: watch::Receiver<bool>) {
    if !wait_thawed(&mut frozen).await {
        return;
    }
    let Ok(server) = TcpStream::connect(to).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        _ = copy(client_read, server_write, frozen.clone()) => {}
        _ = copy(server_read, client_write, frozen) => {}
    }
}

/// Copies `from` to `to`, reading nothing and writing nothing while frozen: the kernel's buffers
/// fill and the sender's writes stall, as behind a stopped proxy.
async fn copy(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut frozen: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if !wait_thawed(&mut frozen).await {
            return;
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // Frozen while waiting to read: wait for the thaw before reading.
            _ = frozen.wait_for(|f| *f) => continue,
        };
        if !wait_thawed(&mut frozen).await || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Waits until not frozen; false once the proxy is gone.
async fn wait_thawed(frozen: &mut watch::Receiver<bool>) -> bool {
    frozen.wait_for(|f| !*f).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Echoes every byte back, for the proxy to stand in front of.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
        let addr = listener.local_addr().expect("echo address");
        actix_rt::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                actix_rt::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn echo_once(s: &mut TcpStream, byte: u8) -> u8 {
        s.write_all(&[byte]).await.expect("write");
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.expect("read");
        b[0]
    }

    #[actix_rt::test]
    async fn a_frozen_proxy_holds_every_byte_until_thawed() {
        let proxy = FreezeProxy::start(echo_server().await).await;
        let mut s = TcpStream::connect(proxy.addr).await.expect("connect");
        assert_eq!(echo_once(&mut s, 1).await, 1);
        proxy.freeze();
        s.write_all(&[2]).await.expect("write while frozen");
        let mut b = [0u8; 1];
        // Nothing comes back while frozen (a slow machine can only hide a leak here, never
        // fail a good proxy: the wait is for an absence).
        let pending =
            tokio::time::timeout(std::time::Duration::from_millis(200), s.read_exact(&mut b)).await;
        assert!(pending.is_err(), "a byte crossed a frozen proxy");
        proxy.thaw();
        s.read_exact(&mut b).await.expect("read after thaw");
        assert_eq!(b[0], 2);
    }
}
