//! Text out of a PDF, page by page in page order: a page with a text layer gives its text
//! directly (`pdftotext`); a page without one (a scan) is rendered (`pdftoppm`) and recognised
//! by Tesseract in Korean and English. Each program runs as its own child process
//! ([`crate::tools`]), so a PDF that crashes poppler cannot crash the worker.
//!
//! Recognition is not one fixed command: a scan is read by the [`Pass`]es of a [`Recipe`] in
//! order (a resolution, a page segmentation mode, the languages), and the page keeps the text of
//! the pass Tesseract is most confident about; once a pass is confident enough the rest are
//! skipped. Before Tesseract sees a page it is prepared in-process (docs/ocr.md): straightened
//! (`ocr/deskew.rs`), thresholded when it is a worn scan (`ocr/clean.rs`), and its columns laid
//! one under another in reading order with a table's rules erased (`ocr/layout.rs`): Tesseract's
//! own layout analysis was the corpus's worst loss. The default recipe was chosen by measuring
//! the character error rate on a generated corpus (`scripts/bench-ocr`, BENCHMARKS.md "OCR").
//! Every recognised page keeps its mean word confidence, and a page below [`LOW_CONFIDENCE`] is
//! reported rather than silently passed.
//!
//! The rendered size of a page is capped ([`MAX_PAGE_PIXELS`]): a huge page is rendered at a
//! lower resolution, and a page that would need less than [`MIN_DPI`] to fit is refused with a
//! permanent error — rendering it would only hold the OCR slot and gigabytes of memory again on
//! every retry.

use serde::Serialize;
use std::path::Path;
use std::time::Duration;

use crate::tools::{self, ToolError};
use homing::CancellationToken;

mod clean;
mod deskew;
/// The page rotation deskewing applies, also used by the tests' scan simulator.
pub use deskew::rotate;
mod layout;
mod words;

/// A page with fewer visible characters than this in its text layer is treated as a scan.
const MIN_TEXT_CHARS: usize = 8;
/// A document with more pages is refused rather than occupying the OCR queue for hours.
pub const MAX_PAGES: u32 = 300;
/// The most pixels one page is rendered to: an A4 page at 600 dpi (4961 × 7016) fits, with room
/// for A3 at 400 dpi. Tesseract needs a few tens of bytes per pixel, so this bounds one page's
/// recognition to about a gigabyte; a bigger page is rendered at a lower resolution.
pub const MAX_PAGE_PIXELS: u64 = 36_000_000;
/// Below this resolution no text of ordinary size is legible; a page so large that even this
/// resolution exceeds [`MAX_PAGE_PIXELS`] (about 12 000 pt on each side) is refused.
pub const MIN_DPI: u32 = 36;
/// A recognised page whose mean word confidence (0–100, weighted by characters) is below this is
/// listed in `low_confidence_pages`: on the generated corpus every clean page scores 91 or more,
/// the worst-read worn pages scored 71 and 56 before the page preparation fixed them, and the
/// tests' unreadable page is caught (BENCHMARKS.md "OCR").
pub const LOW_CONFIDENCE: f32 = 75.0;
const TOOL_LIMIT: Duration = Duration::from_secs(300);

/// How one page's text was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Text,
    Ocr,
}

/// One way of recognising a scanned page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pass {
    /// The resolution the page is rendered at (lowered for a page over [`MAX_PAGE_PIXELS`]).
    pub dpi: u32,
    /// Tesseract's page segmentation mode (`--psm`); `None` leaves Tesseract's default (3).
    pub psm: Option<u8>,
    /// Tesseract's languages, e.g. `kor+eng`.
    pub lang: String,
}

