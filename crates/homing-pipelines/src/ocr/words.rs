//! A page as Tesseract's words — text, box, confidence, and whether a space came before — so
//! two readings of a page can be combined word by word and the text rebuilt from what is kept.
//!
//! Tesseract's TSV has the boxes and confidences but not the spacing (a Korean word is often
//! several TSV words with no space between them); its plain text has the spacing but no boxes.
//! Both list the same words in the same order, so walking the text while consuming the TSV
//! words recovers each word's spacing.

/// One recognised word.
#[derive(Debug, Clone, PartialEq)]
pub struct Word {
    /// (block, paragraph, line) numbers: which line the word is on.
    pub line: (u32, u32, u32),
    pub left: i64,
    pub top: i64,
    pub width: i64,
    pub height: i64,
    pub conf: f32,
    pub text: String,
    pub space_before: bool,
}

impl Word {
    fn right(&self) -> i64 {
        self.left + self.width
    }
    fn bottom(&self) -> i64 {
        self.top + self.height
    }
}

fn is_hangul(c: char) -> bool {
    matches!(c, '\u{ac00}'..='\u{d7a3}')
}

pub fn has_hangul(s: &str) -> bool {
    s.chars().any(is_hangul)
}

/// The words of Tesseract's `tsv` output, with spacing taken from its `txt` output.
pub fn parse(tsv: &str, txt: &str) -> Vec<Word> {
    let mut words = Vec::new();
    for row in tsv.lines().skip(1) {
        let c: Vec<&str> = row.split('\t').collect();
        if c.len() < 12 || c[0] != "5" {
            continue;
        }
        let text = c[11].trim();
        let (Ok(conf), false) = (c[10].parse::<f32>(), text.is_empty()) else {
            continue;
        };
        let num = |i: usize| c[i].parse::<i64>().unwrap_or(0);
        let small = |i: usize| c[i].parse::<u32>().unwrap_or(0);
        words.push(Word {
            line: (small(2), small(3), small(4)),
            left: num(6),
            top: num(7),
            width: num(8),
            height: num(9),
            conf,
            text: text.to_string(),
            space_before: true,
        });
    }
    let txt: Vec<char> = txt.chars().collect();
    let mut at = 0;
    for w in &mut words {
        let start = at;
        while at < txt.len() && txt[at].is_whitespace() {
            at += 1;
        }
        let wanted: Vec<char> = w.text.chars().collect();
        if txt.get(at..at + wanted.len()) == Some(&wanted[..]) {
            w.space_before = at > start;
            at += wanted.len();
        } else {
            // The two outputs disagree here; a space is the safe guess, and the text is
            // searched again from where it was.
            at = start;
        }
    }
    words
}

/// The text of `words`: words on a line joined as Tesseract spaced them, lines by newlines,
/// paragraphs by an empty line.
pub fn text(words: &[Word]) -> String {
    let mut out = String::new();
    let mut prev: Option<(u32, u32, u32)> = None;
    for w in words {
        match prev {
            None => {}
            Some(p) if p == w.line && w.space_before => out.push(' '),
            Some(p) if p == w.line => {}
            Some(p) if (p.0, p.1) == (w.line.0, w.line.1) => out.push('\n'),
            Some(_) => out.push_str("\n\n"),
        }
        out.push_str(&w.text);
        prev = Some(w.line);
    }
    out
}

/// The mean confidence of `words`, each weighted by its characters; `None` with no words.
pub fn mean_confidence(words: &[Word]) -> Option<f32> {
    let (mut sum, mut weight) = (0.0f64, 0usize);
    for w in words {
        let n = w.text.chars().filter(|c| !c.is_whitespace()).count();
        if w.conf >= 0.0 {
            sum += f64::from(w.conf) * n as f64;
            weight += n;
        }
    }
    (weight > 0).then(|| (sum / weight as f64) as f32)
}

struct Line {
    id: (u32, u32, u32),
    left: i64,
    top: i64,
    right: i64,
    bottom: i64,
    conf: f32,
}

