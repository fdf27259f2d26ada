//! A plan's state as JSON: what `pickle` and `==` use. A plan is its schedule, its costs, the
//! limits and objective it was made under and its layer split; the simulation is
//! deterministic, so it is recomputed from those instead of being stored.

use nobubble_schedule::planner::LayerSplit;
use nobubble_schedule::{simulate, CostModel, MemLimit, Objective, Planned, Schedule};
use serde_json::{json, Value};

/// The state of `p` (the even split a layer split was compared with is left out: the
/// bindings do not show it).
pub(crate) fn of(p: &Planned) -> Value {
    json!({
        "schedule": p.schedule,
        "costs": p.costs,
        "limit": p.limit,
        "mem_limit": p.mem_limit.to_string(),
        "objective": p.objective,
        "layer_split": p.split.as_ref().map(|s| &s.counts),
    })
}

/// The plan [`of`] described, simulated again. Only plans that fit are ever handed to
/// Python (the bindings raise for the others), so it fits.
pub(crate) fn plan(text: &str) -> Result<Planned, String> {
    let bad = |e: &dyn std::fmt::Display| format!("not the state of a nobubble.Plan: {e}");
    let v: Value = serde_json::from_str(text).map_err(|e| bad(&e))?;
    let schedule: Schedule = serde_json::from_value(v["schedule"].clone()).map_err(|e| bad(&e))?;
    // What the simulator indexes by, checked first (a state from another version, or edited).
    schedule.check_shape().map_err(|e| bad(&e))?;
    let costs: CostModel = serde_json::from_value(v["costs"].clone()).map_err(|e| bad(&e))?;
    if costs.stages.len() != schedule.stages {
        return Err(bad(&format!(
            "its costs list {} stages for a schedule of {}",
            costs.stages.len(),
            schedule.stages
        )));
    }
    let finite = |x: f64| x.is_finite() && x >= 0.0;
    let entries = costs.stages.iter();
    if !finite(costs.comm)
        || !entries
            .flat_map(|c| [c.f, c.i, c.w, c.mem_b, c.mem_w])
            .all(finite)
    {
        return Err(bad(&"its costs hold a negative or non-finite number"));
    }
    let limit: Option<f64> = serde_json::from_value(v["limit"].clone()).map_err(|e| bad(&e))?;
    let mem_limit =
        MemLimit::parse(v["mem_limit"].as_str().unwrap_or("none")).map_err(|e| bad(&e))?;
    let objective: Option<Objective> =
        serde_json::from_value(v["objective"].clone()).map_err(|e| bad(&e))?;
    let counts: Option<Vec<usize>> =
        serde_json::from_value(v["layer_split"].clone()).map_err(|e| bad(&e))?;
    let sim = simulate(&schedule, &costs).map_err(|e| bad(&e))?;
    Ok(Planned {
        schedule,
        costs,
        sim,
        limit,
        mem_limit,
        objective,
        split: counts.map(|counts| LayerSplit { counts, even: None }),
        over_limit: None,
    })
}