/// How scanned pages are recognised: the passes in order, and the confidence at which a page is
/// taken as read and the remaining passes are skipped.
#[derive(Debug, Clone, PartialEq)]
pub struct Recipe {
    pub passes: Vec<Pass>,
    pub good_enough: f32,
    /// Re-read the page with this language alone (`kor`) when a pass returned a Latin word it
    /// doubts, and take the Korean reading of that word where it is the more confident: mixed
    /// `kor+eng` recognition often turns a small Korean word into Latin junk.
    pub recheck_lang: Option<String>,
    /// A Latin word below this confidence is doubted (see `recheck_lang`).
    pub doubt_below: f32,
    /// Re-read the page with this language alone (`eng`) when a word without Hangul came back
    /// below `garbled_below` with digits or marks in it, and take a confident English reading
    /// of that word: with Korean loaded, a small worn Latin word can come back as digits and
    /// CJK brackets (`ocr/words.rs`, `prefer_english`).
    pub english_lang: Option<String>,
    /// See `english_lang`.
    pub garbled_below: f32,
    /// Drop a "line" Tesseract found inside a taller, more confident line: the lower parts of
    /// large Hangul syllables, read a second time as a line of loose jamo.
    pub drop_nested_lines: bool,
    /// Straighten a page scanned askew (up to 4°) before reading it.
    pub deskew: bool,
    /// Find the page's layout before reading it (`ocr/layout.rs`): erase a table's ruling
    /// lines, and lay columns one under another in reading order.
    pub layout: bool,
    /// Hand Tesseract a black-on-white page of our own thresholding (smoothed, specks removed,
    /// `ocr/clean.rs`) instead of the grey render, when the page is a worn scan (grey paper).
    pub binarise: bool,
    pub max_page_pixels: u64,
}

impl Recipe {
    /// The single fixed command the pipeline used to run (300 dpi, Tesseract's default
    /// segmentation): kept as the benchmark's baseline.
    pub fn baseline() -> Recipe {
        Recipe {
            passes: vec![Pass {
                dpi: 300,
                psm: None,
                lang: "kor+eng".into(),
            }],
            good_enough: 0.0,
            recheck_lang: None,
            doubt_below: 0.0,
            english_lang: None,
            garbled_below: 0.0,
            drop_nested_lines: false,
            deskew: false,
            layout: false,
            binarise: false,
            max_page_pixels: MAX_PAGE_PIXELS,
        }
    }

    /// Whether pages are rebuilt from Tesseract's words rather than taken as it printed them.
    fn rebuilds(&self) -> bool {
        self.recheck_lang.is_some() || self.english_lang.is_some() || self.drop_nested_lines
    }
}

impl Default for Recipe {
    /// Chosen by the numbers in BENCHMARKS.md "OCR".
    fn default() -> Recipe {
        Recipe {
            passes: vec![Pass {
                dpi: 400,
                psm: Some(4),
                lang: "kor+eng".into(),
            }],
            good_enough: 90.0,
            recheck_lang: Some("kor".into()),
            doubt_below: 93.0,
            english_lang: Some("eng".into()),
            garbled_below: 80.0,
            drop_nested_lines: true,
            deskew: true,
            layout: true,
            binarise: true,
            max_page_pixels: MAX_PAGE_PIXELS,
        }
    }
}

/// What is known about one page of the result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Page {
    pub method: Method,
    /// Tesseract's mean word confidence (0–100) for a recognised page; `None` for a text layer.
    pub confidence: Option<f32>,
    /// The resolution a recognised page was rendered at, and its size in pixels.
    pub dpi: Option<u32>,
    pub pixels: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Extracted {
    /// Pages joined in order with a form feed, the conventional page separator.
    pub text: String,
    pub pages: Vec<Page>,
}

impl Extracted {
    pub fn methods(&self) -> Vec<Method> {
        self.pages.iter().map(|p| p.method).collect()
    }

    pub fn confidences(&self) -> Vec<Option<f32>> {
        self.pages.iter().map(|p| p.confidence).collect()
    }

    /// The 1-based numbers of the recognised pages read with less than [`LOW_CONFIDENCE`], or
    /// in which Tesseract found no word at all.
    pub fn low_confidence_pages(&self) -> Vec<u32> {
        (1u32..)
            .zip(&self.pages)
            .filter(|(_, p)| p.is_low_confidence())
            .map(|(n, _)| n)
            .collect()
    }
}

