//! Text out of a PDF, page by page in page order: a page with a text layer gives its text
//! directly (`pdftotext`); a page without one (a scan) is rendered (`pdftoppm`) and recognised
//! by Tesseract in Korean and English. Each program runs as its own child process
//! ([`crate::tools`]), so a PDF that crashes poppler cannot crash the worker.

use serde::Serialize;
use std::path::Path;
use std::time::Duration;

use crate::tools::{self, ToolError};
use homing::CancellationToken;

/// A page with fewer visible characters than this in its text layer is treated as a scan.
const MIN_TEXT_CHARS: usize = 8;
/// A document with more pages is refused rather than occupying the OCR queue for hours.
pub const MAX_PAGES: u32 = 300;
/// Rendering resolution for recognition: Tesseract is most accurate on ~300 dpi images.
const RENDER_DPI: &str = "300";
const TOOL_LIMIT: Duration = Duration::from_secs(300);

/// How one page's text was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Text,
    Ocr,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Extracted {
    /// Pages joined in order with a form feed, the conventional page separator.
    pub text: String,
    pub methods: Vec<Method>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error("the PDF has {0} pages; at most {MAX_PAGES} are extracted")]
    TooManyPages(u32),
    #[error("cannot read the page count of the PDF")]
    NoPageCount,
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

fn page_count(info: &str) -> Option<u32> {
    info.lines()
        .find_map(|l| l.strip_prefix("Pages:"))
        .and_then(|v| v.trim().parse().ok())
}

fn visible_chars(s: &str) -> usize {
    s.chars().filter(|c| !c.is_whitespace()).count()
}

/// Extracts the text of `pdf`, using `work` (an empty directory) for rendered pages.
pub async fn extract(
    pdf: &Path,
    work: &Path,
    cancel: &CancellationToken,
) -> Result<Extracted, ExtractError> {
    let info = tools::run("pdfinfo", &[pdf.as_os_str()], TOOL_LIMIT, cancel).await?;
    let pages = page_count(&String::from_utf8_lossy(&info)).ok_or(ExtractError::NoPageCount)?;
    if pages > MAX_PAGES {
        return Err(ExtractError::TooManyPages(pages));
    }
    let mut texts = Vec::with_capacity(pages as usize);
    let mut methods = Vec::with_capacity(pages as usize);
    for page in 1..=pages {
        let n = page.to_string();
        let layer = tools::run(
            "pdftotext",
            &[
                "-f".as_ref(),
                n.as_ref(),
                "-l".as_ref(),
                n.as_ref(),
                "-enc".as_ref(),
                "UTF-8".as_ref(),
                "-layout".as_ref(),
                pdf.as_os_str(),
                "-".as_ref(),
            ],
            TOOL_LIMIT,
            cancel,
        )
        .await?;
        let layer = String::from_utf8_lossy(&layer).into_owned();
        if visible_chars(&layer) >= MIN_TEXT_CHARS {
            texts.push(layer.trim_end().to_string());
            methods.push(Method::Text);
            continue;
        }
        let prefix = work.join(format!("page-{page}"));
        tools::run(
            "pdftoppm",
            &[
                "-f".as_ref(),
                n.as_ref(),
                "-l".as_ref(),
                n.as_ref(),
                "-r".as_ref(),
                RENDER_DPI.as_ref(),
                "-gray".as_ref(),
                "-png".as_ref(),
                "-singlefile".as_ref(),
                pdf.as_os_str(),
                prefix.as_os_str(),
            ],
            TOOL_LIMIT,
            cancel,
        )
        .await?;
        let image = prefix.with_extension("png");
        let recognised = tools::run(
            "tesseract",
            &[
                image.as_os_str(),
                "stdout".as_ref(),
                "-l".as_ref(),
                "kor+eng".as_ref(),
            ],
            TOOL_LIMIT,
            cancel,
        )
        .await?;
        // Rendered pages are large; keep at most one on disk at a time.
        let _ = tokio::fs::remove_file(&image).await;
        texts.push(String::from_utf8_lossy(&recognised).trim_end().to_string());
        methods.push(Method::Ocr);
    }
    Ok(Extracted {
        text: texts.join("\n\u{c}\n"),
        methods,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_count_is_read_from_pdfinfo() {
        let info = "Producer:  cairo\nPages:           12\nEncrypted: no\n";
        assert_eq!(page_count(info), Some(12));
        assert_eq!(page_count("Syntax Error"), None);
    }

    #[test]
    fn near_empty_text_layers_count_as_scans() {
        assert!(visible_chars(" \n\u{c} 3 ") < MIN_TEXT_CHARS);
        assert!(visible_chars("문서 발급 Homing") >= MIN_TEXT_CHARS);
    }
}
