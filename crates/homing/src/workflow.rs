//! Workflows: a DAG of named steps, each an ordinary job, decided here as pure functions.
//!
//! Why a module of its own: whether a waiting step runs, is cancelled or keeps waiting must be
//! decided once, the same way by both stores, in the transaction that commits its last parent's
//! end (docs/workflows.md). The stores load a workflow's steps under a lock, ask [`settle`], and
//! write the answer; creation is planned by [`plan`] so that a bad graph is refused before
//! anything is written. A leaf: it knows jobs and their states, nothing about storage.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::job::{FollowUp, Job, JobId, JobOptions, JobState, NewJob};
use crate::retry::RetryPolicy;
use crate::time::Micros;

/// A workflow's identifier: a UUID v7, like a job's.
pub type WorkflowId = uuid::Uuid;

/// The most steps one workflow may have: every step is loaded whenever one of them finishes,
/// so the bound keeps that read small.
pub const MAX_STEPS: usize = 200;

/// The most of its parents' results one step is given, together (their stored JSON text). A
/// step's parents are copied into its row when it is made runnable, so without a bound a
/// fan-in of 199 parents of 8 MiB results would make one row, and one allocation, of 1.6 GB.
/// Room for two results of the largest size a handler may return
/// ([`crate::validate::MAX_RESULT_BYTES`]); a step whose parents' results come to more is
/// cancelled, saying so ([`too_large_reason`]), as one whose parent failed is.
pub const MAX_PARENTS_BYTES: u64 = 16 * 1024 * 1024;

/// When a step runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunOn {
    /// Once every parent succeeded; cancelled as soon as one fails for good, dies or is cancelled.
    #[default]
    Success,
    /// Once every parent finished, whatever its state (a finaliser).
    Any,
}

impl RunOn {
    pub fn as_str(self) -> &'static str {
        match self {
            RunOn::Success => "success",
            RunOn::Any => "any",
        }
    }
}

/// One step as a producer describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepSpec {
    pub task: String,
    #[serde(default)]
    pub args: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Names of the steps that must finish first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    #[serde(default)]
    pub run_on: RunOn,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_policy: Option<RetryPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_crashes: Option<u32>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::job::opt_duration"
    )]
    pub time_limit: Option<std::time::Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_success: Option<FollowUp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<FollowUp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
}

impl StepSpec {
    pub fn new(task: impl Into<String>, args: serde_json::Value) -> Self {
        StepSpec {
            task: task.into(),
            args,
            queue: None,
            after: Vec::new(),
            run_on: RunOn::Success,
            max_retries: None,
            retry_policy: None,
            max_crashes: None,
            time_limit: None,
            on_success: None,
            on_failure: None,
            callback_url: None,
        }
    }

    /// The job options this step's job is enqueued with.
    pub fn options(&self) -> JobOptions {
        JobOptions {
            queue: self.queue.clone(),
            idempotency_key: None,
            countdown: None,
            max_retries: self.max_retries,
            retry_policy: self.retry_policy.clone(),
            max_crashes: self.max_crashes,
            time_limit: self.time_limit,
            on_success: self.on_success.clone(),
            on_failure: self.on_failure.clone(),
            callback_url: self.callback_url.clone(),
            priority: None,
            unique_for: None,
            traceparent: None,
        }
    }
}

/// A workflow as a producer describes it. Step names are unique: a JSON object naming one twice
/// is refused, not silently collapsed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowSpec {
    pub name: String,
    #[serde(deserialize_with = "unique_keys")]
    pub steps: BTreeMap<String, StepSpec>,
}

impl WorkflowSpec {
    pub fn new(name: impl Into<String>) -> Self {
        WorkflowSpec {
            name: name.into(),
            steps: BTreeMap::new(),
        }
    }

    /// Adds a step that runs once every step of `after` succeeded (a builder).
    pub fn step(
        mut self,
        name: impl Into<String>,
        task: impl Into<String>,
        args: serde_json::Value,
        after: &[&str],
    ) -> Self {
        let mut s = StepSpec::new(task, args);
        s.after = after.iter().map(|a| a.to_string()).collect();
        self.steps.insert(name.into(), s);
        self
    }

    /// Adds a fully described step (a builder).
    pub fn with_step(mut self, name: impl Into<String>, step: StepSpec) -> Self {
        self.steps.insert(name.into(), step);
        self
    }
}

/// Deserialises steps by name, refusing a name given twice (serde would keep the last).
pub fn unique_keys<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, StepSpec>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = BTreeMap<String, StepSpec>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object of steps by name")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut m: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(k) = m.next_key::<String>()? {
                if out.contains_key(&k) {
                    return Err(serde::de::Error::custom(format!(
                        "step '{k}' is named twice"
                    )));
                }
                let v: StepSpec = m.next_value()?;
                out.insert(k, v);
            }
            Ok(out)
        }
    }
    d.deserialize_map(V)
}

