//! Track generation by an external inference server (`HOMING_BGM_ENDPOINT`): the seed's GPU
//! service. The job id goes along as `Idempotency-Key`, so a server that remembers keys answers
//! a redelivered job from its cache instead of spending GPU time again.

use std::time::Duration;

use crate::compose::Style;
use crate::emotion::Emotion;
use homing::TaskError;

/// The largest track accepted from the server.
const MAX_TRACK_BYTES: usize = 64 * 1024 * 1024;

/// Asks the endpoint for a WAV track for this emotion.
pub async fn generate(
    http: &reqwest::Client,
    endpoint: &str,
    key: &str,
    emotion: &Emotion,
    style: &Style,
    seconds: f32,
) -> Result<Vec<u8>, TaskError> {
    let url = reqwest::Url::parse(endpoint)
        .map_err(|e| TaskError::fatal(format!("HOMING_BGM_ENDPOINT is not a URL: {e}")))?;
    let shown = format!("{}://{}", url.scheme(), url.host_str().unwrap_or("?"));
    let resp = http
        .post(url)
        .header("Idempotency-Key", key)
        .timeout(Duration::from_secs(300))
        .json(&serde_json::json!({
            "emotion": emotion.emotion,
            "valence": emotion.valence,
            "arousal": emotion.arousal,
            "tempo_bpm": style.tempo_bpm,
            "mode": style.mode,
            "key": style.key,
            "seconds": seconds,
            "format": "wav",
        }))
        .send()
        .await
        .map_err(|e| {
            TaskError::retry(format!("inference endpoint {shown}: {}", e.without_url()))
        })?;
    let status = resp.status();
    if status.is_server_error() || status.as_u16() == 429 {
        return Err(TaskError::retry(format!(
            "inference endpoint {shown} answered {status}"
        )));
    }
    if !status.is_success() {
        return Err(TaskError::fatal(format!(
            "inference endpoint {shown} answered {status}"
        )));
    }
    let body = resp.bytes().await.map_err(|e| {
        TaskError::retry(format!("inference endpoint {shown}: {}", e.without_url()))
    })?;
    if body.len() > MAX_TRACK_BYTES {
        return Err(TaskError::fatal(format!(
            "inference endpoint {shown} sent {} bytes; the limit is {MAX_TRACK_BYTES}",
            body.len()
        )));
    }
    if crate::wav::duration_ms(&body).is_none() {
        return Err(TaskError::fatal(format!(
            "inference endpoint {shown} did not answer with a WAV file"
        )));
    }
    Ok(body.to_vec())
}
