//! `nobubble._native`: the Python bindings of the planner. A thin layer, like the CLI: it
//! turns Python arguments into a [`PlanRequest`], calls the library's one planning entry
//! point ([`nobubble_schedule::plan`], or [`planner::evaluate`] for a schedule the user
//! has), and hands back a [`Plan`]. No planning logic lives here, so a Python plan is the
//! CLI's plan, bit for bit.

use nobubble_schedule::export::{chrome, csv, svg};
use nobubble_schedule::sim::Slot;
use nobubble_schedule::split::LayerCosts;
use nobubble_schedule::{
    planner, Action, Objective, Placement, PlanCosts, PlanRequest, Planned, ScheduleKind,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::Duration;

mod args;
mod state;

use args::*;

// Named by its importable path, so that pickle (e.g. `torch.distributed`'s object
// collectives, which carry rank 0's planner error to every rank) can find the class.
create_exception!(
    nobubble._native,
    ScheduleError,
    PyValueError,
    "A request the planner refuses, or a schedule that breaks a rule; the message names the \
     setting (as its keyword), rank or action at fault and what to do."
);

/// The largest plan a notebook draws inline (about 0.5 KB of SVG per action).
const SVG_REPR_MAX_ACTIONS: usize = 4096;

/// A planned schedule: its actions per rank in PyTorch's notation, the stages each rank
/// builds, and what the simulator predicts.
#[pyclass(module = "nobubble", frozen)]
struct Plan {
    inner: Planned,
    /// [`state::of`] as text, made on first use: `==`, `hash()` and pickling all read it, and
    /// a large plan's state is megabytes (a plan never changes: the class is frozen).
    state: std::sync::OnceLock<String>,
}

impl Plan {
    fn new(inner: Planned) -> Self {
        Plan {
            inner,
            state: std::sync::OnceLock::new(),
        }
    }

    fn state(&self) -> &str {
        self.state
            .get_or_init(|| state::of(&self.inner).to_string())
    }
}

#[pymethods]
impl Plan {
    /// The schedule's name (`zb-auto`, or the file's).
    #[getter]
    fn schedule(&self) -> String {
        self.inner.schedule.name.clone()
    }

    /// Pipeline ranks (devices).
    #[getter]
    fn num_ranks(&self) -> usize {
        self.inner.schedule.ranks
    }

    /// Model stages (chunks) over all ranks: the model is cut into this many pieces.
    #[getter]
    fn num_stages(&self) -> usize {
        self.inner.schedule.stages
    }

    /// Microbatches per iteration.
    #[getter]
    fn num_microbatches(&self) -> usize {
        self.inner.schedule.microbatches
    }

    /// `placement[stage]` = the rank that runs it.
    #[getter]
    fn placement(&self) -> Vec<usize> {
        self.inner.schedule.placement.clone()
    }

    /// `"linear"`, `"v"`, or `None` for other placements (interleaved).
    #[getter]
    fn placement_kind(&self) -> Option<&'static str> {
        Placement::of(&self.inner.schedule).map(Placement::name)
    }

    /// Per rank, the actions in program order in PyTorch's notation: `0F3` (forward of stage
    /// 0 on microbatch 3), `1I2` (input gradient), `1W2` (weight gradient), `3B1` (both).
    #[getter]
    fn actions(&self) -> Vec<Vec<String>> {
        let orders = &self.inner.schedule.orders;
        orders
            .iter()
            .map(|o| o.iter().map(|a| a.to_string()).collect())
            .collect()
    }

    /// The stage indices `rank` must build, in increasing order.
    fn stages_of(&self, rank: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
        let s = &self.inner.schedule;
        Ok(s.stages_of(in_range("rank", rank, s.ranks)?))
    }

    /// The rank that runs `stage`.
    fn rank_of(&self, stage: &Bound<'_, PyAny>) -> PyResult<usize> {
        let s = &self.inner.schedule;
        Ok(s.rank_of(in_range("stage", stage, s.stages)?))
    }

    /// Simulated time of one iteration, in the costs' unit.
    #[getter]
    fn makespan(&self) -> f64 {
        self.inner.sim.metrics.makespan
    }

    /// The paper's bubble rate: 1 − the busiest rank's work / its span.
    #[getter]
    fn bubble_rate(&self) -> f64 {
        self.inner.sim.metrics.bubble_rate
    }

    /// Idle share of all ranks over the makespan.
    #[getter]
    fn bubble_fraction(&self) -> f64 {
        self.inner.sim.metrics.bubble_fraction
    }

    /// Each rank's time running passes.
    #[getter]
    fn busy(&self) -> Vec<f64> {
        self.inner.sim.metrics.busy.clone()
    }

    /// Each rank's idle time within its span (span − busy).
    #[getter]
    fn idle(&self) -> Vec<f64> {
        self.inner.sim.metrics.idle.clone()
    }

    /// Transfers between ranks in one iteration.
    #[getter]
    fn messages(&self) -> usize {
        self.inner.sim.metrics.messages
    }

    /// Per rank, each action's `(action, start, end)` as simulated, in program order: the
    /// times to draw or compare a timeline with.
    #[getter]
    fn timeline(&self) -> Vec<Vec<(String, f64, f64)>> {
        let timeline = &self.inner.sim.timeline;
        timeline
            .iter()
            .map(|t| {
                t.iter()
                    .map(|s| (s.action.to_string(), s.start, s.end))
                    .collect()
            })
            .collect()
    }

    /// The actions whose chain of waits sets the makespan, first to last: shortening any of
    /// them (or the transfers between them) is what can shorten the iteration.
    #[getter]
    fn critical_path(&self) -> Vec<String> {
        let path = &self.inner.sim.critical_path;
        path.iter().map(|a| a.to_string()).collect()
    }

    /// Each rank's span, first pass to last.
    #[getter]
    fn span(&self) -> Vec<f64> {
        self.inner.sim.metrics.span.clone()
    }

    /// Peak activation memory per rank, in the costs' memory unit.
    #[getter]
    fn peak_memory(&self) -> Vec<f64> {
        self.inner.peak_memory().to_vec()
    }

    /// A proven lower bound on the makespan under the same costs and memory limit.
    #[getter]
    fn lower_bound(&self) -> f64 {
        self.inner.lower_bound()
    }

    /// A proven lower bound on the longest rank span.
    #[getter]
    fn span_lower_bound(&self) -> f64 {
        self.inner.span_lower_bound()
    }

    /// What the plan minimized (`"span"` or `"makespan"`), `None` for fixed patterns.
    #[getter]
    fn objective(&self) -> Option<&'static str> {
        self.inner.objective.map(Objective::name)
    }

    /// The memory limit as requested (`"none"`, `"8"`, `"20MiB"`, …); the limit the plan
    /// was actually made under, a schedule's default included, is [`Self::limit`].
    #[getter]
    fn mem_limit(&self) -> String {
        self.inner.mem_limit.to_string()
    }

    /// The limit the plan was made (or checked) under, in multiples of M_B: the automatic
    /// kinds' request or default (zb-auto's 2p), a fixed-level kind's own level (v-min's
    /// ⌊(p+4)/3⌋) whatever the request, under budgets in bytes the one multiple the ranks'
    /// shares work out to. `None`: no limit. (The `.pyi` says the same for Python users.)
    #[getter]
    fn limit(&self) -> Option<f64> {
        self.inner.limit
    }

    /// Whether the schedule fits its memory limit. `plan`, `check` and `simulate` raise
    /// `ScheduleError` for one that does not, so a plan they return always fits.
    #[getter]
    fn fits(&self) -> bool {
        self.inner.over_limit.is_none()
    }

    /// Blocks per stage when planned with `layer_costs=`, else `None`.
    #[getter]
    fn layer_split(&self) -> Option<Vec<usize>> {
        self.inner.split.as_ref().map(|s| s.counts.clone())
    }

    /// Per stage, the (F, I, W) times the plan was made with, and B where a fused
    /// backward has a time of its own: what `cost=` takes, to plan again on the same costs.
    #[getter]
    fn stage_costs<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let stages = &self.inner.costs.stages;
        stages
            .iter()
            .map(|c| {
                PyTuple::new(
                    py,
                    [c.f, c.i, c.w].into_iter().chain(c.b).collect::<Vec<_>>(),
                )
            })
            .collect()
    }

    /// PyTorch's compute-only schedule CSV (row r = rank r).
    fn to_csv(&self) -> String {
        csv::write(&self.inner.schedule)
    }

    /// The simulated timeline as a Chrome/Perfetto trace (JSON text).
    fn to_chrome_trace(&self) -> String {
        chrome::to_json(&self.inner.schedule, &self.inner.sim)
    }

    /// The simulated timeline as an SVG picture.
    fn to_svg(&self) -> String {
        svg::render(&self.inner.schedule, &self.inner.sim)
    }

    /// A measured timeline drawn above this plan's simulated one, on one time scale, so a
    /// reader sees where a run departed from the plan: per rank, `(action, start, end)` as
    /// `timeline` gives them (PyTorch's notation; ms, as the axis says, so the plan's costs
    /// must be in ms too), each one of that rank's actions in this plan. `title` names what
    /// was measured, `plan_title` what the plan's panel shows.
    #[pyo3(signature = (measured, title = "measured", plan_title = "planned"))]
    fn measured_svg(
        &self,
        measured: &Bound<'_, PyAny>,
        title: &str,
        plan_title: &str,
    ) -> PyResult<String> {
        let measured = measured_rows(&self.inner.schedule, measured)?;
        let (schedule, sim) = (&self.inner.schedule, &self.inner.sim);
        Ok(svg::render_measured(
            schedule,
            &measured,
            sim,
            [title, plan_title],
        ))
    }

    /// The picture a notebook (Jupyter, VS Code) shows for a plan left as a cell's value:
    /// [`Self::to_svg`], up to [`SVG_REPR_MAX_ACTIONS`] actions. Larger plans show their
    /// text instead (their SVG runs to megabytes, saved in the notebook); `to_svg()` still
    /// draws them.
    fn _repr_svg_(&self) -> Option<String> {
        (self.inner.schedule.len() <= SVG_REPR_MAX_ACTIONS).then(|| self.to_svg())
    }

    /// Plans are equal when their schedules, costs, limits, objective and layer split are.
    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Plan>()
            .is_ok_and(|o| self.state() == o.get().state())
    }

    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.state().hash(&mut h);
        h.finish()
    }

    /// Pickling (and `copy.deepcopy`) rebuild the plan from its state: the same schedule,
    /// costs and limits, simulated again.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let rebuild = py.import("nobubble._native")?.getattr("_plan_from_state")?;
        Ok((rebuild, (self.state().to_string(),)))
    }

    fn __repr__(&self) -> String {
        let s = &self.inner.schedule;
        format!(
            "Plan(schedule={:?}, ranks={}, stages={}, microbatches={}, makespan={}, \
             bubble_rate={:.4})",
            s.name,
            s.ranks,
            s.stages,
            s.microbatches,
            nobubble_schedule::error::fmt_num(self.makespan()),
            self.bubble_rate()
        )
    }
}

