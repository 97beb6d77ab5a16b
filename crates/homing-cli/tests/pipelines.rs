//! The seeds' pipelines end to end, with real processes on real inputs the tests make:
//! PDFs typeset and scanned with real tools, images of clearly different character, worker
//! processes killed with SIGKILL in the middle of generating a track and just after storing it,
//! and a local HTTP server receiving the issuance notification.
//!
//! Inputs are generated with Debian tools: `pango-view` (pango1.0-tools) typesets Korean and
//! English text in NanumGothic (fonts-nanum) into a PDF with a text layer, or into a 300 dpi PNG
//! that `img2pdf` (img2pdf) wraps into an image-only, "scanned" PDF; `pdfunite` (poppler-utils)
//! joins pages. Images are drawn with the `image` crate. A missing tool fails the test with the
//! package to install.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

// ---- tools and inputs

/// Fails (never skips) when a program the test needs is missing, naming its Debian package.
fn need(program: &str, package: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "`{program}` is missing: install the Debian package {package} (apt-get install -y {package}; scripts/test does it when run as root)"
    );
}

fn need_ocr_tools() {
    need("pdfinfo", "poppler-utils");
    need("pdftotext", "poppler-utils");
    need("pdftoppm", "poppler-utils");
    need("pdfunite", "poppler-utils");
    need("tesseract", "tesseract-ocr");
    need("pango-view", "pango1.0-tools");
    need("img2pdf", "img2pdf");
    let langs = Command::new("tesseract")
        .arg("--list-langs")
        .output()
        .expect("tesseract --list-langs");
    let langs = String::from_utf8_lossy(&langs.stdout).to_string()
        + &String::from_utf8_lossy(&langs.stderr);
    for (lang, package) in [("kor", "tesseract-ocr-kor"), ("eng", "tesseract-ocr-eng")] {
        assert!(
            langs.lines().any(|l| l.trim() == lang),
            "Tesseract has no `{lang}` data: install the Debian package {package}"
        );
    }
    let fonts = Command::new("fc-list")
        .output()
        .expect("fc-list (fontconfig)");
    assert!(
        String::from_utf8_lossy(&fonts.stdout).contains("NanumGothic"),
        "the NanumGothic font is missing: install the Debian package fonts-nanum"
    );
}

fn run_tool(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A one-page PDF with a text layer: the words are typeset, not drawn.
fn text_page(dir: &Path, name: &str, text: &str) -> PathBuf {
    let out = dir.join(format!("{name}.pdf"));
    run_tool(
        "pango-view",
        &[
            "-q",
            "--font=NanumGothic 20",
            "--margin=40",
            "-t",
            text,
            "-o",
            out.to_str().unwrap(),
        ],
    );
    out
}

/// A 300 dpi picture of the words, as a scanner would produce.
fn scanned_image(dir: &Path, name: &str, text: &str) -> PathBuf {
    let out = dir.join(format!("{name}.png"));
    run_tool(
        "pango-view",
        &[
            "-q",
            "--font=NanumGothic 28",
            "--dpi=300",
            "--margin=80",
            "-t",
            text,
            "-o",
            out.to_str().unwrap(),
        ],
    );
    out
}

fn unite(dir: &Path, name: &str, pages: &[PathBuf]) -> PathBuf {
    let out = dir.join(format!("{name}.pdf"));
    let mut args: Vec<&str> = pages.iter().map(|p| p.to_str().unwrap()).collect();
    args.push(out.to_str().unwrap());
    run_tool("pdfunite", &args);
    out
}

/// An RGB PNG whose pixel (x, y) (both in 0..=1) is `f(x, y)` in 0..=1.
fn png(f: impl Fn(f32, f32) -> [f32; 3]) -> Vec<u8> {
    let (w, h) = (256u32, 192u32);
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        let c = f(x as f32 / (w - 1) as f32, y as f32 / (h - 1) as f32);
        image::Rgb(c.map(|v| (v.clamp(0.0, 1.0) * 255.0).round() as u8))
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// A dim, grey-blue dusk; a bright, saturated yellow-orange noon; pale pastel mist.
fn three_images() -> [(&'static str, Vec<u8>); 3] {
    [
        (
            "dusk.png",
            png(|x, y| {
                let l = 0.12 + 0.07 * x + 0.02 * y;
                [l, l + 0.01, l + 0.04]
            }),
        ),
        (
            "noon.png",
            png(|x, y| [1.0, 0.55 + 0.45 * y, 0.1 + 0.3 * x]),
        ),
        ("mist.png", png(|x, _| [0.80 + 0.05 * x, 0.88, 0.92])),
    ]
}

// ---- the service

struct Service {
    proc: Proc,
    base: String,
    http: reqwest::Client,
}

impl Service {
    /// Starts `homing <args> --listen 127.0.0.1:0` and reads its address from its log.
    async fn start(env: &Env, name: &str, args: &[&str], vars: &[(&str, &str)]) -> Service {
        let mut all = args.to_vec();
        all.extend(["--listen", "127.0.0.1:0"]);
        let proc = env.spawn_with_env(name, &all, vars);
        let base = eventually(
            Duration::from_secs(30),
            "the server to print its address",
            || {
                let log = proc.log_text();
                async move {
                    let at = log.find("homing is up: http://")?;
                    let rest = &log[at + "homing is up: ".len()..];
                    let end = rest.find('/').map(|i| i + 2)?;
                    let addr_end = rest[end..].find('/')? + end;
                    Some(rest[..addr_end].to_string())
                }
            },
        )
        .await;
        Service {
            proc,
            base,
            http: http_client(),
        }
    }

    async fn get(&self, path: &str) -> Value {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "GET {path}: {}", r.status());
        r.json().await.unwrap()
    }

    async fn bytes(&self, path: &str) -> Vec<u8> {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "GET {path}: {}", r.status());
        r.bytes().await.unwrap().to_vec()
    }

    async fn post(&self, path: &str, form: reqwest::multipart::Form) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .multipart(form)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn issue(&self, pdf: Vec<u8>, callback: Option<&str>) -> Value {
        let mut form = reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(pdf).file_name("document.pdf"),
        );
        if let Some(url) = callback {
            form = form.text("callback_url", url.to_string());
        }
        let (status, body) = self.post("/v1/documents", form).await;
        assert_eq!(status, 201, "issuing a document: {body}");
        body
    }

    async fn exhibition(&self, images: &[(&str, Vec<u8>)]) -> String {
        let mut form = reqwest::multipart::Form::new();
        for (name, bytes) in images {
            form = form.part(
                "images",
                reqwest::multipart::Part::bytes(bytes.clone()).file_name(name.to_string()),
            );
        }
        let (status, body) = self.post("/v1/exhibitions", form).await;
        assert_eq!(status, 201, "creating an exhibition: {body}");
        assert_eq!(body["state"], "processing");
        body["id"].as_str().unwrap().to_string()
    }

    async fn wait_document(&self, id: &str, state: &str, limit: Duration) -> Value {
        eventually(
            limit,
            &format!("document {id} OCR to be {state}"),
            || async {
                let d = self.get(&format!("/v1/documents/{id}")).await;
                (d["ocr_state"] == state).then_some(d)
            },
        )
        .await
    }

    async fn wait_ready(&self, id: &str, limit: Duration) -> Value {
        eventually(limit, &format!("exhibition {id} to be ready"), || async {
            let e = self.get(&format!("/v1/exhibitions/{id}")).await;
            assert_ne!(e["state"], "failed", "the exhibition failed: {e}");
            (e["state"] == "ready").then_some(e)
        })
        .await
    }
}

