//! Chooses backends from URLs (`--broker`, `--store`, `HOMING_BROKER`, `HOMING_STORE`), so every
//! command and embedding program selects them the same way. Two URLs naming the same SQLite file
//! share one open database.

use std::sync::Arc;

use crate::broker::Broker;
use crate::error::{Error, Result};
use crate::redact::redact_url;
use crate::store::Store;

/// The embedded default for both broker and store.
pub const DEFAULT_URL: &str = "sqlite://homing-data/homing.db";

/// The broker and store a process works with.
#[derive(Clone)]
pub struct Backends {
    pub broker: Arc<dyn Broker>,
    pub store: Arc<dyn Store>,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends")
            .field("broker", &self.broker.kind())
            .field("store", &self.store.kind())
            .finish()
    }
}

/// Whether `url` names a PostgreSQL database (`postgres://…` or `postgresql://…`).
pub fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

pub use crate::schema::MigrationReport;

/// Brings the store's schema up to date (see [`crate::schema`]): both stores apply their
/// numbered migrations once each, PostgreSQL's under an advisory lock, SQLite's under the file's
/// write lock (every open of the file does the same).
pub async fn migrate_store(store_url: &str) -> Result<MigrationReport> {
    let store = redact_url(store_url);
    if is_postgres_url(store_url) {
        #[cfg(feature = "postgres")]
        {
            use crate::store::postgres::{PgOptions, PgStore, MIGRATIONS};
            let pg = PgStore::open(store_url, PgOptions::default()).await?;
            let (applied, version) = pg.migrate_to_version().await?;
            return Ok(report(store, MIGRATIONS, applied, version));
        }
        #[cfg(not(feature = "postgres"))]
        return Err(Error::Invalid(
            "this build has no PostgreSQL support (cargo feature `postgres`)".into(),
        ));
    }
    if store_url.starts_with("sqlite:") {
        #[cfg(feature = "sqlite")]
        {
            let path = crate::sqlite::path_from_url(store_url).ok_or_else(|| {
                Error::Invalid(format!(
                    "invalid store URL '{store}': expected sqlite://PATH"
                ))
            })?;
            let (applied, version) =
                tokio::task::spawn_blocking(move || crate::sqlite::migrate_file(&path))
                    .await
                    .map_err(|e| {
                        Error::backend_from("sqlite", e).context("migration task failed")
                    })??;
            return Ok(report(store, crate::sqlite::MIGRATIONS, applied, version));
        }
        #[cfg(not(feature = "sqlite"))]
        return Err(Error::Invalid("this build has no SQLite support".into()));
    }
    Err(Error::Invalid(format!(
        "unsupported store URL '{store}': expected sqlite://PATH or postgres://USER:PASSWORD@HOST/DB"
    )))
}

#[allow(dead_code)] // unused in a build with neither store
fn report(
    store: String,
    all: &[crate::schema::Migration],
    applied: Vec<&'static str>,
    version: i32,
) -> MigrationReport {
    MigrationReport {
        store,
        applied: applied.into_iter().map(str::to_string).collect(),
        version,
        latest: all.last().map_or("", |m| m.name).to_string(),
    }
}

/// Whether `url` names a Redis broker (`redis://`, `rediss://`, `redis+unix://`, `unix://`, or a
/// Redis Cluster's seed nodes: `redis+cluster://`, `rediss+cluster://`).
pub fn is_redis_url(url: &str) -> bool {
    [
        "redis://",
        "rediss://",
        "redis+unix://",
        "unix://",
        "redis+cluster://",
        "rediss+cluster://",
    ]
    .iter()
    .any(|s| url.starts_with(s))
}

/// Settings of the opened backends that their URLs do not carry.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Distinct queue names the store accepts from enqueue (`store::queues`).
    pub max_queues: u64,
    /// An embedded file's calls made on a current-thread runtime run on that thread: reads, and
    /// writes whose lock is had within a few milliseconds (`sqlite::Db::run_calls_here`). For a
    /// process whose runtime is one thread and does little else, as `homing worker` by default.
    pub sqlite_calls_here: bool,
    /// Whether an embedded file's pages are all read once at open to refuse a damaged file
    /// (`PRAGMA quick_check`; about a second at a million jobs). On by default: a process that
    /// serves must not look healthy on a damaged file. A one-shot command may skip it.
    pub sqlite_check_pages: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            max_queues: crate::store::queues::DEFAULT_MAX_QUEUES,
            sqlite_calls_here: false,
            sqlite_check_pages: true,
        }
    }
}