/// Plans `schedule` (a nobubble name such as "zb-auto", or a PyTorch class name such as
/// "ScheduleZBVZeroBubble"; see `nobubble.schedule_names()`) for `stages` ranks and
/// `microbatches` microbatches: the same planner, and so the same schedule, as
/// `nobubble plan`.
///
/// cost: (F, I, W) pass times of one rank's share of the model, or, in model order, one
///     tuple per 1F1B stage (the model in `stages` parts) or per schedule stage; any unit
///     (default 1, 1, 1). A fourth number B is the fused backward's time where it is not
///     I + W (PyTorch's split backward costs extra): zb-auto then also weighs plans that
///     fuse backward passes.
/// comm: time of one transfer between ranks (default 0).
/// mem: (M_B, M_W) activation memory held after F, and after I until W, or one per 1F1B
///     stage or per schedule stage, as cost (default 1, 0.5).
/// mem_limit: a number is a multiple of each rank's M_B; a string with a unit ("20GiB",
///     "1609728B", in mem's unit) or a list of them, one per rank, is a budget in memory.
/// placement: zb-auto's layout, "auto" (plans linear and V, keeps the better), "linear"
///     or "v".
/// objective: "span" (the longest rank span, the default) or "makespan".
/// chunks: model chunks per rank of the interleaved schedules (default 2); for zb-auto,
///     1 means the linear layout and 2 the V one.
/// layer_costs: the JSON text of `nobubble plan --layer-costs`; the planner then also
///     chooses the blocks per stage (cost, mem and comm are refused beside it).
///
/// Returns a `Plan`; raises `ScheduleError` (a ValueError) naming the setting at fault.
/// Other Python threads run while it plans, and Ctrl-C interrupts a long plan at once.
#[pyfunction]
#[pyo3(signature = (
    schedule, stages, microbatches, *, cost=None, comm=None, mem=None, mem_limit=None,
    placement=None, objective=None, chunks=None, layer_costs=None
))]
#[allow(clippy::too_many_arguments)]
fn plan(
    py: Python<'_>,
    schedule: &Bound<'_, PyAny>,
    stages: &Bound<'_, PyAny>,
    microbatches: &Bound<'_, PyAny>,
    cost: Option<&Bound<'_, PyAny>>,
    comm: Option<&Bound<'_, PyAny>>,
    mem: Option<&Bound<'_, PyAny>>,
    mem_limit: Option<&Bound<'_, PyAny>>,
    placement: Option<&Bound<'_, PyAny>>,
    objective: Option<&Bound<'_, PyAny>>,
    chunks: Option<&Bound<'_, PyAny>>,
    layer_costs: Option<&Bound<'_, PyAny>>,
) -> PyResult<Plan> {
    let name = text(schedule, "schedule", "a schedule name such as \"zb-auto\"")?;
    let kind = ScheduleKind::from_name(&name).map_err(py_error)?;
    let placement = match given(placement) {
        Some(p) => text(p, "placement", "\"auto\", \"linear\" or \"v\"")?,
        None => "auto".into(),
    };
    let objective = match given(objective) {
        Some(o) => text(o, "objective", "\"span\" or \"makespan\"")?,
        None => "span".into(),
    };
    let comm = given(comm).map(|c| number(c, "comm")).transpose()?;
    let layer_costs = given(layer_costs)
        .map(|l| text(l, "layer_costs", "the --layer-costs JSON text"))
        .transpose()?;
    let (stages, microbatches) = (
        count(stages, "stages")?,
        count(microbatches, "microbatches")?,
    );
    let (chunks, placement) = self::chunks(kind, chunks, self::placement(&placement)?)?;
    let limit = self::mem_limit(mem_limit)?;
    let costs = match layer_costs {
        Some(json) => {
            let beside: Vec<&str> = [
                ("cost", cost.is_some()),
                ("mem", mem.is_some()),
                ("comm", comm.is_some()),
            ]
            .into_iter()
            .filter_map(|(name, set)| set.then_some(name))
            .collect();
            if !beside.is_empty() {
                return Err(value_error(format!(
                    "layer_costs holds the model's times, memory and comm itself: leave out {} \
                     (or give per-stage costs without layer_costs)",
                    beside.join(", ")
                )));
            }
            text_not_path(&json, "layer_costs", "per-layer costs' JSON")?;
            PlanCosts::Layers(LayerCosts::from_json(&json).map_err(py_error)?)
        }
        None => {
            sized_memory(&limit, mem)?;
            PlanCosts::Stages(cost_spec(cost, mem, comm.unwrap_or(0.0))?)
        }
    };
    let req = PlanRequest {
        schedule: kind,
        ranks: stages,
        microbatches,
        chunks,
        costs,
        mem_limit: limit,
        placement,
        objective: self::objective(&objective)?,
    };
    let planned = plan_interruptibly(py, req)?;
    planned.check_limit().map_err(py_error)?;
    Ok(Plan::new(planned))
}

