//! `POST /v1/exhibitions` takes exactly three images and creates the exhibition's workflow
//! (three emotion steps, each feeding its bgm step, all three feeding `ready`);
//! `GET /v1/exhibitions/{id}` shows progress; `GET …/tracks/{index}` downloads a track.

use axum::extract::rejection::PathRejection;
use axum::extract::{Multipart, Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{display_name, parse_id, read_field, ApiError, ApiState, IMAGE_LIMIT};
use crate::objects::keys;
use crate::state::NewTrack;
use crate::tasks::exhibition::{bgm_step, emotion_step, BGM, EMOTION, READY, READY_STEP};
use homing::workflow::{StepSpec, WorkflowSpec};
use homing::JobState;

const IMAGES: usize = 3;

struct Upload {
    bytes: Vec<u8>,
    name: Option<String>,
    ext: &'static str,
}

pub async fn create(
    State(st): State<ApiState>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Response, ApiError> {
    let mut multipart = multipart?;
    let mut uploads = Vec::with_capacity(IMAGES);
    while let Some(mut field) = multipart.next_field().await? {
        let name = field.name().unwrap_or("").to_string();
        if name != "images" {
            return Err(ApiError::bad_request(format!(
                "unexpected part {name:?}: send exactly {IMAGES} parts named `images`"
            )));
        }
        if uploads.len() == IMAGES {
            return Err(ApiError::bad_request(format!(
                "too many images: send exactly {IMAGES} parts named `images`"
            )));
        }
        let display = display_name(&field);
        let n = uploads.len() + 1;
        let bytes = read_field(&mut field, IMAGE_LIMIT, &format!("image {n}")).await?;
        let ext = match image::guess_format(&bytes) {
            Ok(image::ImageFormat::Png) => "png",
            Ok(image::ImageFormat::Jpeg) => "jpg",
            _ => {
                return Err(ApiError::unsupported(format!(
                    "image {n} is not a PNG or JPEG"
                )))
            }
        };
        uploads.push(Upload {
            bytes,
            name: display,
            ext,
        });
    }
    if uploads.len() != IMAGES {
        return Err(ApiError::bad_request(format!(
            "got {} image(s): send exactly {IMAGES} parts named `images`",
            uploads.len()
        )));
    }

    let s = st.services().await?;
    let id = homing::job::new_job_id().to_string();
    let mut tracks = Vec::with_capacity(IMAGES);
    for (i, u) in uploads.into_iter().enumerate() {
        let key = keys::image(&id, i, u.ext);
        s.objects.put(&key, u.bytes).await?;
        tracks.push(NewTrack {
            image_name: u.name,
            image_key: key,
        });
    }
    s.state.insert_exhibition(&id, tracks).await?;
    let jobs = st.client.create_workflow(workflow(&id)).await?;
    let step = |name: String| {
        jobs.steps
            .get(&name)
            .map(|j| j.to_string())
            .ok_or_else(|| ApiError::internal(format!("the workflow has no step {name}")))
    };
    let tracks = (0..IMAGES)
        .map(|i| Ok((step(emotion_step(i))?, step(bgm_step(i))?)))
        .collect::<Result<Vec<_>, ApiError>>()?;
    s.state
        .set_workflow(&id, &jobs.id.to_string(), tracks)
        .await?;
    tracing::info!(exhibition = %id, "exhibition created");
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, format!("/v1/exhibitions/{id}"))],
        Json(json!({ "id": id, "state": "processing", "url": format!("/v1/exhibitions/{id}") })),
    )
        .into_response())
}

/// The exhibition as one workflow: each image's emotion step feeds its bgm step (which reads
/// the emotion from `ctx.parents()`), and `ready` runs once, after all three bgm steps
/// succeeded. A failed emotion or bgm step cancels its dependents, so the exhibition is never
/// marked ready without its three tracks.
fn workflow(id: &str) -> WorkflowSpec {
    let mut spec = WorkflowSpec::new("exhibition");
    for i in 0..IMAGES {
        let args = json!({ "exhibition": id, "index": i });
        let mut emotion = StepSpec::new(EMOTION, args.clone());
        emotion.queue = Some("emotion".into());
        let mut bgm = StepSpec::new(BGM, args);
        bgm.queue = Some("bgm".into());
        bgm.after = vec![emotion_step(i)];
        spec = spec
            .with_step(emotion_step(i), emotion)
            .with_step(bgm_step(i), bgm);
    }
    let mut ready = StepSpec::new(READY, json!({ "exhibition": id }));
    ready.queue = Some("emotion".into());
    ready.after = (0..IMAGES).map(bgm_step).collect();
    spec.with_step(READY_STEP, ready)
}

