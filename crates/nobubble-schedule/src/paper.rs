//! The zero-bubble paper's benchmark settings (Qi et al. 2024, Tables 5/9): profiled
//! per-stage costs on 32×A100 and the bubble rates the paper reports, so our simulator can be
//! checked against theirs row by row.

use crate::cost::{CostModel, CostSpec, RankCost};
use crate::error::Error;
use crate::generate::{generate, Request, ScheduleKind};
use crate::sim::simulate;
use serde::Serialize;

/// One row of the paper's table.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PaperSetting {
    /// Model size label.
    pub model: &'static str,
    /// Pipeline stages.
    pub p: usize,
    /// Microbatches.
    pub m: usize,
    /// Profiled forward time per stage, µs.
    pub t_f: f64,
    /// Profiled input-gradient time, µs.
    pub t_i: f64,
    /// Profiled weight-gradient time, µs.
    pub t_w: f64,
    /// Profiled stage-to-stage transfer time, µs.
    pub t_comm: f64,
    /// Reported bubble rates: 1F1B, 1F1B-I, ZB-H1, ZB-H2, ZB-1p, ZB-2p.
    pub reported: [f64; 6],
}

macro_rules! row {
    ($model:expr, $p:expr, $m:expr, $f:expr, $i:expr, $w:expr, $c:expr, [$($r:expr),*]) => {
        PaperSetting { model: $model, p: $p, m: $m, t_f: $f, t_i: $i, t_w: $w, t_comm: $c, reported: [$($r),*] }
    };
}

/// The twelve settings, in the paper's order.
pub const SETTINGS: [PaperSetting; 12] = [
    row!(
        "1.5B",
        8,
        24,
        18522.0,
        18086.0,
        9337.0,
        601.0,
        [0.2431, 0.1055, 0.1585, 0.1083, 0.1585, 0.0433]
    ),
    row!(
        "1.5B",
        8,
        32,
        18513.0,
        18086.0,
        9331.0,
        626.0,
        [0.1985, 0.0818, 0.1242, 0.0837, 0.1242, 0.0039]
    ),
    row!(
        "1.5B",
        8,
        64,
        18546.0,
        18097.0,
        9321.0,
        762.0,
        [0.1240, 0.0443, 0.0674, 0.0444, 0.0674, 0.0026]
    ),
    row!(
        "6.2B",
        8,
        24,
        29718.0,
        29444.0,
        19927.0,
        527.0,
        [0.2347, 0.0808, 0.1323, 0.0698, 0.1323, 0.0029]
    ),
    row!(
        "6.2B",
        8,
        32,
        29802.0,
        29428.0,
        19530.0,
        577.0,
        [0.1898, 0.0628, 0.1045, 0.0559, 0.1045, 0.0022]
    ),
    row!(
        "6.2B",
        8,
        64,
        29935.0,
        29621.0,
        19388.0,
        535.0,
        [0.1091, 0.0320, 0.0554, 0.0294, 0.0554, 0.0010]
    ),
    row!(
        "14.6B",
        16,
        48,
        11347.0,
        11248.0,
        8132.0,
        377.0,
        [0.2552, 0.1104, 0.1397, 0.0672, 0.1397, 0.0066]
    ),
    row!(
        "14.6B",
        16,
        64,
        11307.0,
        11254.0,
        8101.0,
        379.0,
        [0.2082, 0.0852, 0.1088, 0.0516, 0.1088, 0.0054]
    ),
    row!(
        "14.6B",
        16,
        128,
        11325.0,
        11308.0,
        8109.0,
        378.0,
        [0.1251, 0.0445, 0.0576, 0.0266, 0.0576, 0.0028]
    ),
    row!(
        "28.3B",
        32,
        96,
        10419.0,
        10207.0,
        7715.0,
        408.0,
        [0.2646, 0.1493, 0.1421, 0.0641, 0.1421, 0.0038]
    ),
    row!(
        "28.3B",
        32,
        128,
        10408.0,
        10204.0,
        7703.0,
        408.0,
        [0.2168, 0.1164, 0.1106, 0.0490, 0.1106, 0.0029]
    ),
    row!(
        "28.3B",
        32,
        256,
        10402.0,
        10248.0,
        7698.0,
        460.0,
        [0.1352, 0.0624, 0.0594, 0.0257, 0.0594, 0.0018]
    ),
];