impl Backends {
    /// Opens the broker and store named by two URLs.
    pub async fn open(broker_url: &str, store_url: &str) -> Result<Backends> {
        Self::open_with(broker_url, store_url, &OpenOptions::default()).await
    }

    /// [`Backends::open`] with settings.
    pub async fn open_with(
        broker_url: &str,
        store_url: &str,
        options: &OpenOptions,
    ) -> Result<Backends> {
        #[cfg(feature = "sqlite")]
        let mut sqlite: Option<(std::path::PathBuf, Arc<crate::sqlite::Db>)> = None;
        #[cfg(feature = "sqlite")]
        let mut open_sqlite = |url: &str| -> Result<Option<Arc<crate::sqlite::Db>>> {
            let Some(path) = crate::sqlite::path_from_url(url) else {
                return Ok(None);
            };
            if let Some((p, db)) = &sqlite {
                if *p == path {
                    return Ok(Some(db.clone()));
                }
            }
            let db = crate::sqlite::Db::open_with(&path, options.sqlite_check_pages)?;
            db.run_calls_here(options.sqlite_calls_here);
            sqlite = Some((path, db.clone()));
            Ok(Some(db))
        };

        let store: Arc<dyn Store> = if store_url.starts_with("sqlite:") {
            #[cfg(feature = "sqlite")]
            {
                let db = open_sqlite(store_url)?.ok_or_else(|| {
                    Error::Invalid(format!(
                        "invalid store URL '{store_url}': expected sqlite://PATH"
                    ))
                })?;
                Arc::new(
                    crate::store::sqlite::SqliteStore::new(db).with_max_queues(options.max_queues),
                )
            }
            #[cfg(not(feature = "sqlite"))]
            return Err(Error::Invalid("this build has no SQLite support".into()));
        } else if is_postgres_url(store_url) {
            #[cfg(feature = "postgres")]
            {
                Arc::new(
                    crate::store::postgres::PgStore::connect(store_url)
                        .await?
                        .with_max_queues(options.max_queues),
                )
            }
            #[cfg(not(feature = "postgres"))]
            return Err(Error::Invalid(
                "this build has no PostgreSQL support (cargo feature `postgres`)".into(),
            ));
        } else {
            return Err(Error::Invalid(format!(
                "unsupported store URL '{}': expected sqlite://PATH or postgres://USER:PASSWORD@HOST/DB",
                redact_url(store_url)
            )));
        };

        let broker: Arc<dyn Broker> = if broker_url.starts_with("sqlite:") {
            #[cfg(feature = "sqlite")]
            {
                let db = open_sqlite(broker_url)?.ok_or_else(|| {
                    Error::Invalid(format!(
                        "invalid broker URL '{broker_url}': expected sqlite://PATH"
                    ))
                })?;
                Arc::new(crate::broker::sqlite::SqliteBroker::new(db))
            }
            #[cfg(not(feature = "sqlite"))]
            return Err(Error::Invalid("this build has no SQLite support".into()));
        } else if is_redis_url(broker_url) {
            #[cfg(feature = "redis")]
            {
                Arc::new(crate::broker::redis::RedisBroker::open(broker_url).await?)
            }
            #[cfg(not(feature = "redis"))]
            return Err(Error::Invalid("this build has no Redis support".into()));
        } else {
            return Err(Error::Invalid(format!(
                "unsupported broker URL '{}': expected sqlite://PATH, redis://HOST:PORT/DB, \
                 rediss://HOST:PORT/DB, redis+unix://PATH or \
                 redis+cluster://HOST:PORT,HOST:PORT",
                redact_url(broker_url)
            )));
        };
        Ok(Backends { broker, store })
    }
}
