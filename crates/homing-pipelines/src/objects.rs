//! The object store: uploaded PDFs and images, generated tracks. A local directory by default
//! (each write lands in a temporary file renamed into place, so a crash never leaves half an
//! object under its real name), an S3-compatible bucket when configured. The pipelines use the
//! existence of an object as a fact ("this track is done"), so a write must be all or nothing.

use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use std::sync::Arc;

use crate::settings::ObjectsConfig;

/// A bucket of objects addressed by `/`-separated keys.
#[derive(Clone)]
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    describe: String,
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe)
    }
}

fn key(k: &str) -> object_store::Result<ObjectPath> {
    ObjectPath::parse(k).map_err(Into::into)
}

impl Objects {
    pub fn open(config: &ObjectsConfig) -> anyhow::Result<Objects> {
        match config {
            ObjectsConfig::Local(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| {
                    anyhow::anyhow!("cannot create the object directory {}: {e}", dir.display())
                })?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(dir)?;
                Ok(Objects {
                    store: Arc::new(fs),
                    describe: format!("objects in {}", dir.display()),
                })
            }
            #[cfg(feature = "s3")]
            ObjectsConfig::S3(url) => {
                let s3 = object_store::aws::AmazonS3Builder::from_env()
                    .with_url(url)
                    .build()?;
                Ok(Objects {
                    store: Arc::new(s3),
                    describe: format!("objects in {url}"),
                })
            }
            #[cfg(not(feature = "s3"))]
            ObjectsConfig::S3(_) => anyhow::bail!(
                "HOMING_OBJECT_STORE names an S3 bucket, but this build has no S3 support \
                 (build with `--features homing-pipelines/s3`)"
            ),
        }
    }

    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// Stores an object whole, replacing any earlier one.
    pub async fn put(&self, k: &str, bytes: Vec<u8>) -> object_store::Result<()> {
        self.store.put(&key(k)?, PutPayload::from(bytes)).await?;
        Ok(())
    }

    pub async fn get(&self, k: &str) -> object_store::Result<Option<Vec<u8>>> {
        match self.store.get(&key(k)?).await {
            Ok(r) => Ok(Some(r.bytes().await?.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub async fn exists(&self, k: &str) -> object_store::Result<bool> {
        match self.store.head(&key(k)?).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Every object key, built in one place.
pub mod keys {
    pub fn document(id: &str) -> String {
        format!("documents/{id}.pdf")
    }
    pub fn image(exhibition: &str, index: usize, ext: &str) -> String {
        format!("exhibitions/{exhibition}/image-{index}.{ext}")
    }
    /// Named by the generating job's id, stable across redeliveries: the object's existence is
    /// the idempotency guard of generation.
    pub fn track(job: &str) -> String {
        format!("tracks/{job}.wav")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_local_store_round_trips_and_reports_absence() {
        let dir = tempfile::tempdir().unwrap();
        let o = Objects::open(&ObjectsConfig::Local(dir.path().join("objects"))).unwrap();
        assert!(!o.exists("tracks/a.wav").await.unwrap());
        assert_eq!(o.get("tracks/a.wav").await.unwrap(), None);
        o.put("tracks/a.wav", b"RIFF".to_vec()).await.unwrap();
        assert!(o.exists("tracks/a.wav").await.unwrap());
        assert_eq!(o.get("tracks/a.wav").await.unwrap(), Some(b"RIFF".to_vec()));
        assert!(dir.path().join("objects/tracks/a.wav").exists());
    }
}
