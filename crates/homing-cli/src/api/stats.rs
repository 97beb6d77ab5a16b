//! The charts (docs/charts.md): `GET /v1/stats/series` reads the store's rollups and answers
//! one chart-ready series; the dashboard's chart script and the vendored charting library
//! (uPlot, MIT, `dashboard/vendor/`) are served from the binary like the rest of the dashboard,
//! so the charts need no CDN and no Prometheus.

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::{ApiError, AppState};
use homing::stats::{self, Range};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeriesQuery {
    pub queue: Option<String>,
    pub range: Option<String>,
}

pub async fn series(
    State(state): State<AppState>,
    q: Result<Query<SeriesQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = q?;
    let range = match q.range.as_deref() {
        None | Some("") => Range::Hour,
        Some(r) => Range::parse(r).ok_or_else(|| {
            ApiError::bad_request(format!(
                "range must be hour, day or week, not {:?}",
                r.chars().take(40).collect::<String>()
            ))
        })?,
    };
    let queue = q.queue.as_deref().filter(|s| !s.is_empty());
    if let Some(queue) = queue {
        homing::client::validate_name("queue", queue)?;
    }
    let now = homing::time::now();
    let (from, to) = range.bounds(now);
    let rows = state
        .backends
        .store
        .stats_rows(range.step() / 1_000_000, from, to)
        .await?;
    Ok(Json(stats::series(range, now, queue, &rows)).into_response())
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(CONTENT_TYPE, content_type)], body).into_response()
}

pub async fn charts_script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("../dashboard/charts.js"),
    )
}

pub async fn uplot_script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("../dashboard/vendor/uplot.min.js"),
    )
}

pub async fn uplot_style() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("../dashboard/vendor/uplot.min.css"),
    )
}
