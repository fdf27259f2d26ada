//! `nobubble bench reference` and `bench v-baseline`: our planner against the zero-bubble
//! authors' own schedules — the six they produced (`../shared/data/reference-schedules`: four
//! on uniform stages, two heterogeneous at one byte limit per rank), and their V
//! constructions, reimplemented, on random pipelines.

use clap::Args;
use nobubble_schedule::export::csv;
use nobubble_schedule::generate::official_v;
use nobubble_schedule::{
    check_memory, generate, plan, simulate, CostModel, CostSpec, MemLimit, Objective, Placement,
    PlanRequest, RankCost, Request, Schedule, ScheduleKind,
};
use serde_json::json;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `bench reference`.
#[derive(Args, Debug)]
pub struct ReferenceBenchArgs {
    /// The folder holding the authors' schedules (the README of `../shared` lists them)
    /// [default: ../shared/data/reference-schedules, from the current folder or the
    /// repository's].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `bench v-baseline`.
#[derive(Args, Debug)]
pub struct VBaselineBenchArgs {
    /// Random pipelines per schedule (p = 2..8, m = p..4p, per-rank costs and memory, comm).
    #[arg(long, default_value_t = 100)]
    pub cases: usize,
    /// Seed of the random pipelines.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print JSON instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// A reference file, its setting (one rank's share: F, I, W, comm, M_B, M_W; p, m), its
/// memory limit (× M_B) and our schedules to plan at that limit.
type Reference = (
    &'static str,
    [f64; 6],
    usize,
    usize,
    f64,
    &'static [ScheduleKind],
);

/// The four uniform schedules of `../shared/data/reference-schedules` (its README's table;
/// the two heterogeneous ones are read by `heterogeneous_rows`).
const REFERENCES: [Reference; 4] = [
    (
        "paper01_1.5B_p8_m24_ZB-V.csv",
        [18522.0, 18086.0, 9337.0, 601.0, 201216.0, 73728.0],
        8,
        24,
        8.0,
        &[ScheduleKind::ZbV, ScheduleKind::VAuto, ScheduleKind::ZbAuto],
    ),
    (
        "paper01_1.5B_p8_m24_V-Half.csv",
        [18522.0, 18086.0, 9337.0, 601.0, 201216.0, 73728.0],
        8,
        24,
        5.0,
        &[
            ScheduleKind::VHalf,
            ScheduleKind::VAuto,
            ScheduleKind::ZbAuto,
        ],
    ),
    (
        "paper01_1.5B_p8_m24_V-Min.csv",
        [18522.0, 18086.0, 9337.0, 601.0, 201216.0, 73728.0],
        8,
        24,
        4.0,
        &[
            ScheduleKind::VMin,
            ScheduleKind::VAuto,
            ScheduleKind::ZbAuto,
        ],
    ),
    (
        "arxivV07_28.3B-V_p32_m96_ZB-2p.csv",
        [18916.0, 19496.0, 14576.0, 879.0, 454656.0, 196608.0],
        32,
        96,
        64.0,
        &[
            ScheduleKind::Zb2p,
            ScheduleKind::ZbPaper,
            ScheduleKind::ZbAuto,
        ],
    ),
];

/// The heterogeneous references: schedule file, its costs file (per-stage F, I, W and memory),
/// the limit per rank (in the costs' memory unit), p and m (the shared README's table).
const HETEROGENEOUS: [(&str, &str, f64, usize, usize); 2] = [
    (
        "hetero_P04_6.2B_p8_m24_paper-split_lim1p_official.csv",
        "hetero_P04_6.2B_p8_m24_paper-split_lim1p.costs.json",
        9_699_328.0,
        8,
        24,
    ),
    (
        "hetero_S1_p8_m32_seed1084_lim1p_official.csv",
        "hetero_S1_p8_m32_seed1084_lim1p.costs.json",
        8.0,
        8,
        32,
    ),
];

/// One schedule's figures under a cost spec, as [`measure`] simulates them.
#[derive(Clone, Copy, Debug)]
struct Figures {
    bubble_rate: f64,
    makespan: f64,
    /// The longest rank span.
    span: f64,
    /// Peak activation memory in multiples of M_B (the largest over the ranks).
    peak: f64,
}

/// One of our plans in a reference's row.
struct Planned {
    name: String,
    figures: Figures,
    v_placement: bool,
    seconds: f64,
}

/// One reference's row: the official schedule's figures against our plans.
struct Row {
    file: String,
    /// The limit as printed (a multiple of M_B, or bytes with a `B`).
    limit: String,
    official: Figures,
    planned: Vec<Planned>,
    /// Whether ours is at or below the official schedule (see the callers for which plan
    /// and which figures decide).
    met: bool,
}

/// Whether `ours` is at or below `official` on the makespan and/or the longest span.
fn at_or_below(ours: &Figures, official: &Figures, makespan: bool, span: bool) -> bool {
    (!makespan || ours.makespan <= official.makespan * (1.0 + 1e-9))
        && (!span || ours.span <= official.span * (1.0 + 1e-9))
}

/// The heterogeneous references' rows: the official greedy's schedule against `zb-paper`
/// and `zb-auto` (linear, the makespan objective, then the span objective) at its bytes.
fn heterogeneous_rows(dir: &std::path::Path) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for (file, costs_file, limit, p, m) in HETEROGENEOUS {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name)).map_err(|e| {
                format!(
                    "cannot read {}: {e}; pass --dir with the folder of the authors' schedules",
                    dir.join(name).display()
                )
            })
        };
        let spec =
            CostSpec::from_json(&read(costs_file)?).map_err(|e| format!("{costs_file}: {e}"))?;
        let theirs = csv::read(&read(file)?, "official").map_err(|e| format!("{file}: {e}"))?;
        let official = measure(&theirs, &spec)?;
        let mut planned = Vec::new();
        for (kind, objective, label) in [
            (ScheduleKind::ZbPaper, Objective::Span, "zb-paper"),
            (
                ScheduleKind::ZbAuto,
                Objective::Makespan,
                "zb-auto, makespan",
            ),
            (ScheduleKind::ZbAuto, Objective::Span, "zb-auto, span"),
        ] {
            let req = PlanRequest {
                mem_limit: MemLimit::Bytes(limit),
                placement: (kind == ScheduleKind::ZbAuto).then_some(Placement::Linear),
                objective,
                ..PlanRequest::new(kind, p, m, spec.clone())
            };
            let started = Instant::now();
            let ours = plan(&req).map_err(|e| format!("{label}: {e}"))?;
            let seconds = started.elapsed().as_secs_f64();
            ours.check_limit().map_err(|e| format!("{label}: {e}"))?;
            planned.push(Planned {
                name: label.to_string(),
                figures: measure(&ours.schedule, &spec)?,
                v_placement: false,
                seconds,
            });
        }
        // zb-auto's makespan under the makespan objective, its span under the span one.
        let met = at_or_below(&planned[1].figures, &official, true, false)
            && at_or_below(&planned[2].figures, &official, false, true);
        rows.push(Row {
            file: file.to_string(),
            limit: format!("{limit}B"),
            official,
            planned,
            met,
        });
    }
    Ok(rows)
}