/// An answer read off a bare connection.
struct Raw {
    status: u16,
    /// The head and the start of the body.
    text: String,
    /// Whether the server ended the connection after answering (only looked at for errors).
    closed: bool,
}

/// Posts a multipart body over a bare connection, with its `Content-Length`, and returns the
/// status and the start of the answer (head and body). A server refusing an upload past its
/// limit answers before the body is all sent, which ordinary HTTP clients report as a broken
/// connection; this one reads while it writes.
async fn post_raw(base: &str, path: &str, parts: &[(&str, &[u8])]) -> (u16, String) {
    let r = send_raw(base, path, parts, false).await;
    (r.status, r.text)
}

/// Like [`post_raw`], with the body sent chunked: no length is declared, so only a limit that
/// counts the bytes as they stream in can stop it.
async fn post_chunked(base: &str, path: &str, parts: &[(&str, &[u8])]) -> Raw {
    send_raw(base, path, parts, true).await
}

/// The declared length of the answer's body, once its head is complete, and where it starts.
fn body_start(answer: &[u8]) -> Option<(usize, usize)> {
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())?;
    Some((end, length))
}

async fn send_raw(base: &str, path: &str, parts: &[(&str, &[u8])], chunked: bool) -> Raw {
    let mut body = Vec::new();
    let boundary = "homing-test-boundary";
    for (name, bytes) in parts {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"f\"\r\n\
                 Content-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    let length = if chunked {
        "Transfer-Encoding: chunked".to_string()
    } else {
        format!("Content-Length: {}", body.len())
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\n\
         Content-Type: multipart/form-data; boundary={boundary}\r\n{length}\r\n\r\n",
        base.trim_start_matches("http://")
    );
    exchange(base, head.into_bytes(), body, chunked).await
}

/// Sends a request head and body (chunked or as is) on a fresh keep-alive connection, reads the
/// whole answer while writing, then whether the server closes the connection.
async fn exchange(base: &str, head: Vec<u8>, body: Vec<u8>, chunked: bool) -> Raw {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://").to_string();
    let stream = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        wr.write_all(&head).await?;
        if chunked {
            for piece in body.chunks(64 * 1024) {
                wr.write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                    .await?;
                wr.write_all(piece).await?;
                wr.write_all(b"\r\n").await?;
            }
            wr.write_all(b"0\r\n\r\n").await?;
        } else {
            wr.write_all(&body).await?;
        }
        // Keep the connection open for writing: whether it closes is the server's call.
        std::future::pending::<()>().await;
        std::io::Result::Ok(())
    });
    let mut answer = Vec::new();
    let mut chunk = [0u8; 64 * 1024];
    let mut eof = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Some((start, length)) = body_start(&answer) {
            if answer.len() >= start + length {
                break;
            }
        }
        match tokio::time::timeout(Duration::from_secs(30), rd.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&chunk[..n]),
            Ok(_) => {
                eof = true;
                break;
            }
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let closed = eof
        || (status >= 400
            && matches!(
                tokio::time::timeout(Duration::from_secs(15), rd.read(&mut chunk)).await,
                Ok(Ok(0) | Err(_))
            ));
    writer.abort();
    Raw {
        status,
        text,
        closed,
    }
}

/// The JSON body of a raw answer.
fn raw_json(answer: &str) -> Value {
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("a JSON body ({e}): {answer}"))
}

/// Whether a raw answer tells the client the connection ends with it.
fn closes(answer: &str) -> bool {
    let head = answer
        .split_once("\r\n\r\n")
        .map(|(h, _)| h)
        .unwrap_or(answer);
    head.lines()
        .any(|l| l.trim().eq_ignore_ascii_case("connection: close"))
}

// ---- audio analysis