/// Where a job sits in its workflow, stored on the job and shown in its JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepLink {
    /// The workflow's id.
    pub id: WorkflowId,
    /// The step's name.
    pub step: String,
    /// The parents' job ids.
    #[serde(default)]
    pub after: Vec<JobId>,
    #[serde(default)]
    pub run_on: RunOn,
}

/// One parent as its dependent sees it, fixed in the transaction that made the dependent
/// runnable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParentRun {
    pub id: JobId,
    pub task: String,
    pub state: JobState,
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    #[serde(default)]
    pub error: Option<String>,
}

/// A workflow ready to be written: every step's job, those with parents `waiting`.
#[derive(Debug, Clone, PartialEq)]
pub struct NewWorkflow {
    pub id: WorkflowId,
    pub name: String,
    pub created_at: Micros,
    /// Each step's job and its link; a step with parents is inserted `waiting`.
    pub steps: Vec<(NewJob, StepLink)>,
}

/// Checks a workflow's graph and turns it into jobs. `job` resolves one step into its job (the
/// client validates the task, queue and options there and picks the default queue). Refuses:
/// no steps, more than [`MAX_STEPS`], bad step names, `after` naming an unknown step or itself
/// or one step twice, and cycles (naming the steps on one).
pub fn plan(
    spec: WorkflowSpec,
    now: Micros,
    mut job: impl FnMut(&str, &StepSpec) -> Result<NewJob, String>,
) -> Result<NewWorkflow, String> {
    crate::validate::name("workflow name", &spec.name)?;
    if spec.steps.is_empty() {
        return Err("a workflow needs at least one step".into());
    }
    if spec.steps.len() > MAX_STEPS {
        return Err(format!(
            "a workflow has at most {MAX_STEPS} steps; this one has {}",
            spec.steps.len()
        ));
    }
    for (name, s) in &spec.steps {
        crate::validate::name("step name", name)?;
        let mut seen = HashSet::new();
        for a in &s.after {
            if a == name {
                return Err(format!("step '{name}' cannot run after itself"));
            }
            if !spec.steps.contains_key(a) {
                return Err(format!(
                    "step '{name}' runs after '{a}', which is not a step"
                ));
            }
            if !seen.insert(a) {
                return Err(format!("step '{name}' names '{a}' twice in after"));
            }
        }
    }
    if let Some(cycle) = find_cycle(&spec.steps) {
        return Err(format!("the steps form a cycle: {}", cycle.join(" -> ")));
    }
    let mut jobs: BTreeMap<&str, NewJob> = BTreeMap::new();
    for (name, s) in &spec.steps {
        let j = job(name, s).map_err(|e| format!("step '{name}': {e}"))?;
        jobs.insert(name, j);
    }
    let id = crate::job::new_job_id();
    let steps = spec
        .steps
        .iter()
        .map(|(name, s)| {
            let j = jobs[name.as_str()].clone();
            let link = StepLink {
                id,
                step: name.clone(),
                after: s.after.iter().map(|a| jobs[a.as_str()].id).collect(),
                run_on: s.run_on,
            };
            (j, link)
        })
        .collect();
    Ok(NewWorkflow {
        id,
        name: spec.name,
        created_at: now,
        steps,
    })
}

/// A cycle among the steps, as the names along it (first repeated at the end), if any.
fn find_cycle(steps: &BTreeMap<String, StepSpec>) -> Option<Vec<String>> {
    // 0 unvisited, 1 on the current path, 2 done. Iterative, so a long chain cannot overflow.
    let mut mark: HashMap<&str, u8> = steps.keys().map(|k| (k.as_str(), 0)).collect();
    for start in steps.keys() {
        if mark[start.as_str()] != 0 {
            continue;
        }
        let mut path: Vec<(&str, usize)> = vec![(start.as_str(), 0)];
        mark.insert(start.as_str(), 1);
        while let Some(&(node, i)) = path.last() {
            let after = &steps[node].after;
            if i >= after.len() {
                mark.insert(node, 2);
                path.pop();
                continue;
            }
            if let Some(top) = path.last_mut() {
                top.1 += 1;
            }
            let next = after[i].as_str();
            match mark.get(next).copied().unwrap_or(2) {
                0 => {
                    mark.insert(next, 1);
                    path.push((next, 0));
                }
                1 => {
                    let from = path.iter().position(|(n, _)| *n == next).unwrap_or(0);
                    let mut c: Vec<String> =
                        path[from..].iter().map(|(n, _)| n.to_string()).collect();
                    c.push(next.to_string());
                    return Some(c);
                }
                _ => {}
            }
        }
    }
    None
}

