//! Reading a job's `--args` (inline JSON, `@FILE` or `-` for standard input), shared by
//! `homing enqueue` and `homing enqueue --celery` so neither command depends on the other.

use anyhow::Context as _;
use std::io::Read;

pub fn read_args(raw: &str) -> anyhow::Result<serde_json::Value> {
    let text = if raw == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("cannot read --args from standard input")?;
        s
    } else if let Some(path) = raw.strip_prefix('@') {
        std::fs::read_to_string(path).with_context(|| format!("cannot read --args file {path}"))?
    } else {
        raw.to_string()
    };
    serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("--args is not valid JSON: {e}"))
}