/// How often a wait for the planner looks for Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// Plans `req` on a thread of its own. Planning a large pipeline takes seconds to minutes:
/// meanwhile other Python threads run, and Ctrl-C (a notebook's interrupt) raises
/// `KeyboardInterrupt` within [`SIGNAL_POLL`] instead of when planning ends. The planner has
/// no way to stop early, so an interrupted plan finishes in the background and is dropped.
fn plan_interruptibly(py: Python<'_>, req: PlanRequest) -> PyResult<Planned> {
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name("nobubble-plan".into())
        .spawn(move || {
            // The receiver is gone if the wait was interrupted: nobody needs the plan.
            let _ = tx.send(nobubble_schedule::plan(&req));
        })
        .map_err(|e| value_error(format!("could not start the planner's thread: {e}")))?;
    let mut rx = rx;
    loop {
        // The receiver goes along into the wait without the GIL (it is `Send`, not `Sync`).
        let (got, back) = py.detach(move || (rx.recv_timeout(SIGNAL_POLL), rx));
        rx = back;
        match got {
            Ok(planned) => return planned.map_err(py_error),
            Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(
                    "the planner stopped without a plan (a bug: please report it with the \
                     arguments that led here)",
                ))
            }
        }
    }
}

/// The plan of a schedule someone else wrote, given as PyTorch's CSV text.
fn evaluate(
    csv_text: &str,
    name: Option<&Bound<'_, PyAny>>,
    cost: Option<&Bound<'_, PyAny>>,
    comm: Option<&Bound<'_, PyAny>>,
    mem: Option<&Bound<'_, PyAny>>,
    limit: Option<&Bound<'_, PyAny>>,
) -> PyResult<Plan> {
    let name = match given(name) {
        Some(n) => text(n, "name", "a string")?,
        None => "custom".into(),
    };
    let comm = match given(comm) {
        Some(c) => number(c, "comm")?,
        None => 0.0,
    };
    let schedule = csv::read(csv_text, &name).map_err(py_error)?;
    let limit = mem_limit(limit)?;
    sized_memory(&limit, mem)?;
    let spec = cost_spec(cost, mem, comm)?;
    let planned =
        planner::evaluate(schedule, &spec, &limit, Objective::default()).map_err(py_error)?;
    planned.check_limit().map_err(py_error)?;
    Ok(Plan::new(planned))
}

