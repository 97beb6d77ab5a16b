//! Reading a job's `--args` (inline JSON, `@FILE` or `-` for standard input), shared by
//! `homing enqueue` and `homing enqueue --celery` so neither command depends on the other.

use anyhow::Context as _;
use std::io::Read;

/// The most `--args` text read from a file or standard input: twice a job's args limit, room
/// for the spaces of pretty-printed JSON. Without it, `--args @/dev/zero` read until memory ran
/// out.
const MAX_ARGS_TEXT: u64 = 2 * homing::validate::MAX_ARGS_BYTES as u64;

pub fn read_args(raw: &str) -> anyhow::Result<serde_json::Value> {
    let text = if raw == "-" {
        read_capped(std::io::stdin(), "standard input")?
    } else if let Some(path) = raw.strip_prefix('@') {
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot read --args file {path}"))?;
        read_capped(file, path)?
    } else {
        raw.to_string()
    };
    let args = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("--args is not valid JSON: {e}"))?;
    homing::validate::exact_integers(text.as_bytes())
        .map_err(|e| anyhow::anyhow!("--args: {e}"))?;
    Ok(args)
}

fn read_capped(from: impl Read, what: &str) -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    from.take(MAX_ARGS_TEXT + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read --args from {what}"))?;
    if bytes.len() as u64 > MAX_ARGS_TEXT {
        anyhow::bail!(
            "--args from {what} is longer than {MAX_ARGS_TEXT} bytes: the limit is {} bytes of args",
            homing::validate::MAX_ARGS_BYTES
        );
    }
    String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("--args from {what} is not UTF-8"))
}