/// The samples of a 16-bit mono PCM WAV file.
fn wav_samples(wav: &[u8]) -> (u32, Vec<f32>) {
    assert_eq!(&wav[0..4], b"RIFF", "a WAV file");
    assert_eq!(&wav[8..12], b"WAVE", "a WAV file");
    let mut pos = 12;
    let mut rate = 0;
    while pos + 8 <= wav.len() {
        let len = u32::from_le_bytes(wav[pos + 4..pos + 8].try_into().unwrap()) as usize;
        let body = &wav[pos + 8..(pos + 8 + len).min(wav.len())];
        match &wav[pos..pos + 4] {
            b"fmt " => {
                assert_eq!(u16::from_le_bytes([body[0], body[1]]), 1, "PCM");
                assert_eq!(u16::from_le_bytes([body[2], body[3]]), 1, "mono");
                rate = u32::from_le_bytes(body[4..8].try_into().unwrap());
                assert_eq!(u16::from_le_bytes([body[14], body[15]]), 16, "16-bit");
            }
            b"data" => {
                let s = body
                    .chunks_exact(2)
                    .map(|c| i16::from_le_bytes([c[0], c[1]]) as f32 / 32768.0)
                    .collect();
                return (rate, s);
            }
            _ => {}
        }
        pos += 8 + len + (len & 1);
    }
    panic!("no data chunk");
}

/// The beat of a track in beats per minute, from the audio alone: the loudness envelope's
/// rises (onsets), smoothed, and the shortest period at which they repeat strongly.
fn measured_tempo(wav: &[u8]) -> f32 {
    let (rate, s) = wav_samples(wav);
    let hop = (rate / 100) as usize; // 10 ms frames
    let env: Vec<f32> = s
        .chunks_exact(hop)
        .map(|c| (c.iter().map(|x| x * x).sum::<f32>() / hop as f32).sqrt())
        .collect();
    let flux: Vec<f32> = env.windows(2).map(|w| (w[1] - w[0]).max(0.0)).collect();
    let smooth: Vec<f32> = flux
        .windows(3)
        .map(|w| (w[0] + 2.0 * w[1] + w[2]) / 4.0)
        .collect();
    let mean = smooth.iter().sum::<f32>() / smooth.len() as f32;
    let x: Vec<f32> = smooth.iter().map(|v| v - mean).collect();
    // Periods from 0.25 s to 1.1 s: 55 to 240 beats per minute.
    let ac: Vec<(usize, f32)> = (25..=110)
        .map(|lag| {
            let n = x.len() - lag;
            (
                lag,
                (0..n).map(|i| x[i] * x[i + lag]).sum::<f32>() / n as f32,
            )
        })
        .collect();
    let best = ac.iter().map(|(_, v)| *v).fold(f32::MIN, f32::max);
    let lag = ac
        .iter()
        .find(|(_, v)| *v >= 0.85 * best)
        .map(|(l, _)| *l)
        .unwrap();
    6000.0 / lag as f32
}

// ---- pipeline records

/// The exhibition's workflow once it is ready: it succeeded, and its `ready` step — the one
/// job that marks the exhibition ready — committed once, after the three bgm steps committed,
/// seeing each of them succeeded. Returns the ready step's job.
async fn ready_once(env: &Env, svc: &Service, exhibition: &str) -> homing::Job {
    let e = svc.get(&format!("/v1/exhibitions/{exhibition}")).await;
    assert_eq!(e["state"], "ready", "{e}");
    let wf: homing::workflow::WorkflowId = e["workflow"].as_str().unwrap().parse().unwrap();
    let client = env.client().await;
    let wf = client.workflow(wf).await.unwrap();
    assert_eq!(
        wf.state,
        homing::workflow::WorkflowState::Succeeded,
        "{wf:?}"
    );
    assert_eq!(wf.steps.len(), 7, "3 emotion, 3 bgm, ready: {wf:?}");
    let ready = client.get(wf.steps["ready"].job).await.unwrap();
    assert_eq!(ready.state, homing::JobState::Succeeded, "{ready:?}");
    let parents = ready.parents.clone().unwrap_or_default();
    assert_eq!(parents.len(), 3, "{ready:?}");
    for (i, t) in e["tracks"].as_array().unwrap().iter().enumerate() {
        let bgm = client
            .get(t["bgm_job"].as_str().unwrap().parse().unwrap())
            .await
            .unwrap();
        assert_eq!(bgm.id, wf.steps[&format!("bgm-{i}")].job);
        assert_eq!(
            parents[&format!("bgm-{i}")].state,
            homing::JobState::Succeeded
        );
        assert!(
            ready.started_at.unwrap() >= bgm.finished_at.unwrap(),
            "ready started after track {i}'s job finished: {ready:?} {bgm:?}"
        );
    }
    ready
}

fn generations(track: &Value) -> (u64, u64) {
    (
        track["generations"]["started"].as_u64().unwrap(),
        track["generations"]["completed"].as_u64().unwrap(),
    )
}

// ---- tests

