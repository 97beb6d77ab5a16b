//! Reads an emotion from an image itself. Colour psychology gives a rough, explainable mapping:
//! bright, warm, saturated pictures read as pleasant (valence), saturated and contrasty ones as
//! energetic (arousal); the quadrant of (valence, arousal) names the emotion, as in Russell's
//! circumplex model. No model weights, so every worker can run it and tests can predict it.

use serde::{Deserialize, Serialize};

/// The side of the thumbnail the features are computed on: enough for colour statistics, and
/// it keeps a 40-megapixel photo from costing seconds.
const THUMBNAIL: u32 = 160;

/// The four emotions, one per quadrant of the circumplex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Label {
    /// Pleasant and energetic.
    Joyful,
    /// Pleasant and quiet.
    Calm,
    /// Unpleasant and quiet.
    Melancholic,
    /// Unpleasant and energetic.
    Tense,
}

impl Label {
    pub fn as_str(self) -> &'static str {
        match self {
            Label::Joyful => "joyful",
            Label::Calm => "calm",
            Label::Melancholic => "melancholic",
            Label::Tense => "tense",
        }
    }
}

/// What was measured and what it means; the `bgm` job composes from this.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Emotion {
    pub emotion: Label,
    /// -1 (unpleasant) ..= 1 (pleasant).
    pub valence: f32,
    /// -1 (quiet) ..= 1 (energetic).
    pub arousal: f32,
    /// Mean luma, 0..=1.
    pub brightness: f32,
    /// Mean HSV saturation, 0..=1.
    pub saturation: f32,
    /// Standard deviation of luma, 0..=0.5.
    pub contrast: f32,
    /// Mean (red − blue), -1..=1: warm colours are positive.
    pub warmth: f32,
    /// The dominant hue in degrees, weighted by saturation (0 when the image is grey).
    pub hue: f32,
}

/// Decodes a PNG or JPEG and reads its emotion.
pub fn read(bytes: &[u8]) -> Result<Emotion, image::ImageError> {
    let img = image::load_from_memory(bytes)?;
    let thumb = img.thumbnail(THUMBNAIL, THUMBNAIL).to_rgb8();
    let pixels: Vec<[f32; 3]> = thumb
        .pixels()
        .map(|p| {
            [
                p[0] as f32 / 255.0,
                p[1] as f32 / 255.0,
                p[2] as f32 / 255.0,
            ]
        })
        .collect();
    Ok(from_pixels(&pixels))
}

/// The emotion of a set of RGB pixels in 0..=1.
pub fn from_pixels(pixels: &[[f32; 3]]) -> Emotion {
    let n = pixels.len().max(1) as f32;
    let (mut luma_sum, mut luma_sq, mut sat_sum, mut warm_sum) = (0.0f32, 0.0f32, 0.0f32, 0.0f32);
    let (mut hx, mut hy) = (0.0f32, 0.0f32);
    for &[r, g, b] in pixels {
        let luma = 0.2126 * r + 0.7152 * g + 0.0722 * b;
        luma_sum += luma;
        luma_sq += luma * luma;
        let max = r.max(g).max(b);
        let min = r.min(g).min(b);
        let sat = if max > 0.0 { (max - min) / max } else { 0.0 };
        sat_sum += sat;
        warm_sum += r - b;
        if max > min {
            let d = max - min;
            let h = if max == r {
                ((g - b) / d).rem_euclid(6.0)
            } else if max == g {
                (b - r) / d + 2.0
            } else {
                (r - g) / d + 4.0
            } * 60.0;
            let rad = h.to_radians();
            hx += sat * rad.cos();
            hy += sat * rad.sin();
        }
    }
    let brightness = luma_sum / n;
    let contrast = (luma_sq / n - brightness * brightness).max(0.0).sqrt();
    let saturation = sat_sum / n;
    let warmth = warm_sum / n;
    let hue = if hx.abs() + hy.abs() > 1e-6 {
        hy.atan2(hx).to_degrees().rem_euclid(360.0)
    } else {
        0.0
    };
    // Weights chosen so that the canonical cases land where people put them: a dim, grey scene
    // is melancholic; a bright, colourful one joyful; pale pastels calm; dark, saturated and
    // harsh pictures tense.
    let valence = (1.4 * (brightness - 0.45) + 0.5 * (saturation - 0.35) + 0.3 * warmth
        - 0.8 * (contrast - 0.2).max(0.0))
    .clamp(-1.0, 1.0);
    let arousal = (1.8 * (saturation - 0.3) + 2.0 * (contrast - 0.12) + 0.2 * (brightness - 0.5))
        .clamp(-1.0, 1.0);
    let emotion = match (valence >= 0.0, arousal >= 0.0) {
        (true, true) => Label::Joyful,
        (true, false) => Label::Calm,
        (false, false) => Label::Melancholic,
        (false, true) => Label::Tense,
    };
    Emotion {
        emotion,
        valence,
        arousal,
        brightness,
        saturation,
        contrast,
        warmth,
        hue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(f: impl Fn(f32, f32) -> [f32; 3]) -> Vec<[f32; 3]> {
        let mut v = Vec::new();
        for y in 0..64 {
            for x in 0..64 {
                v.push(f(x as f32 / 63.0, y as f32 / 63.0));
            }
        }
        v
    }

    #[test]
    fn a_dim_grey_scene_is_melancholic() {
        let e = from_pixels(&gradient(|x, _| {
            let l = 0.12 + 0.08 * x;
            [l, l, l + 0.03]
        }));
        assert_eq!(e.emotion, Label::Melancholic, "{e:?}");
    }

    #[test]
    fn a_bright_colourful_scene_is_joyful() {
        let e = from_pixels(&gradient(|x, y| [1.0, 0.55 + 0.45 * y, 0.1 + 0.3 * x]));
        assert_eq!(e.emotion, Label::Joyful, "{e:?}");
    }

    #[test]
    fn pale_pastels_are_calm() {
        let e = from_pixels(&gradient(|x, _| [0.80 + 0.05 * x, 0.88, 0.92]));
        assert_eq!(e.emotion, Label::Calm, "{e:?}");
    }

    #[test]
    fn dark_harsh_red_is_tense() {
        let e = from_pixels(&gradient(|x, y| {
            if (x * 8.0) as i32 % 2 == (y * 8.0) as i32 % 2 {
                [0.9, 0.02, 0.02]
            } else {
                [0.02, 0.02, 0.02]
            }
        }));
        assert_eq!(e.emotion, Label::Tense, "{e:?}");
    }
}
