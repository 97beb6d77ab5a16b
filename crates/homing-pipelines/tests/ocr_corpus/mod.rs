//! A generated corpus of scanned pages whose text is known because the corpus drew it, and the
//! character error rate (CER) that scores a recognition against it. Shared by the OCR tests
//! (tests/ocr.rs) and the benchmark (examples/bench-ocr.rs, `scripts/bench-ocr`).
//!
//! A page is typeset block by block with `pango-view` (pango1.0-tools) in NanumGothic
//! (fonts-nanum) or DejaVu Sans at the page's resolution, composed onto an A4 sheet, drawn on
//! for tables, then degraded the way scanners and fax-era workflows degrade paper — a slight
//! rotation, blur, grey paper and ink, noise, specks, JPEG artefacts — by the small image code
//! below, and wrapped into an image-only PDF by `img2pdf` (img2pdf). Nothing is checked in.

#![allow(dead_code)]

use image::{GrayImage, Luma};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Fails (never skips) when a program the corpus needs is missing, naming its Debian package.
pub fn need_tools() {
    for (program, package) in [
        ("pango-view", "pango1.0-tools"),
        ("img2pdf", "img2pdf"),
        ("pdfinfo", "poppler-utils"),
        ("pdftotext", "poppler-utils"),
        ("pdftoppm", "poppler-utils"),
        ("tesseract", "tesseract-ocr"),
    ] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
            .unwrap_or(false);
        assert!(
            found,
            "`{program}` is missing: install the Debian package {package} (apt-get install -y {package})"
        );
    }
    let langs = Command::new("tesseract")
        .arg("--list-langs")
        .output()
        .expect("tesseract --list-langs");
    let langs = String::from_utf8_lossy(&langs.stdout).to_string()
        + &String::from_utf8_lossy(&langs.stderr);
    for (lang, package) in [("kor", "tesseract-ocr-kor"), ("eng", "tesseract-ocr-eng")] {
        assert!(
            langs.lines().any(|l| l.trim() == lang),
            "Tesseract has no `{lang}` data: install the Debian package {package}"
        );
    }
    let fonts = Command::new("fc-list")
        .output()
        .expect("fc-list (Debian package fontconfig)");
    let fonts = String::from_utf8_lossy(&fonts.stdout);
    for (font, package) in [
        ("NanumGothic", "fonts-nanum"),
        ("DejaVu Sans", "fonts-dejavu-core"),
    ] {
        assert!(
            fonts.contains(font),
            "the font {font} is missing: install the Debian package {package}"
        );
    }
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub const NANUM: &str = "NanumGothic";
pub const NANUM_BOLD: &str = "NanumGothic Bold";
pub const DEJAVU: &str = "DejaVu Sans";

/// One piece of a page, laid out top to bottom.
#[derive(Debug, Clone)]
pub enum Block {
    /// Text in one font, wrapped at `width` points.
    Text {
        font: &'static str,
        size: f32,
        width: f32,
        text: &'static str,
    },
    /// Columns side by side, read left column first.
    Columns(Vec<Block>),
    /// A ruled table, read row by row; every column is `column` points wide.
    Table {
        font: &'static str,
        size: f32,
        column: f32,
        rows: Vec<Vec<&'static str>>,
    },
    /// Vertical space, in points.
    Space(f32),
}

impl Block {
    fn expected(&self) -> String {
        match self {
            Block::Text { text, .. } => text.to_string(),
            Block::Columns(cs) => cs
                .iter()
                .map(Block::expected)
                .collect::<Vec<_>>()
                .join("\n"),
            Block::Table { rows, .. } => rows
                .iter()
                .map(|r| r.join(" "))
                .collect::<Vec<_>>()
                .join("\n"),
            Block::Space(_) => String::new(),
        }
    }
}

/// How a scan spoils a clean page.
#[derive(Debug, Clone, Copy, Default)]
pub struct Degrade {
    /// Rotation in degrees (counter-clockwise).
    pub angle: f32,
    /// A 3×3 blur, as a scanner's optics soften edges.
    pub blur: bool,
    /// Paper and ink levels (0–255) instead of white and black.
    pub paper: u8,
    pub ink: u8,
    /// Standard deviation of the grey noise added to every pixel.
    pub noise: f32,
    /// The fraction of pixels turned into dark specks.
    pub specks: f32,
    /// JPEG quality the page is stored at, instead of lossless PNG.
    pub jpeg: Option<u8>,
}

impl Degrade {
    pub fn none() -> Degrade {
        Degrade {
            paper: 255,
            ink: 0,
            ..Degrade::default()
        }
    }

    pub fn is_clean(&self) -> bool {
        self.angle == 0.0
            && !self.blur
            && self.noise == 0.0
            && self.specks == 0.0
            && self.jpeg.is_none()
            && self.paper == 255
            && self.ink == 0
    }
}

