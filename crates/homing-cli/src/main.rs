//! The `homing` binary: server, worker and command-line tool over the `homing` library.

mod alloc;
mod api;
mod cli;
mod commands;
mod config;
mod http_server;
mod output;
mod pipelines;
mod signals;
mod tasks;
mod views;

use clap::Parser;

fn init_tracing(format: &str, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HOMING_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if format == "json" {
        builder.json().flatten_event(true).init();
    } else {
        builder.with_target(false).init();
    }
}

fn main() -> std::process::ExitCode {
    // Before any thread exists (docs/pruner.md, "memory").
    alloc::limit_arenas();
    let cli = cli::Cli::parse();
    // The chaos run's own client sees every fault it injects; its report says what mattered.
    let default = match cli.command {
        cli::Command::Chaos(_) => "error",
        _ => "info",
    };
    init_tracing(&cli.global.log_format, default);
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
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
        Some(Ok(guard)) => guard,
        None => None,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
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
            eprintln!("error: {msg}");
            std::process::ExitCode::FAILURE
        }
    }
}
