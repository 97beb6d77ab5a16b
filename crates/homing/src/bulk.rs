//! Bulk actions on a filter (docs/bulk.md): retry every failed job of a task, cancel every
//! queued job of a queue, delete every finished job. They exist so that an operator never has to
//! script a loop over the API, and they are built so that a million matching jobs cost no more
//! than a loop would: each job goes through the same decided transition as a single action
//! ([`crate::transition::operator_retry`], [`crate::transition::cancel`],
//! [`crate::transition::deletable`]), and each step of at most [`BATCH`] jobs is one
//! transaction, so no transaction spans the whole set, the store is never locked for long, and a
//! step costs one commit (one flush) rather than one per job. A bulk action interrupted halfway
//! leaves every job in a state a single action would have left it in; running it again finishes
//! it.
//!
//! The set is walked newest first by id with a cursor (keyset paging over the
//! `(state, task|queue, id)` indexes), so jobs that change (and so leave the filter) are not met
//! again and the walk ends even when some cannot be changed; a job that enters the filter after
//! the walk has passed its place is left for the next run.
//!
//! Over HTTP a walk is cut into calls of bounded time ([`run_for`]): each answers what it did
//! and where to go on, so no answer is ever cut by the request timeout after work committed.

use serde::{Deserialize, Serialize};

use crate::broker::Broker;
use crate::error::{Error, Result};
use crate::job::JobState;
use crate::store::{JobFilter, Store, ToPublish};
use crate::time::now;
use crate::transition;

/// How many jobs one step of a bulk action reads and changes.
pub const BATCH: usize = 500;

/// What a bulk action does to each job of its filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Retry,
    Cancel,
    Delete,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Cancel => "cancel",
            Action::Delete => "delete",
        }
    }

    /// Whether this action takes a job in `state`.
    pub fn admits(self, state: JobState) -> bool {
        match self {
            Action::Retry => transition::retryable(state),
            Action::Cancel => transition::cancellable(state),
            Action::Delete => transition::deletable(state),
        }
    }

    fn states(self) -> Vec<&'static str> {
        JobState::ALL
            .into_iter()
            .filter(|s| self.admits(*s))
            .map(|s| s.as_str())
            .collect()
    }
}

/// Refuses a filter the action cannot run on: the state is required (an operator names what
/// they mean to change; "every job" is never a default) and must be one the action takes.
pub fn check(action: Action, filter: &JobFilter) -> std::result::Result<(), String> {
    let Some(state) = filter.state else {
        return Err(format!(
            "a bulk {} needs a state: one of {}",
            action.as_str(),
            action.states().join(", ")
        ));
    };
    if !action.admits(state) {
        return Err(format!(
            "a bulk {} takes jobs that are {}, not {state}",
            action.as_str(),
            action.states().join(", ")
        ));
    }
    Ok(())
}

/// What a bulk action did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// Jobs changed (retried, cancelled or cancel requested, deleted).
    pub count: u64,
    /// Jobs met that another party had changed first (a conflict), or that the action leaves
    /// alone (a workflow's step is never deleted).
    pub skipped: u64,
}

/// One step of a bulk action: what it did, the retried jobs to publish, and where the next step
/// starts (`None`: the walk is over).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    pub done: Outcome,
    pub publish: Vec<ToPublish>,
    pub next: Option<String>,
}

/// Applies `action` to at most [`BATCH`] jobs matching `filter` after `cursor`, each through its
/// single action's transition. The filter must pass [`check`] (it is checked again here).
pub async fn step(
    store: &dyn Store,
    action: Action,
    filter: &JobFilter,
    cursor: Option<&str>,
) -> Result<Step> {
    check(action, filter).map_err(Error::Invalid)?;
    let page = store.list(filter, cursor, BATCH).await?;
    let ids: Vec<_> = page.jobs.iter().map(|j| j.id).collect();
    // The page's args and results are not needed past here (up to 4 MiB of them).
    drop(page.jobs);
    let mut out = Step {
        next: page.next_cursor,
        ..Step::default()
    };
    match action {
        Action::Delete => {
            let n = store.delete_finished(&ids).await?;
            let met = ids.len() as u64;
            out.done.count = n.min(met);
            out.done.skipped = met - out.done.count;
        }
        Action::Retry | Action::Cancel => {
            let changed = match action {
                Action::Retry => store.retry_many(&ids, now()).await?,
                _ => store.cancel_many(&ids, now()).await?,
            };
            let met = ids.len() as u64;
            out.done.count = (changed.len() as u64).min(met);
            // The others were changed (or removed) by someone else since the page was read.
            out.done.skipped = met - out.done.count;
            if action == Action::Retry {
                out.publish = changed;
            }
        }
    }
    Ok(out)
}

/// Runs `action` on every job matching `filter` (checked with [`check`]), step by step.
/// Retried jobs are published after each step; a publish that fails is left to the reconciler,
/// as for one retry.
pub async fn run(
    store: &dyn Store,
    broker: &dyn Broker,
    action: Action,
    filter: &JobFilter,
) -> Result<Outcome> {
    Ok(run_for(store, broker, action, filter, None, None)
        .await?
        .done)
}

/// What a call of [`run_for`] did, and where the walk goes on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub done: Outcome,
    /// Where the next call starts; `None`: the walk is over.
    pub next: Option<String>,
}

/// Runs `action` from `cursor` on, step by step, until the walk is over or, after a step,
/// `budget` is spent (no budget: to the end). Every step is committed before the next one
/// starts, so what the answer counts is exactly what happened; the caller goes on with
/// `next`. A step is never cut by the budget, so a call lasts at most the budget plus one step.
pub async fn run_for(
    store: &dyn Store,
    broker: &dyn Broker,
    action: Action,
    filter: &JobFilter,
    cursor: Option<&str>,
    budget: Option<std::time::Duration>,
) -> Result<Part> {
    check(action, filter).map_err(Error::Invalid)?;
    let started = std::time::Instant::now();
    let mut total = Outcome::default();
    let mut cursor: Option<String> = cursor.map(str::to_string);
    loop {
        let s = step(store, action, filter, cursor.as_deref()).await?;
        total.count += s.done.count;
        total.skipped += s.done.skipped;
        if !s.publish.is_empty() {
            if let Err(e) = crate::client::publish(broker, store, &s.publish).await {
                tracing::warn!(error = %e, jobs = s.publish.len(), "publish failed; the reconciler will publish the retried jobs later");
            }
        }
        match s.next {
            Some(c) if budget.is_some_and(|b| started.elapsed() >= b) => {
                return Ok(Part {
                    done: total,
                    next: Some(c),
                })
            }
            Some(c) => cursor = Some(c),
            None => {
                return Ok(Part {
                    done: total,
                    next: None,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bulk_action_needs_a_state_it_takes() {
        let f = |state| JobFilter {
            state,
            ..Default::default()
        };
        assert!(check(Action::Retry, &f(None)).is_err());
        assert!(check(Action::Retry, &f(Some(JobState::Failed))).is_ok());
        assert!(check(Action::Retry, &f(Some(JobState::Queued))).is_err());
        assert!(check(Action::Cancel, &f(Some(JobState::Queued))).is_ok());
        assert!(check(Action::Cancel, &f(Some(JobState::Succeeded))).is_err());
        assert!(check(Action::Delete, &f(Some(JobState::Succeeded))).is_ok());
        assert!(check(Action::Delete, &f(Some(JobState::Running))).is_err());
        let e = check(Action::Delete, &f(Some(JobState::Queued))).unwrap_err();
        assert!(e.contains("succeeded, failed, dead, cancelled"), "{e}");
    }
}