/// One scanned page of the corpus.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: &'static str,
    /// `ko`, `en` or `mixed`.
    pub script: &'static str,
    pub dpi: u32,
    pub blocks: Vec<Block>,
    pub degrade: Degrade,
}

impl Case {
    /// The text the page shows, in reading order.
    pub fn expected(&self) -> String {
        self.blocks
            .iter()
            .map(Block::expected)
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn is_clean(&self) -> bool {
        self.degrade.is_clean()
    }

    /// Draws the page and writes `<dir>/<name>.pdf`, a one-page image-only PDF.
    pub fn pdf(&self, dir: &Path) -> PathBuf {
        let page = self.page(dir);
        let page = degrade(page, &self.degrade, seed(self.name));
        let image = match self.degrade.jpeg {
            Some(q) => {
                let path = dir.join(format!("{}.jpg", self.name));
                let mut out = std::fs::File::create(&path).unwrap();
                image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, q)
                    .encode_image(&page)
                    .unwrap();
                path
            }
            None => {
                let path = dir.join(format!("{}.png", self.name));
                page.save(&path).unwrap();
                path
            }
        };
        let pdf = dir.join(format!("{}.pdf", self.name));
        let res = format!("{0}dpix{0}dpi", self.dpi);
        run(
            "img2pdf",
            &[
                image.to_str().unwrap(),
                "--imgsize",
                &res,
                "-o",
                pdf.to_str().unwrap(),
            ],
        );
        pdf
    }

    fn px(&self, points: f32) -> u32 {
        (points / 72.0 * self.dpi as f32).round() as u32
    }

    /// The clean page: A4, a 72 pt margin, blocks one under another.
    fn page(&self, dir: &Path) -> GrayImage {
        let mut page = GrayImage::from_pixel(self.px(595.0), self.px(842.0), Luma([255]));
        let left = self.px(72.0);
        let mut y = self.px(72.0);
        for (i, b) in self.blocks.iter().enumerate() {
            y += self.draw(dir, &format!("{}-{i}", self.name), b, &mut page, left, y);
        }
        page
    }

    /// Draws `b` with its top-left corner at (x, y); returns its height in pixels.
    fn draw(&self, dir: &Path, tag: &str, b: &Block, page: &mut GrayImage, x: u32, y: u32) -> u32 {
        let gap = self.px(10.0);
        match b {
            Block::Text {
                font,
                size,
                width,
                text,
            } => {
                let t = self.typeset(dir, tag, font, *size, *width, text);
                paste(page, &t, x, y);
                t.height() + gap
            }
            Block::Columns(cs) => {
                let mut cx = x;
                let mut tallest = 0;
                for (i, c) in cs.iter().enumerate() {
                    let h = self.draw(dir, &format!("{tag}-{i}"), c, page, cx, y);
                    tallest = tallest.max(h);
                    let w = match c {
                        Block::Text { width, .. } => *width,
                        _ => 200.0,
                    };
                    cx += self.px(w + 24.0);
                }
                tallest
            }
            Block::Table {
                font,
                size,
                column,
                rows,
            } => {
                let cw = self.px(*column);
                let pad = self.px(5.0);
                let line = (self.dpi / 150).max(1);
                let mut ry = y;
                for (r, row) in rows.iter().enumerate() {
                    let cells: Vec<GrayImage> = row
                        .iter()
                        .enumerate()
                        .map(|(c, t)| {
                            self.typeset(
                                dir,
                                &format!("{tag}-{r}-{c}"),
                                font,
                                *size,
                                column - 10.0,
                                t,
                            )
                        })
                        .collect();
                    let rh = cells.iter().map(|c| c.height()).max().unwrap_or(0) + 2 * pad;
                    for (c, cell) in cells.iter().enumerate() {
                        paste(page, cell, x + c as u32 * cw + pad, ry + pad);
                    }
                    let width = cw * row.len() as u32;
                    rule(page, x, ry, width + line, line);
                    for c in 0..=row.len() as u32 {
                        rule(page, x + c * cw, ry, line, rh);
                    }
                    ry += rh;
                    if r + 1 == rows.len() {
                        rule(page, x, ry, width + line, line);
                    }
                }
                ry - y + gap
            }
            Block::Space(pt) => self.px(*pt),
        }
    }

    fn typeset(
        &self,
        dir: &Path,
        tag: &str,
        font: &str,
        size: f32,
        width: f32,
        text: &str,
    ) -> GrayImage {
        let out = dir.join(format!("{tag}.png"));
        run(
            "pango-view",
            &[
                "-q",
                &format!("--font={font} {size}"),
                &format!("--dpi={}", self.dpi),
                "--margin=0",
                &format!("--width={width}"),
                "--wrap=word",
                "--hinting=full",
                "-t",
                text,
                "-o",
                out.to_str().unwrap(),
            ],
        );
        let img = image::open(&out).unwrap().to_luma8();
        let _ = std::fs::remove_file(&out);
        img
    }
}

