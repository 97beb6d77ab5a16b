//! A throwaway PostgreSQL server for tests, made from the installed server binaries: `initdb`
//! into a fresh directory under /tmp, `postgres` listening only on a unix socket in that
//! directory, with fsync off (durability across power loss is not what these tests check).
//! One server per test binary, started on first use; each test takes its own database.
//!
//! PostgreSQL refuses to run as root, so as root the server runs as the `postgres` system user
//! (created when missing) through `setpriv` (or `runuser`). It runs under a small shell "guard"
//! whose standard input is a pipe from the test binary: when the binary exits, however it exits,
//! the pipe closes and the guard stops the server and deletes its directory, so no server
//! outlives the tests. The same pipe carries `stop`/`start` for tests of a server restart.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const SUPERUSER: &str = "homing";
/// Only names the socket file (`.s.PGSQL.<port>`): nothing listens on TCP.
const PORT: u16 = 5432;
const INSTALL_HINT: &str =
    "PostgreSQL server binaries (initdb, postgres) are required for these tests: \
     apt-get install postgresql";

/// Stops the server when the test binary's end closes the guard's standard input.
const GUARD: &str = r#"
PG=$1; DATA=$2; DIR=$3; PORT=$4
pid=
start() {
    "$PG" -D "$DATA" -k "$DIR" -p "$PORT" -c listen_addresses= \
        -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
        -c max_connections=300 </dev/null >>"$DIR/postgres.log" 2>&1 &
    pid=$!
}
stop() {
    if [ -n "$pid" ]; then kill -INT "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=; fi
}
trap 'stop; rm -rf "$DIR"; exit 0' HUP INT TERM
start
echo started
while read -r cmd; do
    case "$cmd" in
        stop) stop; echo stopped ;;
        start) start; echo started ;;
    esac
done
stop
rm -rf "$DIR"
"#;

pub struct PgServer {
    dir: PathBuf,
    data: PathBuf,
    guard: Mutex<Guard>,
}

struct Guard {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

static SERVER: OnceLock<PgServer> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(0);

/// The test binary's server, started on first use.
pub fn server() -> &'static PgServer {
    SERVER.get_or_init(|| PgServer::launch().unwrap_or_else(|e| panic!("{e}")))
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// `initdb` and `postgres` from PATH, else from the newest /usr/lib/postgresql/<version>/bin.
fn server_binaries() -> Result<(PathBuf, PathBuf), String> {
    if let (Some(i), Some(p)) = (on_path("initdb"), on_path("postgres")) {
        return Ok((i, p));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| INSTALL_HINT.to_string())?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, bin)| bin.join("initdb").is_file() && bin.join("postgres").is_file())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| (bin.join("initdb"), bin.join("postgres")))
        .ok_or_else(|| INSTALL_HINT.to_string())
}

fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The user to run the server as: `None` means ourselves (we are not root).
fn server_user() -> Result<Option<(u32, u32)>, String> {
    let uid: u32 = output(Command::new("id").arg("-u"))?
        .parse()
        .map_err(|e| format!("id -u: {e}"))?;
    if uid != 0 {
        return Ok(None);
    }
    if output(Command::new("id").args(["-u", "postgres"])).is_err() {
        output(Command::new("useradd").args([
            "--system",
            "--user-group",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            "postgres",
        ]))
        .map_err(|e| {
            format!("no `postgres` user to run the server as, and cannot create one: {e}")
        })?;
    }
    let uid = output(Command::new("id").args(["-u", "postgres"]))?;
    let gid = output(Command::new("id").args(["-g", "postgres"]))?;
    Ok(Some((
        uid.parse().map_err(|e| format!("uid: {e}"))?,
        gid.parse().map_err(|e| format!("gid: {e}"))?,
    )))
}

/// `program` run as `user` (or as ourselves).
fn command_as(user: Option<(u32, u32)>, program: &Path) -> Command {
    match user {
        None => Command::new(program),
        Some((uid, gid)) if on_path("setpriv").is_some() => {
            let mut c = Command::new("setpriv");
            c.args([
                format!("--reuid={uid}"),
                format!("--regid={gid}"),
                "--clear-groups".to_string(),
                "--".to_string(),
            ])
            .arg(program);
            c
        }
        Some(_) => {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        }
    }
}

