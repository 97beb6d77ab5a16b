//! `homing migrate`: applies the store's schema migrations ahead of a deploy, so that starting
//! many servers and workers at once does not make each of them wait for the first to migrate.

use anyhow::Context as _;
use std::process::ExitCode;

use crate::cli::{Global, OutputArgs};
use crate::output::outln;

pub async fn run(g: &Global, out: OutputArgs) -> anyhow::Result<ExitCode> {
    let report = homing::backend::migrate_store(&g.store)
        .await
        .with_context(|| {
            format!(
                "cannot migrate store {}",
                homing::redact::redact_url(&g.store)
            )
        })?;
    if out.json {
        outln!(
            "{}",
            serde_json::json!({
                "store": report.store,
                "applied": report.applied,
                "version": report.version,
                "latest": report.latest,
            })
        );
    } else {
        for line in report.lines() {
            outln!("{line}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
