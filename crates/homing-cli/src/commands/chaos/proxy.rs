//! A TCP proxy between one worker slot and Redis that the chaos tool can cut and restore: the
//! network fault. A cut is a partition, not a polite close: bytes stop flowing both ways and
//! new connections hang, so clients find out by their own time-outs, as they would behind a
//! broken switch. On restore the stalled connections are closed and new ones pass again.

use std::net::SocketAddr;
use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub struct Proxy {
    pub port: u16,
    cut: watch::Sender<bool>,
    stop: CancellationToken,
}

impl Proxy {
    pub async fn start(upstream_port: u16) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (cut, _) = watch::channel(false);
        let stop = CancellationToken::new();
        let upstream: SocketAddr = ([127, 0, 0, 1], upstream_port).into();
        let (cut2, stop2) = (cut.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let conn = tokio::select! {
                    c = listener.accept() => c,
                    _ = stop2.cancelled() => return,
                };
                let Ok((client, _)) = conn else { continue };
                let rx = cut2.subscribe();
                tokio::spawn(relay(client, upstream, rx, stop2.clone()));
            }
        });
        Ok(Proxy { port, cut, stop })
    }

    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn restore(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn wait_for(rx: &mut watch::Receiver<bool>, want: bool) {
    let _ = rx.wait_for(|v| *v == want).await;
}

async fn relay(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut cut: watch::Receiver<bool>,
    stop: CancellationToken,
) {
    if *cut.borrow() {
        // Accepted during a partition: hold the connection silent, then drop it.
        tokio::select! {
            _ = wait_for(&mut cut, false) => {}
            _ = stop.cancelled() => {}
        }
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    tokio::select! {
        _ = copy_bidirectional(&mut client, &mut server) => {}
        _ = wait_for(&mut cut, true) => {
            // Partitioned: stop forwarding but keep both sockets open until the cut heals.
            tokio::select! {
                _ = wait_for(&mut cut, false) => {}
                _ = stop.cancelled() => {}
            }
        }
        _ = stop.cancelled() => {}
    }
}