/// What [`settle`] decided for one waiting step.
#[derive(Debug, Clone, PartialEq)]
pub enum Settle {
    /// Its parents are done as it requires: `waiting` → `queued` (undispatched), with the
    /// parents as it will see them.
    Ready {
        id: JobId,
        parents: BTreeMap<String, ParentRun>,
    },
    /// A parent failed for good, died or was cancelled, and the step runs only on success; or
    /// its parents' results come to `too_large` bytes, more than [`MAX_PARENTS_BYTES`]:
    /// `waiting` → `cancelled`.
    Cancel { id: JobId, too_large: Option<u64> },
}

/// The reason written on a step whose parents' results come to more than it may be given.
pub fn too_large_reason(bytes: u64) -> String {
    format!(
        "cancelled: its parents' results come to {bytes} bytes, more than the {MAX_PARENTS_BYTES} \
         a step is given; have the parents keep large outputs elsewhere and return their address"
    )
}

/// The reason written on a step cancelled because a parent did not succeed.
pub fn cancelled_reason(parent_step: &str, parent_state: JobState) -> String {
    format!("cancelled: its parent step '{parent_step}' is {parent_state}")
}

/// One waiting step's fate from its parents' states: `None` keeps it waiting.
fn readiness(run_on: RunOn, parents: &[JobState]) -> Option<bool> {
    let failed = parents
        .iter()
        .any(|s| s.is_terminal() && *s != JobState::Succeeded);
    match run_on {
        RunOn::Success if failed => Some(false),
        _ if parents.iter().all(|s| s.is_terminal()) => Some(true),
        _ => None,
    }
}

/// The rule run whenever a step of a workflow reaches a terminal state, over all of the
/// workflow's steps as committed in this transaction: every `waiting` step whose parents are
/// all finished (or, for `run_on: success`, one of which did not succeed) is decided, and a
/// cancellation is propagated to its own dependents in the same answer, until nothing changes.
/// A parent that no longer exists (purged) counts as cancelled. Steps not `waiting` are never
/// touched, so deciding twice (a repair sweep, a second transaction) changes nothing: a step
/// is made runnable exactly once.
///
/// Without the sizes of the steps' results: a store asks again with them
/// ([`settle_within`]) when this makes a step runnable.
pub fn settle(steps: &[Job]) -> Vec<Settle> {
    settle_within(steps, &HashMap::new())
}

/// [`settle`], where a step that would be made runnable but whose parents' results
/// (`result_bytes`, by job id; a parent not in it has none) come to more than
/// [`MAX_PARENTS_BYTES`] is cancelled instead, and that cancellation propagated like any other.
pub fn settle_within(steps: &[Job], result_bytes: &HashMap<JobId, u64>) -> Vec<Settle> {
    let mut state: HashMap<JobId, JobState> = steps.iter().map(|j| (j.id, j.state)).collect();
    let by_id: HashMap<JobId, &Job> = steps.iter().map(|j| (j.id, j)).collect();
    let mut out = Vec::new();
    loop {
        let mut changed = false;
        for j in steps {
            let Some(link) = &j.workflow else { continue };
            if state[&j.id] != JobState::Waiting {
                continue;
            }
            let parents: Vec<JobState> = link
                .after
                .iter()
                .map(|p| state.get(p).copied().unwrap_or(JobState::Cancelled))
                .collect();
            let given: u64 = link.after.iter().filter_map(|p| result_bytes.get(p)).sum();
            match readiness(link.run_on, &parents) {
                None => {}
                Some(true) if given > MAX_PARENTS_BYTES => {
                    state.insert(j.id, JobState::Cancelled);
                    out.push(Settle::Cancel {
                        id: j.id,
                        too_large: Some(given),
                    });
                    changed = true;
                }
                Some(true) => {
                    let parents = link
                        .after
                        .iter()
                        .filter_map(|p| by_id.get(p))
                        .map(|p| parent_run(p, state[&p.id]))
                        .collect();
                    state.insert(j.id, JobState::Queued);
                    out.push(Settle::Ready { id: j.id, parents });
                    changed = true;
                }
                Some(false) => {
                    state.insert(j.id, JobState::Cancelled);
                    out.push(Settle::Cancel {
                        id: j.id,
                        too_large: None,
                    });
                    changed = true;
                }
            }
        }
        if !changed {
            give_reasons(steps, &mut out);
            return out;
        }
    }
}

/// What an operator's retry does with a workflow step's parents.
#[derive(Debug, Clone, PartialEq)]
pub enum Rerun {
    /// Not a step with parents, or one that ran: its `parents` stay as they are.
    AsItIs,
    /// A step that never ran (cancelled while waiting): it runs with its parents as they are
    /// now, results to be read for them ([`with_results`]), as if they had just made it ready.
    WithParents(BTreeMap<String, ParentRun>),
    /// Its parents are not as its `run_on` requires, or give it too much: refused, saying why.
    Refuse(String),
}