/// Validates a schedule in PyTorch's compute-only CSV format (what `nobubble check` does):
/// returns its plan, or raises `ScheduleError` naming the rank and action at fault.
#[pyfunction]
#[pyo3(signature = (csv, *, cost=None, comm=None, mem=None, mem_limit=None, name=None))]
fn check(
    csv: &Bound<'_, PyAny>,
    cost: Option<&Bound<'_, PyAny>>,
    comm: Option<&Bound<'_, PyAny>>,
    mem: Option<&Bound<'_, PyAny>>,
    mem_limit: Option<&Bound<'_, PyAny>>,
    name: Option<&Bound<'_, PyAny>>,
) -> PyResult<Plan> {
    let takes = "the schedule CSV as a str (for per-rank action lists use nobubble.simulate)";
    let csv = text(csv, "check", takes)?;
    text_not_path(&csv, "check", "schedule CSV")?;
    evaluate(&csv, name, cost, comm, mem, mem_limit)
}

/// Simulates per-rank action lists (PyTorch notation, e.g. `[["0F0", "0I0", "0W0"], …]`)
/// under the given costs; raises `ScheduleError` if they do not form a valid schedule.
#[pyfunction]
#[pyo3(signature = (actions, *, cost=None, comm=None, mem=None, mem_limit=None, name=None))]
fn simulate(
    actions: &Bound<'_, PyAny>,
    cost: Option<&Bound<'_, PyAny>>,
    comm: Option<&Bound<'_, PyAny>>,
    mem: Option<&Bound<'_, PyAny>>,
    mem_limit: Option<&Bound<'_, PyAny>>,
    name: Option<&Bound<'_, PyAny>>,
) -> PyResult<Plan> {
    let actions = action_rows(actions)?;
    if let Some(cell) = actions.iter().flatten().find(|a| a.contains([',', '\n'])) {
        return Err(value_error(format!(
            "`{cell}` is not an action such as 0F3"
        )));
    }
    let text: Vec<String> = actions.iter().map(|row| row.join(",")).collect();
    evaluate(&text.join("\n"), name, cost, comm, mem, mem_limit)
}

