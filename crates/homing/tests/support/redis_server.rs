//! A real `redis-server` for tests: started in a temporary directory, without persistence, on a
//! unix socket or a loopback port, and stopped when dropped or when the test binary exits.
//!
//! The server runs under a small `sh` that waits on its standard input and kills the server when
//! that closes: the test process holds the pipe, so even a test binary that panics or is killed
//! leaves no `redis-server` behind.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where a server listens.
#[derive(Debug, Clone)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(u16),
}

#[derive(Debug)]
pub struct RedisServer {
    dir: PathBuf,
    listen: Listen,
    password: Option<String>,
    child: Option<(Child, ChildStdin)>,
}

/// Fails (never skips) when Redis is not installed: these tests are the Redis broker's only
/// evidence.
fn require_redis() {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        found,
        "redis-server is not installed; the Redis broker tests need a real server: \
         run `apt-get install redis-server`"
    );
}

/// A free loopback port (free when asked; the server binds it right after).
pub fn free_port() -> u16 {
    loopback_port_with(&[])
}

/// A free loopback port, with `port + extra` free too for each `extra` (a cluster node's bus),
/// below the kernel's ephemeral range (32768 and up by default). A port from that range can be
/// taken, between the choice and the server's bind, or while a server is down to be restarted
/// on it, by another process binding port 0 or as an outgoing connection's local port (a client
/// reconnecting to it can even connect to itself); the server then cannot bind. Ports are handed
/// out once per process, from a random start.
pub fn loopback_port_with(extras: &[u16]) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 15000;
    const SPAN: u32 = 7700; // LOW + SPAN + a cluster bus's 10000 stays below 32768
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // A random start, once per process: processes started together have nearly consecutive
    // pids, and counting up from `pid % SPAN` they would try each other's ports at once.
    static START: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let start = *START.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let random = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        (random % u64::from(SPAN)) as u32
    });
    let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
    for _ in 0..SPAN {
        let port = (LOW + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if free(port) && extras.iter().all(|e| free(port + e)) {
            return port;
        }
    }
    panic!("no free loopback port between {LOW} and {}", LOW + SPAN);
}

impl RedisServer {
    /// A server on a unix socket in a fresh temporary directory.
    pub fn unix() -> Self {
        let dir = tempfile::tempdir().expect("temp dir").keep();
        let sock = dir.join("redis.sock");
        Self::start(dir, Listen::Unix(sock), None)
    }

    /// A server on a loopback TCP port, with a password.
    pub fn tcp(password: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir").keep();
        Self::start(dir, Listen::Tcp(free_port()), Some(password.to_string()))
    }

    fn start(dir: PathBuf, listen: Listen, password: Option<String>) -> Self {
        require_redis();
        let mut s = Self {
            dir,
            listen,
            password,
            child: None,
        };
        s.restart();
        s
    }

    /// The broker URL for this server with key namespace `prefix`.
    pub fn url(&self, prefix: &str) -> String {
        match &self.listen {
            Listen::Unix(p) => format!("redis+unix://{}?prefix={prefix}", p.display()),
            Listen::Tcp(port) => match &self.password {
                Some(pw) => format!("redis://:{pw}@127.0.0.1:{port}/0?prefix={prefix}"),
                None => format!("redis://127.0.0.1:{port}/0?prefix={prefix}"),
            },
        }
    }

    /// `redis-cli` arguments that reach this server.
    pub fn cli_args(&self) -> Vec<String> {
        let mut a = match &self.listen {
            Listen::Unix(p) => vec!["-s".to_string(), p.display().to_string()],
            Listen::Tcp(port) => vec!["-p".to_string(), port.to_string()],
        };
        if let Some(pw) = &self.password {
            a.extend([
                "-a".to_string(),
                pw.clone(),
                "--no-auth-warning".to_string(),
            ]);
        }
        a
    }

    /// Runs `redis-cli` with `args` against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(self.cli_args())
            .args(args)
            .output()
            .expect("run redis-cli");
        assert!(out.status.success(), "redis-cli {args:?} failed: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Stops the server (its data is gone: no persistence).
    pub fn stop(&mut self) {
        if let Some((mut child, stdin)) = self.child.take() {
            drop(stdin);
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same address.
    pub fn restart(&mut self) {
        self.stop();
        let mut args: Vec<String> = vec![
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--logfile".into(),
            self.dir.join("redis.log").display().to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
        ];
        match &self.listen {
            Listen::Unix(p) => {
                let _ = std::fs::remove_file(p);
                args.extend([
                    "--port".into(),
                    "0".into(),
                    "--unixsocket".into(),
                    p.display().to_string(),
                    "--unixsocketperm".into(),
                    "700".into(),
                ]);
            }
            Listen::Tcp(port) => args.extend(["--port".into(), port.to_string()]),
        }
        if let Some(pw) = &self.password {
            args.extend(["--requirepass".into(), pw.clone()]);
        }
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"redis-server "$@" & pid=$!; read _ignored; kill $pid; wait $pid"#)
            .arg("sh")
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let stdin = child.stdin.take().expect("stdin");
        self.child = Some((child, stdin));
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.ping() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not come up; see {}",
                self.dir.join("redis.log").display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn ping(&self) -> bool {
        let mut req = Vec::new();
        if let Some(pw) = &self.password {
            req.extend_from_slice(format!("AUTH {pw}\r\n").as_bytes());
        }
        req.extend_from_slice(b"PING\r\n");
        let t = Some(Duration::from_secs(1));
        let reply = match &self.listen {
            Listen::Unix(p) => {
                let s = std::os::unix::net::UnixStream::connect(p).ok();
                let s = s.filter(|s| s.set_read_timeout(t).is_ok());
                exchange(s, &req)
            }
            Listen::Tcp(port) => {
                let s = std::net::TcpStream::connect(("127.0.0.1", *port)).ok();
                let s = s.filter(|s| s.set_read_timeout(t).is_ok());
                exchange(s, &req)
            }
        };
        reply.contains("PONG")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn exchange<S: Read + Write>(stream: Option<S>, req: &[u8]) -> String {
    let Some(mut s) = stream else {
        return String::new();
    };
    if s.write_all(req).is_err() {
        return String::new();
    }
    let mut buf = [0u8; 256];
    let mut got = String::new();
    for _ in 0..4 {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.push_str(&String::from_utf8_lossy(&buf[..n])),
        }
        if got.contains("PONG") || got.contains("ERR") || got.contains("NOAUTH") {
            break;
        }
    }
    got
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One server shared by every test of this binary (each test uses its own key prefix).
pub fn shared() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(RedisServer::unix)
}

/// A key prefix no other test of this run uses.
pub fn unique_prefix(what: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "t{}-{what}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}