impl Page {
    fn is_low_confidence(&self) -> bool {
        self.method == Method::Ocr && self.confidence.is_none_or(|c| c < LOW_CONFIDENCE)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error("the PDF has {0} pages; at most {MAX_PAGES} are extracted")]
    TooManyPages(u32),
    #[error("cannot read the page count of the PDF")]
    NoPageCount,
    #[error("cannot read the size of page {0} of the PDF")]
    NoPageSize(u32),
    #[error(
        "page {page} is {width} × {height} pt: even at {MIN_DPI} dpi it exceeds {max} pixels, the most a page is rendered to"
    )]
    PageTooLarge {
        page: u32,
        width: f64,
        height: f64,
        max: u64,
    },
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl ExtractError {
    /// Whether running the extraction again cannot succeed: the PDF itself is the problem.
    /// A tool that exits with an error or crashes on the file will do so again; one killed with
    /// SIGKILL (most often the out-of-memory killer) or timed out, cancelled, missing, or an I/O
    /// error may not. Every variant is named, so a new one must be classified here.
    pub fn is_permanent(&self) -> bool {
        match self {
            ExtractError::Tool(ToolError::Failed { status, .. }) => !status.contains("SIGKILL"),
            ExtractError::TooManyPages(_)
            | ExtractError::NoPageCount
            | ExtractError::NoPageSize(_)
            | ExtractError::PageTooLarge { .. } => true,
            ExtractError::Tool(
                ToolError::TimedOut { .. }
                | ToolError::Cancelled { .. }
                | ToolError::Missing { .. }
                | ToolError::Io { .. },
            )
            | ExtractError::Io(_) => false,
        }
    }
}

fn page_count(info: &str) -> Option<u32> {
    info.lines()
        .find_map(|l| l.strip_prefix("Pages:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Page sizes in points from `pdfinfo -f 1 -l N` ("Page    3 size: 595.28 x 841.89 pts (A4)").
fn page_sizes(info: &str) -> Vec<(u32, f64, f64)> {
    info.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("Page")?;
            let (n, size) = rest.split_once("size:")?;
            let n: u32 = n.trim().parse().ok()?;
            let mut it = size.split_whitespace();
            let w: f64 = it.next()?.parse().ok()?;
            (it.next()? == "x").then_some(())?;
            let h: f64 = it.next()?.parse().ok()?;
            (w.is_finite() && h.is_finite() && w > 0.0 && h > 0.0).then_some((n, w, h))
        })
        .collect()
}

/// The resolution to render a `width` × `height` pt page at: `wanted`, or lower so the page
/// stays within `max_pixels`; `None` when even [`MIN_DPI`] would not fit.
fn capped_dpi(wanted: u32, width: f64, height: f64, max_pixels: u64) -> Option<u32> {
    let square_inches = (width / 72.0) * (height / 72.0);
    // pdftoppm rounds each side up, so leave a pixel of slack per side.
    let fits = |dpi: u32| {
        let side = |pt: f64| (pt / 72.0 * f64::from(dpi)).ceil() + 1.0;
        side(width) * side(height) <= max_pixels as f64
    };
    if fits(wanted) {
        return Some(wanted);
    }
    let mut dpi = (max_pixels as f64 / square_inches)
        .sqrt()
        .floor()
        .min(f64::from(wanted)) as u32;
    while dpi >= MIN_DPI && !fits(dpi) {
        dpi -= 1;
    }
    (dpi >= MIN_DPI).then_some(dpi)
}

fn visible_chars(s: &str) -> usize {
    s.chars().filter(|c| !c.is_whitespace()).count()
}

/// The mean of Tesseract's word confidences in its TSV output, each word weighted by its
/// characters so a stray one-letter mark counts less than a long word; `None` with no words.
fn mean_confidence(tsv: &str) -> Option<f32> {
    let (mut sum, mut weight) = (0.0f64, 0usize);
    for line in tsv.lines().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        if cols.len() < 12 || cols[0] != "5" {
            continue;
        }
        let Ok(conf) = cols[10].parse::<f64>() else {
            continue;
        };
        let chars = visible_chars(cols[11]);
        if conf < 0.0 || chars == 0 {
            continue;
        }
        sum += conf * chars as f64;
        weight += chars;
    }
    (weight > 0).then(|| (sum / weight as f64) as f32)
}

/// Extracts the text of `pdf` with the default [`Recipe`], using `work` (an empty directory)
/// for rendered pages.
pub async fn extract(
    pdf: &Path,
    work: &Path,
    cancel: &CancellationToken,
) -> Result<Extracted, ExtractError> {
    extract_with(pdf, work, cancel, &Recipe::default()).await
}