fn lines(words: &[Word]) -> Vec<Line> {
    let mut out: Vec<Line> = Vec::new();
    for w in words {
        match out.last_mut() {
            Some(l) if l.id == w.line => {
                l.left = l.left.min(w.left);
                l.top = l.top.min(w.top);
                l.right = l.right.max(w.right());
                l.bottom = l.bottom.max(w.bottom());
            }
            _ => out.push(Line {
                id: w.line,
                left: w.left,
                top: w.top,
                right: w.right(),
                bottom: w.bottom(),
                conf: 0.0,
            }),
        }
    }
    for l in &mut out {
        let on: Vec<Word> = words.iter().filter(|w| w.line == l.id).cloned().collect();
        l.conf = mean_confidence(&on).unwrap_or(0.0);
    }
    out
}

/// Removes the lines that lie within the height of a taller, more confident line beside or
/// above them: Tesseract sometimes reads the lower parts of a large Hangul title as a second
/// line of loose jamo. Lines of a skewed page are as tall as each other, so they are kept.
pub fn drop_nested_lines(words: Vec<Word>) -> Vec<Word> {
    let ls = lines(&words);
    let nested = |l: &Line| {
        let h = l.bottom - l.top;
        ls.iter().any(|m| {
            let mh = m.bottom - m.top;
            let across = l.left.max(m.left) < l.right.min(m.right);
            let overlap = l.bottom.min(m.bottom) - l.top.max(m.top);
            m.id != l.id && across && h * 10 < mh * 8 && overlap * 10 >= h * 7 && m.conf > l.conf
        })
    };
    let drop: Vec<(u32, u32, u32)> = ls.iter().filter(|l| nested(l)).map(|l| l.id).collect();
    words
        .into_iter()
        .filter(|w| !drop.contains(&w.line))
        .collect()
}

/// Whether `w` is a Latin reading Tesseract doubts: no Hangul, some letter, confidence below
/// `below`.
pub fn doubted(w: &Word, below: f32) -> bool {
    w.conf < below && !has_hangul(&w.text) && w.text.chars().any(char::is_alphabetic)
}

/// A Korean reading this confident replaces a doubted Latin one even when Tesseract scored the
/// Latin junk higher: on the corpus a Korean word misread as Latin ("번호" as "HS") scores up to
/// 92 in Latin and 89 in Korean, while Korean-only recognition of real Latin text yields digits
/// and symbols, not Hangul, so it never qualifies.
pub const KOREAN_SURE: f32 = 85.0;

/// The words of `other` whose centre lies inside `w`'s box, and how much of `w`'s width they
/// cover; `None` when none does or they cover less than 60% of it.
fn readings_inside<'a>(w: &Word, other: &'a [Word]) -> Option<Vec<&'a Word>> {
    if w.width <= 0 {
        return None;
    }
    let inside: Vec<&Word> = other
        .iter()
        .filter(|k| {
            let cx = k.left + k.width / 2;
            let cy = k.top + k.height / 2;
            cx >= w.left && cx <= w.right() && cy >= w.top && cy <= w.bottom()
        })
        .collect();
    let covered: i64 = inside.iter().map(|k| k.width).sum();
    (!inside.is_empty() && covered * 10 >= w.width * 6).then_some(inside)
}

/// `w` with its text and confidence taken from `inside` (another reading of the same place).
fn replaced(w: Word, inside: &[&Word]) -> Word {
    let owned: Vec<Word> = inside.iter().map(|k| (*k).clone()).collect();
    let conf = mean_confidence(&owned).unwrap_or(0.0);
    let mut text = String::new();
    for (i, k) in inside.iter().enumerate() {
        if i > 0 && k.space_before {
            text.push(' ');
        }
        text.push_str(&k.text);
    }
    Word { text, conf, ..w }
}

/// Replaces each doubted word of `base` with the Korean reading of the same place in `korean`
/// when that reading is all Hangul words, covers most of the word, and is more confident or
/// at least [`KOREAN_SURE`].
pub fn prefer_korean(base: Vec<Word>, korean: &[Word], below: f32) -> Vec<Word> {
    base.into_iter()
        .map(|w| {
            if !doubted(&w, below) {
                return w;
            }
            let Some(inside) = readings_inside(&w, korean) else {
                return w;
            };
            if !inside.iter().all(|k| has_hangul(&k.text)) {
                return w;
            }
            let owned: Vec<Word> = inside.iter().map(|k| (*k).clone()).collect();
            let conf = mean_confidence(&owned).unwrap_or(0.0);
            if conf <= w.conf && conf < KOREAN_SURE {
                return w;
            }
            replaced(w, &inside)
        })
        .collect()
}

