//! The OCR benchmark: generates the corpus (tests/ocr_corpus), reads every page with the old
//! fixed command and with the current recipe, and prints the character error rate and the time
//! per page of each as a Markdown table (BENCHMARKS.md "OCR"). Run it with `scripts/bench-ocr`.
//!
//! `--sweep` also measures single passes over resolutions and segmentation modes, the numbers
//! the default recipe was chosen by. `--case NAME` limits the run to the cases whose name
//! contains NAME. `--after-only` skips the old command (for iterating on the recipe).

#[path = "../tests/ocr_corpus/mod.rs"]
mod corpus;

use homing::CancellationToken;
use homing_pipelines::ocr::{self, Pass, Recipe};
use std::time::Instant;

struct Score {
    cer: f64,
    seconds: f64,
    confidence: Option<f32>,
    dpi: Option<u32>,
}

async fn score(case: &corpus::Case, pdf: &std::path::Path, recipe: &Recipe) -> Score {
    let work = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let out = ocr::extract_with(pdf, work.path(), &CancellationToken::new(), recipe)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
    let seconds = started.elapsed().as_secs_f64();
    if std::env::var_os("BENCH_OCR_SHOW").is_some() {
        eprintln!("--- {} ---\n{}\n", case.name, out.text);
    }
    Score {
        cer: corpus::cer(&case.expected(), &out.text),
        seconds,
        confidence: out.pages[0].confidence,
        dpi: out.pages[0].dpi,
    }
}

/// One pass, with or without the word-level repairs of the default recipe.
fn single(dpi: u32, psm: Option<u8>, repairs: bool) -> Recipe {
    let passes = vec![Pass {
        dpi,
        psm,
        lang: "kor+eng".into(),
    }];
    if repairs {
        Recipe {
            passes,
            ..Recipe::default()
        }
    } else {
        Recipe {
            passes,
            ..Recipe::baseline()
        }
    }
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sweep = args.iter().any(|a| a == "--sweep");
    let after_only = args.iter().any(|a| a == "--after-only");
    let only = args
        .iter()
        .position(|a| a == "--case")
        .and_then(|i| args.get(i + 1))
        .cloned();
    corpus::need_tools();
    let dir = tempfile::tempdir().unwrap();
    // BENCH_OCR_DIR keeps the generated pages for a look.
    let keep = std::env::var_os("BENCH_OCR_DIR").map(std::path::PathBuf::from);
    let out_dir = keep.as_deref().unwrap_or(dir.path());
    let cases: Vec<_> = corpus::all()
        .into_iter()
        .filter(|c| only.as_deref().is_none_or(|o| c.name.contains(o)))
        .collect();

    if args.iter().any(|a| a == "--pages-only") {
        for case in &cases {
            eprintln!("{}", case.pdf(out_dir).display());
        }
        return;
    }
    let mut recipes: Vec<(String, Recipe)> = vec![
        ("before".into(), Recipe::baseline()),
        ("after".into(), Recipe::default()),
    ];
    if after_only {
        recipes.remove(0);
    }
    if sweep {
        for dpi in [300, 400] {
            for psm in [None, Some(4), Some(6)] {
                for repairs in [false, true] {
                    let name = format!(
                        "{dpi} dpi, psm {}{}",
                        psm.map_or("3".into(), |p| p.to_string()),
                        if repairs { ", word repairs" } else { "" }
                    );
                    recipes.push((name, single(dpi, psm, repairs)));
                }
            }
        }
    }

    let mut totals = vec![(0.0f64, 0.0f64, 0usize); recipes.len()];
    let mut rows = Vec::new();
    for case in &cases {
        let pdf = case.pdf(out_dir);
        let mut scores = Vec::new();
        for (i, (_, recipe)) in recipes.iter().enumerate() {
            let s = score(case, &pdf, recipe).await;
            totals[i].0 += s.cer;
            totals[i].1 += s.seconds;
            totals[i].2 += 1;
            scores.push(s);
        }
        eprintln!(
            "{:<24} {}",
            case.name,
            recipes
                .iter()
                .zip(&scores)
                .map(|((n, _), s)| format!(
                    "{n}: {} {:.1}s conf {:.0}",
                    pct(s.cer),
                    s.seconds,
                    s.confidence.unwrap_or(-1.0)
                ))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        rows.push((case, scores));
    }

    println!("| case | script | scan | CER before | CER after | s/page before | s/page after | confidence after | dpi after |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (case, s) in &rows {
        if after_only {
            println!(
                "| {} | {} | {:.1} | {:.0} |",
                case.name,
                pct(s[0].cer),
                s[0].seconds,
                s[0].confidence.unwrap_or(-1.0)
            );
            continue;
        }
        let scan = if case.is_clean() {
            format!("clean, {} dpi", case.dpi)
        } else {
            format!(
                "worn, {} dpi, {:+}°, JPEG q{}",
                case.dpi,
                case.degrade.angle,
                case.degrade.jpeg.unwrap_or(100)
            )
        };
        println!(
            "| {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.0} | {} |",
            case.name,
            case.script,
            scan,
            pct(s[0].cer),
            pct(s[1].cer),
            s[0].seconds,
            s[1].seconds,
            s[1].confidence.unwrap_or(-1.0),
            s[1].dpi.map_or("-".into(), |d| d.to_string()),
        );
    }
    if sweep {
        println!("\n| recipe | mean CER | s/page |");
        println!("|---|---|---|");
        for ((name, _), (cer, secs, n)) in recipes.iter().zip(&totals) {
            let n = (*n).max(1) as f64;
            println!("| {name} | {} | {:.1} |", pct(cer / n), secs / n);
        }
    }
}