/// [`extract`] with an explicit recipe (the benchmark compares recipes).
pub async fn extract_with(
    pdf: &Path,
    work: &Path,
    cancel: &CancellationToken,
    recipe: &Recipe,
) -> Result<Extracted, ExtractError> {
    let info = tools::run("pdfinfo", &[pdf.as_os_str()], TOOL_LIMIT, cancel).await?;
    let pages = page_count(&String::from_utf8_lossy(&info)).ok_or(ExtractError::NoPageCount)?;
    if pages > MAX_PAGES {
        return Err(ExtractError::TooManyPages(pages));
    }
    let mut sizes = Vec::new();
    if pages > 0 {
        let last = pages.to_string();
        let info = tools::run(
            "pdfinfo",
            &[
                "-f".as_ref(),
                "1".as_ref(),
                "-l".as_ref(),
                last.as_ref(),
                pdf.as_os_str(),
            ],
            TOOL_LIMIT,
            cancel,
        )
        .await?;
        sizes = page_sizes(&String::from_utf8_lossy(&info));
    }
    let mut texts = Vec::with_capacity(pages as usize);
    let mut out = Vec::with_capacity(pages as usize);
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
            out.push(Page {
                method: Method::Text,
                confidence: None,
                dpi: None,
                pixels: None,
            });
            continue;
        }
        let &(_, width, height) = sizes
            .iter()
            .find(|(p, _, _)| *p == page)
            .ok_or(ExtractError::NoPageSize(page))?;
        let too_large = || ExtractError::PageTooLarge {
            page,
            width,
            height,
            max: recipe.max_page_pixels,
        };
        let mut best: Option<(String, Page)> = None;
        for (i, pass) in recipe.passes.iter().enumerate() {
            let dpi = capped_dpi(pass.dpi, width, height, recipe.max_page_pixels)
                .ok_or_else(too_large)?;
            let (text, read) = recognise(pdf, work, page, dpi, pass, recipe, cancel).await?;
            let better = match &best {
                None => true,
                Some((_, b)) => read.confidence.unwrap_or(-1.0) > b.confidence.unwrap_or(-1.0),
            };
            if better {
                best = Some((text, read));
            }
            let done = best
                .as_ref()
                .and_then(|(_, b)| b.confidence)
                .is_some_and(|c| c >= recipe.good_enough);
            if done || i + 1 == recipe.passes.len() {
                break;
            }
        }
        let (text, read) = best.unwrap_or_else(|| {
            (
                String::new(),
                Page {
                    method: Method::Ocr,
                    confidence: None,
                    dpi: None,
                    pixels: None,
                },
            )
        });
        texts.push(text);
        out.push(read);
    }
    Ok(Extracted {
        text: texts.join("\n\u{c}\n"),
        pages: out,
    })
}

/// Runs Tesseract once on `image`; returns its text and its TSV (words, boxes, confidences).
#[allow(clippy::too_many_arguments)]
async fn tesseract(
    image: &Path,
    work: &Path,
    page: u32,
    dpi: u32,
    lang: &str,
    psm: Option<u8>,
    cancel: &CancellationToken,
) -> Result<(String, String), ExtractError> {
    let base = work.join(format!("page-{page}-ocr"));
    let mut args: Vec<std::ffi::OsString> = vec![
        image.into(),
        base.clone().into(),
        "-l".into(),
        lang.into(),
        "--dpi".into(),
        dpi.to_string().into(),
    ];
    if let Some(psm) = psm {
        args.push("--psm".into());
        args.push(psm.to_string().into());
    }
    // Two outputs from one run: the text as Tesseract spaces it, and the words with their
    // boxes and confidences.
    args.push("txt".into());
    args.push("tsv".into());
    tools::run("tesseract", &args, TOOL_LIMIT, cancel).await?;
    let txt = tokio::fs::read_to_string(base.with_extension("txt")).await;
    let tsv = tokio::fs::read_to_string(base.with_extension("tsv")).await;
    let _ = tokio::fs::remove_file(base.with_extension("txt")).await;
    let _ = tokio::fs::remove_file(base.with_extension("tsv")).await;
    Ok((txt?, tsv?))
}

fn write_png(img: &image::GrayImage, path: &Path) -> Result<(), image::ImageError> {
    // A page is tens of megapixels: fast compression saves seconds and costs disk only.
    let out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let png = image::codecs::png::PngEncoder::new_with_quality(
        out,
        image::codecs::png::CompressionType::Fast,
        image::codecs::png::FilterType::Sub,
    );
    img.write_with_encoder(png)
}

