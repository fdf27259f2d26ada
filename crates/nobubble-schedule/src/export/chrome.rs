//! Chrome trace event format, readable by ui.perfetto.dev and chrome://tracing: one process
//! per rank, one thread per stage, one complete ("X") event per action.

use crate::schedule::Schedule;
use crate::sim::Simulation;
use serde_json::{json, Value};

/// Builds the trace. Times are written as microseconds, the unit the paper profiles in; a
/// cost model in other units is simply shown on that scale.
pub fn trace(schedule: &Schedule, sim: &Simulation) -> Value {
    let mut events = Vec::new();
    for rank in 0..schedule.ranks {
        events.push(json!({"name": "process_name", "ph": "M", "pid": rank,
            "args": {"name": format!("rank {rank}")}}));
        for s in schedule.stages_of(rank) {
            events.push(
                json!({"name": "thread_name", "ph": "M", "pid": rank, "tid": s,
                "args": {"name": format!("stage {s}")}}),
            );
        }
    }
    for (rank, slots) in sim.timeline.iter().enumerate() {
        for slot in slots {
            let a = slot.action;
            events.push(json!({
                "name": format!("{}{}", a.kind.letter(), a.microbatch),
                "cat": a.kind.letter().to_string(),
                "ph": "X",
                "pid": rank,
                "tid": a.stage,
                "ts": slot.start,
                "dur": slot.end - slot.start,
                "args": {"stage": a.stage, "microbatch": a.microbatch, "pass": a.kind.name(),
                         "waited_for": slot.waited_for.map(|d| d.to_string())},
            }));
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms",
           "otherData": {"schedule": schedule.name, "makespan": sim.metrics.makespan,
                         "bubble_rate": sim.metrics.bubble_rate}})
}
