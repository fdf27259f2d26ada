//! Chrome trace event format, readable by ui.perfetto.dev and chrome://tracing: one process
//! per rank, one thread per stage, one complete ("X") event per action.
//!
//! The trace serializes straight from the schedule and its simulation, one event at a time:
//! a tree of JSON values would take about 4 KB per action (a pipeline of 20 M passes, the
//! planner's largest, would need 75 GB). Keys are written in sorted order, as a JSON map
//! prints them.

use crate::action::Action;
use crate::schedule::Schedule;
use crate::sim::{Simulation, Slot};
use serde::ser::{Serialize, Serializer};

/// The trace of `schedule`'s simulated timeline (serialize it with `serde_json`). Times are
/// written as microseconds, the unit the paper profiles in; a cost model in other units is
/// simply shown on that scale.
pub fn trace<'a>(schedule: &'a Schedule, sim: &'a Simulation) -> Trace<'a> {
    Trace { schedule, sim }
}

/// The trace as JSON text.
pub fn to_json(schedule: &Schedule, sim: &Simulation) -> String {
    serde_json::to_string(&trace(schedule, sim)).expect("a trace serializes")
}

/// A Chrome trace of a simulated schedule; see [`trace`].
#[derive(Clone, Copy)]
pub struct Trace<'a> {
    schedule: &'a Schedule,
    sim: &'a Simulation,
}

#[derive(serde::Serialize)]
struct File<'a> {
    #[serde(rename = "displayTimeUnit")]
    display_time_unit: &'static str,
    #[serde(rename = "otherData")]
    other_data: OtherData<'a>,
    #[serde(rename = "traceEvents")]
    trace_events: Events<'a>,
}

#[derive(serde::Serialize)]
struct OtherData<'a> {
    bubble_rate: f64,
    makespan: f64,
    schedule: &'a str,
}

/// The events, made one at a time as they are written.
struct Events<'a>(Trace<'a>);

#[derive(serde::Serialize)]
struct Name {
    name: String,
}

/// A process's or a thread's name.
#[derive(serde::Serialize)]
struct Meta {
    args: Name,
    name: &'static str,
    ph: &'static str,
    pid: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    tid: Option<usize>,
}

#[derive(serde::Serialize)]
struct PassArgs {
    microbatch: usize,
    pass: &'static str,
    stage: usize,
    waited_for: Option<String>,
}

/// One action's complete event.
#[derive(serde::Serialize)]
struct Pass {
    args: PassArgs,
    cat: String,
    dur: f64,
    name: String,
    ph: &'static str,
    pid: usize,
    tid: usize,
    ts: f64,
}

impl Pass {
    fn new(rank: usize, slot: &Slot) -> Self {
        let Action {
            stage,
            kind,
            microbatch,
        } = slot.action;
        Pass {
            args: PassArgs {
                microbatch,
                pass: kind.name(),
                stage,
                waited_for: slot.waited_for.map(|d| d.to_string()),
            },
            cat: kind.letter().to_string(),
            dur: slot.end - slot.start,
            name: format!("{}{microbatch}", kind.letter()),
            ph: "X",
            pid: rank,
            tid: stage,
            ts: slot.start,
        }
    }
}

impl Serialize for Trace<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let m = &self.sim.metrics;
        File {
            display_time_unit: "ms",
            other_data: OtherData {
                bubble_rate: m.bubble_rate,
                makespan: m.makespan,
                schedule: &self.schedule.name,
            },
            trace_events: Events(*self),
        }
        .serialize(serializer)
    }
}

impl Serialize for Events<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        #[serde(untagged)]
        enum Event {
            Meta(Meta),
            Pass(Pass),
        }
        let Trace { schedule, sim } = self.0;
        let names = (0..schedule.ranks).flat_map(|rank| {
            let process = Meta {
                args: Name {
                    name: format!("rank {rank}"),
                },
                name: "process_name",
                ph: "M",
                pid: rank,
                tid: None,
            };
            let threads = schedule.stages_of(rank).into_iter().map(move |s| Meta {
                args: Name {
                    name: format!("stage {s}"),
                },
                name: "thread_name",
                ph: "M",
                pid: rank,
                tid: Some(s),
            });
            std::iter::once(process).chain(threads).map(Event::Meta)
        });
        let passes = sim.timeline.iter().enumerate().flat_map(|(rank, slots)| {
            slots
                .iter()
                .map(move |slot| Event::Pass(Pass::new(rank, slot)))
        });
        serializer.collect_seq(names.chain(passes))
    }
}