/// Straightens the page image at `path` and finds its layout, as `recipe` asks, rewriting the
/// file only when something changed. A worn page is written twice: thresholded by us at
/// `path`, and as rendered (grey) at `grey`; the function says whether it wrote `grey`.
fn prepare(path: &Path, grey: &Path, dpi: u32, recipe: &Recipe) -> Result<bool, image::ImageError> {
    if !recipe.deskew && !recipe.layout && !recipe.binarise {
        return Ok(false);
    }
    let mut img = image::open(path)?.to_luma8();
    let mut changed = false;
    if recipe.deskew {
        if let Some(level) = deskew::straighten(&img) {
            img = level;
            changed = true;
        }
    }
    let mut wrote_grey = false;
    if recipe.binarise && clean::is_worn(&img) {
        let black = clean::binarise(&img, dpi);
        if recipe.layout {
            layout::prepare(&mut img, dpi);
        }
        write_png(&img, grey)?;
        wrote_grey = true;
        img = black;
        changed = true;
    }
    if recipe.layout {
        changed |= layout::prepare(&mut img, dpi).0;
    }
    if changed {
        write_png(&img, path)?;
    }
    Ok(wrote_grey)
}

/// One reading of a prepared page image: its text and its mean word confidence.
async fn read_image(
    image: &Path,
    work: &Path,
    page: u32,
    dpi: u32,
    pass: &Pass,
    recipe: &Recipe,
    cancel: &CancellationToken,
) -> Result<(String, Option<f32>), ExtractError> {
    let (txt, tsv) = tesseract(image, work, page, dpi, &pass.lang, pass.psm, cancel).await?;
    if !recipe.rebuilds() {
        return Ok((txt.trim_end().to_string(), mean_confidence(&tsv)));
    }
    let mut read = words::parse(&tsv, &txt);
    if recipe.drop_nested_lines {
        read = words::drop_nested_lines(read);
    }
    if let Some(lang) = &recipe.recheck_lang {
        if read.iter().any(|w| words::doubted(w, recipe.doubt_below)) {
            let (txt, tsv) = tesseract(image, work, page, dpi, lang, pass.psm, cancel).await?;
            let korean = words::parse(&tsv, &txt);
            read = words::prefer_korean(read, &korean, recipe.doubt_below);
        }
    }
    // After the Korean recheck: a word it made Hangul is no longer a candidate.
    if let Some(lang) = &recipe.english_lang {
        if read.iter().any(|w| words::garbled(w, recipe.garbled_below)) {
            let (txt, tsv) = tesseract(image, work, page, dpi, lang, pass.psm, cancel).await?;
            let english = words::parse(&tsv, &txt);
            read = words::prefer_english(read, &english, recipe.garbled_below);
        }
    }
    Ok((words::text(&read), words::mean_confidence(&read)))
}