/// Decides [`Rerun`] for `job`, an operator's retry of which [`crate::transition`] took:
/// `steps` are its workflow's steps as [`STEPS_LEAVE_OUT`] reads them, `result_bytes` their
/// results' sizes, `retrying` the jobs the same call retries (a bulk step), which count as
/// queued: a parent brought back by the same transaction has not finished. A step cancelled
/// before it ran had no parents written; run without them, its handler would see none, so it is
/// given them now, by the rule that makes a step ready.
pub fn rerun(
    job: &Job,
    steps: &[Job],
    result_bytes: &HashMap<JobId, u64>,
    retrying: &[JobId],
) -> Rerun {
    let Some(link) = job.workflow.as_ref().filter(|_| rerun_reads(job).is_some()) else {
        return Rerun::AsItIs;
    };
    let by_id: HashMap<JobId, &Job> = steps.iter().map(|j| (j.id, j)).collect();
    let state_of = |p: &JobId| {
        by_id.get(p).map(|j| {
            if retrying.contains(p) {
                JobState::Queued
            } else {
                j.state
            }
        })
    };
    let states: Vec<JobState> = link
        .after
        .iter()
        .map(|p| state_of(p).unwrap_or(JobState::Cancelled))
        .collect();
    if readiness(link.run_on, &states) != Some(true) {
        let named: Vec<(&str, JobState)> = link
            .after
            .iter()
            .filter_map(|p| {
                let step = by_id
                    .get(p)?
                    .workflow
                    .as_ref()
                    .map_or("?", |l| l.step.as_str());
                Some((step, state_of(p)?))
            })
            .collect();
        let why = if let Some((step, st)) = named.iter().find(|(_, s)| !s.is_terminal()) {
            format!("its parent step '{step}' is {st}: wait for it to finish")
        } else if let Some((step, st)) = named.iter().find(|(_, s)| *s != JobState::Succeeded) {
            format!("its parent step '{step}' is {st}: retry it first, then this step once it has succeeded")
        } else {
            "a parent step no longer exists (purged), so it cannot be given its parents".into()
        };
        return Rerun::Refuse(format!(
            "this workflow step never became runnable and cannot run yet: {why}"
        ));
    }
    let given: u64 = link.after.iter().filter_map(|p| result_bytes.get(p)).sum();
    if given > MAX_PARENTS_BYTES {
        return Rerun::Refuse(too_large_reason(given));
    }
    let parents = link
        .after
        .iter()
        .filter_map(|p| by_id.get(p))
        .map(|p| parent_run(p, p.state))
        .collect();
    Rerun::WithParents(parents)
}

/// The workflow whose steps a store reads for an operator's retry of `job` ([`rerun`]): a step
/// with parents that never had them written. `None`: the retry leaves `parents` as they are,
/// and nothing need be read.
pub fn rerun_reads(job: &Job) -> Option<WorkflowId> {
    job.workflow
        .as_ref()
        .filter(|l| !l.after.is_empty() && job.parents.is_none())
        .map(|l| l.id)
}

/// A parent as its dependent sees it, under its step name, in `state`; its result is filled in
/// afterwards ([`with_results`]), since steps are read without them.
fn parent_run(p: &Job, state: JobState) -> (String, ParentRun) {
    let step = p.workflow.as_ref().map_or("", |l| l.step.as_str());
    (
        step.to_string(),
        ParentRun {
            id: p.id,
            task: p.task.clone(),
            state,
            result: p.result.clone(),
            error: p.error.clone(),
        },
    )
}

/// A made-runnable step's parents cancelled in the same answer carry the reason written on them
/// (the steps were read before it, without it): a finaliser sees why its parent did not run.
fn give_reasons(steps: &[Job], decided: &mut [Settle]) {
    let reasons: HashMap<JobId, String> = decided
        .iter()
        .filter_map(|d| match d {
            Settle::Cancel { id, .. } => Some((*id, cancel_reason(steps, *id, decided))),
            Settle::Ready { .. } => None,
        })
        .collect();
    if reasons.is_empty() {
        return;
    }
    for d in decided {
        if let Settle::Ready { parents, .. } = d {
            for p in parents.values_mut() {
                if let Some(r) = reasons.get(&p.id) {
                    p.error = Some(r.clone());
                }
            }
        }
    }
}

/// The columns a store leaves out when it reads a workflow's steps (to settle it, to show it),
/// with what it reads in their place: args, results and progress (up to 1 MiB, 8 MiB and 64 KiB
/// a step, and every step's end settles its workflow, which read all of them again), the
/// follow-ups and a step's own parents (which hold its parents' results). [`settle`] looks at
/// states and links; the results a made-runnable step carries are read afterwards, for its
/// parents alone ([`parents_to_read`], [`with_results`]).
pub const STEPS_LEAVE_OUT: [(&str, &str); 6] = [
    ("args", "'null'"),
    ("result", "NULL"),
    ("progress", "NULL"),
    ("on_success", "NULL"),
    ("on_failure", "NULL"),
    ("parents", "NULL"),
];

