//! The built-in composer: when no inference server is configured, a background track is
//! synthesised from the emotion, so the exhibition pipeline runs anywhere. The emotion sets the
//! music's dimensions the way film scoring does: arousal sets the tempo, the brightness of the
//! instrument and how hard notes are struck; valence sets the mode (major or minor); the image's
//! dominant hue picks the key. The sound is additive synthesis — every note a sum of partials
//! with its own envelope, pads doubled with slightly detuned copies for width — through a small
//! feedback-delay reverb. It costs real CPU time (about a second per track), like the slow
//! inference it stands in for, and runs on the blocking pool.

use serde::Serialize;
use std::f32::consts::TAU;

use crate::emotion::Emotion;
use homing::CancellationToken;

pub const SAMPLE_RATE: u32 = 44_100;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Major,
    Minor,
}

/// The musical decisions taken from an emotion.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Style {
    pub tempo_bpm: f32,
    pub mode: Mode,
    /// MIDI note of the tonic (48 = C3).
    pub tonic: u8,
    pub key: String,
    /// 0 (mellow, few soft partials) ..= 1 (bright, many strong partials).
    pub timbre: f32,
    /// Overall loudness of the notes, 0..=1.
    pub dynamics: f32,
    /// Pad attack time in seconds: slow swells for quiet emotions.
    pub attack_s: f32,
    /// How much reverb: spacious for quiet emotions, dry for energetic ones.
    pub space: f32,
}

const NAMES: [&str; 12] = [
    "C", "C#", "D", "Eb", "E", "F", "F#", "G", "Ab", "A", "Bb", "B",
];

impl Style {
    pub fn for_emotion(e: &Emotion) -> Style {
        let a = e.arousal.clamp(-1.0, 1.0);
        let v = e.valence.clamp(-1.0, 1.0);
        let mode = if v >= 0.0 { Mode::Major } else { Mode::Minor };
        // Hues map onto the circle of fifths: neighbouring colours give related keys.
        let step = ((e.hue / 30.0).round() as i32).rem_euclid(12);
        let pc = (step * 7).rem_euclid(12) as u8;
        let tonic = 48 + pc;
        Style {
            tempo_bpm: (60.0 + 45.0 * (a + 1.0)).clamp(56.0, 160.0),
            mode,
            tonic,
            key: format!(
                "{} {}",
                NAMES[pc as usize],
                if mode == Mode::Major {
                    "major"
                } else {
                    "minor"
                }
            ),
            timbre: (0.5 + 0.5 * a).clamp(0.0, 1.0),
            dynamics: (0.55 + 0.3 * a).clamp(0.2, 1.0),
            attack_s: (0.5 - 0.35 * a).clamp(0.08, 0.9),
            space: (0.35 - 0.2 * a).clamp(0.1, 0.55),
        }
    }

    fn scale(&self) -> [i32; 7] {
        match self.mode {
            Mode::Major => [0, 2, 4, 5, 7, 9, 11],
            Mode::Minor => [0, 2, 3, 5, 7, 8, 10],
        }
    }

    /// Four chords, one per bar, as scale degrees of their roots: I–V–vi–IV in major,
    /// i–VI–III–VII in minor; each chord is stacked in thirds from the scale.
    fn progression(&self) -> [usize; 4] {
        match self.mode {
            Mode::Major => [0, 4, 5, 3],
            Mode::Minor => [0, 5, 2, 6],
        }
    }
}

fn midi_freq(note: i32) -> f32 {
    440.0 * 2f32.powf((note - 69) as f32 / 12.0)
}

/// One struck or bowed note.
struct Note {
    start: usize,
    /// Samples until the release starts.
    hold: usize,
    release: usize,
    freq: f32,
    amp: f32,
    attack: usize,
    /// Exponential decay time constant in samples; `f32::INFINITY` sustains.
    decay: f32,
    partials: usize,
    /// Partial k has amplitude k^-rolloff.
    rolloff: f32,
    /// Frequency ratios of the doubled copies (1.0 alone: no doubling).
    detune: &'static [f32],
}

