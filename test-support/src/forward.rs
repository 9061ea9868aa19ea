//! A TCP forward on an ephemeral loopback port to a target that may change, whose connections a
//! test can cut. A client that connects through it sees a cut as its connection dying (no close
//! frame), and reconnects to the same address, whichever service answers there by then: so a
//! test can drop a real client's connection, or restart the service on another port under it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The forward; it stops accepting when dropped (connections already cut or not end with it).
pub struct Forward {
    pub addr: SocketAddr,
    target: Arc<Mutex<SocketAddr>>,
    cuts: watch::Sender<u64>,
    accept: actix_rt::task::JoinHandle<()>,
}

impl Forward {
    /// Listens on 127.0.0.1:0 and forwards each connection to `target`.
    pub async fn start(target: SocketAddr) -> Forward {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind forward");
        let addr = listener.local_addr().expect("forward address");
        let target = Arc::new(Mutex::new(target));
        let (cuts, _) = watch::channel(0u64);
        let accept = actix_rt::spawn({
            let target = target.clone();
            let cuts = cuts.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let to = *target.lock().expect("target");
                    actix_rt::spawn(pipe(client, to, cuts.subscribe()));
                }
            }
        });
        Forward {
            addr,
            target,
            cuts,
            accept,
        }
    }

    /// New connections go to `target` from now on.
    pub fn retarget(&self, target: SocketAddr) {
        *self.target.lock().expect("target") = target;
    }

    /// Cuts every connection open now (both sockets closed at once).
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies both ways between `client` and a new connection to `to` until either ends or a cut.
async fn pipe(mut client: TcpStream, to: SocketAddr, mut cut: watch::Receiver<u64>) {
    let Ok(mut server) = TcpStream::connect(to).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = cut.changed() => {}
    }
}
