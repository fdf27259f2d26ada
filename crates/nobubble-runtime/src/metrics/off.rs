//! Metrics without the `metrics` feature: the same API as `served.rs`, recording nothing.
//! A server cannot start, and says how to get one.

use super::StepRates;
use crate::run::StepRecord;

/// The run's metrics, built without the `metrics` feature: records nothing.
#[derive(Clone, Debug, Default)]
pub struct Metrics;

impl Metrics {
    /// Metrics that record nothing.
    pub fn new() -> Metrics {
        Metrics
    }

    /// Records nothing.
    pub fn record_step(&self, _rec: &StepRecord, _rates: &StepRates) {}

    /// Records nothing.
    pub fn set_planned_bubble(&self, _fraction: f64) {}

    /// No exposition text.
    pub fn encode(&self) -> String {
        String::new()
    }
}

/// Without the `metrics` feature there is no server: [`MetricsServer::start`] always fails.
#[derive(Debug)]
pub struct MetricsServer {
    addr: String,
}

impl MetricsServer {
    /// Refuses: this build has no metrics server.
    pub fn start(addr: &str, _metrics: Metrics) -> Result<MetricsServer, String> {
        Err(format!(
            "--metrics-addr {addr}: this nobubble was built without metrics (the `metrics` \
             feature, on by default); rebuild it with `--features metrics` or without \
             `--no-default-features`"
        ))
    }

    /// The address it would listen on.
    pub fn addr(&self) -> &str {
        &self.addr
    }
}