/// `Plan.measured_svg`'s rows as slots: one list per rank of `(action, start, end)`, each
/// action one of that rank's in the plan and run once, times finite with 0 ≤ start ≤ end.
fn measured_rows(
    schedule: &nobubble_schedule::schedule::Schedule,
    measured: &Bound<'_, PyAny>,
) -> PyResult<Vec<Vec<Slot>>> {
    let what = "measured_svg takes one list per rank of (action, start, end), e.g. \
                [[(\"0F0\", 0.0, 1.5), …], …], as Plan.timeline gives them";
    if measured.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(what));
    }
    let rows: Vec<Vec<(String, f64, f64)>> =
        measured.extract().map_err(|_| PyTypeError::new_err(what))?;
    if rows.len() != schedule.ranks {
        return Err(value_error(format!(
            "measured has {} ranks and the plan {}: give one list per rank, empty for a rank \
             that ran nothing",
            rows.len(),
            schedule.ranks
        )));
    }
    let mut out = Vec::with_capacity(rows.len());
    for (rank, row) in rows.iter().enumerate() {
        let mut left: std::collections::HashSet<Action> =
            schedule.orders[rank].iter().copied().collect();
        let mut slots = Vec::with_capacity(row.len());
        for (text, start, end) in row {
            let action: Action = text.parse().map_err(|e| value_error(format!("{e}")))?;
            if !left.remove(&action) {
                return Err(value_error(format!(
                    "{text} on rank {rank} is not one of that rank's actions in this plan, or \
                     is given twice: draw a run against the plan it ran"
                )));
            }
            if !(start.is_finite() && end.is_finite() && 0.0 <= *start && start <= end) {
                return Err(value_error(format!(
                    "{text} runs from {start} to {end}: times must be finite, 0 ≤ start ≤ end"
                )));
            }
            let (start, end) = (*start, *end);
            slots.push(Slot {
                action,
                start,
                end,
                waited_for: None,
            });
        }
        out.push(slots);
    }
    Ok(out)
}

