//! External programs (poppler's `pdfinfo`/`pdftotext`/`pdftoppm`, `tesseract`) run as child
//! processes: a crash or a runaway in a native library then kills the child, never the worker.
//! Arguments go to the program as they are, never through a shell, and a child outliving its
//! job (time-out, cancellation, the handler dropped) is killed.

use homing::CancellationToken;
use std::ffi::OsStr;
use std::process::Stdio;
use std::time::Duration;

/// The Debian package that provides a program, for error messages that tell an operator what
/// to install.
pub fn package_of(program: &str) -> &'static str {
    match program {
        "pdfinfo" | "pdftotext" | "pdftoppm" => "poppler-utils",
        "tesseract" => "tesseract-ocr (with tesseract-ocr-kor and tesseract-ocr-eng)",
        _ => "the package that provides it",
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("`{program}` is not installed (Debian package: {package})")]
    Missing {
        program: String,
        package: &'static str,
    },
    #[error("`{program}` failed ({status}): {stderr}")]
    Failed {
        program: String,
        status: String,
        stderr: String,
    },
    #[error("`{program}` ran longer than {limit:?} and was killed")]
    TimedOut { program: String, limit: Duration },
    #[error("`{program}` was stopped: the job was cancelled")]
    Cancelled { program: String },
    #[error("cannot run `{program}`: {source}")]
    Io {
        program: String,
        source: std::io::Error,
    },
}

/// The first lines of a program's complaint, enough to tell what went wrong.
fn summary(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let mut s: String = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(3)
        .collect::<Vec<_>>()
        .join(" / ");
    if s.len() > 400 {
        let mut cut = 400;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    if s.is_empty() {
        "no message".into()
    } else {
        s
    }
}

/// Runs `program` with `args` and returns its standard output.
pub async fn run<S: AsRef<OsStr>>(
    program: &str,
    args: &[S],
    limit: Duration,
    cancel: &CancellationToken,
) -> Result<Vec<u8>, ToolError> {
    let mut cmd = tokio::process::Command::new(program);
    // Tesseract starts one OpenMP thread per core for each run. The worker already runs OCR
    // jobs side by side and the machine has other work, so those threads only compete with
    // each other: one thread per child (BENCHMARKS.md "OCR"). Programs without OpenMP ignore it.
    cmd.env("OMP_THREAD_LIMIT", "1");
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ToolError::Missing {
                program: program.into(),
                package: package_of(program),
            }
        } else {
            ToolError::Io {
                program: program.into(),
                source: e,
            }
        }
    })?;
    // Dropping the future drops the child, and kill_on_drop kills it.
    let out = tokio::select! {
        r = tokio::time::timeout(limit, child.wait_with_output()) => match r {
            Ok(r) => r.map_err(|e| ToolError::Io { program: program.into(), source: e })?,
            Err(_) => return Err(ToolError::TimedOut { program: program.into(), limit }),
        },
        _ = cancel.cancelled() => return Err(ToolError::Cancelled { program: program.into() }),
    };
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(ToolError::Failed {
            program: program.into(),
            status: out.status.to_string(),
            stderr: summary(&out.stderr),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_program_names_its_package() {
        let e = run(
            "homing-no-such-program",
            &["x"],
            Duration::from_secs(1),
            &CancellationToken::new(),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, ToolError::Missing { .. }), "{e}");
    }

    #[tokio::test]
    async fn arguments_are_not_interpreted_by_a_shell() {
        let out = run(
            "echo",
            &["$(id)", "; rm -rf /"],
            Duration::from_secs(5),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "$(id) ; rm -rf /\n");
    }

    #[tokio::test]
    async fn children_run_with_one_openmp_thread() {
        let out = run(
            "env",
            &[] as &[&str],
            Duration::from_secs(5),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
        let env = String::from_utf8(out).unwrap();
        assert!(env.lines().any(|l| l == "OMP_THREAD_LIMIT=1"), "{env}");
    }

    #[tokio::test]
    async fn a_slow_program_is_killed_at_its_limit() {
        let e = run(
            "sleep",
            &["30"],
            Duration::from_millis(100),
            &CancellationToken::new(),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, ToolError::TimedOut { .. }), "{e}");
    }
}
