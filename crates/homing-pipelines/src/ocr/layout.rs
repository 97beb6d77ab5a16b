//! The page's layout, found on the rendered image before Tesseract reads it, because
//! Tesseract's own answers to "where are the columns" were the corpus's worst losses: read as
//! one column, two columns interleave line by line; read with its layout analysis, a phrase
//! moves to the wrong column and a worn table falls apart into fragments.
//!
//! The ink is separated from the paper (Otsu's threshold), specks too small to be a mark of
//! writing are ignored, and long straight runs of ink — a table's ruling lines — are found and
//! later erased from the image Tesseract sees (a rule next to a cell reads as `|`, `l` or `1`).
//! The page is cut into text lines by the horizontal projection of the ink; consecutive lines
//! that share a blank vertical strip at least [`GUTTER_LINES`] line heights wide, inside the
//! text and with ink on both sides, form a section with columns. A section with columns is read
//! column by column (left column before right), except inside a ruled table, whose rows are read
//! across. When there are columns, the page is recomposed as a single column of those pieces in
//! reading order, so one Tesseract run in single-column mode reads it in the right order.

use image::{GrayImage, Luma};

/// A blank vertical strip this many median line heights wide, shared by consecutive lines, is
/// a gutter between columns (word spaces are a fraction of a line height; the corpus's gutter
/// is about two).
const GUTTER_LINES: f32 = 1.5;
/// A straight run of ink this long (in inches) is a ruling line, not a stroke of a letter (a
/// 26 pt Hangul title's longest stroke is under 0.3 inch; a table rule spans its width).
const RULE_INCHES: f32 = 0.5;

/// A rectangle of the page, in pixels: x, y, width, height.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rect {
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
}

/// What was found on a page.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// The page's text in reading order, as pieces; `None` when it is one column and needs no
    /// rearranging.
    pub pieces: Option<Vec<Rect>>,
    /// The pixels of ruling lines (row-major, one per pixel of the page).
    pub rules: Vec<bool>,
    pub rule_pixels: usize,
    /// The grey of the paper (the page's median): what an erased rule is painted with, so no
    /// white grid is left on grey paper.
    pub paper: u8,
}

/// Otsu's threshold: the grey level that best separates the image's histogram into two classes.
pub fn otsu(img: &GrayImage) -> u8 {
    let mut hist = [0u64; 256];
    for p in img.pixels() {
        hist[usize::from(p.0[0])] += 1;
    }
    let total: u64 = hist.iter().sum();
    let sum_all: f64 = hist
        .iter()
        .enumerate()
        .map(|(i, &n)| i as f64 * n as f64)
        .sum();
    let (mut w0, mut sum0, mut best, mut at) = (0u64, 0.0f64, -1.0f64, 128u8);
    for (t, &n) in hist.iter().enumerate() {
        w0 += n;
        sum0 += t as f64 * n as f64;
        let w1 = total - w0;
        if w0 == 0 || w1 == 0 {
            continue;
        }
        let m0 = sum0 / w0 as f64;
        let m1 = (sum_all - sum0) / w1 as f64;
        let between = w0 as f64 * w1 as f64 * (m0 - m1) * (m0 - m1);
        if between > best {
            best = between;
            at = t as u8;
        }
    }
    at
}

/// Dark pixels (at or below `threshold`), row-major.
pub(super) fn ink(img: &GrayImage, threshold: u8) -> Vec<bool> {
    img.pixels().map(|p| p.0[0] <= threshold).collect()
}

/// Clears the connected groups of ink (8-connected) smaller than `min_area` pixels.
pub(super) fn drop_specks(mask: &mut [bool], w: usize, h: usize, min_area: usize) {
    let mut seen = vec![false; mask.len()];
    let mut stack = Vec::new();
    let mut group = Vec::new();
    for start in 0..mask.len() {
        if !mask[start] || seen[start] {
            continue;
        }
        seen[start] = true;
        stack.push(start);
        group.clear();
        while let Some(i) = stack.pop() {
            group.push(i);
            let (x, y) = (i % w, i / w);
            for dy in [-1i64, 0, 1] {
                for dx in [-1i64, 0, 1] {
                    let (nx, ny) = (x as i64 + dx, y as i64 + dy);
                    if nx < 0 || ny < 0 || nx >= w as i64 || ny >= h as i64 {
                        continue;
                    }
                    let j = ny as usize * w + nx as usize;
                    if mask[j] && !seen[j] {
                        seen[j] = true;
                        stack.push(j);
                    }
                }
            }
        }
        if group.len() < min_area {
            for &i in &group {
                mask[i] = false;
            }
        }
    }
}

