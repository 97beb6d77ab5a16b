//! Human output: aligned tables and one-line job summaries; `--json` bypasses all of it.

use homing::time::rfc3339;
use homing::Job;

/// `println!` for a command's output, through [`print_line`].
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::print_line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// Prints rows as a table with a header, columns padded to their widest cell.
pub fn table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{:<w$}  ", c, w = widths[i]));
            }
        }
        outln!("{}", s.trim_end());
    };
    line(header.iter().map(|h| h.to_uppercase()).collect());
    for r in rows {
        line(r);
    }
}

pub fn opt_time(t: Option<i64>) -> String {
    t.map(rfc3339).unwrap_or_else(|| "-".into())
}

/// A job in human form, one field per line.
pub fn job(j: &Job) {
    let fields: Vec<(&str, String)> = vec![
        ("id", j.id.to_string()),
        ("task", j.task.clone()),
        ("queue", j.queue.clone()),
        ("state", j.state.to_string()),
        ("attempts", j.attempts.to_string()),
        ("crashes", j.crashes.to_string()),
        ("epoch", j.epoch.to_string()),
        (
            "max_retries",
            j.max_retries
                .map(|n| n.to_string())
                .unwrap_or_else(|| "task default".into()),
        ),
        (
            "idempotency_key",
            j.idempotency_key.clone().unwrap_or_else(|| "-".into()),
        ),
        ("worker", j.worker.clone().unwrap_or_else(|| "-".into())),
        ("args", j.args.to_string()),
        (
            "result",
            j.result
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into()),
        ),
        ("error", j.error.clone().unwrap_or_else(|| "-".into())),
        (
            "progress",
            j.progress
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into()),
        ),
        ("created_at", rfc3339(j.created_at)),
        ("scheduled_at", opt_time(j.scheduled_at)),
        ("started_at", opt_time(j.started_at)),
        ("finished_at", opt_time(j.finished_at)),
    ];
    for (k, v) in fields {
        outln!("{k:<16} {v}");
    }
}

pub fn json(v: &impl serde::Serialize) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => outln!("{s}"),
        Err(e) => crate::logs::say(format_args!("error: cannot print JSON: {e}")),
    }
}

/// A job's timeline (`homing jobs history`): one line per entry, oldest first, with the error
/// or reason (its traceback) indented below its line.
pub fn history(j: &Job, h: &homing::history::History) {
    outln!("job {} ({}, {}): {}", j.id, j.task, j.queue, j.state);
    if h.truncated {
        outln!("(older entries between the first and the latest ones were dropped)");
    }
    let rows: Vec<Vec<String>> = h
        .entries
        .iter()
        .map(|e| {
            vec![
                rfc3339(e.at),
                e.kind.as_str().to_string(),
                e.state.to_string(),
                e.epoch.map_or("-".into(), |n| n.to_string()),
                e.worker.clone().unwrap_or_else(|| "-".into()),
                format!("{}/{}", e.attempts, e.crashes),
                e.data.as_ref().map(|d| d.to_string()).unwrap_or_default(),
            ]
        })
        .collect();
    table(
        &[
            "at",
            "what",
            "state",
            "epoch",
            "worker",
            "errors/crashes",
            "data",
        ],
        rows,
    );
    for (i, e) in h.entries.iter().enumerate() {
        if let Some(m) = &e.message {
            outln!(
                "\n#{} {} (epoch {}):",
                i + 1,
                e.kind.as_str(),
                e.epoch.map_or("-".into(), |n| n.to_string())
            );
            for line in m.lines() {
                outln!("    {line}");
            }
        }
    }
}

/// One line of a command's output, in place of `println!`, which panics when the reader has
/// gone (`homing jobs list | head -1`). Then the command ends quietly with the status a death by
/// SIGPIPE gives (141), as other command-line tools do. The process keeps ignoring SIGPIPE:
/// restoring it would also let a server that closes the connection mid-request (a body over its
/// limit) kill a client silently instead of letting it report the refusal. What the command did
/// before stands (`homing enqueue` stored its jobs), so its buffered trace spans are exported
/// first: the exit skips the drop that would export them.
pub fn print_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.write_all(b"\n")) {
        drop(out);
        homing::otel::flush();
        let broken = e.kind() == std::io::ErrorKind::BrokenPipe;
        if !broken {
            crate::logs::say(format_args!("error: cannot write the output: {e}"));
        }
        crate::logs::flush();
        std::process::exit(if broken { 141 } else { 1 });
    }
}
