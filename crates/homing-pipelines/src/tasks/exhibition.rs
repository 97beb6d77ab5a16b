//! The exhibition's three tasks, run as the steps of one homing workflow (see
//! `api/exhibitions.rs`): `exhibition.emotion` reads an image's emotion; `exhibition.bgm`, runnable
//! once its emotion step succeeded, generates the track; `exhibition.ready`, runnable once all
//! three bgm steps succeeded, marks the exhibition ready. That `ready` happens once, after the
//! three tracks, is the workflow's guarantee, so nothing here counts tracks or guards a flag.
//!
//! Generation is the expensive, side-effecting step the seed had to protect: its guard is the
//! object store itself. A track is stored under its job's id, which every redelivery shares, so
//! a run that finds the object skips generation entirely — whether the earlier run crashed after
//! storing, or after committing nothing at all. Every generation started and finished is
//! recorded, which is how tests (and operators) count them.

use serde::Deserialize;
use std::time::Duration;

use super::{joined, services};
use crate::compose::{self, Style};
use crate::emotion::{self, Emotion};
use crate::objects::keys;
use crate::{inference, wav, Pipelines};
use homing::{Context, Task, TaskError};

pub const EMOTION: &str = "exhibition.emotion";
pub const BGM: &str = "exhibition.bgm";
pub const READY: &str = "exhibition.ready";

/// The exhibition's step names in its workflow.
pub fn emotion_step(index: usize) -> String {
    format!("emotion-{index}")
}
pub fn bgm_step(index: usize) -> String {
    format!("bgm-{index}")
}
pub const READY_STEP: &str = "ready";

#[derive(Debug, Clone)]
pub struct ReadEmotion(pub Pipelines);

#[derive(Debug, Deserialize)]
pub struct TrackArgs {
    pub exhibition: String,
    pub index: u32,
}

#[homing::async_trait]
impl Task for ReadEmotion {
    const NAME: &'static str = EMOTION;
    type Args = TrackArgs;
    type Output = Emotion;

    async fn run(&self, _ctx: Context, a: TrackArgs) -> Result<Emotion, TaskError> {
        let s = services(&self.0).await?;
        let track = s
            .state
            .track(&a.exhibition, a.index)
            .await?
            .ok_or_else(|| TaskError::fatal("no such exhibition track"))?;
        let bytes = s
            .objects
            .get(&track.image_key)
            .await?
            .ok_or_else(|| TaskError::fatal("the image is missing from the store"))?;
        let e = joined(tokio::task::spawn_blocking(move || emotion::read(&bytes)).await)?
            .map_err(|e| TaskError::fatal(format!("cannot read the image: {e}")))?;
        let reading = serde_json::to_value(&e).unwrap_or_default();
        s.state
            .set_emotion(&a.exhibition, a.index, e.emotion.as_str(), &reading)
            .await?;
        Ok(e)
    }

    fn queue(&self) -> &str {
        "emotion"
    }
}

#[derive(Debug, Clone)]
pub struct ComposeTrack(pub Pipelines);

#[derive(Debug, Deserialize)]
pub struct ParentResult {
    #[serde(default)]
    pub result: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub struct BgmArgs {
    pub exhibition: String,
    pub index: u32,
    /// The `exhibition.emotion` job this follows, with its result: set on a bgm job enqueued as
    /// a follow-up by a release before exhibitions were workflows (a workflow step reads its
    /// parent from `ctx.parents()`).
    #[serde(default)]
    pub parent: Option<ParentResult>,
}

/// A seed from the job id: a redelivered job composes the very same track.
fn seed(job: homing::JobId) -> u64 {
    let v = job.as_u128();
    (v >> 64) as u64 ^ v as u64
}

#[homing::async_trait]
impl Task for ComposeTrack {
    const NAME: &'static str = BGM;
    type Args = BgmArgs;
    type Output = serde_json::Value;

