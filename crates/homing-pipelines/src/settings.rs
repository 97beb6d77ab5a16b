//! Where the pipelines keep their files and how they behave, read once from the environment so a
//! server and its workers (separate processes) agree without sharing flags.

use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where uploaded files and generated tracks go.
#[derive(Debug, Clone, PartialEq)]
pub enum ObjectsConfig {
    /// A directory on this machine (the default: `<data dir>/objects`).
    Local(PathBuf),
    /// An S3-compatible bucket, `s3://bucket[/prefix]`; credentials and endpoint come from the
    /// usual `AWS_*` variables (`AWS_ENDPOINT` for MinIO and friends).
    S3(String),
}

/// Everything the pipelines read from the environment.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The pipelines' own database (`pipelines.db`) lives here, beside homing's.
    pub data_dir: PathBuf,
    pub objects: ObjectsConfig,
    /// The delay between OCR retries (the seeds' "every 30 s"); `HOMING_OCR_RETRY_DELAY`.
    pub ocr_retry_delay: Duration,
    /// Retries after the first OCR run (the seeds' 2).
    pub ocr_max_retries: u32,
    /// An inference server that generates tracks; `HOMING_BGM_ENDPOINT`. Unset: the built-in
    /// composer.
    pub bgm_endpoint: Option<String>,
    /// Length of a composed track; `HOMING_BGM_SECONDS`.
    pub bgm_seconds: f32,
    /// Only with `HOMING_TEST_TASKS=1`: hooks that widen crash windows for the process tests.
    pub test_hooks: TestHooks,
}

/// Pauses that make a crash window wide enough for a test to hit it with `kill -9`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TestHooks {
    /// After a track is stored and its generation recorded, before the job's result is
    /// committed: `HOMING_TEST_BGM_PAUSE_AFTER_STORE`.
    pub bgm_pause_after_store: Option<Duration>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_duration(name: &str) -> anyhow::Result<Option<Duration>> {
    env(name)
        .map(|v| homing::time::parse_duration(&v).map_err(anyhow::Error::msg))
        .transpose()
        .with_context(|| format!("{name} is not a duration"))
}

/// The directory of an embedded SQLite store (`sqlite://dir/homing.db` → `dir`).
fn sqlite_dir(store_url: &str) -> Option<PathBuf> {
    let path = store_url.strip_prefix("sqlite://")?;
    let path = path.split('?').next().unwrap_or(path);
    let parent = Path::new(path).parent()?;
    Some(if parent.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        parent.to_path_buf()
    })
}

impl Settings {
    /// Reads the settings; the data directory is `HOMING_DATA_DIR`, else the directory of an
    /// embedded store, else `homing-data`.
    pub fn from_env(store_url: &str) -> anyhow::Result<Settings> {
        let data_dir = env("HOMING_DATA_DIR")
            .map(PathBuf::from)
            .or_else(|| sqlite_dir(store_url))
            .unwrap_or_else(|| PathBuf::from("homing-data"));
        let objects = match env("HOMING_OBJECT_STORE") {
            Some(url) if url.starts_with("s3://") => ObjectsConfig::S3(url),
            Some(url) => {
                ObjectsConfig::Local(PathBuf::from(url.strip_prefix("file://").unwrap_or(&url)))
            }
            None => ObjectsConfig::Local(data_dir.join("objects")),
        };
        let bgm_seconds = match env("HOMING_BGM_SECONDS") {
            None => 20.0,
            Some(v) => match v.parse::<f32>() {
                Ok(s) if (1.0..=600.0).contains(&s) => s,
                _ => anyhow::bail!("HOMING_BGM_SECONDS must be a number of seconds from 1 to 600"),
            },
        };
        let test_hooks = if env("HOMING_TEST_TASKS").as_deref() == Some("1") {
            TestHooks {
                bgm_pause_after_store: env_duration("HOMING_TEST_BGM_PAUSE_AFTER_STORE")?,
            }
        } else {
            TestHooks::default()
        };
        Ok(Settings {
            data_dir,
            objects,
            ocr_retry_delay: env_duration("HOMING_OCR_RETRY_DELAY")?
                .unwrap_or(Duration::from_secs(30)),
            ocr_max_retries: 2,
            bgm_endpoint: env("HOMING_BGM_ENDPOINT"),
            bgm_seconds,
            test_hooks,
        })
    }

    /// Settings for a data directory with every default (tests, embedding programs).
    pub fn in_dir(data_dir: impl Into<PathBuf>) -> Settings {
        let data_dir = data_dir.into();
        Settings {
            objects: ObjectsConfig::Local(data_dir.join("objects")),
            data_dir,
            ocr_retry_delay: Duration::from_secs(30),
            ocr_max_retries: 2,
            bgm_endpoint: None,
            bgm_seconds: 20.0,
            test_hooks: TestHooks::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_dir_follows_an_embedded_store() {
        assert_eq!(
            sqlite_dir("sqlite://homing-data/homing.db"),
            Some(PathBuf::from("homing-data"))
        );
        assert_eq!(
            sqlite_dir("sqlite:///tmp/x/homing.db"),
            Some(PathBuf::from("/tmp/x"))
        );
        assert_eq!(sqlite_dir("sqlite://homing.db"), Some(PathBuf::from(".")));
        assert_eq!(sqlite_dir("postgres://db/homing"), None);
    }
}
