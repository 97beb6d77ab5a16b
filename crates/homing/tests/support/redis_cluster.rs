//! A real Redis Cluster for tests: `masters` `redis-server --cluster-enabled yes` processes on
//! loopback ports, each in its own temporary directory, joined with `redis-cli --cluster create`
//! (three masters or more; fewer are joined by hand with `CLUSTER MEET` and `ADDSLOTSRANGE`,
//! which `--cluster create` refuses). No replicas and no persistence: a master that is killed
//! and restarted comes back with its node id and slots (from its `nodes.conf`) but empty, which
//! is the harshest case for the broker. `cluster-require-full-coverage no` keeps the other
//! masters serving while one is down.
//!
//! Each server runs under a small `sh` that prints the server's pid, then waits on its standard
//! input and kills the server when that closes: even a test binary that panics or is killed
//! leaves no `redis-server` behind, and a test can still `kill -9` the server itself.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

struct Node {
    port: u16,
    dir: PathBuf,
    /// The wrapper, the pipe that keeps it alive, and the server's pid.
    child: Option<(Child, ChildStdin, u32)>,
}

pub struct RedisCluster {
    nodes: Vec<Node>,
}

fn require(tool: &str) {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        found,
        "{tool} is not installed; the Redis Cluster tests need a real one: \
         run `apt-get install redis-server redis-tools`"
    );
}

/// A port for a node whose cluster bus (port + 10000) is free too.
fn free_port() -> u16 {
    super::redis_server::loopback_port_with(&[10000])
}