/// A text PDF gives its text directly and a scanned one is recognised by Tesseract, in Korean
/// and English, pages in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_and_scanned_pdfs_come_back_as_text_in_page_order() {
    need_ocr_tools();
    let env = Env::sqlite();
    let dir = env.path().join("inputs");
    std::fs::create_dir_all(&dir).unwrap();
    let text_pdf = unite(
        &dir,
        "text",
        &[
            text_page(&dir, "t1", "첫째 페이지 발급 문서 HOMING invoice"),
            text_page(&dir, "t2", "둘째 페이지 영수증 확인 RECEIPT total"),
        ],
    );
    let scan_pages: Vec<PathBuf> = [("s1", "발급 문서 HOMING"), ("s2", "결과 보고서 REPORT")]
        .iter()
        .map(|(n, t)| scanned_image(&dir, n, t))
        .collect();
    let scanned_pdf = dir.join("scanned.pdf");
    let mut args: Vec<&str> = scan_pages.iter().map(|p| p.to_str().unwrap()).collect();
    // The scan is 300 dpi; without saying so img2pdf assumes 96 and makes a poster-sized page.
    args.extend([
        "--imgsize",
        "300dpix300dpi",
        "-o",
        scanned_pdf.to_str().unwrap(),
    ]);
    run_tool("img2pdf", &args);
    let layer = Command::new("pdftotext")
        .args([scanned_pdf.to_str().unwrap(), "-"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&layer.stdout).trim().is_empty(),
        "the scanned PDF must have no text layer"
    );

    let svc = Service::start(&env, "up", &["up"], &[]).await;
    let text_doc = svc.issue(std::fs::read(&text_pdf).unwrap(), None).await;
    let scan_doc = svc.issue(std::fs::read(&scanned_pdf).unwrap(), None).await;
    assert!(text_doc["ocr_job"].is_string());

    let d = svc
        .wait_document(
            text_doc["id"].as_str().unwrap(),
            "succeeded",
            Duration::from_secs(120),
        )
        .await;
    let text = d["text"].as_str().unwrap();
    assert_eq!(d["methods"], serde_json::json!(["text", "text"]), "{d}");
    // A text layer is not recognised, so it has no confidence and is never flagged.
    assert_eq!(d["page_confidence"], serde_json::json!([null, null]), "{d}");
    assert_eq!(d["low_confidence_pages"], serde_json::json!([]), "{d}");
    for w in [
        "첫째",
        "발급",
        "문서",
        "HOMING",
        "invoice",
        "둘째",
        "영수증",
        "RECEIPT",
    ] {
        assert!(text.contains(w), "{w:?} missing from the text: {text:?}");
    }
    assert!(
        text.find("첫째").unwrap() < text.find("둘째").unwrap(),
        "page order: {text:?}"
    );

    let d = svc
        .wait_document(
            scan_doc["id"].as_str().unwrap(),
            "succeeded",
            Duration::from_secs(180),
        )
        .await;
    let text = d["text"].as_str().unwrap();
    assert_eq!(d["methods"], serde_json::json!(["ocr", "ocr"]), "{d}");
    // Both scans read cleanly: a confidence per page, none below the threshold.
    let confidences = d["page_confidence"].as_array().expect("page_confidence");
    assert_eq!(confidences.len(), 2, "{d}");
    assert!(
        confidences.iter().all(|c| c
            .as_f64()
            .is_some_and(|c| c >= f64::from(homing_pipelines::ocr::LOW_CONFIDENCE))),
        "{d}"
    );
    assert_eq!(d["low_confidence_pages"], serde_json::json!([]), "{d}");
    for w in ["발급", "문서", "HOMING", "결과", "보고서", "REPORT"] {
        assert!(text.contains(w), "{w:?} not recognised: {text:?}");
    }
    assert!(
        text.find("HOMING").unwrap() < text.find("REPORT").unwrap(),
        "page order: {text:?}"
    );
    assert_eq!(d["state"], "issued");
    // The notification is a follow-up job of its own: it may run a moment after the OCR job.
    let id = scan_doc["id"].as_str().unwrap();
    let d = eventually(Duration::from_secs(60), "the notification", || async {
        let d = svc.get(&format!("/v1/documents/{id}")).await;
        (!d["notifications"][0].is_null()).then_some(d)
    })
    .await;
    assert_eq!(d["notifications"][0]["status"], "SUCCESS");
    drop(svc);
}