/// A store's job column as a workflow's steps are read ([`STEPS_LEAVE_OUT`]).
pub fn step_column(column: &str) -> &str {
    STEPS_LEAVE_OUT
        .iter()
        .find(|(c, _)| *c == column)
        .map_or(column, |(_, read)| read)
}

/// The parents whose results the steps [`settle`] made runnable carry, each once.
pub fn parents_to_read(decided: &[Settle]) -> Vec<JobId> {
    let mut ids: Vec<JobId> = decided
        .iter()
        .flat_map(|d| match d {
            Settle::Ready { parents, .. } => parents.values().map(|p| p.id).collect(),
            Settle::Cancel { .. } => Vec::new(),
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// One made-runnable step's parents with their results, as read by the store, to be written
/// and dropped before the next step's are made: a fan-out's children share one parent's
/// result, and all their copies at once would hold it as many times over.
pub fn with_results(
    parents: &BTreeMap<String, ParentRun>,
    results: &HashMap<JobId, serde_json::Value>,
) -> BTreeMap<String, ParentRun> {
    let mut parents = parents.clone();
    for p in parents.values_mut() {
        p.result = results.get(&p.id).cloned();
    }
    parents
}

/// The reason of a [`Settle::Cancel`]: its parents' results too large, or the first parent
/// that did not succeed.
pub fn cancel_reason(steps: &[Job], id: JobId, decided: &[Settle]) -> String {
    let too_large = decided.iter().find_map(|d| match d {
        Settle::Cancel {
            id: c,
            too_large: Some(bytes),
        } if *c == id => Some(*bytes),
        _ => None,
    });
    if let Some(bytes) = too_large {
        return too_large_reason(bytes);
    }
    let cancelled: HashSet<JobId> = decided
        .iter()
        .filter_map(|s| match s {
            Settle::Cancel { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    let by_id: HashMap<JobId, &Job> = steps.iter().map(|j| (j.id, j)).collect();
    let after = by_id
        .get(&id)
        .and_then(|j| j.workflow.as_ref())
        .map(|l| l.after.clone())
        .unwrap_or_default();
    for p in after {
        let Some(pj) = by_id.get(&p) else {
            return "cancelled: a parent step no longer exists".into();
        };
        let st = if cancelled.contains(&p) {
            JobState::Cancelled
        } else {
            pj.state
        };
        if st.is_terminal() && st != JobState::Succeeded {
            let step = pj.workflow.as_ref().map_or("?", |l| l.step.as_str());
            return cancelled_reason(step, st);
        }
    }
    crate::transition::CANCELLED.into()
}

/// A workflow's state, from its steps' states and whether it was cancelled as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkflowState {
    /// Some step has not finished.
    Running,
    /// Every step succeeded.
    Succeeded,
    /// Every step finished and at least one failed or died.
    Failed,
    /// Every step finished, none failed or died, and some were cancelled (or the workflow was).
    Cancelled,
}

impl std::fmt::Display for WorkflowState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WorkflowState::Running => "running",
            WorkflowState::Succeeded => "succeeded",
            WorkflowState::Failed => "failed",
            WorkflowState::Cancelled => "cancelled",
        })
    }
}

impl WorkflowState {
    pub fn of(steps: impl IntoIterator<Item = JobState>, cancelled: bool) -> Self {
        let mut all_ok = true;
        let mut failed = false;
        for s in steps {
            if !s.is_terminal() {
                return WorkflowState::Running;
            }
            all_ok &= s == JobState::Succeeded;
            failed |= matches!(s, JobState::Failed | JobState::Dead);
        }
        if cancelled {
            WorkflowState::Cancelled
        } else if all_ok {
            WorkflowState::Succeeded
        } else if failed {
            WorkflowState::Failed
        } else {
            WorkflowState::Cancelled
        }
    }
}

/// One step of a [`Workflow`] view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepView {
    pub job: JobId,
    pub task: String,
    pub queue: String,
    pub state: JobState,
    pub after: Vec<String>,
    pub run_on: RunOn,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A workflow as readers see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workflow {
    pub id: WorkflowId,
    pub name: String,
    pub state: WorkflowState,
    #[serde(with = "crate::time::as_rfc3339")]
    pub created_at: Micros,
    #[serde(with = "crate::time::opt_rfc3339")]
    pub cancelled_at: Option<Micros>,
    pub steps: BTreeMap<String, StepView>,
}

impl Workflow {
    /// The view of a workflow from its stored row and its steps' jobs.
    pub fn from_parts(
        id: WorkflowId,
        name: String,
        created_at: Micros,
        cancelled_at: Option<Micros>,
        jobs: &[Job],
    ) -> Workflow {
        let names: HashMap<JobId, &str> = jobs
            .iter()
            .filter_map(|j| j.workflow.as_ref().map(|l| (j.id, l.step.as_str())))
            .collect();
        let steps = jobs
            .iter()
            .filter_map(|j| {
                let l = j.workflow.as_ref()?;
                Some((
                    l.step.clone(),
                    StepView {
                        job: j.id,
                        task: j.task.clone(),
                        queue: j.queue.clone(),
                        state: j.state,
                        after: l
                            .after
                            .iter()
                            .map(|p| {
                                names
                                    .get(p)
                                    .map_or_else(|| p.to_string(), |n| n.to_string())
                            })
                            .collect(),
                        run_on: l.run_on,
                        error: j.error.clone(),
                    },
                ))
            })
            .collect();
        Workflow {
            id,
            name,
            state: WorkflowState::of(jobs.iter().map(|j| j.state), cancelled_at.is_some()),
            created_at,
            cancelled_at,
            steps,
        }
    }
}

/// A page of workflows, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowPage {
    pub workflows: Vec<Workflow>,
    pub next_cursor: Option<String>,
}

