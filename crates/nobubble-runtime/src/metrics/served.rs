//! The Prometheus side of the metrics (feature `metrics`): the registry and the HTTP server.
//!
//! Every value of one step is written under one lock, and a scrape encodes under the same
//! lock, so a scrape never mixes two steps.

use super::StepRates;
use crate::run::StepRecord;
use prometheus::{
    exponential_buckets, CounterVec, Encoder, Gauge, GaugeVec, Histogram, HistogramOpts,
    IntCounter, IntGauge, Opts, Registry, TextEncoder,
};
use std::sync::{Arc, Mutex};

struct Handles {
    bubble: Gauge,
    planned_bubble: Gauge,
    mfu: Gauge,
    memory: GaugeVec,
    tokens: Gauge,
    step_seconds: Histogram,
    loss: Gauge,
    grad_norm: Gauge,
    skipped: IntCounter,
    idle: CounterVec,
    step: IntGauge,
}

struct State {
    registry: Registry,
    m: Handles,
}

/// The run's metrics; cheap to clone (all clones share the values).
#[derive(Clone)]
pub struct Metrics {
    state: Arc<Mutex<State>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Every name and help text is a valid constant, so building them cannot fail.
const VALID: &str = "metric definitions are valid";

impl Metrics {
    /// Empty metrics, registered under their exposition names.
    pub fn new() -> Metrics {
        let gauge = |name: &str, help: &str| Gauge::new(name, help).expect(VALID);
        let per_rank =
            |name: &str, help: &str| GaugeVec::new(Opts::new(name, help), &["rank"]).expect(VALID);
        let m = Handles {
            bubble: gauge(
                "pipeline_bubble_fraction",
                "Measured bubble fraction of the last step: idle share of all ranks' time within the span of its passes",
            ),
            planned_bubble: gauge(
                "nobubble_planned_bubble_fraction",
                "Bubble fraction the simulator predicts for the plan in use",
            ),
            mfu: gauge(
                "gpu_flop_utilization_mfu",
                "Model FLOPs per second of the last step over the peak FLOP/s of all ranks (CPU cores on CPU runs; the name is kept for dashboards)",
            ),
            memory: per_rank(
                "active_microbatch_memory_mb",
                "Peak activation memory of the last step per rank, MiB",
            ),
            tokens: gauge(
                "nobubble_tokens_per_second",
                "Training tokens per second of wall time in the last step (all replicas)",
            ),
            // 1 ms to about 65 s.
            step_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "nobubble_step_seconds",
                    "Wall time of an optimizer step, seconds",
                )
                .buckets(exponential_buckets(0.001, 2.0, 17).expect(VALID)),
            )
            .expect(VALID),
            loss: gauge("nobubble_loss", "Training loss of the last step"),
            grad_norm: gauge(
                "nobubble_grad_norm",
                "Global gradient norm of the last step, before clipping",
            ),
            skipped: IntCounter::new(
                "nobubble_skipped_steps_total",
                "Steps whose update was skipped (non-finite gradients)",
            )
            .expect(VALID),
            idle: CounterVec::new(
                Opts::new(
                    "nobubble_rank_idle_seconds_total",
                    "Idle time of a rank within its steps' spans, seconds",
                ),
                &["rank"],
            )
            .expect(VALID),
            step: IntGauge::new(
                "nobubble_step",
                "Steps completed when the last step was recorded (the console's, --log's and the checkpoints' step number)",
            )
            .expect(VALID),
        };
        let r = Registry::new();
        let collectors: [Box<dyn prometheus::core::Collector>; 11] = [
            Box::new(m.bubble.clone()),
            Box::new(m.planned_bubble.clone()),
            Box::new(m.mfu.clone()),
            Box::new(m.memory.clone()),
            Box::new(m.tokens.clone()),
            Box::new(m.step_seconds.clone()),
            Box::new(m.loss.clone()),
            Box::new(m.grad_norm.clone()),
            Box::new(m.skipped.clone()),
            Box::new(m.idle.clone()),
            Box::new(m.step.clone()),
        ];
        for c in collectors {
            r.register(c).expect("metric names are distinct");
        }
        Metrics {
            state: Arc::new(Mutex::new(State { registry: r, m })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere while holding the lock leaves plain numbers behind: still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a finished step.
    pub fn record_step(&self, rec: &StepRecord, rates: &StepRates) {
        let s = self.lock();
        let m = &s.m;
        m.bubble.set(rec.bubble_fraction);
        m.mfu.set(rates.mfu);
        m.tokens.set(rates.tokens_per_second);
        m.step_seconds.observe(rec.wall);
        m.loss.set(rates.loss);
        m.grad_norm.set(rates.grad_norm);
        if rec.skipped {
            m.skipped.inc();
        }
        for (rank, bytes) in rec.peak_bytes.iter().enumerate() {
            m.memory
                .with_label_values(&[rank.to_string()])
                .set(*bytes as f64 / 1048576.0);
        }
        for (rank, busy) in rec.busy.iter().enumerate() {
            m.idle
                .with_label_values(&[rank.to_string()])
                .inc_by((rec.makespan - busy).max(0.0));
        }
        m.step.set(rec.step as i64 + 1);
    }

    /// Records the bubble fraction the plan in use predicts.
    pub fn set_planned_bubble(&self, fraction: f64) {
        self.lock().m.planned_bubble.set(fraction);
    }

    /// The exposition text (the Prometheus text format, version 0.0.4).
    pub fn encode(&self) -> String {
        let s = self.lock();
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&s.registry.gather(), &mut out)
            .expect("writing to memory cannot fail");
        String::from_utf8(out).expect("the encoder writes UTF-8")
    }
}

/// `addr` in the `HOST:PORT` form the server binds. The forms other exporters accept are
/// read as they read them: `:9464` is every interface (Prometheus exporters, Go), a bare
/// `9464` this machine only.
fn listen_address(addr: &str) -> String {
    let a = addr.trim();
    if let Some(port) = a.strip_prefix(':').filter(|p| p.parse::<u16>().is_ok()) {
        return format!("0.0.0.0:{port}");
    }
    if a.parse::<u16>().is_ok() {
        return format!("127.0.0.1:{a}");
    }
    a.to_string()
}

/// An HTTP endpoint serving [`Metrics`] at `/metrics` until dropped.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
    addr: String,
}

