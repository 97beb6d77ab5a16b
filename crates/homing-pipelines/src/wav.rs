//! The WAV container: 16-bit PCM, written by hand (a RIFF header of 44 bytes is all it takes) so
//! generated tracks play everywhere without an audio library.

/// Encodes mono samples in -1..=1 as a 16-bit PCM WAV file.
pub fn encode(samples: &[f32], sample_rate: u32) -> Vec<u8> {
    let data_len = (samples.len() * 2) as u32;
    let mut out = Vec::with_capacity(44 + data_len as usize);
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data_len).to_le_bytes());
    out.extend_from_slice(b"WAVE");
    out.extend_from_slice(b"fmt ");
    out.extend_from_slice(&16u32.to_le_bytes()); // size of the fmt chunk
    out.extend_from_slice(&1u16.to_le_bytes()); // PCM
    out.extend_from_slice(&1u16.to_le_bytes()); // mono
    out.extend_from_slice(&sample_rate.to_le_bytes());
    out.extend_from_slice(&(sample_rate * 2).to_le_bytes()); // bytes per second
    out.extend_from_slice(&2u16.to_le_bytes()); // bytes per frame
    out.extend_from_slice(&16u16.to_le_bytes()); // bits per sample
    out.extend_from_slice(b"data");
    out.extend_from_slice(&data_len.to_le_bytes());
    for s in samples {
        let v = (s.clamp(-1.0, 1.0) * i16::MAX as f32).round() as i16;
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// The playing time of a PCM WAV file, from its header; `None` if it is not one.
pub fn duration_ms(wav: &[u8]) -> Option<u64> {
    if wav.len() < 12 || &wav[0..4] != b"RIFF" || &wav[8..12] != b"WAVE" {
        return None;
    }
    let mut pos = 12;
    let mut byte_rate = None;
    while pos + 8 <= wav.len() {
        let id = &wav[pos..pos + 4];
        let len = u32::from_le_bytes(wav[pos + 4..pos + 8].try_into().ok()?) as usize;
        let body = pos + 8;
        if id == b"fmt " && body + 12 <= wav.len() {
            byte_rate = Some(u32::from_le_bytes(
                wav[body + 8..body + 12].try_into().ok()?,
            ));
        }
        if id == b"data" {
            let rate = byte_rate.filter(|r| *r > 0)? as u64;
            let len = len.min(wav.len() - body) as u64;
            return Some(len * 1000 / rate);
        }
        pos = body + len + (len & 1);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_of_audio_reads_back_as_a_second() {
        let wav = encode(&vec![0.25; 22_050], 22_050);
        assert_eq!(&wav[0..4], b"RIFF");
        assert_eq!(wav.len(), 44 + 44_100);
        assert_eq!(duration_ms(&wav), Some(1000));
        assert_eq!(i16::from_le_bytes([wav[44], wav[45]]), 8192);
        assert_eq!(duration_ms(b"not a wav file"), None);
    }
}