impl PgServer {
    fn launch() -> Result<PgServer, String> {
        let (initdb, postgres) = server_binaries()?;
        let user = server_user()?;
        // /tmp rather than $TMPDIR: the server's user must be able to reach the directory.
        let dir = tempfile::Builder::new()
            .prefix("homing-pg-")
            .tempdir_in("/tmp")
            .map_err(|e| format!("temp dir: {e}"))?
            .keep();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", dir.display()))?;
        }
        let data = dir.join("data");
        let init = output(
            command_as(user, &initdb)
                .arg("-D")
                .arg(&data)
                .args([
                    "-U",
                    SUPERUSER,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ])
                .current_dir(&dir),
        );
        if let Err(e) = init {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!("initdb failed: {e}"));
        }
        let mut child = command_as(user, Path::new("/bin/sh"))
            .arg("-c")
            .arg(GUARD)
            .arg("homing-pg-guard")
            .arg(&postgres)
            .arg(&data)
            .arg(&dir)
            .arg(PORT.to_string())
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start the PostgreSQL guard: {e}"))?;
        let guard = Guard {
            stdin: child.stdin.take().expect("piped"),
            stdout: BufReader::new(child.stdout.take().expect("piped")),
            _child: child,
        };
        let server = PgServer {
            dir,
            data,
            guard: Mutex::new(guard),
        };
        server.expect_reply("started")?;
        server.wait_ready()?;
        Ok(server)
    }

    fn expect_reply(&self, want: &str) -> Result<(), String> {
        let mut g = self.guard.lock().unwrap_or_else(|p| p.into_inner());
        let mut line = String::new();
        g.stdout
            .read_line(&mut line)
            .map_err(|e| format!("guard: {e}"))?;
        if line.trim() != want {
            return Err(format!(
                "PostgreSQL guard said {line:?}, expected {want:?}; log:\n{}",
                self.log()
            ));
        }
        Ok(())
    }

    /// Waits until the postmaster reports that it accepts connections.
    fn wait_ready(&self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let pid_file = self.data.join("postmaster.pid");
        while Instant::now() < deadline {
            if let Ok(s) = std::fs::read_to_string(&pid_file) {
                if s.lines().any(|l| l.trim() == "ready") {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "PostgreSQL did not become ready within 60 s; log:\n{}",
            self.log()
        ))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default()
    }

    fn send(&self, cmd: &str) {
        let mut g = self.guard.lock().unwrap_or_else(|p| p.into_inner());
        writeln!(g.stdin, "{cmd}").expect("write to the PostgreSQL guard");
        g.stdin.flush().expect("flush the PostgreSQL guard");
    }

    /// Stops the server (fast shutdown: sessions are cut) and waits until it has exited.
    pub fn stop(&self) {
        self.send("stop");
        self.expect_reply("stopped")
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Starts the server again on the same data and socket, and waits until it is ready.
    pub fn start(&self) {
        self.send("start");
        self.expect_reply("started")
            .unwrap_or_else(|e| panic!("{e}"));
        self.wait_ready().unwrap_or_else(|e| panic!("{e}"));
    }

    /// The socket directory.
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// A URL for database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://{SUPERUSER}@localhost:{PORT}/{db}?host={}",
            self.dir.display()
        )
    }

    /// Creates a new, empty database and returns its URL.
    pub async fn fresh_database(&self) -> String {
        use sqlx::Connection;
        let name = format!(
            "homing_t{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::SeqCst)
        );
        let mut conn = sqlx::PgConnection::connect(&self.url("postgres"))
            .await
            .unwrap_or_else(|e| panic!("connect to the test server: {e}; log:\n{}", self.log()));
        sqlx::Executor::execute(
            &mut conn,
            sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")),
        )
        .await
        .expect("create a test database");
        let _ = conn.close().await;
        self.url(&name)
    }
}