impl MetricsServer {
    /// Binds `addr` (`HOST:PORT`; port 0 picks a free one) and serves `metrics` from a
    /// background thread.
    pub fn start(addr: &str, metrics: Metrics) -> Result<MetricsServer, String> {
        let addr = &listen_address(addr);
        let server = tiny_http::Server::http(addr).map_err(|e| {
            format!("--metrics-addr {addr}: cannot listen there ({e}); pick a free port, e.g. 127.0.0.1:9464, or port 0 for any")
        })?;
        let server = Arc::new(server);
        let bound = match server.server_addr() {
            tiny_http::ListenAddr::IP(a) => a.to_string(),
            #[allow(unreachable_patterns)]
            _ => addr.to_string(),
        };
        let s = server.clone();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || serve(&s, &metrics))
            .map_err(|e| format!("cannot start the metrics server: {e}"))?;
        Ok(MetricsServer {
            server,
            thread: Some(thread),
            addr: bound,
        })
    }

    /// The address it listens on (with the port chosen when 0 was asked for).
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(server: &tiny_http::Server, metrics: &Metrics) {
    let header = |k: &str, v: &str| tiny_http::Header::from_bytes(k, v).expect("valid header");
    for req in server.incoming_requests() {
        let path = req.url().split('?').next().unwrap_or("");
        let response = match path {
            "/metrics" => tiny_http::Response::from_string(metrics.encode())
                .with_header(header("Content-Type", prometheus::TEXT_FORMAT)),
            "/" => tiny_http::Response::from_string(
                "<html><body>nobubble training run: <a href=\"/metrics\">/metrics</a></body></html>",
            )
            .with_header(header("Content-Type", "text/html")),
            _ => tiny_http::Response::from_string("not found; metrics are at /metrics\n")
                .with_status_code(404),
        };
        // A client that hung up is its own problem.
        let _ = req.respond(response);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> StepRecord {
        StepRecord {
            step: 4,
            loss: 2.5,
            grad_norm: 0.75,
            clip_scale: 1.0,
            lr: 1e-3,
            skipped: true,
            timeline: vec![Vec::new(), Vec::new()],
            makespan: 0.5,
            busy: vec![0.4, 0.3],
            bubble_fraction: 0.3,
            bubble_rate: 0.2,
            peak_bytes: vec![2 << 20, 3 << 20],
            wall: 0.25,
            comm: Vec::new(),
        }
    }

    fn value(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
            .trim()
            .parse()
            .unwrap()
    }

    #[test]
    fn other_exporters_address_forms_are_read_as_they_read_them() {
        assert_eq!(listen_address(":9464"), "0.0.0.0:9464");
        assert_eq!(listen_address("9464"), "127.0.0.1:9464");
        assert_eq!(listen_address("127.0.0.1:0"), "127.0.0.1:0");
        assert_eq!(listen_address(":x"), ":x");
    }

    #[test]
    fn a_step_shows_under_the_checklist_names() {
        let m = Metrics::new();
        let rec = record();
        let rates = StepRates::of(&rec, 1000.0, 1e9, 2e9);
        assert_eq!(rates.tokens_per_second, 4000.0);
        assert_eq!(rates.mfu, 2.0);
        m.record_step(&rec, &rates);
        m.record_step(&rec, &rates);
        m.set_planned_bubble(0.125);
        let t = m.encode();
        assert_eq!(value(&t, "pipeline_bubble_fraction"), 0.3);
        assert_eq!(value(&t, "nobubble_planned_bubble_fraction"), 0.125);
        assert_eq!(value(&t, "gpu_flop_utilization_mfu"), 2.0);
        assert_eq!(value(&t, "active_microbatch_memory_mb{rank=\"1\"}"), 3.0);
        assert_eq!(value(&t, "nobubble_loss"), 2.5);
        assert_eq!(value(&t, "nobubble_skipped_steps_total"), 2.0);
        // Idle time accumulates: 2 × (0.5 − 0.3) on rank 1.
        assert!((value(&t, "nobubble_rank_idle_seconds_total{rank=\"1\"}") - 0.4).abs() < 1e-12);
        assert_eq!(value(&t, "nobubble_step_seconds_count"), 2.0);
        assert_eq!(value(&t, "nobubble_step"), 5.0);
    }
}
