//! Straightens a page scanned a few degrees askew before Tesseract reads it: a single-column
//! reading of a tilted page cuts across lines. The angle is the one whose horizontal projection
//! of the ink is sharpest (text lines give tall, narrow peaks only when they lie level), found
//! on a reduced copy of the page; the full page is then turned by it.

use image::{GrayImage, Luma};

/// Angles searched, in degrees either side of level, and the step.
const MAX_ANGLE: f32 = 4.0;
const STEP: f32 = 0.25;
/// A page this close to level is left as it is.
const LEVEL: f32 = 0.3;

/// The skew of `img` in degrees (counter-clockwise), if any text is found.
pub fn angle(img: &GrayImage) -> Option<f32> {
    let factor = (img.width() / 800).max(1);
    let (w, h) = (img.width() / factor, img.height() / factor);
    let mut ink = Vec::new();
    for y in 0..h {
        for x in 0..w {
            if img.get_pixel(x * factor, y * factor).0[0] < 128 {
                ink.push((x as f32 - w as f32 / 2.0, y as f32 - h as f32 / 2.0));
            }
        }
    }
    if ink.len() < 50 {
        return None;
    }
    let rows = (w + h) as usize * 2;
    let mut best = (0.0f32, f64::MIN);
    let steps = (MAX_ANGLE / STEP) as i32;
    let mut profile = vec![0u32; rows];
    for i in -steps..=steps {
        let a = i as f32 * STEP;
        let (s, c) = a.to_radians().sin_cos();
        profile.iter_mut().for_each(|p| *p = 0);
        for &(x, y) in &ink {
            // The row this ink lands on once a tilt of `a` is undone.
            let r = (x * s + y * c) + rows as f32 / 2.0;
            if r >= 0.0 && (r as usize) < rows {
                profile[r as usize] += 1;
            }
        }
        let score: f64 = profile.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        if score > best.1 {
            best = (a, score);
        }
    }
    Some(best.0)
}

/// `img` rotated about its centre (bilinear, white where nothing was); `rotate(·, -a)` undoes
/// `rotate(·, a)`, and [`angle`] of `rotate(level, a)` is `a`.
pub fn rotate(img: &GrayImage, degrees: f32) -> GrayImage {
    let (w, h) = img.dimensions();
    let (s, c) = degrees.to_radians().sin_cos();
    let (cx, cy) = (w as f32 / 2.0, h as f32 / 2.0);
    let at = |x: i64, y: i64| -> f32 {
        if x < 0 || y < 0 || x >= i64::from(w) || y >= i64::from(h) {
            255.0
        } else {
            f32::from(img.get_pixel(x as u32, y as u32).0[0])
        }
    };
    GrayImage::from_fn(w, h, |x, y| {
        let (dx, dy) = (x as f32 - cx, y as f32 - cy);
        let sx = c * dx - s * dy + cx;
        let sy = s * dx + c * dy + cy;
        let (x0, y0) = (sx.floor(), sy.floor());
        let (fx, fy) = (sx - x0, sy - y0);
        let (x0, y0) = (x0 as i64, y0 as i64);
        let v = at(x0, y0) * (1.0 - fx) * (1.0 - fy)
            + at(x0 + 1, y0) * fx * (1.0 - fy)
            + at(x0, y0 + 1) * (1.0 - fx) * fy
            + at(x0 + 1, y0 + 1) * fx * fy;
        Luma([v.round().clamp(0.0, 255.0) as u8])
    })
}

/// `img` straightened, or `None` when it is level already (or holds no text).
pub fn straighten(img: &GrayImage) -> Option<GrayImage> {
    match angle(img) {
        Some(a) if a.abs() >= LEVEL => Some(rotate(img, -a)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines of "text": dark bars with gaps, like words on lines.
    fn page() -> GrayImage {
        GrayImage::from_fn(1200, 900, |x, y| {
            let on_line = (100..800).contains(&y) && y % 60 < 14;
            let in_word = (100..1100).contains(&x) && x % 90 < 70;
            Luma([if on_line && in_word { 0 } else { 255 }])
        })
    }

    #[test]
    fn a_tilted_page_is_measured_and_turned_level() {
        let level = page();
        assert_eq!(angle(&level), Some(0.0));
        for tilt in [2.0f32, -3.0] {
            let tilted = rotate(&level, tilt);
            let a = angle(&tilted).unwrap();
            assert!((a - tilt).abs() <= STEP, "measured {a} for {tilt}");
            let back = angle(&rotate(&tilted, -a)).unwrap();
            assert!(back.abs() <= STEP, "{back}");
        }
        assert_eq!(angle(&GrayImage::from_pixel(100, 100, Luma([255]))), None);
    }
}