/// Uploads are checked before anything is stored: clear 4xx answers, 413 over the limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_get_clear_client_errors() {
    let env = Env::sqlite();
    let svc = Service::start(&env, "up", &["up"], &[]).await;
    let part = |name: &str, bytes: Vec<u8>| {
        reqwest::multipart::Form::new().part(
            name.to_string(),
            reqwest::multipart::Part::bytes(bytes).file_name("x"),
        )
    };
    let (s, b) = svc
        .post("/v1/documents", part("file", b"hello, not a pdf".to_vec()))
        .await;
    assert_eq!(s, 415, "{b}");
    assert_eq!(b["error"]["code"], "unsupported_media_type");
    let (s, b) = svc
        .post("/v1/documents", part("document", b"%PDF-1.4".to_vec()))
        .await;
    assert_eq!(s, 400, "{b}");
    let mut big = b"%PDF-1.4\n".to_vec();
    big.resize(21 * 1024 * 1024, b'x');
    let (s, b) = post_raw(&svc.base, "/v1/documents", &[("file", &big)]).await;
    assert_eq!(s, 413, "{b}");
    assert!(b.contains("payload_too_large"), "{b}");
    let form = reqwest::multipart::Form::new()
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"%PDF-1.4".to_vec()),
        )
        .text("callback_url", "file:///etc/passwd");
    let (s, _) = svc.post("/v1/documents", form).await;
    assert_eq!(s, 400);

    let images = three_images();
    let two = reqwest::multipart::Form::new()
        .part(
            "images",
            reqwest::multipart::Part::bytes(images[0].1.clone()),
        )
        .part(
            "images",
            reqwest::multipart::Part::bytes(images[1].1.clone()),
        );
    let (s, b) = svc.post("/v1/exhibitions", two).await;
    assert_eq!(s, 400, "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exactly 3"),
        "{b}"
    );
    let mut four = reqwest::multipart::Form::new();
    for _ in 0..4 {
        four = four.part(
            "images",
            reqwest::multipart::Part::bytes(images[0].1.clone()),
        );
    }
    assert_eq!(svc.post("/v1/exhibitions", four).await.0, 400);
    let not_image = reqwest::multipart::Form::new()
        .part(
            "images",
            reqwest::multipart::Part::bytes(images[0].1.clone()),
        )
        .part(
            "images",
            reqwest::multipart::Part::bytes(b"GIF89a".to_vec()),
        )
        .part(
            "images",
            reqwest::multipart::Part::bytes(images[2].1.clone()),
        );
    assert_eq!(svc.post("/v1/exhibitions", not_image).await.0, 415);
    let mut huge = images[0].1.clone();
    huge.resize(11 * 1024 * 1024, 0);
    let (s, b) = post_raw(
        &svc.base,
        "/v1/exhibitions",
        &[
            ("images", &huge),
            ("images", &images[1].1),
            ("images", &images[2].1),
        ],
    )
    .await;
    assert_eq!(s, 413, "{b}");
    let r = http_client()
        .get(format!("{}/v1/documents/not-an-id", svc.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let r = http_client()
        .get(format!(
            "{}/v1/exhibitions/{}",
            svc.base,
            homing::job::new_job_id()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
}

/// Random RGB noise as a PNG: incompressible, so the file is about `3 * w * h` bytes.
fn noise_png(w: u32, h: u32, seed: u64) -> Vec<u8> {
    let mut img = image::RgbImage::new(w, h);
    fastrand::Rng::with_seed(seed).fill(&mut img);
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

/// A request head that declares a body of `length` bytes, sent without the body: for limits the
/// server must apply before reading anything.
async fn declared_only(base: &str, path: &str, content_type: &str, length: usize) -> Raw {
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: {content_type}\r\n\
         Content-Length: {length}\r\n\r\n",
        base.trim_start_matches("http://")
    );
    exchange(base, head.into_bytes(), Vec::new(), false).await
}

fn assert_too_large(r: &Raw, what: &str) {
    assert_eq!(r.status, 413, "{what}: {}", r.text);
    assert_eq!(
        raw_json(&r.text)["error"]["code"],
        "payload_too_large",
        "{what}: {}",
        r.text
    );
    assert!(
        closes(&r.text),
        "{what}: a 413 says `connection: close`: {}",
        r.text
    );
    assert!(
        r.closed,
        "{what}: the server closes the connection after a 413"
    );
}

/// Each upload route has its own limit, whether the body's length is declared or streamed
/// (chunked): real multi-MiB PDFs and images are accepted up to 20 MiB per PDF and 10 MiB per
/// image, one byte more is a 413 with the JSON error, and the JSON routes keep their 2 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_upload_route_takes_uploads_up_to_its_own_limit() {
    need("img2pdf", "img2pdf");
    const MIB: usize = 1024 * 1024;
    let env = Env::sqlite();
    let svc = Service::start(&env, "up", &["up"], &[]).await;

    // A real PDF of several MiB: a noisy 1200x1000 scan wrapped by img2pdf.
    let scan = env.path().join("noise.png");
    std::fs::write(&scan, noise_png(1200, 1000, 7)).unwrap();
    let pdf_path = env.path().join("noise.pdf");
    run_tool(
        "img2pdf",
        &[scan.to_str().unwrap(), "-o", pdf_path.to_str().unwrap()],
    );
    let pdf = std::fs::read(&pdf_path).unwrap();
    assert!(pdf.len() > 3 * MIB, "a multi-MiB PDF: {} bytes", pdf.len());
    let doc = svc.issue(pdf.clone(), None).await;
    let id = doc["id"].as_str().unwrap();
    assert_eq!(svc.bytes(&format!("/v1/documents/{id}/file")).await, pdf);
    let r = post_chunked(&svc.base, "/v1/documents", &[("file", &pdf)]).await;
    assert_eq!(
        r.status, 201,
        "the same PDF, streamed without a length: {}",
        r.text
    );

    // Exactly at the PDF limit is accepted; one byte more is refused, declared or streamed.
    let mut at_limit = b"%PDF-1.4\n".to_vec();
    at_limit.resize(20 * MIB, b' ');
    let doc = svc.issue(at_limit.clone(), None).await;
    assert!(doc["id"].is_string(), "{doc}");
    let mut over = at_limit;
    over.push(b' ');
    let declared = send_raw(&svc.base, "/v1/documents", &[("file", &over)], false).await;
    assert_too_large(&declared, "a PDF one byte over, with its length");
    let streamed = post_chunked(&svc.base, "/v1/documents", &[("file", &over)]).await;
    assert_too_large(&streamed, "a PDF one byte over, streamed");
    let whole = declared_only(
        &svc.base,
        "/v1/documents",
        "multipart/form-data; boundary=x",
        20 * MIB + 64 * 1024 + 1,
    )
    .await;
    assert_too_large(&whole, "a document body declared over the route's limit");

    // Three real images of almost 10 MiB each are one exhibition, read like any other.
    let images: Vec<(String, Vec<u8>)> = (0..3)
        .map(|i| (format!("noise-{i}.png"), noise_png(1800, 1800, 100 + i)))
        .collect();
    for (name, bytes) in &images {
        assert!(
            bytes.len() > 9 * MIB && bytes.len() <= 10 * MIB,
            "{name}: {} bytes",
            bytes.len()
        );
    }
    let named: Vec<(&str, Vec<u8>)> = images
        .iter()
        .map(|(n, b)| (n.as_str(), b.clone()))
        .collect();
    let exhibition = svc.exhibition(&named).await;
    eventually(
        Duration::from_secs(120),
        "the large images' emotions to be read",
        || async {
            let e = svc.get(&format!("/v1/exhibitions/{exhibition}")).await;
            assert_ne!(e["state"], "failed", "{e}");
            e["tracks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|t| t["emotion"].is_string())
                .then_some(())
        },
    )
    .await;
    let parts: Vec<(&str, &[u8])> = images
        .iter()
        .map(|(_, b)| ("images", b.as_slice()))
        .collect();
    let r = post_chunked(&svc.base, "/v1/exhibitions", &parts).await;
    assert_eq!(r.status, 201, "the same images, streamed: {}", r.text);

    // An image one byte over its limit is refused, declared or streamed.
    let mut big = images[0].1.clone();
    big.resize(10 * MIB + 1, 0);
    let over = [
        ("images", big.as_slice()),
        ("images", images[1].1.as_slice()),
        ("images", images[2].1.as_slice()),
    ];
    let declared = send_raw(&svc.base, "/v1/exhibitions", &over, false).await;
    assert_too_large(&declared, "an image one byte over, with its length");
    let streamed = post_chunked(&svc.base, "/v1/exhibitions", &over).await;
    assert_too_large(&streamed, "an image one byte over, streamed");

    // The job API keeps its own 2 MiB limit, declared or streamed.
    let jobs = declared_only(&svc.base, "/v1/jobs", "application/json", 2 * MIB + 1).await;
    assert_too_large(&jobs, "a job body declared one byte over 2 MiB");
    let mut json = format!(
        "{{\"task\": \"builtin.noop\", \"args\": \"{}",
        "x".repeat(2 * MIB)
    );
    json.push_str("\"}");
    let head = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n",
        svc.base.trim_start_matches("http://")
    );
    let streamed = exchange(&svc.base, head.into_bytes(), json.into_bytes(), true).await;
    assert_eq!(
        streamed.status, 413,
        "a job body streamed past 2 MiB: {}",
        streamed.text
    );
    assert_eq!(
        raw_json(&streamed.text)["error"]["code"],
        "payload_too_large"
    );
    // Still serving.
    let e = svc.get(&format!("/v1/exhibitions/{exhibition}")).await;
    assert_eq!(e["id"], exhibition.as_str());
}

/// An image that passes the upload check (a PNG signature) but cannot be decoded fails its
/// emotion job on the first attempt with the reason, and the exhibition shows it failed: no
/// retries spent on bytes that will never decode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_image_fails_its_emotion_job_at_once() {
    let env = Env::sqlite();
    let svc = Service::start(&env, "up", &["up"], &[]).await;
    let [dusk, noon, _] = three_images();
    let mut broken = b"\x89PNG\r\n\x1a\n".to_vec();
    broken.extend_from_slice(b"not the rest of a PNG file");
    let id = svc.exhibition(&[dusk, noon, ("broken.png", broken)]).await;
    let e = eventually(
        Duration::from_secs(120),
        "the exhibition to fail",
        || async {
            let e = svc.get(&format!("/v1/exhibitions/{id}")).await;
            (e["state"] == "failed").then_some(e)
        },
    )
    .await;
    let track = &e["tracks"][2];
    assert_eq!(track["state"], "failed", "{e}");
    let job: homing::JobId = track["emotion_job"].as_str().unwrap().parse().unwrap();
    let client = env.client().await;
    let job = client.get(job).await.unwrap();
    assert_eq!(job.state, homing::JobState::Failed, "{job:?}");
    assert_eq!(job.attempts, 1, "failed on its first attempt: {job:?}");
    // The workflow cancels what depended on the failed step: that track's bgm step and the
    // ready step, so the exhibition is never marked ready and nothing waits forever.
    let wf: homing::workflow::WorkflowId = e["workflow"].as_str().unwrap().parse().unwrap();
    let wf = eventually(Duration::from_secs(120), "the workflow to end", || async {
        let wf = client.workflow(wf).await.unwrap();
        (wf.state != homing::workflow::WorkflowState::Running).then_some(wf)
    })
    .await;
    assert_eq!(wf.state, homing::workflow::WorkflowState::Failed, "{wf:?}");
    assert_eq!(
        wf.steps["bgm-2"].state,
        homing::JobState::Cancelled,
        "{wf:?}"
    );
    assert_eq!(
        wf.steps["ready"].state,
        homing::JobState::Cancelled,
        "{wf:?}"
    );
    assert_eq!(
        track["bgm_job"].as_str(),
        Some(wf.steps["bgm-2"].job.to_string().as_str())
    );
    let e = svc.get(&format!("/v1/exhibitions/{id}")).await;
    assert_eq!(e["state"], "failed", "{e}");
    assert_eq!(e["ready_at"], Value::Null, "{e}");
    assert!(
        job.error
            .as_deref()
            .unwrap_or("")
            .contains("cannot read the image"),
        "{job:?}"
    );
}

/// A track job for an exhibition that does not exist (a producer's typo, an exhibition gone)
/// fails at once with the reason. It used to compose a track, store it where nothing referred
/// to it, and succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_track_job_for_no_such_exhibition_fails_before_composing() {
    let env = Env::sqlite();
    let _svc = Service::start(&env, "up", &["up"], &[]).await;
    let emotion = serde_json::json!({
        "emotion": "calm", "valence": 0.4, "arousal": -0.3, "brightness": 0.6,
        "saturation": 0.4, "contrast": 0.1, "warmth": 0.1, "hue": 200.0
    });
    let client = env.client().await;
    let id = client
        .enqueue(homing::EnqueueRequest::new(
            "exhibition.bgm",
            serde_json::json!({"exhibition": "no-such-exhibition", "index": 0,
                               "parent": {"result": emotion}}),
        ))
        .await
        .unwrap()
        .id;
    let job = wait_all_terminal(&client, &[id], Duration::from_secs(120))
        .await
        .remove(0);
    assert_eq!(job.state, homing::JobState::Failed, "{job:?}");
    assert_eq!(job.attempts, 1, "{job:?}");
    assert!(
        job.error
            .as_deref()
            .unwrap_or("")
            .contains("no such exhibition track"),
        "{job:?}"
    );
}

