//! Child processes the chaos tool owns. Each one dies with the tool however the tool ends: a
//! parent-death signal covers `kill -9` of the tool itself, `Drop` covers errors and Ctrl-C, and
//! every child gets its own process group so a terminal's Ctrl-C reaches only the tool, which
//! then tears the deployment down in order. `homing bench` takes its parent-death signal from
//! here too ([`dies_with_bench`]), as it takes its throwaway servers from `services`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Sends `sig` to `pid`. Errors (the process is already gone) are the caller's to ignore.
#[allow(unsafe_code)]
pub fn signal(pid: u32, sig: libc::c_int) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| std::io::Error::other("pid out of range"))?;
    // SAFETY: kill(2) takes plain integers and has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Makes `cmd`'s process receive SIGKILL when the thread that spawned it exits; see [`keeper`].
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only async-signal-safe calls are allowed; see
    // [`kill_me_with_parent`].
    unsafe {
        cmd.pre_exec(kill_me_with_parent);
    }
    cmd.process_group(0);
}

/// Makes a child of `homing bench` receive SIGKILL when the thread that spawned it exits, so a
/// bench killed with -9 leaves no worker behind (`kill_on_drop` covers every other end). The
/// bench spawns from its runtime's own threads (the main thread's `block_on`, or a worker
/// thread), which live as long as the process, unlike the blocking pool's that [`keeper`] is
/// for. Its children keep the bench's process group: a terminal's Ctrl-C stops them with it.
#[allow(unsafe_code)]
pub(crate) fn dies_with_bench(cmd: &mut tokio::process::Command) {
    // SAFETY: between fork and exec only async-signal-safe calls are allowed; see
    // [`kill_me_with_parent`].
    unsafe {
        cmd.pre_exec(kill_me_with_parent);
    }
}

/// Run in a forked child before its exec: asks for SIGKILL when the forking thread exits.
/// Async-signal-safe: prctl(2) and reading errno, nothing that allocates or locks.
#[allow(unsafe_code)]
fn kill_me_with_parent() -> std::io::Result<()> {
    // SAFETY: prctl(2) with integer arguments has no memory-safety preconditions.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

type SpawnRequest = (Command, std::sync::mpsc::Sender<std::io::Result<Child>>);

/// The parent-death signal fires when the *thread* that forked the child exits, and a tokio
/// runtime retires idle threads. So every child is forked by this one thread, which lives as
/// long as the process.
fn keeper() -> &'static std::sync::Mutex<std::sync::mpsc::Sender<SpawnRequest>> {
    static KEEPER: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<SpawnRequest>>> =
        std::sync::OnceLock::new();
    KEEPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("chaos-keeper".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("a thread for spawning children");
        std::sync::Mutex::new(tx)
    })
}

fn spawn_kept(cmd: Command) -> std::io::Result<Child> {
    let (tx, rx) = std::sync::mpsc::channel();
    keeper()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send((cmd, tx))
        .map_err(|_| std::io::Error::other("the spawning thread is gone"))?;
    rx.recv()
        .map_err(|_| std::io::Error::other("the spawning thread is gone"))?
}

/// A running child with its log file.
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Option<Child>,
    pid: u32,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Proc> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        cmd.stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        die_with_parent(&mut cmd);
        let program = cmd.get_program().to_os_string();
        let child = spawn_kept(cmd)
            .map_err(|e| anyhow::anyhow!("cannot start {name} ({program:?}): {e}"))?;
        Ok(Proc {
            name: name.to_string(),
            log: log.to_path_buf(),
            pid: child.id(),
            child: Some(child),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn signal(&self, sig: libc::c_int) {
        if self.child.is_some() {
            let _ = signal(self.pid, sig);
        }
    }

    /// Whether the process has exited (reaping it if so).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(c) => matches!(c.try_wait(), Ok(Some(_))),
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = signal(self.pid, libc::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `sig` and waits up to `limit` for the exit; SIGKILL after that.
    pub fn stop_with(&mut self, sig: libc::c_int, limit: Duration) {
        let Some(c) = self.child.as_mut() else { return };
        let _ = signal(self.pid, libc::SIGCONT);
        let _ = signal(self.pid, sig);
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if matches!(c.try_wait(), Ok(Some(_))) {
                self.child = None;
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill9();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}