fn render(buf: &mut [f32], n: &Note) {
    let sr = SAMPLE_RATE as f32;
    let nyquist = sr * 0.45;
    let mut incs = Vec::new();
    let mut amps = Vec::new();
    for &d in n.detune {
        for k in 1..=n.partials {
            let f = n.freq * d * k as f32;
            if f >= nyquist {
                break;
            }
            incs.push(TAU * f / sr);
            amps.push(n.amp * (k as f32).powf(-n.rolloff) / n.detune.len() as f32);
        }
    }
    let mut phases = vec![0.0f32; incs.len()];
    let end = (n.start + n.hold + n.release).min(buf.len());
    for (t, out) in buf[n.start.min(end)..end].iter_mut().enumerate() {
        let mut env = if t < n.attack {
            t as f32 / n.attack as f32
        } else {
            1.0
        };
        if n.decay.is_finite() {
            env *= (-(t as f32) / n.decay).exp();
        }
        if t >= n.hold {
            env *= 1.0 - (t - n.hold) as f32 / n.release.max(1) as f32;
        }
        let mut s = 0.0;
        for ((p, inc), a) in phases.iter_mut().zip(&incs).zip(&amps) {
            s += a * p.sin();
            *p += inc;
            if *p > TAU {
                *p -= TAU;
            }
        }
        *out += env * s;
    }
}

/// A small Schroeder reverb: parallel feedback combs, then all-passes to diffuse them.
fn reverb(dry: &[f32], space: f32) -> Vec<f32> {
    let combs = [1399usize, 1511, 1613, 1747];
    let allpasses = [593usize, 241];
    let feedback = 0.72 + 0.2 * space;
    let mut wet = vec![0.0f32; dry.len()];
    for &d in &combs {
        let mut line = vec![0.0f32; d];
        for (i, (w, x)) in wet.iter_mut().zip(dry).enumerate() {
            let y = line[i % d];
            line[i % d] = x + y * feedback;
            *w += y / combs.len() as f32;
        }
    }
    for &d in &allpasses {
        let mut line = vec![0.0f32; d];
        for (i, w) in wet.iter_mut().enumerate() {
            let y = line[i % d];
            let x = *w;
            line[i % d] = x + y * 0.5;
            *w = y - 0.5 * x;
        }
    }
    dry.iter()
        .zip(&wet)
        .map(|(d, w)| d * (1.0 - space * 0.5) + w * space)
        .collect()
}