/// A schedule's figures under `spec`, simulated.
fn measure(s: &Schedule, spec: &CostSpec) -> Result<Figures, String> {
    let c = CostModel::for_schedule(spec, s).map_err(|e| e.to_string())?;
    let m = simulate(s, &c).map_err(|e| e.to_string())?.metrics;
    let need = (0..s.ranks)
        .map(|r| m.peak_memory[r] / c.rank_mem_b(s, r))
        .fold(0.0, f64::max);
    let span = m.span.iter().copied().fold(0.0, f64::max);
    Ok(Figures {
        bubble_rate: m.bubble_rate,
        makespan: m.makespan,
        span,
        peak: need,
    })
}

/// `--dir`, or the shared folder beside the current one or beside the repository this
/// binary was built from (so the tour's command works from any folder).
fn reference_dir(given: Option<&std::path::Path>) -> Result<PathBuf, String> {
    if let Some(d) = given {
        return Ok(d.to_path_buf());
    }
    const REL: &str = "../shared/data/reference-schedules";
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(REL);
    [PathBuf::from(REL), repo]
        .into_iter()
        .find(|d| d.is_dir())
        .ok_or_else(|| {
            format!(
                "the authors' schedules are not at {REL} (from here or from the repository): \
                 pass --dir FOLDER"
            )
        })
}

