//! What the worker view keeps about a lost worker (docs/workers.md): which of its jobs the
//! rescuer reclaimed, at which epoch, and what became of each. A leaf module: the decision of
//! what a reclaim records is made here once, and both stores write it in the reclaim's own
//! transaction, so a worker listed `lost` never misses a job that was taken from it.

use serde::{Deserialize, Serialize};

use crate::job::{JobId, JobState};
use crate::time::Micros;

/// What a reclaim did to a lost worker's job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReclaimOutcome {
    /// Back to `queued`, to run again under a new epoch.
    Requeued,
    /// Its crash budget was spent (or its data unreadable): `dead`.
    Dead,
    /// It had a cancel request: `cancelled`.
    Cancelled,
}

impl ReclaimOutcome {
    /// The outcome of a reclaim that left the job in `state` (the state
    /// [`crate::transition::lost`] decided, or `dead` for the last resort).
    pub fn after(state: JobState) -> ReclaimOutcome {
        match state {
            JobState::Dead => ReclaimOutcome::Dead,
            JobState::Cancelled => ReclaimOutcome::Cancelled,
            _ => ReclaimOutcome::Requeued,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ReclaimOutcome::Requeued => "requeued",
            ReclaimOutcome::Dead => "dead",
            ReclaimOutcome::Cancelled => "cancelled",
        }
    }

    /// Reads a stored word; `None` for an unknown one (a damaged row), which the stores skip
    /// rather than fail the whole worker list.
    pub fn read(stored: &str) -> Option<ReclaimOutcome> {
        [
            ReclaimOutcome::Requeued,
            ReclaimOutcome::Dead,
            ReclaimOutcome::Cancelled,
        ]
        .into_iter()
        .find(|o| o.as_str() == stored)
    }
}

/// One job reclaimed from a lost worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reclaim {
    pub job: JobId,
    /// The epoch of the run the worker lost.
    pub epoch: u64,
    pub outcome: ReclaimOutcome,
    #[serde(with = "crate::time::as_rfc3339")]
    pub at: Micros,
}

/// Most reclaims listed per worker (newest first): a worker's concurrency bounds what one loss
/// reclaims, so this only cuts off a worker that ran thousands at once.
pub const RECLAIMS_LISTED: usize = 200;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_follows_the_decided_state_and_reads_back() {
        assert_eq!(
            ReclaimOutcome::after(JobState::Queued),
            ReclaimOutcome::Requeued
        );
        assert_eq!(ReclaimOutcome::after(JobState::Dead), ReclaimOutcome::Dead);
        assert_eq!(
            ReclaimOutcome::after(JobState::Cancelled),
            ReclaimOutcome::Cancelled
        );
        for o in [
            ReclaimOutcome::Requeued,
            ReclaimOutcome::Dead,
            ReclaimOutcome::Cancelled,
        ] {
            assert_eq!(ReclaimOutcome::read(o.as_str()), Some(o));
            assert_eq!(
                serde_json::to_value(o).unwrap(),
                serde_json::json!(o.as_str())
            );
        }
        assert_eq!(ReclaimOutcome::read("zombie"), None);
    }
}
