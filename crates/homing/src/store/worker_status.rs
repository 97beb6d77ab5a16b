//! A worker's status as the store records it: one closed set, so a typo cannot compare
//! unequal to every status, and the stored and served words stay the same everywhere.

use serde::{Deserialize, Serialize};

/// Where a worker is in its life, as the store records it. Serialised (and stored) as the
/// lowercase word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerStatus {
    /// Running and heartbeating (as far as the store knows; the broker decides liveness).
    Live,
    /// Shut down cleanly.
    Stopped,
    /// Its heartbeat expired; a rescuer declared it lost.
    Lost,
}

impl WorkerStatus {
    pub const ALL: [WorkerStatus; 3] = [
        WorkerStatus::Live,
        WorkerStatus::Stopped,
        WorkerStatus::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WorkerStatus::Live => "live",
            WorkerStatus::Stopped => "stopped",
            WorkerStatus::Lost => "lost",
        }
    }
}

impl WorkerStatus {
    /// A stored status, read without failing the view it is part of: a word this version does
    /// not know (written by hand, or by a newer version) shows the worker as `lost`, the status
    /// that claims the least about it, and is logged.
    pub fn read(stored: &str, worker: &str) -> WorkerStatus {
        stored.parse().unwrap_or_else(|e| {
            tracing::warn!(%worker, error = %e, "a worker's stored status cannot be read; showing it as lost");
            WorkerStatus::Lost
        })
    }
}

impl std::fmt::Display for WorkerStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for WorkerStatus {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        WorkerStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown worker status '{s}'; expected live, stopped or lost"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_the_lowercase_words_everywhere() {
        for (st, word) in [
            (WorkerStatus::Live, "live"),
            (WorkerStatus::Stopped, "stopped"),
            (WorkerStatus::Lost, "lost"),
        ] {
            assert_eq!(st.as_str(), word);
            assert_eq!(st.to_string(), word);
            assert_eq!(word.parse::<WorkerStatus>().unwrap(), st);
            assert_eq!(serde_json::to_value(st).unwrap(), serde_json::json!(word));
            assert_eq!(
                serde_json::from_value::<WorkerStatus>(serde_json::json!(word)).unwrap(),
                st
            );
        }
        assert!("Live".parse::<WorkerStatus>().is_err());
        assert_eq!(WorkerStatus::read("stopped", "w"), WorkerStatus::Stopped);
        assert_eq!(WorkerStatus::read("zombie", "w"), WorkerStatus::Lost);
        assert!("gone".parse::<WorkerStatus>().is_err());
    }
}