/// `bench reference`.
pub fn reference(a: &ReferenceBenchArgs) -> Result<(), String> {
    let dir = reference_dir(a.dir.as_deref())?;
    let mut rows: Vec<Row> = Vec::new();
    for reference in REFERENCES {
        rows.push(uniform_row(&dir, reference)?);
    }
    rows.extend(heterogeneous_rows(&dir)?);
    if a.json {
        let out: Vec<_> = rows
            .iter()
            .map(|row| {
                let ours: Vec<_> = (row.planned.iter())
                    .map(|p| {
                        let mut entry = figures_json(&p.figures);
                        entry["schedule"] = json!(p.name);
                        entry["v_placement"] = json!(p.v_placement);
                        entry["seconds"] = json!(p.seconds);
                        entry
                    })
                    .collect();
                json!({"file": row.file, "limit": row.limit,
                       "official": figures_json(&row.official), "ours": ours})
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&out).expect("serializes")
        );
        return Ok(());
    }
    print_reference_table(&rows);
    Ok(())
}

/// `figures` as the JSON object `bench reference --json` prints.
fn figures_json(figures: &Figures) -> serde_json::Value {
    json!({"bubble_rate": figures.bubble_rate, "makespan": figures.makespan,
           "span": figures.span, "peak": figures.peak})
}

/// One uniform reference: the official schedule checked at its limit and measured, and ours
/// planned at the same limit (the same family first, whose figures decide the row).
fn uniform_row(dir: &std::path::Path, reference: Reference) -> Result<Row, String> {
    let (file, [f, i, w, comm, mem_b, mem_w], p, m, limit, ours) = reference;
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "cannot read {}: {e}; pass --dir with the folder of the authors' schedules",
            path.display()
        )
    })?;
    let theirs = csv::read(&text, "official").map_err(|e| format!("{file}: {e}"))?;
    let spec = CostSpec::uniform(
        RankCost {
            f,
            i,
            w,
            mem_b,
            mem_w,
            b: None,
        },
        comm,
    );
    let c = CostModel::for_schedule(&spec, &theirs).map_err(|e| e.to_string())?;
    check_memory(&theirs, &c, limit).map_err(|e| format!("{file}: {e}"))?;
    let official = measure(&theirs, &spec)?;
    let mut planned = Vec::new();
    for &kind in ours {
        let req = Request {
            mem_limit: kind
                .planning_limit(p, Some(limit))
                .map_or(MemLimit::None, |_| MemLimit::Multiple(limit)),
            ..Request::new(kind, p, m)
        };
        let started = Instant::now();
        let s = generate(&req, &spec).map_err(|e| format!("{}: {e}", kind.name()))?;
        let seconds = started.elapsed().as_secs_f64();
        let c = CostModel::for_schedule(&spec, &s).map_err(|e| e.to_string())?;
        check_memory(&s, &c, limit).map_err(|e| format!("{}: {e}", kind.name()))?;
        let v = nobubble_schedule::Placement::of(&s) == Some(nobubble_schedule::Placement::V);
        let name = format!(
            "{}{}",
            kind.name(),
            if v && kind == ScheduleKind::ZbAuto {
                " (V)"
            } else {
                ""
            }
        );
        planned.push(Planned {
            name,
            figures: measure(&s, &spec)?,
            v_placement: v,
            seconds,
        });
    }
    let met = at_or_below(&planned[0].figures, &official, true, true);
    Ok(Row {
        file: file.to_string(),
        limit: limit.to_string(),
        official,
        planned,
        met,
    })
}