/// The pixels on horizontal or vertical runs of `dark` at least `min_len` long (gaps of up to
/// `gap` pixels bridged: a thin grey rule breaks up under noise), widened by `pad` pixels across
/// the run so the grey edge of a rule goes with it.
fn rules(dark: &[bool], w: usize, h: usize, min_len: usize, gap: usize, pad: usize) -> Vec<bool> {
    let mut out = vec![false; dark.len()];
    // Runs along one line of `len` pixels, `at(i)` being the index of its i-th pixel.
    let mut scan = |len: usize,
                    at: &dyn Fn(usize) -> usize,
                    across: &dyn Fn(usize, usize) -> Option<usize>| {
        let mut i = 0;
        while i < len {
            if !dark[at(i)] {
                i += 1;
                continue;
            }
            let start = i;
            let mut end = i + 1;
            let mut j = i + 1;
            while j < len && j <= end + gap {
                if dark[at(j)] {
                    end = j + 1;
                }
                j += 1;
            }
            if end - start >= min_len {
                for k in start..end {
                    for d in 0..=2 * pad {
                        if let Some(p) = across(at(k), d) {
                            out[p] = true;
                        }
                    }
                }
            }
            i = end;
        }
    };
    for y in 0..h {
        scan(w, &|x| y * w + x, &|p, d| {
            let py = (p / w + d).checked_sub(pad)?;
            (py < h).then_some(py * w + p % w)
        });
    }
    for x in 0..w {
        scan(h, &|y| y * w + x, &|p, d| {
            let px = (p % w + d).checked_sub(pad)?;
            (px < w).then_some((p / w) * w + px)
        });
    }
    out
}

/// Runs of `true` in `v` as (start, end) half-open ranges.
fn runs(v: impl Iterator<Item = bool>) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    let mut n = 0;
    for (i, on) in v.enumerate() {
        match (on, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
        n = i + 1;
    }
    if let Some(s) = start {
        out.push((s, n));
    }
    out
}

/// The gutters of a line's blank strip `blank` (indexed from the text's left edge): runs of
/// blank at least `min` wide that touch neither edge of the text.
fn gutters(blank: &[bool], min: usize) -> Vec<(usize, usize)> {
    runs(blank.iter().copied())
        .into_iter()
        .filter(|&(s, e)| s > 0 && e < blank.len() && e - s >= min)
        .collect()
}

