//! The `homing` binary: server, worker and command-line tool over the `homing` library.

mod alloc;
mod api;
mod cli;
mod commands;
mod config;
mod http_server;
mod logs;
mod output;
mod pipelines;
mod signals;
mod tasks;
mod views;

use clap::Parser;

/// The log filter from `HOMING_LOG` (unset or blank: `default`). A bare word must be a level
/// (or its number) or one of homing's targets: a bare `garbage` or `inof` is valid filter
/// syntax for "everything from target `garbage`", so the process logged nothing at all, not
/// even a dead job, and said nothing about it. Spaces around items are dropped (the filter's
/// parser misreads `info, homing=debug`).
fn log_filter(value: Option<&str>, default: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    let items: Vec<&str> = value
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .collect();
    if items.is_empty() {
        return Ok(tracing_subscriber::EnvFilter::new(default));
    }
    const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];
    for item in &items {
        let bare_ok = item.contains(['=', '['])
            || LEVELS.contains(&item.to_ascii_lowercase().as_str())
            || matches!(*item, "0" | "1" | "2" | "3" | "4" | "5")
            || item.starts_with("homing");
        if !bare_ok {
            let shown: String = item.chars().take(64).collect();
            return Err(format!(
                "HOMING_LOG: {shown:?} is neither a level ({}) nor TARGET=LEVEL (homing=debug)",
                LEVELS.join(", ")
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(items.join(",")).map_err(|e| format!("HOMING_LOG: {e}"))
}

fn init_tracing(format: &str, filter: tracing_subscriber::EnvFilter) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(logs::start())
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if format == "json" {
        builder.json().flatten_event(true).init();
    } else {
        builder.with_target(false).init();
    }
}

/// A worker's runtime has the threads it asks for (one by default: its hand-offs between the
/// fetcher, the jobs and the committer then wake no other thread, which on a busy machine costs
/// more than the jobs; BENCHMARKS.md, "One runtime thread per worker"); a single thread is the
/// main one. Every other command keeps tokio's default of one thread per core, so the API
/// serves requests in parallel.
fn runtime_builder(command: &cli::Command) -> tokio::runtime::Builder {
    match command {
        cli::Command::Worker(a) if a.runtime_threads == 1 => {
            tokio::runtime::Builder::new_current_thread()
        }
        cli::Command::Worker(a) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(a.runtime_threads);
            b
        }
        _ => tokio::runtime::Builder::new_multi_thread(),
    }
}

fn main() -> std::process::ExitCode {
    let code = run();
    // Whatever was logged on the way out and is still queued (logs.rs).
    logs::flush();
    code
}

fn run() -> std::process::ExitCode {
    // Before any thread exists (docs/pruner.md, "memory").
    alloc::limit_arenas();
    let cli = cli::Cli::parse();
    // The chaos run's own client sees every fault it injects; its report says what mattered.
    let default = match cli.command {
        cli::Command::Chaos(_) => "error",
        _ => "info",
    };
    match log_filter(std::env::var("HOMING_LOG").ok().as_deref(), default) {
        Ok(filter) => init_tracing(&cli.global.log_format, filter),
        Err(e) => {
            init_tracing(
                &cli.global.log_format,
                tracing_subscriber::EnvFilter::new(default),
            );
            fail(&e);
            return std::process::ExitCode::from(2);
        }
    }
    logs::route_panics();
    homing::tls::install_crypto_provider();
    // Spans (docs/traces.md) from the processes that enqueue and run jobs, when the standard
    // OTEL_EXPORTER_OTLP_* variables ask for them. Set up outside the runtime, and dropped
    // after it (the last spans are exported then), because the exporter's client blocks.
    let traced = matches!(
        cli.command,
        cli::Command::Up(_)
            | cli::Command::Server(_)
            | cli::Command::Worker(_)
            | cli::Command::Enqueue(_)
    );
    let _traces = match traced.then(|| homing::otel::init_from_env("homing")) {
        Some(Err(e)) => {
            return fail(&e.to_string());
        }
        Some(Ok(guard)) => guard,
        None => None,
    };
    let runtime = match runtime_builder(&cli.command).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the runtime: {e}")),
    };
    let outcome = runtime.block_on(commands::run(cli));
    drop(runtime);
    match outcome {
        Ok(code) => code,
        Err(e) => {
            let mut msg = e.to_string();
            for cause in e.chain().skip(1) {
                // Errors that keep their cause as a source often print it too: say it once.
                let cause = cause.to_string();
                if !msg.ends_with(&cause) {
                    msg.push_str(": ");
                    msg.push_str(&cause);
                }
            }
            fail(&msg)
        }
    }
}

