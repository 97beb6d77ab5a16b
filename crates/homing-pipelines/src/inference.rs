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
    // A length over the limit is refused before anything is read; without one (chunked), the
    // body is read only up to the limit. Reading it whole first once let a server that sent
    // without end take the worker's memory.
    let too_large = |sent: String| {
        TaskError::fatal(format!(
            "inference endpoint {shown} sent {sent}; a track may be at most {MAX_TRACK_BYTES} bytes"
        ))
    };
    if let Some(len) = resp
        .content_length()
        .filter(|&l| l > MAX_TRACK_BYTES as u64)
    {
        return Err(too_large(format!("{len} bytes")));
    }
    let mut resp = resp;
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| TaskError::retry(format!("inference endpoint {shown}: {}", e.without_url())))?
    {
        if chunk.len() > MAX_TRACK_BYTES - body.len() {
            return Err(too_large(format!("more than {MAX_TRACK_BYTES} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    if crate::wav::duration_ms(&body).is_none() {
        return Err(TaskError::fatal(format!(
            "inference endpoint {shown} did not answer with a WAV file"
        )));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An endpoint on loopback that answers each request with `body` in chunks of 4 KiB, or
    /// with 1 MiB chunks without end when it is `None`.
    async fn endpoint(body: Option<Vec<u8>>) -> String {
        const HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: audio/wav\r\n\
                            Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut request = vec![0; 64 * 1024];
                let _ = conn.read(&mut request).await;
                let endless = vec![b'x'; 1 << 20];
                let mut chunks: Box<dyn Iterator<Item = &[u8]> + Send> = match &body {
                    Some(b) => Box::new(b.chunks(4096)),
                    None => Box::new(std::iter::repeat(&endless[..])),
                };
                let mut framed = HEAD.as_bytes().to_vec();
                loop {
                    let chunk = chunks.next().unwrap_or_default();
                    framed.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    framed.extend_from_slice(chunk);
                    framed.extend_from_slice(b"\r\n");
                    if conn.write_all(&framed).await.is_err() || chunk.is_empty() {
                        break;
                    }
                    framed.clear();
                }
            }
        });
        format!("http://{addr}/generate")
    }

    async fn ask(url: &str) -> Result<Vec<u8>, TaskError> {
        let emotion = crate::emotion::from_pixels(&[[0.5, 0.5, 0.5]]);
        let style = crate::compose::Style::for_emotion(&emotion);
        homing::tls::install_crypto_provider();
        generate(&reqwest::Client::new(), url, "key", &emotion, &style, 1.0).await
    }

    #[tokio::test]
    async fn an_answer_without_end_is_read_only_to_the_limit() {
        let url = endpoint(None).await;
        let err = tokio::time::timeout(Duration::from_secs(60), ask(&url))
            .await
            .expect("the endpoint never stops sending: the read must stop at the limit")
            .unwrap_err();
        assert!(matches!(err, TaskError::Fatal(_)), "{err:?}");
        assert!(
            err.to_string()
                .contains(&format!("sent more than {MAX_TRACK_BYTES} bytes")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_length_over_the_limit_is_refused_before_reading() {
        // Announces a length over the limit and sends nothing: waiting for the body would hang.
        const HEAD: &str = "HTTP/1.1 200 OK\r\nContent-Type: audio/wav\r\n\
                            Content-Length: 67108865\r\n\r\n";
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/generate", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = vec![0; 64 * 1024];
            let _ = conn.read(&mut request).await;
            conn.write_all(HEAD.as_bytes()).await.unwrap();
            std::future::pending::<()>().await;
        });
        let err = tokio::time::timeout(Duration::from_secs(60), ask(&url))
            .await
            .expect("refused from the announced length, without waiting for the body")
            .unwrap_err();
        assert!(matches!(err, TaskError::Fatal(_)), "{err:?}");
        assert!(err.to_string().contains("sent 67108865 bytes"), "{err}");
    }

    #[tokio::test]
    async fn a_track_in_many_chunks_is_taken_whole() {
        let track = crate::wav::encode(&vec![0.25; 44_100], 44_100);
        let url = endpoint(Some(track.clone())).await;
        assert_eq!(ask(&url).await.unwrap(), track);
    }
}