/// Finds the layout of a page rendered at `dpi`.
pub fn analyse(img: &GrayImage, dpi: u32) -> Layout {
    let (w, h) = (img.width() as usize, img.height() as usize);
    let threshold = otsu(img);
    let mut mask = ink(img, threshold);
    // A thin rule, blurred by the scanner, is lighter than the strokes of letters: it is looked
    // for with a threshold halfway to the paper.
    let paper = {
        let mut hist = [0usize; 256];
        img.pixels().for_each(|p| hist[usize::from(p.0[0])] += 1);
        let mut seen = 0;
        hist.iter()
            .position(|&n| {
                seen += n;
                seen * 2 >= mask.len()
            })
            .unwrap_or(255) as u8
    };
    let faint = ink(img, threshold / 2 + paper.max(threshold) / 2);
    let rule_len = (RULE_INCHES * dpi as f32) as usize;
    let ruled = rules(
        &faint,
        w,
        h,
        rule_len.max(8),
        (dpi as usize / 150).max(1),
        (dpi as usize / 100).max(1),
    );
    let rule_pixels = ruled.iter().filter(|&&r| r).count();
    for (m, r) in mask.iter_mut().zip(&ruled) {
        *m &= !r;
    }
    // A speck is a scanner's pixel or two; the smallest mark of writing (an 8 pt full stop) is
    // a few times larger.
    let speck = ((dpi as usize / 100).pow(2)).max(2);
    drop_specks(&mut mask, w, h, speck);

    let empty = Layout {
        pieces: None,
        rules: ruled.clone(),
        rule_pixels,
        paper,
    };
    let row_ink: Vec<bool> = (0..h)
        .map(|y| mask[y * w..(y + 1) * w].contains(&true))
        .collect();
    let lines = runs(row_ink.iter().copied());
    if lines.is_empty() {
        return empty;
    }
    let col_ink: Vec<bool> = (0..w).map(|x| (0..h).any(|y| mask[y * w + x])).collect();
    let (Some(left), Some(right)) = (
        col_ink.iter().position(|&c| c),
        col_ink.iter().rposition(|&c| c),
    ) else {
        return empty;
    };
    let right = right + 1;
    let mut heights: Vec<usize> = lines.iter().map(|(s, e)| e - s).collect();
    heights.sort_unstable();
    let line_h = heights[heights.len() / 2].max(1);
    // Never narrower than a sixth of an inch: on a worn page leftover grain can make the
    // median "line" short, and word spaces must not pass for gutters.
    let min_gutter = ((line_h as f32 * GUTTER_LINES) as usize).max(dpi as usize / 6);
    let blank_of = |&(top, bottom): &(usize, usize)| -> Vec<bool> {
        (left..right)
            .map(|x| !(top..bottom).any(|y| mask[y * w + x]))
            .collect()
    };
    let in_table = |(top, bottom): (usize, usize)| {
        (top..bottom).any(|y| ruled[y * w + left..y * w + right].contains(&true))
    };

    // Sections: (top, bottom, gutters as page x ranges).
    type Section = (usize, usize, Vec<(usize, usize)>);
    let mut sections: Vec<Section> = Vec::new();
    let mut shared: Option<Vec<bool>> = None;
    for line in &lines {
        let blank = blank_of(line);
        let table = in_table(*line);
        if let (Some(cur), Some(last)) = (&shared, sections.last_mut()) {
            let both: Vec<bool> = cur.iter().zip(&blank).map(|(a, b)| *a && *b).collect();
            let g = gutters(&both, min_gutter);
            if !g.is_empty() && !table {
                last.1 = line.1;
                last.2 = g.iter().map(|&(s, e)| (s + left, e + left)).collect();
                shared = Some(both);
                continue;
            }
        }
        let g = if table {
            Vec::new()
        } else {
            gutters(&blank, min_gutter)
        };
        if g.is_empty() {
            match sections.last_mut() {
                Some(last) if shared.is_none() => last.1 = line.1,
                _ => sections.push((line.0, line.1, Vec::new())),
            }
            shared = None;
        } else {
            sections.push((
                line.0,
                line.1,
                g.iter().map(|&(s, e)| (s + left, e + left)).collect(),
            ));
            shared = Some(blank);
        }
    }
    // A section of one line with a wide gap reads the same either way; only a section of
    // several lines has columns worth rearranging.
    let columns = sections
        .iter()
        .any(|s| !s.2.is_empty() && lines.iter().filter(|l| l.0 >= s.0 && l.1 <= s.1).count() > 1);
    if !columns {
        return empty;
    }
    let margin = line_h / 2;
    let mut pieces = Vec::new();
    for (top, bottom, gs) in &sections {
        let top = top.saturating_sub(margin);
        let bottom = (bottom + margin).min(h);
        let mut xs = vec![left.saturating_sub(margin)];
        for &(s, e) in gs {
            xs.push(s + (e - s) / 2);
            xs.push(s + (e - s) / 2);
        }
        xs.push((right + margin).min(w));
        for pair in xs.chunks(2) {
            pieces.push(Rect {
                x: pair[0] as u32,
                y: top as u32,
                w: (pair[1] - pair[0]) as u32,
                h: (bottom - top) as u32,
            });
        }
    }
    // A column narrower than an inch and a half is not a column of text (the corpus's are about
    // three inches): something else was taken for gutters, and reading the page as it is is
    // safer. The recomposed page must also stay within what Tesseract accepts (32 767 pixels
    // on a side) and what the page itself was.
    let narrow = pieces.iter().any(|r| (r.w as usize) < dpi as usize * 3 / 2);
    let tall: u64 = pieces
        .iter()
        .map(|r| u64::from(r.h) + u64::from(dpi / 6))
        .sum();
    if narrow || tall > 30_000 || tall * u64::from(w as u32) > (w * h) as u64 * 2 {
        return empty;
    }
    Layout {
        pieces: Some(pieces),
        rules: ruled,
        rule_pixels,
        paper,
    }
}

/// `img` with the ruling lines painted over in the paper's grey.
pub fn erase_rules(img: &mut GrayImage, rules: &[bool], paper: u8) {
    for (p, &r) in img.pixels_mut().zip(rules) {
        if r {
            *p = Luma([paper]);
        }
    }
}

/// The `pieces` of `img` one under another, left-aligned, `gap` apart on `paper`.
pub fn compose(img: &GrayImage, pieces: &[Rect], gap: u32, paper: u8) -> GrayImage {
    let width = pieces.iter().map(|r| r.w).max().unwrap_or(1) + 2 * gap;
    let height = pieces.iter().map(|r| r.h + gap).sum::<u32>() + gap;
    let mut out = GrayImage::from_pixel(width, height, Luma([paper]));
    let mut y = gap;
    for r in pieces {
        for dy in 0..r.h {
            for dx in 0..r.w {
                let (sx, sy) = (r.x + dx, r.y + dy);
                if sx < img.width() && sy < img.height() {
                    out.put_pixel(gap + dx, y + dy, *img.get_pixel(sx, sy));
                }
            }
        }
        y += r.h + gap;
    }
    out
}

