//! The audit log's records (docs/access.md): what an operator did through the HTTP API or the
//! CLI, kept in the store beside the jobs it touched so that it survives restarts and is pruned
//! with them. The store only keeps and pages them; what is recorded is decided by the API and
//! the CLI.

use serde::{Deserialize, Serialize};

use crate::time::Micros;

/// Longest text kept in any field of an entry: a path with its query is short, and an entry is
/// written for every operator action, so a crafted long URL must not grow the table unbounded.
pub const MAX_FIELD: usize = 1024;

/// An entry to record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewAudit {
    /// The token's name (never the token itself); `anonymous` without authentication;
    /// `cli:<user>` for the CLI.
    pub actor: String,
    /// The token's role: `read` or `admin`.
    pub role: String,
    /// The route, as `METHOD /path/{param}`; for the CLI its command, as `cli jobs retry`.
    pub action: String,
    /// The path and query it was called with, which name the job, queue or schedule (the CLI:
    /// `id=…`, `queue=…`, `name=…`, or a bulk action's filter as `state=failed&task=x`).
    pub target: String,
    /// The HTTP status it was answered with (the CLI: 200, or the status the API would answer
    /// for the same failure).
    pub status: u16,
    /// For bulk actions, how many jobs it changed.
    pub count: Option<u64>,
}

impl NewAudit {
    /// Cuts every text to [`MAX_FIELD`] bytes (on a character boundary) and replaces NUL,
    /// which PostgreSQL cannot store: an entry must never fail to be written for its text.
    pub fn bounded(mut self) -> NewAudit {
        for f in [
            &mut self.actor,
            &mut self.role,
            &mut self.action,
            &mut self.target,
        ] {
            if f.contains('\0') {
                *f = f.replace('\0', "\u{fffd}");
            }
            if f.len() > MAX_FIELD {
                let mut end = MAX_FIELD;
                while !f.is_char_boundary(end) {
                    end -= 1;
                }
                f.truncate(end);
            }
        }
        self
    }
}

/// A recorded entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Increasing with time of recording; the page cursor.
    pub id: i64,
    /// When it was recorded (microseconds since the epoch).
    pub at: Micros,
    #[serde(flatten)]
    pub entry: NewAudit,
}

/// A page of entries, newest first; `next_cursor` continues after the last one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    pub next_cursor: Option<String>,
}

impl AuditPage {
    /// Makes a page from up to `limit + 1` rows, newest first: the extra row only says that
    /// another page follows, whose cursor is the last kept entry's id.
    pub fn cut(mut entries: Vec<AuditEntry>, limit: usize) -> AuditPage {
        let next_cursor = if entries.len() > limit {
            entries.truncate(limit);
            entries.last().map(|e| e.id.to_string())
        } else {
            None
        };
        AuditPage {
            entries,
            next_cursor,
        }
    }
}

/// Reads a page cursor: the id of the last entry of the previous page.
pub fn parse_cursor(cursor: Option<&str>) -> crate::error::Result<Option<i64>> {
    match cursor {
        None => Ok(None),
        Some(c) => c
            .parse::<i64>()
            .ok()
            .filter(|n| *n > 0)
            .map(Some)
            .ok_or_else(|| crate::error::Error::Invalid(format!("invalid cursor '{c}'"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_cuts_on_a_character_boundary_and_drops_nul() {
        let e = NewAudit {
            actor: "a\0b".into(),
            role: "admin".into(),
            action: "POST /x".into(),
            target: "é".repeat(MAX_FIELD),
            status: 200,
            count: None,
        }
        .bounded();
        assert_eq!(e.actor, "a\u{fffd}b");
        assert!(e.target.len() <= MAX_FIELD && e.target.len() > MAX_FIELD - 2);
        assert!(e.target.chars().all(|c| c == 'é'));
    }

    #[test]
    fn cursors_are_positive_ids() {
        assert_eq!(parse_cursor(None).unwrap(), None);
        assert_eq!(parse_cursor(Some("12")).unwrap(), Some(12));
        for bad in ["", "x", "-1", "0", "99999999999999999999"] {
            assert!(parse_cursor(Some(bad)).is_err(), "{bad}");
        }
    }
}