/// `simulate`'s per-rank action lists: a list of lists of strings, no rank empty.
fn action_rows(obj: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<String>>> {
    let what = "simulate takes a list with one list of actions per rank, e.g. \
                [[\"0F0\", \"0I0\", \"0W0\"], [\"1F0\", \"1I0\", \"1W0\"]] (for CSV text use \
                nobubble.check)";
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(what));
    }
    let rows: Vec<Vec<String>> = obj.extract().map_err(|_| PyTypeError::new_err(what))?;
    if rows.is_empty() {
        return Err(value_error(format!("the action list is empty; {what}")));
    }
    if let Some(r) = rows.iter().position(|row| row.is_empty()) {
        return Err(value_error(format!(
            "rank {r} has no actions: every rank runs at least one stage"
        )));
    }
    Ok(rows)
}

/// A plan from the state `Plan.__reduce__` wrote (for pickle).
#[pyfunction]
fn _plan_from_state(state: &str) -> PyResult<Plan> {
    // A state checked as far as the simulator needs; should another inconsistency reach it,
    // its panic becomes the same ValueError (a PanicException escapes `except Exception`).
    let inner = std::panic::catch_unwind(|| state::plan(state))
        .unwrap_or_else(|_| Err("not the state of a nobubble.Plan: it is inconsistent".into()))
        .map_err(value_error)?;
    Ok(Plan::new(inner))
}

/// Every schedule name with its one-line summary, in `compare`'s order.
#[pyfunction]
fn schedules() -> Vec<(&'static str, &'static str)> {
    ScheduleKind::ALL
        .iter()
        .map(|k| (k.name(), k.summary()))
        .collect()
}

/// Every schedule name with the other names `plan` accepts for it (PyTorch's class names
/// such as `ScheduleZBVZeroBubble`, other systems' spellings), in `compare`'s order.
#[pyfunction]
fn schedule_names() -> Vec<(&'static str, Vec<&'static str>)> {
    ScheduleKind::ALL
        .iter()
        .map(|&k| {
            let mut names = k.other_names();
            for (alias, kind) in ScheduleKind::ALIASES {
                if kind == k && !names.iter().any(|n| n.eq_ignore_ascii_case(alias)) {
                    names.push(alias);
                }
            }
            (k.name(), names)
        })
        .collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Plan>()?;
    m.add_function(wrap_pyfunction!(schedule_names, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(check, m)?)?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add_function(wrap_pyfunction!(schedules, m)?)?;
    m.add_function(wrap_pyfunction!(_plan_from_state, m)?)?;
    m.add("ScheduleError", m.py().get_type::<ScheduleError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