/// Images of different character get different emotions, and tracks whose tempo — measured
/// from the audio — follows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_image_gets_its_emotion_and_a_track_that_sounds_like_it() {
    let env = Env::sqlite();
    let svc = Service::start(&env, "up", &["up"], &[]).await;
    let id = svc.exhibition(&three_images()).await;
    let e = svc.wait_ready(&id, Duration::from_secs(180)).await;
    let tracks = e["tracks"].as_array().unwrap();
    let emotions: Vec<&str> = tracks
        .iter()
        .map(|t| t["emotion"].as_str().unwrap())
        .collect();
    assert_eq!(emotions, ["melancholic", "joyful", "calm"], "{e}");
    assert_eq!(tracks[0]["image"], "dusk.png");
    assert_eq!(tracks[0]["style"]["mode"], "minor");
    assert_eq!(tracks[1]["style"]["mode"], "major");

    let mut tempos = Vec::new();
    for t in tracks {
        assert_eq!(generations(t), (1, 1), "one generation per track: {t}");
        let wav = svc.bytes(t["url"].as_str().unwrap()).await;
        let (rate, samples) = wav_samples(&wav);
        assert!(
            samples.len() as f32 / rate as f32 >= 5.0,
            "several seconds of audio"
        );
        let tempo = measured_tempo(&wav);
        let planned = t["style"]["tempo_bpm"].as_f64().unwrap() as f32;
        assert!(
            (tempo - planned).abs() / planned < 0.08,
            "track {}: measured {tempo:.1} bpm, composed at {planned:.1}",
            t["index"]
        );
        tempos.push(tempo);
    }
    assert!(
        tempos[1] > 1.3 * tempos[0],
        "the joyful track must be audibly faster than the melancholic one: {tempos:?}"
    );
    ready_once(&env, &svc, &id).await;
}