/// Composes `seconds` of music in `style`, deterministically for a `seed`; `None` if cancelled.
pub fn compose(
    style: &Style,
    seconds: f32,
    seed: u64,
    cancel: &CancellationToken,
) -> Option<Vec<f32>> {
    let sr = SAMPLE_RATE as f32;
    let total = (seconds * sr) as usize;
    let mut buf = vec![0.0f32; total + SAMPLE_RATE as usize];
    let mut rng = fastrand::Rng::with_seed(seed);
    let beat = (60.0 / style.tempo_bpm * sr) as usize;
    let bar = beat * 4;
    let scale = style.scale();
    let degree = |d: i32| -> i32 {
        let octave = d.div_euclid(7);
        style.tonic as i32 + 12 * octave + scale[d.rem_euclid(7) as usize]
    };
    let partials = 3 + (style.timbre * 9.0).round() as usize;
    let rolloff = 2.2 - 1.3 * style.timbre;
    let mut melody = 7 + 2; // the third above the tonic, an octave up
    let bars = total.div_ceil(bar);
    for b in 0..bars {
        if cancel.is_cancelled() {
            return None;
        }
        let root = style.progression()[b % 4] as i32;
        let start = b * bar;
        // Pad: the chord an octave above the tonic, swelling in and held through the bar.
        for third in 0..3 {
            render(
                &mut buf,
                &Note {
                    start,
                    hold: bar,
                    release: (0.25 * sr) as usize,
                    freq: midi_freq(degree(root + 2 * third) + 12),
                    amp: 0.10 * style.dynamics,
                    attack: (style.attack_s * sr) as usize,
                    decay: f32::INFINITY,
                    partials,
                    rolloff: rolloff + 0.4,
                    detune: &[0.993, 0.9965, 1.0, 1.0035, 1.007],
                },
            );
        }
        for i in 0..4 {
            let at = start + i * beat;
            let accent = if i == 0 {
                1.0 + 0.3 * style.timbre
            } else {
                0.85
            };
            // Bass: the chord's root plucked on every beat, the pulse of the track.
            render(
                &mut buf,
                &Note {
                    start: at,
                    hold: beat,
                    release: (0.02 * sr) as usize,
                    freq: midi_freq(degree(root) - 12),
                    amp: 0.42 * style.dynamics * accent,
                    attack: (0.004 * sr) as usize,
                    decay: beat as f32 * 0.28,
                    partials: 6,
                    rolloff: 1.6,
                    detune: &[1.0],
                },
            );
            // Melody: a walk along the scale that lands on chord tones on strong beats.
            let step = [-2, -1, -1, 0, 1, 1, 2][rng.usize(0..7)];
            melody = (melody + step).clamp(5, 16);
            if i % 2 == 0 {
                let chord = [root, root + 2, root + 4];
                melody = chord
                    .iter()
                    .flat_map(|c| [c + 7, c + 14])
                    .min_by_key(|c| (c - melody).abs())
                    .unwrap_or(melody);
            }
            let velocity = style.dynamics * accent * (0.85 + 0.3 * rng.f32());
            render(
                &mut buf,
                &Note {
                    start: at,
                    hold: (beat as f32 * 0.9) as usize,
                    release: (0.03 * sr) as usize,
                    freq: midi_freq(degree(melody) + 12),
                    amp: 0.22 * velocity,
                    attack: (0.008 * sr) as usize,
                    decay: beat as f32 * (0.6 - 0.3 * style.timbre),
                    partials,
                    rolloff,
                    detune: &[1.0],
                },
            );
        }
    }
    let mut out = reverb(&buf, style.space);
    out.truncate(total);
    let fade = (0.5 * sr) as usize;
    let len = out.len();
    for (i, s) in out.iter_mut().enumerate().skip(len.saturating_sub(fade)) {
        *s *= (len - i) as f32 / fade as f32;
    }
    let peak = out.iter().fold(0.0f32, |m, s| m.max(s.abs()));
    if peak > 0.0 {
        let gain = 0.89 / peak;
        out.iter_mut().for_each(|s| *s *= gain);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emotion::{Emotion, Label};

    fn emotion(valence: f32, arousal: f32) -> Emotion {
        Emotion {
            emotion: Label::Calm,
            valence,
            arousal,
            brightness: 0.5,
            saturation: 0.5,
            contrast: 0.1,
            warmth: 0.0,
            hue: 0.0,
        }
    }

    #[test]
    fn energy_speeds_the_tempo_and_pleasure_picks_the_mode() {
        let joyful = Style::for_emotion(&emotion(0.8, 0.7));
        let melancholic = Style::for_emotion(&emotion(-0.6, -0.6));
        assert!(joyful.tempo_bpm > melancholic.tempo_bpm * 1.4);
        assert_eq!(joyful.mode, Mode::Major);
        assert_eq!(melancholic.mode, Mode::Minor);
        assert_eq!(melancholic.key, "C minor");
        assert!(joyful.timbre > melancholic.timbre);
    }

    #[test]
    fn a_track_is_deterministic_normalised_and_cancellable() {
        let style = Style::for_emotion(&emotion(0.5, 0.5));
        let never = CancellationToken::new();
        let a = compose(&style, 2.0, 7, &never).unwrap();
        let b = compose(&style, 2.0, 7, &never).unwrap();
        assert_eq!(a.len(), 2 * SAMPLE_RATE as usize);
        assert_eq!(a, b);
        let peak = a.iter().fold(0.0f32, |m, s| m.max(s.abs()));
        assert!((peak - 0.89).abs() < 0.01, "{peak}");
        let cancelled = CancellationToken::new();
        cancelled.cancel();
        assert!(compose(&style, 2.0, 7, &cancelled).is_none());
    }
}