/// A command's last word, after the lines logged before it and written as they are (`main`
/// flushes it out with them).
fn fail(msg: &str) -> std::process::ExitCode {
    logs::say(format_args!("error: {msg}"));
    std::process::ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_filters_refuse_a_bare_word_that_is_not_a_level() {
        for ok in [
            None,
            Some(""),
            Some("  "),
            Some("debug"),
            Some("WARN"),
            Some("homing=debug"),
            Some("info,sqlx::query=debug"),
            Some("homing::worker::fetcher=trace"),
        ] {
            assert!(log_filter(ok, "info").is_ok(), "{ok:?}");
        }
        for bad in ["garbage", "inof", "info,garbage", "homing=loud"] {
            let e = log_filter(Some(bad), "info").unwrap_err();
            assert!(e.starts_with("HOMING_LOG: "), "{bad}: {e}");
        }
    }
    use tokio::runtime::RuntimeFlavor;

    fn runtime(args: &[&str]) -> tokio::runtime::Runtime {
        let cli = cli::Cli::try_parse_from(args).expect("the arguments parse");
        runtime_builder(&cli.command).enable_all().build().unwrap()
    }

    /// A worker runs its tasks on the main thread unless told otherwise, on as many threads as
    /// it is told, and nothing else changes: the server keeps tokio's default.
    #[test]
    fn a_worker_gets_the_runtime_threads_it_asks_for() {
        // The settings the environment can give (an operator's shell) decide what to expect.
        let env_threads = std::env::var("HOMING_RUNTIME_THREADS").ok();
        let one = runtime(&["homing", "worker", "--queue", "q", "--runtime-threads", "1"]);
        assert_eq!(one.handle().runtime_flavor(), RuntimeFlavor::CurrentThread);
        // A spawned task runs on the thread that drives the runtime, not on a thread of its own.
        let main = std::thread::current().id();
        let ran_on = one.block_on(async {
            tokio::spawn(async { std::thread::current().id() })
                .await
                .unwrap()
        });
        assert_eq!(ran_on, main);
        if env_threads.is_none() {
            let default = runtime(&["homing", "worker", "--queue", "q"]);
            assert_eq!(
                default.handle().runtime_flavor(),
                RuntimeFlavor::CurrentThread
            );
        }

        let three = runtime(&["homing", "worker", "--queue", "q", "--runtime-threads", "3"]);
        assert_eq!(three.handle().runtime_flavor(), RuntimeFlavor::MultiThread);
        assert_eq!(three.metrics().num_workers(), 3);
        let ran_on = three.block_on(async {
            tokio::spawn(async { std::thread::current().id() })
                .await
                .unwrap()
        });
        assert_ne!(ran_on, main);

        let server = runtime(&["homing", "server"]);
        assert_eq!(server.handle().runtime_flavor(), RuntimeFlavor::MultiThread);
        if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            assert_eq!(server.metrics().num_workers(), cores);
        }
    }

    #[test]
    fn runtime_threads_out_of_range_are_refused_with_the_range() {
        for bad in ["0", "1025", "many", "1.5"] {
            let e = cli::Cli::try_parse_from([
                "homing",
                "worker",
                "--queue",
                "q",
                "--runtime-threads",
                bad,
            ])
            .unwrap_err()
            .to_string();
            assert!(e.contains("from 1 to 1024"), "{bad}: {e}");
        }
    }
}