/// The schedules the paper table compares, with the index of their reported column.
pub const COMPARED: [(ScheduleKind, usize); 5] = [
    (ScheduleKind::OneFOneB, 0),
    (ScheduleKind::ZbH1, 2),
    (ScheduleKind::ZbH2, 3),
    (ScheduleKind::Zb1p, 4),
    (ScheduleKind::Zb2p, 5),
];

impl PaperSetting {
    /// (hidden size, attention heads) of the model, from the paper's table.
    pub fn shape(&self) -> (f64, f64) {
        match self.model {
            "1.5B" => (2304.0, 24.0),
            "6.2B" => (4096.0, 32.0),
            "14.6B" => (5120.0, 40.0),
            _ => (6144.0, 48.0),
        }
    }

    /// The paper's cost model for this row: its profiled times and comm, and its memory per
    /// token, M_B = 34h + 5·a·s held after F and M_W = 32h kept after I (sequence 1024),
    /// expressed with M_B = 1.
    pub fn costs(&self) -> CostSpec {
        let (h, a) = self.shape();
        let (mem_b, mem_w) =
            crate::flops::block_activation_bytes(h as usize, a as usize, 1024, 1, 2.0);
        CostSpec::uniform(
            RankCost {
                f: self.t_f,
                i: self.t_i,
                w: self.t_w,
                mem_b: 1.0,
                mem_w: mem_w / mem_b,
                b: None,
            },
            self.t_comm,
        )
    }
}

/// Our simulated bubble rate for `kind` on `setting`, with T_comm as a latency on every
/// cross-rank dependency (see BENCHMARKS.md for why this is the model that matches).
pub fn bubble_rate(setting: &PaperSetting, kind: ScheduleKind) -> Result<f64, Error> {
    rate(setting, &Request::new(kind, setting.p, setting.m))
}

/// The simulated bubble rate of what `req` generates with `setting`'s costs.
fn rate(setting: &PaperSetting, req: &Request) -> Result<f64, Error> {
    let spec = setting.costs();
    let schedule = generate(req, &spec)?;
    let costs = CostModel::for_schedule(&spec, &schedule)?;
    Ok(simulate(&schedule, &costs)?.metrics.bubble_rate)
}

/// The smallest bubble rate any schedule can have on `setting` within `kind`'s memory limit
/// (unlimited for kinds without one), from [`crate::span_lower_bound`]. Where ours equals
/// it, no better schedule exists.
pub fn bubble_rate_floor(setting: &PaperSetting, kind: ScheduleKind) -> Result<f64, Error> {
    let spec = setting.costs();
    let costs = CostModel::for_layout(&spec, setting.p, setting.p)?;
    let placement: Vec<usize> = (0..setting.p).collect();
    let x = kind.planning_limit(setting.p, None);
    let bound = crate::span_lower_bound(&placement, setting.m, &costs, x);
    let busy = costs
        .stages
        .iter()
        .map(|s| setting.m as f64 * (s.f + s.i + s.w))
        .fold(0.0, f64::max);
    Ok((1.0 - busy / bound).max(0.0))
}

/// The bubble rate of our reimplementation of the paper's own scheduler (`zb-paper`) on
/// `setting` under `x` × M_B: how faithful the baseline is, beside the published ZB-1p
/// (x = p) and ZB-2p (x = 2p) columns.
pub fn paper_scheduler_rate(setting: &PaperSetting, x: f64) -> Result<f64, Error> {
    let req = Request {
        mem_limit: crate::limit::MemLimit::Multiple(x),
        ..Request::new(ScheduleKind::ZbPaper, setting.p, setting.m)
    };
    rate(setting, &req)
}