async fn job_state(st: &ApiState, id: Option<&str>) -> Result<Option<JobState>, ApiError> {
    let Some(id) = id.and_then(|j| j.parse().ok()) else {
        return Ok(None);
    };
    Ok(st.client.store().get(id).await?.map(|j| j.state))
}

fn given_up(s: Option<JobState>) -> bool {
    matches!(
        s,
        Some(JobState::Failed | JobState::Dead | JobState::Cancelled)
    )
}

pub async fn get(
    State(st): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Path(raw) = path?;
    let id = parse_id(&raw, "exhibition")?.to_string();
    let s = st.services().await?;
    let (e, tracks) = s
        .state
        .exhibition(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no exhibition {id}")))?;
    // The ready step itself giving up (it refuses to mark an exhibition missing a track) fails
    // the exhibition too. A pruned workflow was long finished; its exhibition says so itself.
    // Read before the tracks' jobs: a failed step is stored before the workflow cancels its
    // dependents, so a cancelled ready step read first means the failed track's job is seen
    // failed below; read after, the view could say "failed" with every track still working.
    let ready_step = match e.workflow.as_deref().and_then(|w| w.parse().ok()) {
        Some(w) => match st.client.store().workflow(w).await? {
            Some(wf) => wf.steps.get(READY_STEP).map(|s| s.state),
            None => None,
        },
        None => None,
    };
    let mut failed = false;
    let mut out = Vec::with_capacity(tracks.len());
    for t in tracks {
        let emotion_state = job_state(&st, t.emotion_job.as_deref()).await?;
        let bgm_state = job_state(&st, t.bgm_job.as_deref()).await?;
        let state = if t.track_key.is_some() {
            "ready"
        } else if given_up(emotion_state) || given_up(bgm_state) {
            failed = true;
            "failed"
        } else if t.emotion.is_some() {
            "composing"
        } else {
            "reading emotion"
        };
        let reading = t.reading.unwrap_or_default();
        out.push(json!({
            "index": t.index,
            "image": t.image_name.unwrap_or_else(|| format!("image {}", t.index + 1)),
            "emotion": t.emotion,
            "valence": reading.get("valence"),
            "arousal": reading.get("arousal"),
            "state": state,
            "url": t.track_key.as_ref().map(|_| format!("/v1/exhibitions/{id}/tracks/{}", t.index)),
            "duration_ms": t.duration_ms,
            "style": t.style,
            "engine": t.engine,
            "emotion_job": t.emotion_job,
            "bgm_job": t.bgm_job,
            "generations": { "started": t.generations_started, "completed": t.generations_finished },
        }));
    }
    let state = if e.state == "ready" {
        "ready"
    } else if failed || given_up(ready_step) {
        "failed"
    } else {
        "processing"
    };
    Ok(Json(json!({
        "id": e.id,
        "state": state,
        "created_at": homing::time::rfc3339(e.created_at),
        "ready_at": e.ready_at.map(homing::time::rfc3339),
        "workflow": e.workflow,
        "tracks": out,
    })))
}

pub async fn track(
    State(st): State<ApiState>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path((raw, index)) = path?;
    let id = parse_id(&raw, "exhibition")?.to_string();
    let index: u32 = index
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid track index {index:?}")))?;
    let s = st.services().await?;
    let t = s
        .state
        .track(&id, index)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no track {index} in exhibition {id}")))?;
    let key = t
        .track_key
        .ok_or_else(|| ApiError::not_found("this track is not generated yet"))?;
    let wav = s
        .objects
        .get(&key)
        .await?
        .ok_or_else(|| ApiError::not_found("the track file is missing"))?;
    let emotion = t.emotion.unwrap_or_default();
    Ok((
        [
            (header::CONTENT_TYPE, "audio/wav".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"exhibition-{id}-{index}-{emotion}.wav\""),
            ),
        ],
        wav,
    )
        .into_response())
}
