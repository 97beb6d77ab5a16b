//! A worn scan made black on white before Tesseract reads it. Tesseract thresholds the grey
//! page itself (Otsu), but on a worn, upscaled scan paper grain and JPEG blocks survive its
//! threshold as ragged glyph edges and loose dots, and scanner specks become "letters". Here
//! the page is smoothed over a few pixels (grain averages out, strokes are wider than the
//! window), thresholded, and ink groups too small to be writing are removed.

use image::GrayImage;

use super::layout::{drop_specks, ink, otsu};

/// The mean of each pixel's (2r+1)² neighbourhood (clamped at the borders), by running sums
/// along rows and then columns.
fn box_mean(img: &GrayImage, r: u32) -> GrayImage {
    let (w, h) = (img.width() as usize, img.height() as usize);
    let r = r as usize;
    let src: Vec<u32> = img.pixels().map(|p| u32::from(p.0[0])).collect();
    let pass = |src: &[u32], len: usize, lines: usize, at: &dyn Fn(usize, usize) -> usize| {
        let mut out = vec![0u32; src.len()];
        for line in 0..lines {
            let mut sum: u32 = 0;
            let mut n: u32 = 0;
            // The window over positions [i - r, i + r] within [0, len).
            for i in 0..len.min(r + 1) {
                sum += src[at(line, i)];
                n += 1;
            }
            for i in 0..len {
                out[at(line, i)] = sum / n.max(1);
                if i + r + 1 < len {
                    sum += src[at(line, i + r + 1)];
                    n += 1;
                }
                if i >= r {
                    sum -= src[at(line, i - r)];
                    n -= 1;
                }
            }
        }
        out
    };
    let rows = pass(&src, w, h, &|y, x| y * w + x);
    let both = pass(&rows, h, w, &|x, y| y * w + x);
    GrayImage::from_raw(
        w as u32,
        h as u32,
        both.into_iter().map(|v| v as u8).collect(),
    )
    .unwrap_or_else(|| img.clone())
}

/// Paper at least this light (the page's median grey) is clean: Tesseract's own threshold reads
/// it well, and on the corpus our thresholding of a clean page cost the jamo-ghost repair its
/// cue (the page went from 0% to 21% CER), so such a page is left as rendered.
const WHITE_PAPER: u8 = 245;

/// Whether `img` is a worn scan (grey paper) that [`binarise`] should clean.
pub fn is_worn(img: &GrayImage) -> bool {
    let mut hist = [0usize; 256];
    img.pixels().for_each(|p| hist[usize::from(p.0[0])] += 1);
    let half = img.pixels().len().div_ceil(2);
    let mut seen = 0;
    let median = hist
        .iter()
        .position(|&n| {
            seen += n;
            seen >= half
        })
        .unwrap_or(255);
    median < usize::from(WHITE_PAPER)
}

/// `img` (rendered at `dpi`) as clean black ink on white paper.
pub fn binarise(img: &GrayImage, dpi: u32) -> GrayImage {
    let smooth = box_mean(img, (dpi / 200).max(1));
    let (w, h) = (img.width() as usize, img.height() as usize);
    let mut mask = ink(&smooth, otsu(&smooth));
    drop_specks(&mut mask, w, h, ((dpi as usize / 100).pow(2)).max(2));
    GrayImage::from_raw(
        w as u32,
        h as u32,
        mask.iter().map(|&m| if m { 0 } else { 255 }).collect(),
    )
    .unwrap_or_else(|| img.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::Luma;

    #[test]
    fn grain_and_specks_go_and_strokes_stay() {
        let mut rng = fastrand::Rng::with_seed(7);
        let img = GrayImage::from_fn(300, 200, |x, y| {
            let stroke = (50..250).contains(&x) && (90..100).contains(&y);
            let base: i32 = if stroke { 40 } else { 230 };
            let speck = x == 20 && y == 20;
            let v = if speck { 30 } else { base + rng.i32(-25..=25) };
            Luma([v.clamp(0, 255) as u8])
        });
        let out = binarise(&img, 400);
        assert_eq!(out.get_pixel(20, 20).0[0], 255, "a speck is removed");
        assert!(
            (50..250).all(|x| out.get_pixel(x, 95).0[0] == 0),
            "the stroke stays"
        );
        let stray = out
            .enumerate_pixels()
            .filter(|(_, y, p)| !(85..105).contains(y) && p.0[0] == 0)
            .count();
        assert_eq!(stray, 0, "no grain becomes ink");
        assert!(is_worn(&img));
        assert!(!is_worn(&GrayImage::from_pixel(50, 50, Luma([255]))));
    }
}
