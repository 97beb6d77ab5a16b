//! The pipelines' own records — documents, exhibitions, tracks, generations — in a small SQLite
//! file beside homing's database. homing's job records stay the truth about job states; this
//! file holds what the jobs produce (extracted text, emotions, track addresses). Nothing here
//! has to decide anything exactly once: an exhibition becomes ready in its workflow's `ready`
//! step, which homing makes runnable once, after the three tracks' jobs succeeded.
//!
//! The file is shared by the server and worker processes of one machine (WAL mode, a busy
//! timeout); every call runs on the blocking pool so a slow disk never stalls the runtime.

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use std::path::Path;
use std::sync::{Arc, Mutex};

use homing::time::now;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS documents (
    id           TEXT PRIMARY KEY,
    filename     TEXT,
    size         INTEGER NOT NULL,
    object_key   TEXT NOT NULL,
    callback_url TEXT,
    ocr_job      TEXT,
    text         TEXT,
    pages        INTEGER,
    methods      TEXT,
    -- per page: Tesseract's mean word confidence, null for a text-layer page (a JSON array)
    confidences  TEXT,
    -- the 1-based pages read with low confidence (a JSON array), see ocr::LOW_CONFIDENCE
    low_confidence_pages TEXT,
    -- the epoch of the OCR run that wrote `text`: an older run cannot overwrite a newer one
    ocr_epoch    INTEGER NOT NULL DEFAULT 0,
    created_at   INTEGER NOT NULL,
    extracted_at INTEGER
);
CREATE TABLE IF NOT EXISTS notifications (
    job       TEXT PRIMARY KEY,
    document  TEXT NOT NULL,
    status    TEXT NOT NULL,
    ocr_state TEXT NOT NULL,
    channel   TEXT NOT NULL,
    at        INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS exhibitions (
    id         TEXT PRIMARY KEY,
    state      TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    ready_at   INTEGER
);
CREATE TABLE IF NOT EXISTS tracks (
    exhibition  TEXT NOT NULL,
    idx         INTEGER NOT NULL,
    image_name  TEXT,
    image_key   TEXT NOT NULL,
    emotion_job TEXT,
    emotion     TEXT,
    reading     TEXT,
    bgm_job     TEXT,
    track_key   TEXT,
    style       TEXT,
    duration_ms INTEGER,
    engine      TEXT,
    epoch       INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (exhibition, idx)
);
-- one row per generation started; finished_at once its track is stored
CREATE TABLE IF NOT EXISTS generations (
    id          INTEGER PRIMARY KEY,
    job         TEXT NOT NULL,
    epoch       INTEGER NOT NULL,
    exhibition  TEXT NOT NULL,
    idx         INTEGER NOT NULL,
    engine      TEXT NOT NULL,
    started_at  INTEGER NOT NULL,
    finished_at INTEGER
);
";

/// A failure of the pipelines' database, with its cause kept as the error's source.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("pipeline state: {0}")]
    Db(#[from] rusqlite::Error),
    #[error("pipeline state: cannot create directory {dir}: {source}")]
    Dir {
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("pipeline state: the database task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

pub type Result<T> = std::result::Result<T, StateError>;

/// The pipelines' database.
#[derive(Clone)]
pub struct State {
    conn: Arc<Mutex<Connection>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("State")
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Document {
    pub id: String,
    pub filename: Option<String>,
    pub size: u64,
    pub object_key: String,
    #[serde(skip)]
    pub callback_url: Option<String>,
    pub ocr_job: Option<String>,
    pub text: Option<String>,
    pub pages: Option<u32>,
    pub methods: Option<Vec<String>>,
    /// Per page, the OCR's mean word confidence (0–100); `None` for a page with a text layer.
    pub confidences: Option<Vec<Option<f32>>>,
    /// The 1-based pages whose recognition is doubtful (see [`crate::ocr::LOW_CONFIDENCE`]).
    pub low_confidence_pages: Option<Vec<u32>>,
    pub created_at: i64,
    pub extracted_at: Option<i64>,
}

/// What one OCR run found, as saved on the document.
#[derive(Debug, Clone, Default)]
pub struct ExtractedText {
    pub text: String,
    pub pages: u32,
    pub methods: Vec<String>,
    pub confidences: Vec<Option<f32>>,
    pub low_confidence_pages: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct Notification {
    pub status: String,
    pub ocr_state: String,
    pub channel: String,
    pub at: i64,
}

#[derive(Debug, Clone)]
pub struct Exhibition {
    pub id: String,
    pub state: String,
    pub created_at: i64,
    pub ready_at: Option<i64>,
    /// The homing workflow whose steps make this exhibition (absent for one made before
    /// exhibitions were workflows).
    pub workflow: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Track {
    pub index: u32,
    pub image_name: Option<String>,
    pub image_key: String,
    pub emotion_job: Option<String>,
    pub emotion: Option<String>,
    pub reading: Option<serde_json::Value>,
    pub bgm_job: Option<String>,
    pub track_key: Option<String>,
    pub style: Option<serde_json::Value>,
    pub duration_ms: Option<u64>,
    pub engine: Option<String>,
    pub generations_started: u32,
    pub generations_finished: u32,
}

/// A new track slot: one uploaded image.
#[derive(Debug, Clone)]
pub struct NewTrack {
    pub image_name: Option<String>,
    pub image_key: String,
}

/// Columns added after the first release: a database made before them gets them on open.
const ADDED_COLUMNS: &[(&str, &str, &str)] = &[
    ("documents", "confidences", "TEXT"),
    ("documents", "low_confidence_pages", "TEXT"),
    ("exhibitions", "workflow", "TEXT"),
];

fn add_missing_columns(conn: &Connection) -> rusqlite::Result<()> {
    for (table, column, ty) in ADDED_COLUMNS {
        let present: bool = conn.query_row(
            "SELECT count(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
            params![table, column],
            |r| r.get(0),
        )?;
        if !present {
            // Names come from the constant above, never from input.
            conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {ty}"))?;
        }
    }
    Ok(())
}

impl State {
    pub fn open(path: &Path) -> Result<State> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StateError::Dir {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(SCHEMA)?;
        add_missing_columns(&conn)?;
        Ok(State {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut c).map_err(StateError::from)
        })
        .await?
    }

    // ---- documents

    pub async fn insert_document(&self, d: Document) -> Result<()> {
        self.with(move |c| {
            c.execute(
                "INSERT INTO documents (id, filename, size, object_key, callback_url, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    d.id,
                    d.filename,
                    d.size as i64,
                    d.object_key,
                    d.callback_url,
                    d.created_at
                ],
            )
            .map(|_| ())
        })
        .await
    }

    pub async fn set_ocr_job(&self, id: &str, job: &str) -> Result<()> {
        let (id, job) = (id.to_string(), job.to_string());
        self.with(move |c| {
            c.execute(
                "UPDATE documents SET ocr_job = ?2 WHERE id = ?1",
                params![id, job],
            )
            .map(|_| ())
        })
        .await
    }

    pub async fn document(&self, id: &str) -> Result<Option<Document>> {
        let id = id.to_string();
        self.with(move |c| {
            c.query_row(
                "SELECT id, filename, size, object_key, callback_url, ocr_job, text, pages, methods, \
                 created_at, extracted_at, confidences, low_confidence_pages FROM documents \
                 WHERE id = ?1",
                [id],
                |r| {
                    let methods: Option<String> = r.get(8)?;
                    let confidences: Option<String> = r.get(11)?;
                    let low: Option<String> = r.get(12)?;
                    Ok(Document {
                        id: r.get(0)?,
                        filename: r.get(1)?,
                        size: r.get::<_, i64>(2)? as u64,
                        object_key: r.get(3)?,
                        callback_url: r.get(4)?,
                        ocr_job: r.get(5)?,
                        text: r.get(6)?,
                        pages: r.get(7)?,
                        methods: methods.and_then(|m| serde_json::from_str(&m).ok()),
                        created_at: r.get(9)?,
                        extracted_at: r.get(10)?,
                        confidences: confidences.and_then(|c| serde_json::from_str(&c).ok()),
                        low_confidence_pages: low.and_then(|l| serde_json::from_str(&l).ok()),
                    })
                },
            )
            .optional()
        })
        .await
    }

    /// Saves extracted text if no newer OCR run saved its own; `false` when this run is stale.
    pub async fn save_text(&self, id: &str, epoch: u64, t: ExtractedText) -> Result<bool> {
        let id = id.to_string();
        let methods = serde_json::to_string(&t.methods).unwrap_or_default();
        let confidences = serde_json::to_string(&t.confidences).unwrap_or_default();
        let low = serde_json::to_string(&t.low_confidence_pages).unwrap_or_default();
        self.with(move |c| {
            c.execute(
                "UPDATE documents SET text = ?2, pages = ?3, methods = ?4, ocr_epoch = ?5, \
                 extracted_at = ?6, confidences = ?7, low_confidence_pages = ?8 \
                 WHERE id = ?1 AND ocr_epoch <= ?5",
                params![
                    id,
                    t.text,
                    t.pages,
                    methods,
                    epoch as i64,
                    now(),
                    confidences,
                    low
                ],
            )
            .map(|n| n == 1)
        })
        .await
    }

    pub async fn record_notification(
        &self,
        job: &str,
        document: &str,
        n: Notification,
    ) -> Result<()> {
        let (job, document) = (job.to_string(), document.to_string());
        self.with(move |c| {
            c.execute(
                "INSERT OR REPLACE INTO notifications (job, document, status, ocr_state, channel, at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![job, document, n.status, n.ocr_state, n.channel, n.at],
            )
            .map(|_| ())
        })
        .await
    }

    pub async fn notifications(&self, document: &str) -> Result<Vec<Notification>> {
        let document = document.to_string();
        self.with(move |c| {
            let mut st = c.prepare(
                "SELECT status, ocr_state, channel, at FROM notifications WHERE document = ?1 ORDER BY at",
            )?;
            let rows = st.query_map([document], |r| {
                Ok(Notification {
                    status: r.get(0)?,
                    ocr_state: r.get(1)?,
                    channel: r.get(2)?,
                    at: r.get(3)?,
                })
            })?;
            rows.collect()
        })
        .await
    }

    // ---- exhibitions

    pub async fn insert_exhibition(&self, id: &str, tracks: Vec<NewTrack>) -> Result<()> {
        let id = id.to_string();
        self.with(move |c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO exhibitions (id, state, created_at) VALUES (?1, 'processing', ?2)",
                params![id, now()],
            )?;
            for (i, t) in tracks.iter().enumerate() {
                tx.execute(
                    "INSERT INTO tracks (exhibition, idx, image_name, image_key) VALUES (?1, ?2, ?3, ?4)",
                    params![id, i as i64, t.image_name, t.image_key],
                )?;
            }
            tx.commit()
        })
        .await
    }

    /// Records the exhibition's workflow and each track's emotion and bgm step jobs, all known
    /// once the workflow is created.
    pub async fn set_workflow(
        &self,
        id: &str,
        workflow: &str,
        jobs: Vec<(String, String)>,
    ) -> Result<()> {
        let (id, workflow) = (id.to_string(), workflow.to_string());
        self.with(move |c| {
            let tx = c.transaction()?;
            tx.execute(
                "UPDATE exhibitions SET workflow = ?2 WHERE id = ?1",
                params![id, workflow],
            )?;
            for (i, (emotion, bgm)) in jobs.iter().enumerate() {
                tx.execute(
                    "UPDATE tracks SET emotion_job = ?3, bgm_job = ?4 WHERE exhibition = ?1 AND idx = ?2",
                    params![id, i as i64, emotion, bgm],
                )?;
            }
            tx.commit()
        })
        .await
    }

    pub async fn exhibition(&self, id: &str) -> Result<Option<(Exhibition, Vec<Track>)>> {
        let id = id.to_string();
        self.with(move |c| {
            let Some(e) = c
                .query_row(
                    "SELECT id, state, created_at, ready_at, workflow FROM exhibitions WHERE id = ?1",
                    [&id],
                    |r| {
                        Ok(Exhibition {
                            id: r.get(0)?,
                            state: r.get(1)?,
                            created_at: r.get(2)?,
                            ready_at: r.get(3)?,
                            workflow: r.get(4)?,
                        })
                    },
                )
                .optional()?
            else {
                return Ok(None);
            };
            let mut st = c.prepare(
                "SELECT idx, image_name, image_key, emotion_job, emotion, reading, bgm_job, track_key, \
                 style, duration_ms, engine, \
                 (SELECT count(*) FROM generations g WHERE g.exhibition = t.exhibition AND g.idx = t.idx), \
                 (SELECT count(*) FROM generations g WHERE g.exhibition = t.exhibition AND g.idx = t.idx \
                  AND g.finished_at IS NOT NULL) \
                 FROM tracks t WHERE exhibition = ?1 ORDER BY idx",
            )?;
            let json = |s: Option<String>| s.and_then(|s| serde_json::from_str(&s).ok());
            let tracks = st
                .query_map([&id], |r| {
                    Ok(Track {
                        index: r.get(0)?,
                        image_name: r.get(1)?,
                        image_key: r.get(2)?,
                        emotion_job: r.get(3)?,
                        emotion: r.get(4)?,
                        reading: json(r.get(5)?),
                        bgm_job: r.get(6)?,
                        track_key: r.get(7)?,
                        style: json(r.get(8)?),
                        duration_ms: r.get::<_, Option<i64>>(9)?.map(|v| v as u64),
                        engine: r.get(10)?,
                        generations_started: r.get(11)?,
                        generations_finished: r.get(12)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Some((e, tracks)))
        })
        .await
    }

    pub async fn track(&self, exhibition: &str, index: u32) -> Result<Option<Track>> {
        Ok(self
            .exhibition(exhibition)
            .await?
            .and_then(|(_, ts)| ts.into_iter().find(|t| t.index == index)))
    }

    pub async fn set_emotion(
        &self,
        exhibition: &str,
        index: u32,
        emotion: &str,
        reading: &serde_json::Value,
    ) -> Result<()> {
        let (ex, emotion, reading) = (
            exhibition.to_string(),
            emotion.to_string(),
            reading.to_string(),
        );
        self.with(move |c| {
            c.execute(
                "UPDATE tracks SET emotion = ?3, reading = ?4 WHERE exhibition = ?1 AND idx = ?2",
                params![ex, index, emotion, reading],
            )
            .map(|_| ())
        })
        .await
    }

    pub async fn set_bgm_job(&self, exhibition: &str, index: u32, job: &str) -> Result<()> {
        let (ex, job) = (exhibition.to_string(), job.to_string());
        self.with(move |c| {
            c.execute(
                "UPDATE tracks SET bgm_job = ?3 WHERE exhibition = ?1 AND idx = ?2",
                params![ex, index, job],
            )
            .map(|_| ())
        })
        .await
    }

    /// Records that a generation starts; returns its row id for [`State::generation_finished`].
    pub async fn generation_started(
        &self,
        job: &str,
        epoch: u64,
        exhibition: &str,
        index: u32,
        engine: &str,
    ) -> Result<i64> {
        let (job, ex, engine) = (job.to_string(), exhibition.to_string(), engine.to_string());
        self.with(move |c| {
            c.execute(
                "INSERT INTO generations (job, epoch, exhibition, idx, engine, started_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![job, epoch as i64, ex, index, engine, now()],
            )?;
            Ok(c.last_insert_rowid())
        })
        .await
    }

    pub async fn generation_finished(&self, generation: i64) -> Result<()> {
        self.with(move |c| {
            c.execute(
                "UPDATE generations SET finished_at = ?2 WHERE id = ?1",
                params![generation, now()],
            )
            .map(|_| ())
        })
        .await
    }

    /// Records a stored track, unless a newer run of its job already did (epoch fencing).
    #[allow(clippy::too_many_arguments)]
    pub async fn track_stored(
        &self,
        exhibition: &str,
        index: u32,
        epoch: u64,
        track_key: &str,
        style: &serde_json::Value,
        duration_ms: Option<u64>,
        engine: &str,
    ) -> Result<bool> {
        let (ex, key, style, engine) = (
            exhibition.to_string(),
            track_key.to_string(),
            style.to_string(),
            engine.to_string(),
        );
        self.with(move |c| {
            c.execute(
                "UPDATE tracks SET track_key = ?3, style = ?4, duration_ms = ?5, engine = ?6, epoch = ?7 \
                 WHERE exhibition = ?1 AND idx = ?2 AND epoch <= ?7",
                params![
                    ex,
                    index,
                    key,
                    style,
                    duration_ms.map(|d| d as i64),
                    engine,
                    epoch as i64
                ],
            )
            .map(|n| n == 1)
        })
        .await
    }

    /// Marks the exhibition ready if every track is stored; `false` (and nothing written) when
    /// one is missing. Idempotent: a repeated call keeps the first `ready_at`. Deciding that
    /// this happens once, after the three tracks, is the workflow's job, not this write's.
    pub async fn mark_ready(&self, exhibition: &str) -> Result<bool> {
        let ex = exhibition.to_string();
        self.with(move |c| {
            c.execute(
                "UPDATE exhibitions SET state = 'ready', ready_at = coalesce(ready_at, ?2) \
                 WHERE id = ?1 \
                 AND NOT EXISTS (SELECT 1 FROM tracks WHERE exhibition = ?1 AND track_key IS NULL)",
                params![ex, now()],
            )
            .map(|n| n == 1)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_exhibition_is_marked_ready_only_when_every_track_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let s = State::open(&dir.path().join("pipelines.db")).unwrap();
        let tracks = (0..3)
            .map(|i| NewTrack {
                image_name: None,
                image_key: format!("img-{i}"),
            })
            .collect();
        s.insert_exhibition("e1", tracks).await.unwrap();
        let style = serde_json::json!({});
        for i in 0..3 {
            assert!(!s.mark_ready("e1").await.unwrap());
            assert_eq!(
                s.exhibition("e1").await.unwrap().unwrap().0.state,
                "processing"
            );
            assert!(s
                .track_stored("e1", i, 1, &format!("t{i}"), &style, None, "composer")
                .await
                .unwrap());
        }
        assert!(s.mark_ready("e1").await.unwrap());
        let (e, _) = s.exhibition("e1").await.unwrap().unwrap();
        assert_eq!(e.state, "ready");
        // A ready step run again (its worker died after this write) keeps the first time.
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(s.mark_ready("e1").await.unwrap());
        assert_eq!(
            s.exhibition("e1").await.unwrap().unwrap().0.ready_at,
            e.ready_at
        );
    }

    #[tokio::test]
    async fn a_stale_run_cannot_overwrite_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let s = State::open(&dir.path().join("pipelines.db")).unwrap();
        s.insert_document(Document {
            id: "d".into(),
            filename: None,
            size: 1,
            object_key: "k".into(),
            callback_url: None,
            ocr_job: None,
            text: None,
            pages: None,
            methods: None,
            confidences: None,
            low_confidence_pages: None,
            created_at: 0,
            extracted_at: None,
        })
        .await
        .unwrap();
        let run = |text: &str, confidence: f32, low: Vec<u32>| ExtractedText {
            text: text.into(),
            pages: 1,
            methods: vec!["ocr".into()],
            confidences: vec![Some(confidence)],
            low_confidence_pages: low,
        };
        assert!(s.save_text("d", 3, run("new", 91.5, vec![])).await.unwrap());
        assert!(!s
            .save_text("d", 2, run("old", 40.0, vec![1]))
            .await
            .unwrap());
        let d = s.document("d").await.unwrap().unwrap();
        assert_eq!(d.text.as_deref(), Some("new"));
        assert_eq!(d.confidences, Some(vec![Some(91.5)]));
        assert_eq!(d.low_confidence_pages, Some(vec![]));
    }

    #[tokio::test]
    async fn a_database_from_before_the_confidence_columns_gets_them_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pipelines.db");
        let old = Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE documents (id TEXT PRIMARY KEY, filename TEXT, size INTEGER NOT NULL, \
             object_key TEXT NOT NULL, callback_url TEXT, ocr_job TEXT, text TEXT, pages INTEGER, \
             methods TEXT, ocr_epoch INTEGER NOT NULL DEFAULT 0, created_at INTEGER NOT NULL, \
             extracted_at INTEGER); \
             INSERT INTO documents (id, size, object_key, text, created_at) \
             VALUES ('d', 1, 'k', 'kept', 0);",
        )
        .unwrap();
        drop(old);
        let s = State::open(&path).unwrap();
        let d = s.document("d").await.unwrap().unwrap();
        assert_eq!(d.text.as_deref(), Some("kept"));
        assert_eq!(d.low_confidence_pages, None);
        assert!(s.save_text("d", 1, run_of("again")).await.unwrap());
        // Opening again finds the columns present and changes nothing.
        drop(s);
        let s = State::open(&path).unwrap();
        assert_eq!(
            s.document("d").await.unwrap().unwrap().low_confidence_pages,
            Some(vec![1])
        );
    }

    fn run_of(text: &str) -> ExtractedText {
        ExtractedText {
            text: text.into(),
            pages: 1,
            methods: vec!["ocr".into()],
            confidences: vec![Some(12.0)],
            low_confidence_pages: vec![1],
        }
    }
}