/// `bench reference`'s table and its count of references met.
fn print_reference_table(rows: &[Row]) {
    println!(
        "Ours against the zero-bubble authors' own schedules, at the memory each was made for"
    );
    println!(
        "(bubble rate = 1 − work / longest span; peak in × M_B; all simulated by nobubble).\n"
    );
    println!(
        "{:<54} {:>9}  {:<18} {:>8} {:>11} {:>11} {:>6}  {:>7}",
        "reference", "limit", "schedule", "bubble", "makespan", "span", "peak", "plan s"
    );
    for row in rows {
        let o = &row.official;
        println!(
            "{:<54} {:>9}  {:<18} {:>7.2}% {:>11.1} {:>11.1} {:>6.2}",
            row.file,
            row.limit,
            "official",
            100.0 * o.bubble_rate,
            o.makespan,
            o.span,
            o.peak
        );
        for p in &row.planned {
            let m = &p.figures;
            println!(
                "{:<54} {:>9}  {:<18} {:>7.2}% {:>11.1} {:>11.1} {:>6.2}  {:>7.3}",
                "",
                "",
                p.name,
                100.0 * m.bubble_rate,
                m.makespan,
                m.span,
                m.peak,
                p.seconds
            );
        }
    }
    let beaten = rows.iter().filter(|r| r.met).count();
    println!(
        "\nat or below the official schedule on {beaten}/{} (uniform: our schedule of its family, span and \
         makespan; heterogeneous: zb-auto's makespan and span under each objective)",
        rows.len()
    );
}

/// One V family's comparisons in `bench v-baseline`.
#[derive(Clone, Copy, Default)]
struct Tally {
    /// Longest span shorter, equal, longer than the official construction's.
    shorter: usize,
    equal: usize,
    longer: usize,
    /// Cases where the official schedule needs more than the family's limit (ours is then
    /// v-auto at the official schedule's own peak).
    at_their_peak: usize,
    /// Cases where the authors' construction does not exist (its slot offsets collide for
    /// that p and m): not compared.
    absent: usize,
    /// Summed bubble rates.
    bubble_ours: f64,
    bubble_theirs: f64,
}

impl Tally {
    fn cases(&self) -> f64 {
        (self.shorter + self.equal + self.longer).max(1) as f64
    }
}

