//! `homing enqueue --from-file jobs.jsonl`: many jobs from a JSON Lines file or standard input,
//! each line the body `POST /v1/jobs` takes, sent in chunks of [`MAX_BATCH`] through the
//! library's bulk enqueue (docs/batch.md). The file is read as a stream, so its size is not
//! bounded by memory; the price is that a bad line is found only when its chunk is read, after
//! the chunks before it are committed. The message says exactly what was committed, so the user
//! knows where to start again.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::ExitCode;

use anyhow::Context as _;
use homing::client::MAX_BATCH;
use homing::{Client, EnqueueRequest};

use super::open;
use crate::api::jobs::CreateJob;
use crate::cli::Global;
use crate::tasks;

/// The longest line read: a job's args (1 MiB of JSON) plus room for its options. A longer line
/// is refused without being held in memory.
const MAX_LINE: u64 = 2 * 1024 * 1024;

/// What has been committed so far, for the final message.
#[derive(Default)]
struct Progress {
    enqueued: u64,
    existed: u64,
    /// The last line of the last committed chunk.
    through_line: u64,
}

impl Progress {
    fn summary(&self) -> String {
        format!(
            "enqueued {} jobs ({} of them already existed)",
            self.enqueued + self.existed,
            self.existed
        )
    }
}

pub async fn run(g: &Global, file: &str, allow_unknown_task: bool) -> anyhow::Result<ExitCode> {
    let input: Box<dyn Read> = if file == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(file).with_context(|| format!("cannot open {file}"))?)
    };
    let mut input = BufReader::with_capacity(1 << 20, input);
    let backends = open(g).await?;
    let registry = tasks::registry(&crate::pipelines::for_routing());
    let known = backends.store.known_tasks().await?;
    let client = Client::new(backends.broker.clone(), backends.store.clone())
        .with_registry(registry.clone());
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut done = Progress::default();
    let mut line_no: u64 = 0;
    let mut chunk: Vec<EnqueueRequest> = Vec::with_capacity(MAX_BATCH);
    let mut lines: Vec<u64> = Vec::with_capacity(MAX_BATCH);
    let mut buf = String::new();
    let result: anyhow::Result<()> = async {
        loop {
            buf.clear();
            let n = (&mut input)
                .take(MAX_LINE + 1)
                .read_line(&mut buf)
                .with_context(|| format!("line {}: cannot be read", line_no + 1))?;
            let eof = n == 0;
            if !eof {
                line_no += 1;
                if n as u64 > MAX_LINE {
                    anyhow::bail!("line {line_no}: longer than {MAX_LINE} bytes");
                }
                let text = buf.trim();
                if !text.is_empty() {
                    let req = parse_line(text, allow_unknown_task, &registry, &known)
                        .map_err(|e| anyhow::anyhow!("line {line_no}: {e}"))?;
                    chunk.push(req);
                    lines.push(line_no);
                }
            }
            if chunk.len() == MAX_BATCH || (eof && !chunk.is_empty()) {
                let reqs = std::mem::take(&mut chunk);
                let inserted = client
                    .enqueue_batch(reqs)
                    .await
                    .map_err(|e| anyhow::anyhow!(name_line(&e.to_string(), &lines)))?;
                // Counted before they are printed: if the ids cannot be written (the reader
                // of a pipe went away), the report still says what was stored.
                for i in &inserted {
                    if i.existed {
                        done.existed += 1;
                    } else {
                        done.enqueued += 1;
                    }
                }
                done.through_line = line_no;
                lines.clear();
                for i in &inserted {
                    writeln!(out, "{}", i.id).context("cannot write the jobs' ids")?;
                }
            }
            if eof {
                return Ok(());
            }
        }
    }
    .await;
    let flushed = out.flush();
    let result = result.and_then(|()| flushed.context("cannot write the jobs' ids"));
    match result {
        Ok(()) => {
            eprintln!("{}", done.summary());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            let committed = if done.through_line == 0 {
                "nothing was enqueued".to_string()
            } else {
                format!(
                    "{} from lines 1 to {}; nothing after line {} was stored",
                    done.summary(),
                    done.through_line,
                    done.through_line
                )
            };
            anyhow::bail!("{e:#}\n{committed}")
        }
    }
}

/// One line as a request, checked as one enqueue is (the store is not asked anything here:
/// `known` holds the registered tasks read once).
fn parse_line(
    text: &str,
    allow_unknown_task: bool,
    registry: &homing::Registry,
    known: &[String],
) -> anyhow::Result<EnqueueRequest> {
    let body: CreateJob = serde_json::from_str(text).map_err(|e| {
        anyhow::anyhow!("not a job (an object with the fields of POST /v1/jobs): {e}")
    })?;
    homing::validate::exact_integers(text.as_bytes()).map_err(anyhow::Error::msg)?;
    let (req, allow) = body.into_request();
    homing::client::validate_request(&req)?;
    if !(allow || allow_unknown_task)
        && registry.get(&req.task).is_none()
        && !known.contains(&req.task)
    {
        anyhow::bail!(
            "no worker has registered task '{}'; start a worker that runs it, or pass --allow-unknown-task (or \"allow_unknown_task\": true on the line)",
            req.task
        );
    }
    Ok(req)
}

/// Rewrites a batch error's `job N:` (its index in the chunk) as the line it came from.
fn name_line(message: &str, lines: &[u64]) -> String {
    let rest = message.strip_prefix("invalid input: ").unwrap_or(message);
    if let Some((idx, reason)) = rest.strip_prefix("job ").and_then(|r| r.split_once(": ")) {
        if let Some(line) = idx.parse::<usize>().ok().and_then(|i| lines.get(i)) {
            return format!("line {line}: {reason}");
        }
    }
    message.to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_batch_error_names_its_line() {
        let lines = [3, 4, 9];
        assert_eq!(
            super::name_line("invalid input: job 2: args too large", &lines),
            "line 9: args too large"
        );
        assert_eq!(
            super::name_line("sqlite unavailable: busy", &lines),
            "sqlite unavailable: busy"
        );
        assert_eq!(
            super::name_line("invalid input: job 7: x", &lines),
            "invalid input: job 7: x"
        );
    }
}
