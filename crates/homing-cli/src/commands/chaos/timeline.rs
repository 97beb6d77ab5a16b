//! The timeline invariant (docs/timeline.md): after a chaos run, every job's timeline agrees
//! with its row. Each entry is written in its transition's transaction, so no kill, cut or
//! outage may leave them apart: the latest entry's state is the job's state, epochs never go
//! down and every start raises it, each run ends once, and (for a timeline not yet trimmed) the
//! crash and error entries are the row's `crashes` and `attempts`.

use std::collections::HashMap;

use homing::history::{disagreement, History};
use homing::{Client, Job, JobId};

use super::invariants::MAX_LISTED;

/// Every job's timeline, read once for the checks that need them (this one and the at-risk
/// bound's, `slots.rs`).
pub async fn read(client: &Client, jobs: &[Job]) -> anyhow::Result<HashMap<JobId, History>> {
    let mut out = HashMap::with_capacity(jobs.len());
    for job in jobs {
        out.insert(job.id, client.store().history(job.id).await?);
    }
    Ok(out)
}

/// The jobs whose timeline (in `histories`, read before this call) disagrees with their row,
/// with the first disagreement of each, and how many timelines were checked.
pub async fn check(
    client: &Client,
    jobs: &[Job],
    histories: &HashMap<JobId, History>,
) -> anyhow::Result<(Vec<String>, usize)> {
    let mut out = Vec::new();
    let mut checked = 0;
    for job in jobs {
        let read;
        let history = match histories.get(&job.id) {
            Some(h) => h,
            None => {
                read = client.store().history(job.id).await?;
                &read
            }
        };
        // The job as read after its timeline: a late transition (none should happen once the
        // deployment is stopped) shows as a newer row, never as a missing entry.
        let Some(now) = client.store().get(job.id).await? else {
            continue;
        };
        checked += 1;
        if let Some(why) = disagreement(&now, history) {
            if out.len() < MAX_LISTED {
                out.push(format!("job {} timeline: {why}", job.id));
            }
        }
    }
    Ok((out, checked))
}
