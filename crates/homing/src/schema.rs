//! The one way both stores' schemas change: numbered migrations, each applied once, in order,
//! and recorded in a `homing_migrations` table (version, name, time applied) in the same
//! transaction as its DDL. PostgreSQL (`store/postgres/migrations/`) and the embedded SQLite
//! file (`sqlite/migrations/`) each keep their own list, because their SQL differs, but they are
//! planned, recorded and reported by the code here, so `homing migrate` says the same thing for
//! both.
//!
//! A released migration is never edited, only followed by a new one: a database records what
//! it ran by number, and would never run an edited migration again.

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub version: i32,
    /// `NNNN_what`, as the file is named.
    pub name: &'static str,
    pub(crate) sql: &'static str,
}

/// The migrations of `all` that `done` (the versions a database recorded) lacks, in order.
pub(crate) fn pending<'a>(all: &'a [Migration], done: &[i32]) -> Vec<&'a Migration> {
    all.iter().filter(|m| !done.contains(&m.version)).collect()
}

/// The newest version in `all` (0 when there is none).
pub(crate) fn latest(all: &[Migration]) -> i32 {
    all.last().map_or(0, |m| m.version)
}

/// Logs when a database has migrations this build does not know: a newer build ran against it,
/// and this process should be upgraded (it carries on: migrations only ever add).
pub(crate) fn warn_if_newer(backend: &str, all: &[Migration], done: &[i32]) {
    let build = latest(all);
    if let Some(newest) = done.iter().copied().max().filter(|v| *v > build) {
        tracing::warn!(
            backend,
            database_version = newest,
            build_version = build,
            "the database schema is newer than this build of homing; upgrade this process"
        );
    }
}

/// What one migration run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// The store's URL without its secrets.
    pub store: String,
    /// Migrations applied by this run, in order; empty when the schema was already current.
    pub applied: Vec<String>,
    /// The schema version the database is at now (its newest recorded migration).
    pub version: i32,
    /// The newest migration this build knows.
    pub latest: String,
}

impl MigrationReport {
    /// The lines `homing migrate` prints: one `applied NNNN_x` per migration, then where the
    /// schema stands.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .applied
            .iter()
            .map(|m| format!("applied {m}"))
            .collect();
        if self.applied.is_empty() {
            out.push(format!(
                "{}: schema at version {}, nothing to apply",
                self.store, self.version
            ));
        } else {
            out.push(format!(
                "{}: schema at version {}",
                self.store, self.version
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[Migration] = &[
        Migration {
            version: 1,
            name: "0001_a",
            sql: "",
        },
        Migration {
            version: 2,
            name: "0002_b",
            sql: "",
        },
    ];

    #[test]
    fn pending_is_what_was_not_recorded_in_order() {
        let names = |done: &[i32]| -> Vec<&str> {
            pending(ALL, done).into_iter().map(|m| m.name).collect()
        };
        assert_eq!(names(&[]), ["0001_a", "0002_b"]);
        assert_eq!(names(&[1]), ["0002_b"]);
        assert!(names(&[1, 2]).is_empty());
        assert!(names(&[1, 2, 3]).is_empty());
        assert_eq!(latest(ALL), 2);
    }

    #[test]
    fn every_store_lists_its_migrations_numbered_in_order() {
        let mut lists: Vec<&[Migration]> = Vec::new();
        #[cfg(feature = "sqlite")]
        lists.push(crate::sqlite::MIGRATIONS);
        #[cfg(feature = "postgres")]
        lists.push(crate::store::postgres::MIGRATIONS);
        for list in lists {
            // Numbered upwards from 1. A gap is allowed: every version applied is recorded on
            // its own, and work merged in parallel keeps the numbers it was given (0011–0014).
            for (i, m) in list.iter().enumerate() {
                let n = m.version;
                let before = if i == 0 { 0 } else { list[i - 1].version };
                assert!(n > before, "{} after version {before}", m.name);
                assert!(m.name.starts_with(&format!("{n:04}_")), "{}", m.name);
                assert!(!m.sql.trim().is_empty(), "{}", m.name);
            }
        }
    }

    #[test]
    fn the_report_names_what_was_applied_or_says_nothing_was() {
        let mut r = MigrationReport {
            store: "sqlite://x.db".into(),
            applied: vec!["0002_b".into()],
            version: 2,
            latest: "0002_b".into(),
        };
        assert_eq!(
            r.lines(),
            ["applied 0002_b", "sqlite://x.db: schema at version 2"]
        );
        r.applied.clear();
        assert_eq!(
            r.lines(),
            ["sqlite://x.db: schema at version 2, nothing to apply"]
        );
    }
}