impl WorkflowPage {
    /// A page of workflows, newest first; `more` says that another page follows, whose cursor
    /// is the last kept workflow's id.
    pub fn new(workflows: Vec<Workflow>, more: bool) -> WorkflowPage {
        let next_cursor = if more {
            workflows.last().map(|w| w.id.to_string())
        } else {
            None
        };
        WorkflowPage {
            workflows,
            next_cursor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transition::sample_job;

    /// Parents are comma-separated.
    fn spec(steps: &[(&str, &str)]) -> WorkflowSpec {
        let mut w = WorkflowSpec::new("w");
        for (n, after) in steps {
            let after: Vec<&str> = after.split(',').filter(|a| !a.is_empty()).collect();
            w = w.step(*n, "t", serde_json::json!({}), &after);
        }
        w
    }

    fn planned(w: WorkflowSpec) -> Result<NewWorkflow, String> {
        plan(w, 5, |_, s| {
            Ok(NewJob {
                id: crate::job::new_job_id(),
                task: s.task.clone(),
                queue: "q".into(),
                args: s.args.clone(),
                options: s.options(),
                created_at: 5,
                run_at: None,
            })
        })
    }

    #[test]
    fn plans_refuse_bad_graphs_with_the_reason() {
        let cases: Vec<(WorkflowSpec, &str)> = vec![
            (WorkflowSpec::new("w"), "at least one step"),
            (spec(&[("a", "a")]), "after itself"),
            (spec(&[("a", "x")]), "'x', which is not a step"),
            (spec(&[("a", ""), ("b", "a,a")]), "twice"),
            (
                spec(&[("a", "c"), ("b", "a"), ("c", "b")]),
                "cycle: a -> c -> b -> a",
            ),
            (spec(&[("bad name", "")]), "step name"),
        ];
        for (w, want) in cases {
            let e = planned(w).unwrap_err();
            assert!(e.contains(want), "{e} lacks {want}");
        }
        let mut big = WorkflowSpec::new("w");
        for i in 0..=MAX_STEPS {
            big = big.step(format!("s{i}"), "t", serde_json::json!({}), &[]);
        }
        assert!(planned(big).unwrap_err().contains("at most 200 steps"));
        let e = plan(spec(&[("a", "")]), 5, |_, _| Err("no such task".into())).unwrap_err();
        assert_eq!(e, "step 'a': no such task");
    }

    #[test]
    fn duplicate_step_names_are_refused() {
        let e = serde_json::from_str::<WorkflowSpec>(
            r#"{"name": "w", "steps": {"a": {"task": "t"}, "a": {"task": "u"}}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("step 'a' is named twice"), "{e}");
    }

    #[test]
    fn plans_link_parents_by_job_id() {
        let w = planned(spec(&[("a", ""), ("b", ""), ("c", "a,b")])).unwrap();
        let ids: HashMap<&str, JobId> = w
            .steps
            .iter()
            .map(|(j, l)| (l.step.as_str(), j.id))
            .collect();
        let c = &w.steps.iter().find(|(_, l)| l.step == "c").unwrap().1;
        assert_eq!(c.after, vec![ids["a"], ids["b"]]);
        assert!(w.steps.iter().all(|(_, l)| l.id == w.id));
    }

    /// Jobs for a graph, each in the state given.
    fn jobs(steps: &[(&str, &str, RunOn, JobState)]) -> Vec<Job> {
        let ids: HashMap<&str, JobId> = steps
            .iter()
            .map(|(n, ..)| (*n, crate::job::new_job_id()))
            .collect();
        let wf = crate::job::new_job_id();
        steps
            .iter()
            .map(|(n, after, run_on, st)| {
                let mut j = sample_job(*st);
                j.id = ids[n];
                j.workflow = Some(StepLink {
                    id: wf,
                    step: n.to_string(),
                    after: after
                        .split(',')
                        .filter(|a| !a.is_empty())
                        .map(|a| ids[a])
                        .collect(),
                    run_on: *run_on,
                });
                j
            })
            .collect()
    }

    fn decided(steps: &[Job]) -> Vec<(String, &'static str)> {
        let name = |id: &JobId| {
            steps
                .iter()
                .find(|j| j.id == *id)
                .unwrap()
                .workflow
                .as_ref()
                .unwrap()
                .step
                .clone()
        };
        settle(steps)
            .iter()
            .map(|s| match s {
                Settle::Ready { id, .. } => (name(id), "ready"),
                Settle::Cancel { id, .. } => (name(id), "cancel"),
            })
            .collect()
    }

    #[test]
    fn a_step_is_ready_once_every_parent_succeeded() {
        use JobState::*;
        use RunOn::*;
        let s = jobs(&[
            ("a", "", Success, Succeeded),
            ("b", "", Success, Running),
            ("c", "a,b", Success, Waiting),
        ]);
        assert!(decided(&s).is_empty());
        let s = jobs(&[
            ("a", "", Success, Succeeded),
            ("b", "", Success, Succeeded),
            ("c", "a,b", Success, Waiting),
        ]);
        assert_eq!(decided(&s), vec![("c".to_string(), "ready")]);
        let Settle::Ready { parents, .. } = &settle(&s)[0] else {
            panic!()
        };
        assert_eq!(parents.keys().collect::<Vec<_>>(), vec!["a", "b"]);
        // Not waiting any more (already made ready): never decided again.
        let s = jobs(&[("a", "", Success, Succeeded), ("c", "a", Success, Queued)]);
        assert!(decided(&s).is_empty());
    }

    /// Steps are read without results; the made-runnable steps' parents, each once, get theirs
    /// afterwards, and only those.
    #[test]
    fn results_are_read_for_the_parents_of_ready_steps_alone() {
        use JobState::*;
        use RunOn::*;
        let s = jobs(&[
            ("a", "", Success, Succeeded),
            ("b", "", Success, Succeeded),
            ("x", "", Success, Succeeded),
            ("c", "a,b", Success, Waiting),
            ("d", "a", Any, Waiting),
        ]);
        let decided = settle(&s);
        assert_eq!(parents_to_read(&decided), {
            let mut want = vec![s[0].id, s[1].id];
            want.sort_unstable();
            want
        });
        let results = [
            (s[0].id, serde_json::json!("A")),
            (s[2].id, serde_json::json!("X")),
        ];
        let results = results.into_iter().collect();
        for d in &decided {
            let Settle::Ready { parents, .. } = d else {
                panic!("{d:?}")
            };
            let parents = with_results(parents, &results);
            assert_eq!(parents["a"].result, Some(serde_json::json!("A")));
            if let Some(b) = parents.get("b") {
                assert_eq!(b.result, None, "a parent without a result read has none");
            }
        }
        assert_eq!(step_column("args"), "'null'");
        assert_eq!(step_column("parents"), "NULL");
        assert_eq!(step_column("workflow"), "workflow");
    }

    /// A step whose parents' results come to more than it may be given is cancelled, and its
    /// dependents follow as after any cancellation; at the bound exactly it runs.
    #[test]
    fn too_large_parents_cancel_the_step_and_reach_its_dependents() {
        use JobState::*;
        use RunOn::*;
        let s = jobs(&[
            ("a", "", Success, Succeeded),
            ("b", "", Success, Succeeded),
            ("c", "a,b", Success, Waiting),
            ("d", "c", Success, Waiting),
            ("fin", "c", Any, Waiting),
            ("e", "a", Success, Waiting),
        ]);
        let half = MAX_PARENTS_BYTES / 2;
        let sizes: HashMap<JobId, u64> = [(s[0].id, half), (s[1].id, half + 1)].into();
        let decided = settle_within(&s, &sizes);
        let names: Vec<(String, &str, Option<u64>)> = decided
            .iter()
            .map(|d| match d {
                Settle::Ready { id, .. } => (step_of(&s, *id), "ready", None),
                Settle::Cancel { id, too_large } => (step_of(&s, *id), "cancel", *too_large),
            })
            .collect();
        assert_eq!(
            names,
            vec![
                ("c".into(), "cancel", Some(MAX_PARENTS_BYTES + 1)),
                ("d".into(), "cancel", None),
                ("fin".into(), "ready", None),
                ("e".into(), "ready", None),
            ]
        );
        assert_eq!(
            cancel_reason(&s, s[2].id, &decided),
            too_large_reason(MAX_PARENTS_BYTES + 1)
        );
        // The finaliser sees why its parent did not run.
        let Settle::Ready { parents, .. } = &decided[2] else {
            panic!("{decided:?}")
        };
        assert_eq!(
            parents["c"].error,
            Some(too_large_reason(MAX_PARENTS_BYTES + 1))
        );
        assert!(too_large_reason(1).contains("16777216"));
        assert_eq!(
            cancel_reason(&s, s[3].id, &decided),
            "cancelled: its parent step 'c' is cancelled"
        );
        let sizes: HashMap<JobId, u64> = [(s[0].id, half), (s[1].id, half)].into();
        assert!(matches!(
            settle_within(&s, &sizes)[0],
            Settle::Ready { id, .. } if id == s[2].id
        ));
    }

    /// A step cancelled before it ran is retried with its parents as they are now, if they are
    /// as its `run_on` requires and within the bound; one that ran keeps what it had.
    #[test]
    fn a_rerun_gives_a_never_run_step_its_parents_now() {
        use JobState::*;
        use RunOn::*;
        let s = jobs(&[
            ("a", "", Success, Succeeded),
            ("x", "", Success, Failed),
            ("b", "a", Success, Cancelled),
            ("c", "a,x", Success, Cancelled),
            ("fin", "a,x", Any, Cancelled),
        ]);
        let none = HashMap::new();
        let Rerun::WithParents(p) = rerun(&s[2], &s, &none, &[]) else {
            panic!()
        };
        assert_eq!(p.keys().collect::<Vec<_>>(), vec!["a"]);
        assert_eq!((p["a"].id, p["a"].state), (s[0].id, Succeeded));
        let Rerun::Refuse(why) = rerun(&s[3], &s, &none, &[]) else {
            panic!()
        };
        assert!(why.contains("'x' is failed"), "{why}");
        assert!(matches!(rerun(&s[4], &s, &none, &[]), Rerun::WithParents(p) if p.len() == 2));
        // Its parent retried by the same call has not finished: the finaliser waits.
        let Rerun::Refuse(why) = rerun(&s[4], &s, &none, &[s[1].id]) else {
            panic!()
        };
        assert!(why.contains("'x' is queued: wait for it"), "{why}");
        let big: HashMap<JobId, u64> = [(s[0].id, MAX_PARENTS_BYTES + 1)].into();
        assert_eq!(
            rerun(&s[2], &s, &big, &[]),
            Rerun::Refuse(too_large_reason(MAX_PARENTS_BYTES + 1))
        );
        let mut ran = s[2].clone();
        ran.parents = Some(BTreeMap::new());
        assert_eq!(rerun(&ran, &s, &none, &[]), Rerun::AsItIs);
        assert_eq!(rerun(&s[0], &s, &none, &[]), Rerun::AsItIs);
        let mut alone = s[2].clone();
        alone.workflow = None;
        assert_eq!(rerun(&alone, &s, &none, &[]), Rerun::AsItIs);
    }

    fn step_of(steps: &[Job], id: JobId) -> String {
        let j = steps.iter().find(|j| j.id == id).unwrap();
        j.workflow.as_ref().unwrap().step.clone()
    }

    #[test]
    fn failure_cancels_dependents_transitively_but_not_finalisers() {
        use JobState::*;
        use RunOn::*;
        for bad in [Failed, Dead, Cancelled] {
            let s = jobs(&[
                ("a", "", Success, bad),
                ("b", "", Success, Running),
                ("c", "a,b", Success, Waiting),
                ("d", "c", Success, Waiting),
                ("fin", "d,b", Any, Waiting),
            ]);
            // c is cancelled without waiting for b; d follows; fin waits for b.
            assert_eq!(
                decided(&s),
                vec![("c".to_string(), "cancel"), ("d".to_string(), "cancel")],
                "{bad}"
            );
            let reason = cancel_reason(&s, s[2].id, &settle(&s));
            assert_eq!(reason, format!("cancelled: its parent step 'a' is {bad}"));
            let reason = cancel_reason(&s, s[3].id, &settle(&s));
            assert_eq!(reason, "cancelled: its parent step 'c' is cancelled");
        }
        let s = jobs(&[
            ("a", "", Success, Failed),
            ("b", "", Success, Succeeded),
            ("c", "a", Success, Waiting),
            ("fin", "c,b", Any, Waiting),
        ]);
        assert_eq!(
            decided(&s),
            vec![("c".to_string(), "cancel"), ("fin".to_string(), "ready")]
        );
        let Settle::Ready { parents, .. } = &settle(&s)[1] else {
            panic!()
        };
        assert_eq!(parents["c"].state, Cancelled);
        assert_eq!(parents["b"].state, Succeeded);
    }

    #[test]
    fn workflow_state_follows_its_steps() {
        use JobState::*;
        use WorkflowState as W;
        for (steps, cancelled, want) in [
            (vec![Succeeded, Running], false, W::Running),
            (vec![Succeeded, Waiting], true, W::Running),
            (vec![Succeeded, Succeeded], false, W::Succeeded),
            (vec![Succeeded, Failed, Cancelled], false, W::Failed),
            (vec![Dead, Succeeded], false, W::Failed),
            (vec![Cancelled, Succeeded], false, W::Cancelled),
            (vec![Failed, Cancelled], true, W::Cancelled),
        ] {
            assert_eq!(
                WorkflowState::of(steps.clone(), cancelled),
                want,
                "{steps:?}"
            );
        }
    }
}