/// Starts a server (rescuer every 200 ms) and an emotion worker for the crash tests.
async fn crash_setup(env: &Env) -> (Service, Proc) {
    let svc = Service::start(
        env,
        "server",
        &["server", "--rescue-interval", "200ms"],
        &[],
    )
    .await;
    let emotions = env.worker("emotion", "emotion", &["--concurrency", "2"]);
    (svc, emotions)
}

fn bgm_worker(env: &Env, name: &str, vars: &[(&str, &str)]) -> Proc {
    env.spawn_with_env(
        name,
        &[
            "worker",
            "--queue",
            "bgm",
            "--concurrency",
            "1",
            "--prefetch",
            "1",
            "--heartbeat-interval",
            "200ms",
        ],
        vars,
    )
}

/// kill -9 in the middle of generating a track: the track is generated once more at most,
/// and the exhibition becomes ready exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_generation_generates_the_track_once_more_at_most() {
    let env = Env::sqlite();
    let (svc, _emotions) = crash_setup(&env).await;
    let mut w1 = bgm_worker(&env, "bgm-1", &[]);
    let id = svc.exhibition(&three_images()).await;

    let victim = eventually(
        Duration::from_secs(60),
        "a generation in progress",
        || async {
            let e = svc.get(&format!("/v1/exhibitions/{id}")).await;
            e["tracks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| generations(t) == (1, 0))
                .map(|t| t["index"].as_u64().unwrap())
        },
    )
    .await;
    w1.kill9();
    let killed_at = Instant::now();
    let _w2 = bgm_worker(&env, "bgm-2", &[]);

    let e = svc.wait_ready(&id, Duration::from_secs(180)).await;
    for t in e["tracks"].as_array().unwrap() {
        let (started, completed) = generations(t);
        assert_eq!(completed, 1, "each track stored once: {t}");
        if t["index"].as_u64() == Some(victim) {
            assert_eq!(
                started, 2,
                "the interrupted track is generated once more: {t}"
            );
            let job: homing::JobId = t["bgm_job"].as_str().unwrap().parse().unwrap();
            let job = env.client().await.get(job).await.unwrap();
            assert_eq!(job.state, homing::JobState::Succeeded);
            assert_eq!(job.crashes, 1, "{job:?}");
            assert_eq!(job.attempts, 0, "a crash spends no retry");
        } else {
            assert_eq!(started, 1, "other tracks are generated once: {t}");
        }
    }
    ready_once(&env, &svc, &id).await;
    eprintln!("recovered {:?} after the kill", killed_at.elapsed());
}

/// kill -9 after the track was stored but before the job committed: the redelivered job finds
/// the track and does not generate it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_track_stored_before_the_crash_is_not_generated_again() {
    let env = Env::sqlite();
    let (svc, _emotions) = crash_setup(&env).await;
    let mut w1 = bgm_worker(
        &env,
        "bgm-1",
        &[("HOMING_TEST_BGM_PAUSE_AFTER_STORE", "60s")],
    );
    let id = svc.exhibition(&three_images()).await;

    let victim = eventually(
        Duration::from_secs(60),
        "a track stored, its job not yet committed",
        || async {
            let e = svc.get(&format!("/v1/exhibitions/{id}")).await;
            e["tracks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| generations(t) == (1, 1))
                .map(|t| t["bgm_job"].as_str().unwrap().to_string())
        },
    )
    .await;
    let client = env.client().await;
    let job_id: homing::JobId = victim.parse().unwrap();
    assert_eq!(
        client.get(job_id).await.unwrap().state,
        homing::JobState::Running,
        "the job is paused after storing, before its commit"
    );
    w1.kill9();
    let w2 = bgm_worker(&env, "bgm-2", &[]);

    let e = svc.wait_ready(&id, Duration::from_secs(180)).await;
    for t in e["tracks"].as_array().unwrap() {
        assert_eq!(generations(t), (1, 1), "no track generated twice: {t}");
    }
    let job = client.get(job_id).await.unwrap();
    assert_eq!(job.state, homing::JobState::Succeeded);
    assert_eq!(job.crashes, 1);
    assert_eq!(job.result.as_ref().unwrap()["generated"], false, "{job:?}");
    w2.wait_log("not generating it again").await;
    ready_once(&env, &svc, &id).await;
}