/// Whether `w` looks like a Latin word that mixed recognition garbled: no Hangul, confidence
/// below `below`, and some character that is not a Latin letter (a digit, a mark, a CJK
/// bracket). With Korean loaded, Tesseract reads a small worn Latin word as digits and marks
/// ("Delivered" as `061106『「60` at confidence 0, BENCHMARKS.md "OCR"); an all-letter word it
/// doubts is the Korean recheck's business.
pub fn garbled(w: &Word, below: f32) -> bool {
    w.conf < below && !has_hangul(&w.text) && !w.text.chars().all(|c| c.is_ascii_alphabetic())
}

/// An English reading must be at least this confident to replace a garbled word: English-only
/// recognition reads Korean as Latin junk too, at 40–85 on the corpus ("번호" as "HS" at 85),
/// so only a reading it is surer of than that is taken.
pub const ENGLISH_SURE: f32 = 88.0;

/// Replaces each garbled word of `base` (see [`garbled`]) with the English-only reading of the
/// same place in `english` when that reading covers most of the word and is more confident
/// than both the word and [`ENGLISH_SURE`].
pub fn prefer_english(base: Vec<Word>, english: &[Word], below: f32) -> Vec<Word> {
    base.into_iter()
        .map(|w| {
            if !garbled(&w, below) {
                return w;
            }
            let Some(inside) = readings_inside(&w, english) else {
                return w;
            };
            if inside.iter().any(|k| has_hangul(&k.text)) {
                return w;
            }
            let owned: Vec<Word> = inside.iter().map(|k| (*k).clone()).collect();
            let conf = mean_confidence(&owned).unwrap_or(0.0);
            if conf <= w.conf || conf < ENGLISH_SURE {
                return w;
            }
            replaced(w, &inside)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext\n";

    fn row(line: u32, left: i64, top: i64, w: i64, h: i64, conf: f32, text: &str) -> String {
        format!("5\t1\t1\t1\t{line}\t1\t{left}\t{top}\t{w}\t{h}\t{conf}\t{text}\n")
    }

    #[test]
    fn spacing_comes_from_the_text_and_boxes_from_the_tsv() {
        let tsv = format!(
            "{HEAD}4\t1\t1\t1\t1\t0\t0\t0\t300\t40\t-1\t\n{}{}{}{}",
            row(1, 0, 0, 40, 40, 90.0, "발"),
            row(1, 40, 0, 40, 40, 91.0, "급"),
            row(1, 100, 0, 80, 40, 92.0, "번호"),
            row(2, 0, 50, 80, 40, 93.0, "copy"),
        );
        let words = parse(&tsv, "발급 번호\ncopy\n\n");
        assert_eq!(
            words.iter().map(|w| w.space_before).collect::<Vec<_>>(),
            [false, false, true, true]
        );
        assert_eq!(text(&words), "발급 번호\ncopy");
        assert_eq!(words[2].left, 100);
    }

    #[test]
    fn a_line_inside_a_taller_confident_line_is_dropped() {
        let tsv = format!(
            "{HEAD}{}{}{}{}",
            row(1, 0, 0, 200, 100, 96.0, "문서"),
            row(2, 0, 45, 150, 60, 30.0, "ㄴㄴ"),
            row(3, 0, 130, 200, 40, 95.0, "The"),
            // A neighbour on a skewed page: as tall as the title, overlapping half of it.
            row(4, 0, 160, 200, 40, 20.0, "next"),
        );
        let words = drop_nested_lines(parse(&tsv, "문서\nㄴㄴ\nThe\nnext"));
        assert_eq!(text(&words), "문서\nThe\nnext");
    }

    #[test]
    fn a_doubted_latin_word_takes_the_more_confident_korean_reading() {
        let base = parse(
            &format!(
                "{HEAD}{}{}{}",
                row(1, 0, 0, 100, 40, 96.0, "은행"),
                row(1, 120, 0, 100, 40, 33.0, "alB2"),
                row(1, 240, 0, 100, 40, 40.0, "copy"),
            ),
            "은행 alB2 copy",
        );
        let korean = parse(
            &format!(
                "{HEAD}{}{}{}{}",
                row(1, 0, 0, 100, 40, 95.0, "은행"),
                row(1, 120, 0, 50, 40, 92.0, "제출"),
                row(1, 170, 0, 50, 40, 90.0, "용"),
                row(1, 240, 0, 100, 40, 60.0, "00ㅁ"),
            ),
            "은행 제출용 00ㅁ",
        );
        let merged = prefer_korean(base, &korean, 85.0);
        assert_eq!(text(&merged), "은행 제출용 copy");
        // A confident Korean reading wins over a more confident Latin misreading…
        let latin = |conf| {
            parse(
                &format!("{HEAD}{}", row(1, 0, 0, 100, 40, conf, "HS")),
                "HS",
            )
        };
        let hangul = |conf| {
            parse(
                &format!("{HEAD}{}", row(1, 0, 0, 100, 40, conf, "번호")),
                "번호",
            )
        };
        assert_eq!(
            text(&prefer_korean(latin(91.0), &hangul(89.0), 93.0)),
            "번호"
        );
        // …but a doubtful one only over a less confident Latin reading.
        assert_eq!(text(&prefer_korean(latin(91.0), &hangul(60.0), 93.0)), "HS");
        assert_eq!(
            text(&prefer_korean(latin(50.0), &hangul(60.0), 93.0)),
            "번호"
        );
        // A Latin word read confidently is not doubted at all.
        assert_eq!(text(&prefer_korean(latin(96.0), &hangul(97.0), 93.0)), "HS");
        assert!(
            (merged[1].conf - 274.0 / 3.0).abs() < 0.01,
            "weighted by characters"
        );
    }

    #[test]
    fn a_garbled_latin_word_takes_a_confident_english_reading() {
        // The worn notice of the corpus, as `kor+eng` and `eng` read it.
        let base = parse(
            &format!(
                "{HEAD}{}{}{}{}{}",
                row(1, 1250, 588, 40, 70, 91.0, "는"),
                row(1, 1294, 596, 231, 45, 0.0, "061106『「60"),
                row(1, 1540, 596, 100, 45, 91.0, "입니다."),
                row(2, 1717, 662, 130, 45, 45.6, "(855"),
                row(2, 402, 662, 376, 45, 91.9, "02-1234-5678"),
            ),
            "는 061106『「60 입니다.\n(855 02-1234-5678",
        );
        let english = parse(
            &format!(
                "{HEAD}{}{}{}{}{}",
                row(1, 1120, 594, 153, 53, 0.0, "AEHE"),
                row(1, 1294, 596, 231, 45, 93.2, "Delivered"),
                row(1, 1540, 594, 100, 53, 48.6, "VUCH."),
                row(2, 1717, 662, 130, 45, 66.8, "KRSS"),
                row(2, 402, 662, 376, 45, 99.0, "02-I234-5678"),
            ),
            "AEHE Delivered VUCH.\nKRSS 02-I234-5678",
        );
        let merged = prefer_english(base, &english, 80.0);
        // The garbled word is replaced; a reading not sure enough is not, nor is a Korean word
        // or a code read with confidence above the doubt.
        assert_eq!(text(&merged), "는 Delivered 입니다.\n(855 02-1234-5678");
        assert!((merged[1].conf - 93.2).abs() < 0.01);
        // A surer English reading replaces only a less confident word.
        let word = |conf, t: &str| parse(&format!("{HEAD}{}", row(1, 0, 0, 100, 40, conf, t)), t);
        assert_eq!(
            text(&prefer_english(word(70.0, "1O0"), &word(95.0, "100"), 80.0)),
            "100"
        );
        assert_eq!(
            text(&prefer_english(word(70.0, "1O0"), &word(60.0, "100"), 80.0)),
            "1O0"
        );
        // An all-letter word is left to the Korean recheck.
        assert!(!garbled(&word(10.0, "HS")[0], 80.0));
        assert!(garbled(&word(10.0, "H5")[0], 80.0));
    }
}
