//! Keeps the processes' memory flat over a long run. glibc's malloc gives each thread that
//! allocates under contention an arena of its own (up to eight per core) and keeps what is freed
//! in it for that arena's later use. homing's store calls run on tokio's blocking threads, which
//! come and go; each new one may start another arena, and the pages freed there are rarely
//! reused by the next thread. Draining a million jobs, `homing server` grew from about 35 to
//! well over 100 MB that way, with nothing live to show for it; capped at two arenas it stayed
//! within a few MB of where it started (BENCHMARKS.md; the drain's throughput differed by less
//! than that loaded machine's run-to-run noise).

/// The arenas glibc may keep: one for the async workers' steady allocation, one spare so a
/// blocking thread rarely waits for the other's lock.
const ARENAS: i32 = 2;

/// Caps glibc's malloc arenas unless `MALLOC_ARENA_MAX` already says how many (glibc read it
/// at start, and an operator's choice wins). Must run before the runtime starts its threads.
/// Returns whether the cap was set here.
pub(crate) fn limit_arenas() -> bool {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return false;
    }
    set_arena_max(ARENAS)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn set_arena_max(n: i32) -> bool {
    // SAFETY: mallopt(3) takes two integers and only changes malloc's tunables.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, n) == 1 }
}

/// Other allocators (musl's, the BSDs', macOS's) do not keep per-thread arenas this way.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_arena_max(_n: i32) -> bool {
    false
}

#[cfg(test)]
mod tests {
    /// glibc accepts the cap (mallopt answers 1 for a setting it applied, 0 for one it refused).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn glibc_accepts_the_arena_cap() {
        assert!(super::set_arena_max(super::ARENAS));
    }
}