/// Rewrites `img` (rendered at `dpi`) as Tesseract should see it: ruling lines erased,
/// columns one under another. Returns whether it changed, and whether columns were found.
pub fn prepare(img: &mut GrayImage, dpi: u32) -> (bool, bool) {
    let layout = analyse(img, dpi);
    if layout.rule_pixels == 0 && layout.pieces.is_none() {
        return (false, false);
    }
    erase_rules(img, &layout.rules, layout.paper);
    let columns = layout.pieces.is_some();
    if let Some(pieces) = &layout.pieces {
        *img = compose(img, pieces, dpi / 6, layout.paper);
    }
    (true, columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bar(img: &mut GrayImage, x: u32, y: u32, w: u32, h: u32) {
        for py in y..y + h {
            for px in x..x + w {
                img.put_pixel(px, py, Luma([0]));
            }
        }
    }

    /// "Words" 30 px tall on lines 50 px apart, within `x0..x1`.
    fn text(img: &mut GrayImage, x0: u32, x1: u32, y0: u32, lines: u32) {
        for l in 0..lines {
            let mut x = x0;
            while x + 40 <= x1 {
                bar(img, x, y0 + l * 50, 40, 30);
                x += 52;
            }
        }
    }

    #[test]
    fn two_columns_under_a_title_are_read_left_column_first() {
        let mut img = GrayImage::from_pixel(1000, 700, Luma([255]));
        text(&mut img, 100, 900, 50, 1);
        text(&mut img, 100, 460, 150, 5);
        text(&mut img, 560, 900, 150, 4);
        let layout = analyse(&img, 150);
        let pieces = layout.pieces.expect("columns");
        assert_eq!(pieces.len(), 3, "{pieces:?}");
        assert!(pieces[0].y < pieces[1].y && pieces[0].w > 700, "{pieces:?}");
        assert!(
            pieces[1].x < 200 && pieces[1].x + pieces[1].w < 560,
            "{pieces:?}"
        );
        assert!(
            pieces[2].x > 460 && pieces[2].y == pieces[1].y,
            "{pieces:?}"
        );
        assert_eq!(layout.rule_pixels, 0);
    }

    #[test]
    fn one_column_of_text_and_specks_is_left_alone() {
        let mut img = GrayImage::from_pixel(1000, 700, Luma([255]));
        text(&mut img, 100, 900, 50, 8);
        for i in 0..200u32 {
            img.put_pixel((i * 97) % 1000, (i * 61) % 700, Luma([0]));
        }
        let layout = analyse(&img, 150);
        assert_eq!(layout.pieces, None);
        assert_eq!(layout.rule_pixels, 0);
    }

    #[test]
    fn narrow_strips_are_not_taken_for_columns() {
        // Six strips of words 100 px wide with 60 px gaps, on eight lines: what grain or a list
        // of short items can look like. Recomposed, the page would be a strip 20 000 px tall.
        let mut img = GrayImage::from_pixel(1000, 700, Luma([255]));
        for c in 0..6 {
            text(&mut img, 20 + c * 160, 20 + c * 160 + 100, 50, 8);
        }
        assert_eq!(analyse(&img, 150).pieces, None);
    }

    #[test]
    fn a_ruled_table_loses_its_rules_and_keeps_its_rows() {
        let mut img = GrayImage::from_pixel(1000, 700, Luma([255]));
        for r in 0..=4 {
            bar(&mut img, 100, 100 + r * 60, 801, 2);
        }
        for c in 0..=3 {
            bar(&mut img, 100 + c * 267, 100, 2, 240);
        }
        for r in 0..4 {
            for c in 0..3 {
                bar(&mut img, 120 + c * 267, 115 + r * 60, 60, 30);
            }
        }
        let layout = analyse(&img, 150);
        assert_eq!(layout.pieces, None, "rows are read across");
        assert!(layout.rule_pixels > 5 * 801, "{}", layout.rule_pixels);
        erase_rules(&mut img, &layout.rules, layout.paper);
        assert_eq!(img.get_pixel(500, 101).0[0], 255);
        assert_eq!(img.get_pixel(130, 130).0[0], 0, "the cells stay");
    }
}