    async fn run(&self, ctx: Context, a: BgmArgs) -> Result<serde_json::Value, TaskError> {
        let s = services(&self.0).await?;
        let job = ctx.idempotency_key();
        let from_step = ctx
            .parents()
            .into_values()
            .find(|p| p.task == EMOTION)
            .and_then(|p| p.result);
        let legacy = ctx.workflow().is_none();
        // Looked up before anything is composed: a job for a track that does not exist (a
        // producer's typo, an exhibition deleted since) composed and stored a track that
        // nothing referred to, and succeeded.
        let track = s
            .state
            .track(&a.exhibition, a.index)
            .await?
            .ok_or_else(|| TaskError::fatal("no such exhibition track"))?;
        let emotion: Emotion = match from_step.or(a.parent.and_then(|p| p.result)) {
            Some(v) => serde_json::from_value(v)
                .map_err(|e| TaskError::fatal(format!("the emotion job's result: {e}")))?,
            None => {
                let reading = track
                    .reading
                    .ok_or_else(|| TaskError::fatal("no emotion was read for this track"))?;
                serde_json::from_value(reading)
                    .map_err(|e| TaskError::fatal(format!("the stored emotion: {e}")))?
            }
        };
        if legacy {
            s.state.set_bgm_job(&a.exhibition, a.index, &job).await?;
        }
        let key = keys::track(&job);
        let style = Style::for_emotion(&emotion);
        let settings = &s.settings;
        let engine = if settings.bgm_endpoint.is_some() {
            "endpoint"
        } else {
            "composer"
        };

        let generated = !s.objects.exists(&key).await?;
        let duration_ms = if generated {
            let generation = s
                .state
                .generation_started(&job, ctx.epoch(), &a.exhibition, a.index, engine)
                .await?;
            tracing::info!(%job, exhibition = %a.exhibition, index = a.index, emotion = emotion.emotion.as_str(), engine, "generating a track");
            let track = match &settings.bgm_endpoint {
                Some(url) => {
                    inference::generate(&s.http, url, &job, &emotion, &style, settings.bgm_seconds)
                        .await?
                }
                None => {
                    let (style, seconds, seed, cancel) = (
                        style.clone(),
                        settings.bgm_seconds,
                        seed(ctx.job_id()),
                        ctx.cancellation_token(),
                    );
                    let samples = joined(
                        tokio::task::spawn_blocking(move || {
                            compose::compose(&style, seconds, seed, &cancel)
                        })
                        .await,
                    )?
                    .ok_or_else(|| {
                        TaskError::retry("composition stopped: the job was cancelled")
                    })?;
                    wav::encode(&samples, compose::SAMPLE_RATE)
                }
            };
            let duration = wav::duration_ms(&track);
            s.objects.put(&key, track).await?;
            s.state.generation_finished(generation).await?;
            if let Some(pause) = settings.test_hooks.bgm_pause_after_store {
                tracing::warn!(%job, ?pause, "test hook: track stored, pausing before the job commits");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = ctx.cancelled() => {}
                }
            }
            duration
        } else {
            tracing::info!(%job, exhibition = %a.exhibition, index = a.index, "the track is already stored by an earlier run of this job; not generating it again");
            s.objects
                .get(&key)
                .await?
                .as_deref()
                .and_then(wav::duration_ms)
        };

        let style_json = serde_json::to_value(&style).unwrap_or_default();
        s.state
            .track_stored(
                &a.exhibition,
                a.index,
                ctx.epoch(),
                &key,
                &style_json,
                duration_ms,
                engine,
            )
            .await?;
        if legacy && s.state.mark_ready(&a.exhibition).await? {
            // No ready step follows a job from before workflows: the last track marks it.
            tracing::info!(exhibition = %a.exhibition, "exhibition ready: all three tracks exist");
        }
        Ok(serde_json::json!({
            "track": key,
            "generated": generated,
            "emotion": emotion.emotion,
            "style": style_json,
            "duration_ms": duration_ms,
        }))
    }

    fn queue(&self) -> &str {
        "bgm"
    }
    fn time_limit(&self) -> Duration {
        Duration::from_secs(15 * 60)
    }
}

#[derive(Debug, Clone)]
pub struct MarkReady(pub Pipelines);

#[derive(Debug, Deserialize)]
pub struct ReadyArgs {
    pub exhibition: String,
}

#[homing::async_trait]
impl Task for MarkReady {
    const NAME: &'static str = READY;
    type Args = ReadyArgs;
    type Output = serde_json::Value;

    async fn run(&self, ctx: Context, a: ReadyArgs) -> Result<serde_json::Value, TaskError> {
        let s = services(&self.0).await?;
        // Runnable only once every bgm step succeeded, and each stored its track before its
        // commit: a missing track is a bug, not a passing state to wait out.
        if !s.state.mark_ready(&a.exhibition).await? {
            return Err(TaskError::fatal(
                "every track's job succeeded but a track is not recorded",
            ));
        }
        let tracks: Vec<_> = ctx
            .parents()
            .into_values()
            .filter_map(|p| p.result.and_then(|r| r.get("track").cloned()))
            .collect();
        tracing::info!(exhibition = %a.exhibition, "exhibition ready: all three tracks exist");
        Ok(serde_json::json!({ "exhibition": a.exhibition, "tracks": tracks }))
    }

    /// A single light write: it shares the light `emotion` queue rather than waiting behind
    /// generations on `bgm` or needing a worker of its own.
    fn queue(&self) -> &str {
        "emotion"
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_job_keeps_its_seed() {
        let id = homing::job::new_job_id();
        assert_eq!(super::seed(id), super::seed(id));
        assert_ne!(super::seed(id), super::seed(homing::job::new_job_id()));
    }
}