impl Node {
    fn start(&mut self) {
        self.stop();
        let args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--dir".into(),
            self.dir.display().to_string(),
            "--logfile".into(),
            self.dir.join("redis.log").display().to_string(),
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--cluster-enabled".into(),
            "yes".into(),
            "--cluster-config-file".into(),
            self.dir.join("nodes.conf").display().to_string(),
            "--cluster-node-timeout".into(),
            "2000".into(),
            "--cluster-require-full-coverage".into(),
            "no".into(),
        ];
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"redis-server "$@" & pid=$!; echo $pid; read _ignored; kill $pid 2>/dev/null; wait $pid"#)
            .arg("sh")
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start redis-server");
        let stdin = child.stdin.take().expect("stdin");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the server's pid");
        let pid: u32 = line.trim().parse().expect("a pid");
        self.child = Some((child, stdin, pid));
        // Up when the server on the port is this one: a PONG could come from another process's
        // server that took the port first (this one then failed to bind it).
        let deadline = Instant::now() + Duration::from_secs(10);
        let me = format!("process_id:{pid}");
        while !cli(self.port, &["INFO", "server"])
            .is_some_and(|i| i.lines().any(|l| l.trim() == me))
        {
            assert!(
                Instant::now() < deadline,
                "redis-server did not come up; see {}",
                self.dir.join("redis.log").display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        if let Some((mut child, stdin, _)) = self.child.take() {
            drop(stdin);
            let _ = child.wait();
        }
    }
}

/// `redis-cli -p port args…`, its trimmed output when it succeeded.
fn cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl RedisCluster {
    /// Starts `masters` nodes and joins them into one cluster owning all 16384 slots. A cluster
    /// that does not become healthy is described on stderr and started once more on new ports:
    /// what the tests check is the broker on a cluster, not the cluster's own start.
    pub fn start(masters: usize) -> Self {
        require("redis-server");
        require("redis-cli");
        let first = Self::join(masters).and_then(|c| {
            let healthy = c.healthy_within(Duration::from_secs(30));
            healthy.map(|()| c)
        });
        match first {
            Ok(c) => c,
            Err(e) => {
                // Straight to the process's stderr: the test harness would capture (and, once
                // the retry passes, drop) what eprintln! says.
                use std::io::Write;
                let _ = std::io::stderr().write_all(
                    format!("the cluster did not become healthy; starting another:\n{e}\n")
                        .as_bytes(),
                );
                let second = Self::join(masters).unwrap_or_else(|e| panic!("{e}"));
                second.wait_ok();
                second
            }
        }
    }

    /// Starts the nodes and joins them; a join that fails, or takes longer than 30 s (a node
    /// that never joins keeps `--cluster create` waiting for ever), is an error that says what
    /// each node reports, its nodes stopped.
    fn join(masters: usize) -> Result<Self, String> {
        let mut nodes: Vec<Node> = (0..masters)
            .map(|_| Node {
                port: free_port(),
                dir: tempfile::tempdir().expect("temp dir").keep(),
                child: None,
            })
            .collect();
        for n in &mut nodes {
            n.start();
        }
        let c = Self { nodes };
        let addrs: Vec<String> = c
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        if masters >= 3 {
            let out = Command::new("timeout")
                .args(["30", "redis-cli", "--cluster", "create"])
                .args(&addrs)
                .args(["--cluster-replicas", "0", "--cluster-yes"])
                .output()
                .expect("run timeout 30 redis-cli --cluster create");
            if !out.status.success() {
                return Err(format!(
                    "redis-cli --cluster create failed or took over 30 s ({}): {}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    c.describe()
                ));
            }
        } else {
            let per = 16384 / masters;
            for (i, n) in c.nodes.iter().enumerate() {
                let first = i * per;
                let last = if i + 1 == masters {
                    16383
                } else {
                    first + per - 1
                };
                c.must(
                    n.port,
                    &[
                        "CLUSTER",
                        "ADDSLOTSRANGE",
                        &first.to_string(),
                        &last.to_string(),
                    ],
                );
                if i > 0 {
                    c.must(
                        n.port,
                        &["CLUSTER", "MEET", "127.0.0.1", &c.nodes[0].port.to_string()],
                    );
                }
            }
        }
        Ok(c)
    }

    fn must(&self, port: u16, args: &[&str]) -> String {
        cli(port, args).unwrap_or_else(|| panic!("redis-cli -p {port} {args:?} failed"))
    }

    /// Waits until every node reports the cluster healthy and knows every other node; if that
    /// does not come within 30 s, panics with what each node says and the end of its log.
    pub fn wait_ok(&self) {
        if let Err(e) = self.healthy_within(Duration::from_secs(30)) {
            panic!("the cluster did not become healthy:\n{e}");
        }
    }

    fn healthy_within(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        loop {
            let ok = self.nodes.iter().all(|n| {
                cli(n.port, &["CLUSTER", "INFO"]).is_some_and(|i| {
                    let has = |want: &str| i.lines().any(|l| l.trim() == want);
                    has("cluster_state:ok") && has(&known) && has("cluster_slots_ok:16384")
                })
            });
            if ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.describe());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Each node's port, pid, `CLUSTER INFO` summary, `CLUSTER NODES` and last log lines.
    fn describe(&self) -> String {
        let mut out = String::new();
        for n in &self.nodes {
            let pid = n.child.as_ref().map(|c| c.2);
            out += &format!("node {} (pid {pid:?}, dir {}):\n", n.port, n.dir.display());
            let info = cli(n.port, &["CLUSTER", "INFO"]).unwrap_or_else(|| "no answer".into());
            for l in info.lines().filter(|l| {
                l.starts_with("cluster_state")
                    || l.starts_with("cluster_slots_")
                    || l.starts_with("cluster_known_nodes")
                    || l.starts_with("cluster_current_epoch")
            }) {
                out += &format!("  {}\n", l.trim());
            }
            let nodes = cli(n.port, &["CLUSTER", "NODES"]).unwrap_or_else(|| "no answer".into());
            for l in nodes.lines() {
                out += &format!("  | {l}\n");
            }
            let log = std::fs::read_to_string(n.dir.join("redis.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            for l in &lines[lines.len().saturating_sub(15)..] {
                out += &format!("  log: {l}\n");
            }
        }
        out
    }

    /// The broker URL for this cluster with key namespace `prefix`.
    pub fn url(&self, prefix: &str) -> String {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis+cluster://{}?prefix={prefix}", seeds.join(","))
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// `redis-cli -c` (follows redirections) against the first node.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-c", "-p", &self.nodes[0].port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        assert!(out.status.success(), "redis-cli {args:?} failed: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `redis-cli` against node `i`, without following redirections.
    pub fn node_cli(&self, i: usize, args: &[&str]) -> String {
        self.must(self.nodes[i].port, args)
    }

    /// The index of the node owning `key`'s slot.
    pub fn owner_of(&self, key: &str) -> usize {
        let slot: u32 = self
            .cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("a slot number");
        for (i, n) in self.nodes.iter().enumerate() {
            // Each node's own line of `CLUSTER NODES` ("myself") lists the slots it serves.
            let nodes = self.must(n.port, &["CLUSTER", "NODES"]);
            let me = nodes
                .lines()
                .find(|l| l.contains("myself"))
                .expect("myself line");
            if owns(me, slot) {
                return i;
            }
        }
        panic!("no node owns slot {slot}");
    }

    /// The node id of node `i`.
    pub fn node_id(&self, i: usize) -> String {
        self.must(self.nodes[i].port, &["CLUSTER", "MYID"])
    }

    /// Kills node `i`'s server with SIGKILL (no shutdown, nothing saved).
    pub fn kill9(&mut self, i: usize) {
        let pid = self.nodes[i].child.as_ref().expect("running").2;
        let status = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -9 {pid} failed");
        self.nodes[i].stop();
    }

    /// Starts node `i` again (same port, same `nodes.conf`: same id and slots, no data).
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].start();
        self.wait_ok();
    }
}

/// Whether a `CLUSTER NODES` line lists `slot` among its ranges.
fn owns(line: &str, slot: u32) -> bool {
    line.split_whitespace().skip(8).any(|r| {
        if r.starts_with('[') {
            return false;
        }
        match r.split_once('-') {
            Some((a, b)) => match (a.parse::<u32>(), b.parse::<u32>()) {
                (Ok(a), Ok(b)) => a <= slot && slot <= b,
                _ => false,
            },
            None => r.parse::<u32>() == Ok(slot),
        }
    })
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.stop();
        }
    }
}

/// One three-master cluster shared by every test of this binary (each test uses its own key
/// prefix).
pub fn shared() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3))
}