/// A local HTTP server that records every notification it receives.
#[derive(Clone, Default)]
struct Inbox(Arc<Mutex<Vec<Received>>>);

/// A notification as received: its `Idempotency-Key` header and its JSON body.
type Received = (Option<String>, Value);

impl Inbox {
    async fn start() -> (Inbox, String) {
        use axum::http::HeaderMap;
        let inbox = Inbox::default();
        let keep = inbox.clone();
        let app = axum::Router::new().route(
            "/hooks/issued",
            axum::routing::post(move |headers: HeaderMap, body: axum::Json<Value>| {
                let keep = keep.clone();
                async move {
                    let key = headers
                        .get("idempotency-key")
                        .and_then(|v| v.to_str().ok())
                        .map(String::from);
                    keep.0.lock().unwrap().push((key, body.0));
                    "ok"
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/hooks/issued?token=secret",
            listener.local_addr().unwrap()
        );
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        (inbox, url)
    }

    fn received(&self) -> Vec<Received> {
        self.0.lock().unwrap().clone()
    }
}

/// Waits for exactly one SUCCESS notification of `id` and checks it, giving a duplicate every
/// chance to arrive first.
async fn one_success_notification(svc: &Service, inbox: &Inbox, id: &str, ocr_state: &str) {
    eventually(Duration::from_secs(30), "the notification", || async {
        (!inbox.received().is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let got = inbox.received();
    assert_eq!(got.len(), 1, "exactly one notification: {got:?}");
    let (key, body) = &got[0];
    assert!(key.is_some(), "sent with an Idempotency-Key");
    assert_eq!(body["status"], "SUCCESS");
    assert_eq!(body["ocr_state"], ocr_state);
    assert_eq!(body["document"], id);
    let d = svc.get(&format!("/v1/documents/{id}")).await;
    assert_eq!(d["notifications"].as_array().unwrap().len(), 1);
    assert!(
        !svc.proc.log_text().contains("token=secret"),
        "callback URLs are never logged in full"
    );
}

/// A file poppler cannot read fails the same way every time: the OCR job fails on its first
/// attempt with the reason — not after its retries, which are set 10 minutes apart here — the
/// document stays issued, and exactly one SUCCESS notification arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_pdf_fails_at_once_and_still_notifies_success_once() {
    need("pdfinfo", "poppler-utils");
    let env = Env::sqlite();
    let (inbox, hook) = Inbox::start().await;
    let svc = Service::start(&env, "up", &["up"], &[("HOMING_OCR_RETRY_DELAY", "10m")]).await;
    let broken = b"%PDF-1.7\n1 0 obj << /Type /Catalog >> this is not a PDF body\n".to_vec();
    let doc = svc.issue(broken, Some(&hook)).await;
    let id = doc["id"].as_str().unwrap();

    let d = svc
        .wait_document(id, "failed", Duration::from_secs(120))
        .await;
    assert_eq!(d["state"], "issued", "OCR failure does not undo issuance");
    assert_eq!(d["ocr_attempts"], 1, "failed on its first attempt: {d}");
    assert!(d["text"].is_null());
    let error = d["ocr_error"].as_str().unwrap_or("");
    assert!(error.contains("pdfinfo"), "the reason is given: {d}");
    one_success_notification(&svc, &inbox, id, "failed").await;
}

/// A failure of this machine, not of the file (here the object store cannot open the PDF: its
/// file became a symbolic-link loop) is retried: the OCR job fails after 2 retries the configured
/// delay apart, the document stays issued, and exactly one SUCCESS notification arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ocr_failing_for_a_transient_reason_is_retried_and_still_notifies_success_once() {
    let env = Env::sqlite();
    let (inbox, hook) = Inbox::start().await;
    // No worker yet: the PDF is broken on disk before its job first runs.
    let svc = Service::start(
        &env,
        "server",
        &["server"],
        &[("HOMING_OCR_RETRY_DELAY", "1s")],
    )
    .await;
    let doc = svc.issue(b"%PDF-1.4\n".to_vec(), Some(&hook)).await;
    let id = doc["id"].as_str().unwrap();
    let object = env.path().join(format!("objects/documents/{id}.pdf"));
    assert!(
        object.is_file(),
        "the PDF is stored at {}",
        object.display()
    );
    std::fs::remove_file(&object).unwrap();
    std::os::unix::fs::symlink(&object, &object).unwrap();
    let _worker = env.worker("worker", "ocr", &["--queue", "default"]);

    let d = svc
        .wait_document(id, "failed", Duration::from_secs(90))
        .await;
    assert_eq!(d["state"], "issued", "OCR failure does not undo issuance");
    assert_eq!(d["ocr_attempts"], 3, "the first run and 2 retries: {d}");
    assert!(d["text"].is_null());
    let job: homing::JobId = d["ocr_job"].as_str().unwrap().parse().unwrap();
    let job = env.client().await.get(job).await.unwrap();
    let took = Duration::from_micros((job.finished_at.unwrap() - job.created_at) as u64);
    assert!(
        took >= Duration::from_secs(2),
        "2 retries 1 s apart take at least 2 s, took {took:?}"
    );
    assert!(
        !job.error.as_deref().unwrap_or("").starts_with("fatal"),
        "{job:?}"
    );
    one_success_notification(&svc, &inbox, id, "failed").await;
}
