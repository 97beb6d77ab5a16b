//! The seeds' two services, built on homing as a user would build them: document OCR (an issued
//! PDF's text is extracted on queue `ocr`, one at a time, retried twice 30 s apart; OCR failure
//! never undoes issuance) and AI exhibitions (three images → three emotions → three background
//! tracks → ready, one homing workflow whose `ready` step runs exactly once). They live apart from the framework so the
//! framework stays small, and they show what the library's guarantees buy an application.
//!
//! The binary links three things from here: [`Pipelines::registry`] (the tasks),
//! [`Pipelines::router`] (the HTTP routes) and [`QUEUES`] (the workers `homing up` runs).
//! Files live in an object store ([`objects`]), the pipelines' records in a small SQLite file
//! ([`state`]); homing's job records stay the truth about job states.

pub mod api;
pub mod compose;
pub mod emotion;
mod inference;
pub mod objects;
pub mod ocr;
pub mod settings;
pub mod state;
pub mod tasks;
pub mod tools;
pub mod wav;

use std::sync::Arc;
use tokio::sync::OnceCell;

pub use settings::Settings;
use tasks::FatalOnPanic;

/// A queue the pipelines need workers for, with the limits the seeds chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSpec {
    pub name: &'static str,
    pub concurrency: usize,
    pub prefetch: usize,
}

/// `ocr` runs one document at a time and reserves no more (the seed's concurrency 1, prefetch
/// 1); reading emotions is light; `bgm` generation is the scarce resource (an inference server
/// or the CPU), so one at a time as well.
pub const QUEUES: &[QueueSpec] = &[
    QueueSpec {
        name: "ocr",
        concurrency: 1,
        prefetch: 1,
    },
    QueueSpec {
        name: "emotion",
        concurrency: 2,
        prefetch: 2,
    },
    QueueSpec {
        name: "bgm",
        concurrency: 1,
        prefetch: 1,
    },
];

/// What the tasks and routes share once opened.
#[derive(Debug)]
pub struct Services {
    pub settings: Arc<Settings>,
    pub objects: objects::Objects,
    pub state: state::State,
    pub http: reqwest::Client,
}

/// A handle on the pipelines. Cheap to create and clone: the object store and the database open
/// on first use, so commands that only list tasks (`homing enqueue`, `homing jobs`) never create
/// data directories.
#[derive(Debug, Clone)]
pub struct Pipelines {
    settings: Arc<Settings>,
    services: Arc<OnceCell<Arc<Services>>>,
}

impl Pipelines {
    pub fn new(settings: Settings) -> Pipelines {
        Pipelines {
            settings: Arc::new(settings),
            services: Arc::default(),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The opened object store and database.
    pub async fn services(&self) -> anyhow::Result<Arc<Services>> {
        self.services
            .get_or_try_init(|| async {
                let settings = self.settings.clone();
                tokio::task::spawn_blocking(move || -> anyhow::Result<Arc<Services>> {
                    let objects = objects::Objects::open(&settings.objects)?;
                    let state = state::State::open(&settings.data_dir.join("pipelines.db"))?;
                    homing::tls::install_crypto_provider();
                    let http = reqwest::Client::builder()
                        .connect_timeout(std::time::Duration::from_secs(10))
                        .build()?;
                    tracing::debug!(objects = objects.describe(), "pipelines opened");
                    Ok(Arc::new(Services {
                        settings,
                        objects,
                        state,
                        http,
                    }))
                })
                .await?
            })
            .await
            .cloned()
    }

    /// The pipelines' tasks: `ocr.extract`, `ocr.notify`, `exhibition.emotion`, `exhibition.bgm`,
    /// `exhibition.ready`.
    pub fn registry(&self) -> homing::Registry {
        let mut r = homing::Registry::new();
        r.register(FatalOnPanic(tasks::ocr::Extract(self.clone())))
            .register(FatalOnPanic(tasks::ocr::Notify(self.clone())))
            .register(FatalOnPanic(tasks::exhibition::ReadEmotion(self.clone())))
            .register(FatalOnPanic(tasks::exhibition::ComposeTrack(self.clone())))
            .register(FatalOnPanic(tasks::exhibition::MarkReady(self.clone())));
        r
    }

    /// The routes under `/v1/documents` and `/v1/exhibitions`, enqueuing through `client`.
    pub fn router<S: Clone + Send + Sync + 'static>(
        &self,
        client: homing::Client,
    ) -> axum::Router<S> {
        api::router(api::ApiState {
            pipelines: self.clone(),
            client,
        })
    }
}