/// Renders `page` at `dpi` and reads it with one pass; the rendered image is removed after.
async fn recognise(
    pdf: &Path,
    work: &Path,
    page: u32,
    dpi: u32,
    pass: &Pass,
    recipe: &Recipe,
    cancel: &CancellationToken,
) -> Result<(String, Page), ExtractError> {
    let n = page.to_string();
    let r = dpi.to_string();
    let prefix = work.join(format!("page-{page}"));
    tools::run(
        "pdftoppm",
        &[
            "-f".as_ref(),
            n.as_ref(),
            "-l".as_ref(),
            n.as_ref(),
            "-r".as_ref(),
            r.as_ref(),
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
    let result = async {
        // The size was planned from pdfinfo's numbers; check what poppler actually drew before
        // handing it to Tesseract, the step whose memory grows with the pixels.
        let (w, h) = image::image_dimensions(&image)
            .map_err(|e| std::io::Error::other(format!("cannot read the rendered page: {e}")))?;
        let pixels = u64::from(w) * u64::from(h);
        if pixels > recipe.max_page_pixels {
            return Err(ExtractError::PageTooLarge {
                page,
                width: f64::from(w) * 72.0 / f64::from(dpi),
                height: f64::from(h) * 72.0 / f64::from(dpi),
                max: recipe.max_page_pixels,
            });
        }
        let grey = work.join(format!("page-{page}-grey.png"));
        let wrote_grey = {
            let (path, grey, recipe) = (image.clone(), grey.clone(), recipe.clone());
            tokio::task::spawn_blocking(move || prepare(&path, &grey, dpi, &recipe))
                .await
                .map_err(std::io::Error::other)?
                .map_err(|e| std::io::Error::other(format!("cannot prepare the page: {e}")))?
        };
        let mut best = read_image(&image, work, page, dpi, pass, recipe, cancel).await;
        if wrote_grey {
            // Our threshold rescues most worn pages, but it can also split a large bold title
            // into a line and a ghost of its lower half: the grey page is read too and the
            // more confident reading kept (BENCHMARKS.md "OCR").
            let other = read_image(&grey, work, page, dpi, pass, recipe, cancel).await;
            let _ = tokio::fs::remove_file(&grey).await;
            let conf = |r: &Result<(String, Option<f32>), ExtractError>| {
                r.as_ref().ok().and_then(|(_, c)| *c).unwrap_or(-1.0)
            };
            if best.is_err() || conf(&other) > conf(&best) {
                best = other;
            }
        }
        let (text, confidence) = best?;
        Ok((
            text,
            Page {
                method: Method::Ocr,
                confidence,
                dpi: Some(dpi),
                pixels: Some(pixels),
            },
        ))
    }
    .await;
    // Rendered pages are large; keep at most one on disk at a time.
    let _ = tokio::fs::remove_file(&image).await;
    result
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
    fn page_sizes_are_read_from_pdfinfo() {
        let info =
            "Pages:          2\nPage    1 size: 595.276 x 841.89 pts (A4)\nPage    1 rot:  0\n\
                    Page    2 size: 5000 x 5000 pts\nPage    3 size: nan x 3 pts\n";
        assert_eq!(
            page_sizes(info),
            vec![(1, 595.276, 841.89), (2, 5000.0, 5000.0)]
        );
    }

    #[test]
    fn a_huge_page_is_rendered_at_a_lower_resolution_or_refused() {
        assert_eq!(capped_dpi(400, 595.0, 842.0, MAX_PAGE_PIXELS), Some(400));
        let dpi = capped_dpi(400, 5000.0, 5000.0, MAX_PAGE_PIXELS).unwrap();
        assert!((MIN_DPI..400).contains(&dpi), "{dpi}");
        let side = (5000.0 / 72.0 * f64::from(dpi)).ceil() + 1.0;
        assert!(side * side <= MAX_PAGE_PIXELS as f64);
        assert_eq!(capped_dpi(400, 14400.0, 100_000.0, MAX_PAGE_PIXELS), None);
        // A long thin strip is limited by its area, not its longest side.
        assert!(capped_dpi(300, 72.0, 200_000.0, MAX_PAGE_PIXELS).is_some());
    }

    #[test]
    fn the_mean_confidence_weights_words_by_their_characters() {
        let tsv = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext\n\
                   4\t1\t1\t1\t1\t0\t0\t0\t9\t9\t-1\t\n\
                   5\t1\t1\t1\t1\t1\t0\t0\t9\t9\t90\t문서발급\n\
                   5\t1\t1\t1\t1\t2\t0\t0\t9\t9\t30\t=\n\
                   5\t1\t1\t1\t1\t3\t0\t0\t9\t9\t95\t \n";
        let c = mean_confidence(tsv).unwrap();
        assert!((c - 78.0).abs() < 0.01, "{c}");
        assert_eq!(mean_confidence("level\tpage_num\n"), None);
    }

    #[test]
    fn pages_below_the_threshold_are_listed_by_number() {
        let page = |method, confidence| Page {
            method,
            confidence,
            dpi: None,
            pixels: None,
        };
        let e = Extracted {
            text: String::new(),
            pages: vec![
                page(Method::Text, None),
                page(Method::Ocr, Some(95.0)),
                page(Method::Ocr, Some(LOW_CONFIDENCE - 1.0)),
                page(Method::Ocr, Some(LOW_CONFIDENCE)),
                page(Method::Ocr, None),
            ],
        };
        assert_eq!(e.low_confidence_pages(), vec![3, 5]);
    }

    #[test]
    fn near_empty_text_layers_count_as_scans() {
        assert!(visible_chars(" \n\u{c} 3 ") < MIN_TEXT_CHARS);
        assert!(visible_chars("문서 발급 Homing") >= MIN_TEXT_CHARS);
    }
}
