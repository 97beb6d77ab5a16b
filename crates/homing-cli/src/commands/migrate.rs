//! `homing migrate`: applies the store's schema migrations ahead of a deploy, so that starting
//! many servers and workers at once does not make each of them wait for the first to migrate.

use anyhow::Context as _;
use std::process::ExitCode;

use crate::cli::{Global, OutputArgs};

pub async fn run(g: &Global, out: OutputArgs) -> anyhow::Result<ExitCode> {
    let report = homing::backend::migrate_store(&g.store)
        .await
        .with_context(|| {
            format!(
                "cannot migrate store {}",
                homing::backend::redact_url(&g.store)
            )
        })?;
    if out.json {
        println!(
            "{}",
            serde_json::json!({
                "store": report.store,
                "applied": report.applied,
                "latest": report.latest,
            })
        );
    } else if report.applied.is_empty() {
        println!(
            "{}: up to date ({}); nothing to apply",
            report.store, report.latest
        );
    } else {
        for name in &report.applied {
            println!("applied {name}");
        }
        println!("{}: now at {}", report.store, report.latest);
    }
    Ok(ExitCode::SUCCESS)
}