fn paste(page: &mut GrayImage, img: &GrayImage, x: u32, y: u32) {
    for (ix, iy, p) in img.enumerate_pixels() {
        let (px, py) = (x + ix, y + iy);
        if px < page.width() && py < page.height() {
            let cur = page.get_pixel(px, py).0[0];
            page.put_pixel(px, py, Luma([cur.min(p.0[0])]));
        }
    }
}

fn rule(page: &mut GrayImage, x: u32, y: u32, w: u32, h: u32) {
    for py in y..(y + h).min(page.height()) {
        for px in x..(x + w).min(page.width()) {
            page.put_pixel(px, py, Luma([0]));
        }
    }
}

fn seed(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Applies `d` to a clean page; the same seed gives the same page.
pub fn degrade(page: GrayImage, d: &Degrade, seed: u64) -> GrayImage {
    let mut img = if d.angle != 0.0 {
        homing_pipelines::ocr::rotate(&page, d.angle)
    } else {
        page
    };
    if d.blur {
        img = image::imageops::blur(&img, 0.7);
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let (paper, ink) = (f32::from(d.paper), f32::from(d.ink));
    for p in img.pixels_mut() {
        let v = f32::from(p.0[0]) / 255.0;
        let mut v = ink + (paper - ink) * v;
        if d.noise > 0.0 {
            // The sum of four uniforms is close enough to a Gaussian for paper grain.
            let g: f32 = (0..4).map(|_| rng.f32()).sum::<f32>() - 2.0;
            v += g * d.noise * 1.7;
        }
        if d.specks > 0.0 && rng.f32() < d.specks {
            v = ink + rng.f32() * 60.0;
        }
        p.0[0] = v.clamp(0.0, 255.0).round() as u8;
    }
    img
}

/// Whitespace runs become one space; leading and trailing whitespace goes.
pub fn normalise(s: &str) -> Vec<char> {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .collect()
}

/// Levenshtein distance over characters.
pub fn edit_distance(a: &[char], b: &[char]) -> usize {
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let swap = prev[j] + usize::from(ca != cb);
            cur[j + 1] = swap.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The character error rate of `got` against `expected`: edits per expected character, after
/// whitespace normalisation.
pub fn cer(expected: &str, got: &str) -> f64 {
    let (e, g) = (normalise(expected), normalise(got));
    edit_distance(&e, &g) as f64 / e.len().max(1) as f64
}

// ---- the corpus

const TITLE_KO: &str = "문서 발급 확인서";
const SEED_EN: &str = "The document was issued and stored on 2024-03-15.";
const SEED_MIXED: &str = "발급 번호 HOM-2024 은행 제출용 copy";

const BODY_KO: &str =
    "본 문서는 신청인의 요청에 따라 발급되었으며 발급일로부터 삼십 일 동안 유효합니다. \
제출처에서 진위 여부를 확인할 수 있도록 발급 번호와 확인 코드를 함께 기재하였습니다. \
문의 사항이 있으시면 민원 안내 창구로 연락하시기 바랍니다.";
const BODY_EN: &str =
    "This certificate confirms that the applicant has completed the registration \
process. The record was verified against the original documents and will be kept for five \
years. Please keep this page with your other papers and present it when asked.";
const BODY_MIXED: &str =
    "주문 번호 ORD-7731 의 배송 상태는 Delivered 입니다. 담당자 Kim Minsoo 에게 \
문의하시거나 고객센터 02-1234-5678 로 전화해 주십시오. Tracking code 는 KR55 입니다.";
const COL_LEFT: &str =
    "회의 결과 요약: 다음 분기 예산은 원안대로 승인되었습니다. The budget review \
meeting approved the plan without changes.";
const COL_RIGHT: &str =
    "후속 조치로 각 부서는 다음 주까지 세부 계획을 제출합니다. Each team sends \
its detailed plan by next Friday.";

/// The page: a large Korean title, an English line and a small mixed line.
pub fn seed_case() -> Case {
    Case {
        name: "seed-3-lines",
        script: "mixed",
        dpi: 300,
        blocks: seed_blocks(),
        degrade: Degrade::none(),
    }
}

fn seed_blocks() -> Vec<Block> {
    vec![
        Block::Text {
            font: NANUM_BOLD,
            size: 26.0,
            width: 451.0,
            text: TITLE_KO,
        },
        Block::Text {
            font: DEJAVU,
            size: 10.0,
            width: 451.0,
            text: SEED_EN,
        },
        Block::Text {
            font: NANUM,
            size: 9.0,
            width: 451.0,
            text: SEED_MIXED,
        },
    ]
}

/// The seed's page as a worn scan: 200 dpi, turned 2°, blurred, grey, noisy, JPEG.
pub fn seed_degraded_case() -> Case {
    Case {
        name: "seed-degraded",
        script: "mixed",
        dpi: 200,
        blocks: seed_blocks(),
        degrade: Degrade {
            angle: 2.0,
            blur: true,
            paper: 235,
            ink: 40,
            noise: 12.0,
            specks: 0.0005,
            jpeg: Some(50),
        },
    }
}

fn text(font: &'static str, size: f32, text: &'static str) -> Block {
    Block::Text {
        font,
        size,
        width: 451.0,
        text,
    }
}

fn worn(angle: f32, jpeg: u8) -> Degrade {
    Degrade {
        angle,
        blur: true,
        paper: 232,
        ink: 35,
        noise: 14.0,
        specks: 0.0008,
        jpeg: Some(jpeg),
    }
}

fn letter_ko() -> Vec<Block> {
    vec![
        text(NANUM_BOLD, 22.0, "재직 증명서"),
        text(NANUM, 10.0, BODY_KO),
    ]
}

/// A Korean letter scanned 3° askew through a worn scanner, stored as a JPEG.
pub fn ko_letter_worn_case() -> Case {
    Case {
        name: "ko-letter-worn",
        script: "ko",
        dpi: 300,
        blocks: letter_ko(),
        degrade: worn(-3.0, 45),
    }
}

/// Every case the benchmark measures: clean pages first, then degraded ones.
pub fn all() -> Vec<Case> {
    let letter_ko = letter_ko();
    let letter_en = vec![
        text(DEJAVU, 20.0, "Certificate of Registration"),
        text(DEJAVU, 10.0, BODY_EN),
    ];
    let small_ko = vec![text(NANUM, 8.0, BODY_KO), text(NANUM, 8.0, BODY_MIXED)];
    let columns = vec![
        text(NANUM_BOLD, 18.0, "회의록 Meeting notes"),
        Block::Columns(vec![
            Block::Text {
                font: NANUM,
                size: 10.0,
                width: 210.0,
                text: COL_LEFT,
            },
            Block::Text {
                font: NANUM,
                size: 10.0,
                width: 210.0,
                text: COL_RIGHT,
            },
        ]),
    ];
    let table = vec![
        text(NANUM_BOLD, 16.0, "거래 내역 Statement"),
        Block::Table {
            font: NANUM,
            size: 10.0,
            column: 140.0,
            rows: vec![
                vec!["날짜", "내용", "금액"],
                vec!["2024-03-02", "사무용품 구입", "45,000"],
                vec!["2024-03-09", "Cloud hosting", "128,500"],
                vec!["2024-03-17", "교통비 정산", "12,300"],
            ],
        },
    ];
    let mixed = vec![
        text(NANUM_BOLD, 20.0, "배송 안내 Delivery notice"),
        text(NANUM, 10.0, BODY_MIXED),
    ];
    let case = |name, script, dpi, blocks: &Vec<Block>, degrade| Case {
        name,
        script,
        dpi,
        blocks: blocks.clone(),
        degrade,
    };
    let clean = Degrade::none();
    vec![
        seed_case(),
        case("ko-letter", "ko", 300, &letter_ko, clean),
        case("en-letter", "en", 300, &letter_en, clean),
        case("ko-small-print", "ko", 300, &small_ko, clean),
        case("en-letter-150dpi", "en", 150, &letter_en, clean),
        case("ko-letter-200dpi", "ko", 200, &letter_ko, clean),
        case("mixed-two-columns", "mixed", 300, &columns, clean),
        case("mixed-table", "mixed", 300, &table, clean),
        seed_degraded_case(),
        ko_letter_worn_case(),
        case("en-letter-worn", "en", 200, &letter_en, worn(1.5, 50)),
        case(
            "ko-letter-150dpi-worn",
            "ko",
            150,
            &letter_ko,
            worn(-1.0, 70),
        ),
        case("mixed-notice-worn", "mixed", 200, &mixed, worn(3.0, 55)),
        case(
            "mixed-two-columns-worn",
            "mixed",
            300,
            &columns,
            worn(-2.0, 50),
        ),
        case("mixed-table-worn", "mixed", 200, &table, worn(1.0, 60)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cer_counts_edits_per_expected_character_after_whitespace() {
        assert_eq!(cer("문서 발급", "문서  발급\n"), 0.0);
        assert_eq!(cer("abcd", "abxd"), 0.25);
        assert_eq!(cer("ab", ""), 1.0);
        assert_eq!(
            edit_distance(&normalise("kitten"), &normalise("sitting")),
            3
        );
    }
}