/// `bench v-baseline`.
pub fn v_baseline(a: &VBaselineBenchArgs) -> Result<(), String> {
    if a.cases == 0 {
        return Err("--cases must be at least 1".into());
    }
    let mut rng = crate::bench::Rng(a.seed);
    let kinds = [ScheduleKind::ZbV, ScheduleKind::VHalf, ScheduleKind::VMin];
    let mut tally = [Tally::default(); 3];
    let started = Instant::now();
    for case in 0..a.cases {
        let (p, m, spec) = rng.pipeline();
        for (k, &kind) in kinds.iter().enumerate() {
            compare_v(kind, p, m, &spec, &mut tally[k]).map_err(|e| format!("case {case}: {e}"))?;
        }
        if !a.json && (case + 1) % 25 == 0 {
            eprintln!("  {}/{} pipelines", case + 1, a.cases);
        }
    }
    if a.json {
        print_v_json(a, &kinds, &tally);
    } else {
        print_v_table(a, &kinds, &tally, started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// One V family on one pipeline: ours against the authors' construction, at the family's
/// limit (or the construction's own peak when it needs more), into `t_k`.
fn compare_v(
    kind: ScheduleKind,
    p: usize,
    m: usize,
    spec: &CostSpec,
    t_k: &mut Tally,
) -> Result<(), String> {
    let limit = kind
        .planning_limit(p, None)
        .expect("V kinds plan under a limit");
    let Ok(theirs) = official_v(kind, p, m, spec) else {
        t_k.absent += 1;
        return Ok(());
    };
    let c = CostModel::for_schedule(spec, &theirs).map_err(|e| e.to_string())?;
    // With uneven stage memory the unit-slot constructions can exceed the family's
    // limit; then the comparison is at the memory the official schedule takes.
    let req = if check_memory(&theirs, &c, limit.min(m as f64)).is_ok() {
        Request::new(kind, p, m)
    } else {
        t_k.at_their_peak += 1;
        Request {
            mem_limit: MemLimit::Multiple(measure(&theirs, spec)?.peak),
            ..Request::new(ScheduleKind::VAuto, p, m)
        }
    };
    let ours = generate(&req, spec).map_err(|e| e.to_string())?;
    let (o, t) = (measure(&ours, spec)?, measure(&theirs, spec)?);
    let tol = 1e-9 * t.span;
    if o.span < t.span - tol {
        t_k.shorter += 1;
    } else if o.span > t.span + tol {
        t_k.longer += 1;
    } else {
        t_k.equal += 1;
    }
    t_k.bubble_ours += o.bubble_rate;
    t_k.bubble_theirs += t.bubble_rate;
    Ok(())
}

fn print_v_json(a: &VBaselineBenchArgs, kinds: &[ScheduleKind], tally: &[Tally]) {
    let out: Vec<_> = kinds
        .iter()
        .zip(tally)
        .map(|(k, t)| {
            let n = t.cases();
            json!({"schedule": k.name(), "better": t.shorter, "equal": t.equal,
                   "worse": t.longer, "compared_at_the_official_peak": t.at_their_peak,
                   "mean_bubble_ours": t.bubble_ours / n,
                   "mean_bubble_official": t.bubble_theirs / n})
        })
        .collect();
    println!(
        "{}",
        json!({"cases": a.cases, "seed": a.seed, "schedules": out})
    );
}

fn print_v_table(a: &VBaselineBenchArgs, kinds: &[ScheduleKind], tally: &[Tally], seconds: f64) {
    println!(
        "Our V schedules against the authors' V constructions (reimplemented) on {} random \
         pipelines (seed {}), {:.1} s; longest span, at each family's memory:",
        a.cases, a.seed, seconds
    );
    for (k, t) in kinds.iter().zip(tally) {
        let n = t.cases();
        println!(
            "  {:<7} shorter in {:>3}, equal in {:>3}, longer in {}; mean bubble rate {:.2}% vs {:.2}%{}",
            k.name(),
            t.shorter,
            t.equal,
            t.longer,
            100.0 * t.bubble_ours / n,
            100.0 * t.bubble_theirs / n,
            if t.at_their_peak > 0 {
                format!(" ({} where the official one needs more than the family's limit: v-auto at its peak)", t.at_their_peak)
            } else {
                String::new()
            }
        );
        if t.absent > 0 {
            println!(
                "          {} not compared: the authors' construction does not exist there \
                 (its slot offsets collide)",
                t.absent
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nobubble_schedule::RankCost;

    /// Where the authors' ZB-V construction does not exist (`bench v-baseline --seed 3`'s
    /// case 86: p 8, m 27, its offsets collide) the case is counted as not compared instead
    /// of ending the whole benchmark.
    #[test]
    fn a_missing_official_construction_is_counted_not_fatal() {
        let mut rng = crate::bench::Rng(3);
        for _ in 0..86 {
            rng.pipeline();
        }
        let (p, m, spec) = rng.pipeline();
        assert_eq!((p, m), (8, 27));
        assert!(official_v(ScheduleKind::ZbV, p, m, &spec).is_err());
        let mut t = Tally::default();
        compare_v(ScheduleKind::ZbV, p, m, &spec, &mut t).unwrap();
        assert_eq!((t.absent, t.shorter + t.equal + t.longer), (1, 0));
        let uniform = CostSpec::uniform(RankCost::default(), 0.0);
        compare_v(ScheduleKind::ZbV, 4, 8, &uniform, &mut t).unwrap();
        assert_eq!((t.absent, t.shorter + t.equal, t.longer), (1, 1, 0));
    }
}
