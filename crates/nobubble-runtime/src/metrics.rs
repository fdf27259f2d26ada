//! Live metrics of a training run, served in the Prometheus text format (`train
//! --metrics-addr HOST:PORT`, path `/metrics`), and the figures they are made of.
//!
//! Rank 0 serves every rank's figures: it already assembles each step's record from all
//! ranks' reports. Names follow the deployment checklist dashboards are built on
//! (`pipeline_bubble_fraction`, `gpu_flop_utilization_mfu`, `active_microbatch_memory_mb`),
//! and everything else is prefixed `nobubble_`. `gpu_flop_utilization_mfu` keeps its name on
//! CPU too: it is model FLOPs per second over the peak of whatever the ranks compute on.
//!
//! Every value of one step is written under one lock, and a scrape encodes under the same
//! lock, so a scrape never mixes two steps.

use crate::pipeline::StepRecord;
use nobubble_nn::GptConfig;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

type FloatGauge = Gauge<f64, AtomicU64>;
type RankLabels = Vec<(String, String)>;

/// Model FLOPs of one optimizer step (forward and both backward halves, every microbatch of
/// every replica): the paper's per-block counts plus the LM head's three matrix products.
/// Recomputation-free, as this engine is, so model FLOPs and hardware FLOPs agree.
pub fn model_flops_per_step(model: &GptConfig, microbatches: usize) -> f64 {
    let [f, i, w] =
        nobubble_nn::bench::block_flops(model.hidden, model.seq_len, model.microbatch_size);
    let tokens = (model.seq_len * model.microbatch_size) as f64;
    let head = 3.0 * 2.0 * tokens * model.hidden as f64 * model.vocab as f64;
    microbatches as f64 * (model.layers as f64 * (f + i + w) + head)
}

/// What one step's record means for the dashboard; computed once so that the log, the
/// report and `/metrics` show the same numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepRates {
    /// Tokens per second of wall time (all replicas).
    pub tokens_per_second: f64,
    /// Model FLOPs per second over the peak of all ranks.
    pub mfu: f64,
}

impl StepRates {
    /// Rates of `rec` for `tokens` and `flops` per step on hardware with `peak` FLOP/s.
    pub fn of(rec: &StepRecord, tokens: f64, flops: f64, peak: f64) -> StepRates {
        let wall = rec.wall.max(f64::MIN_POSITIVE);
        StepRates {
            tokens_per_second: tokens / wall,
            mfu: flops / wall / peak.max(f64::MIN_POSITIVE),
        }
    }
}

struct Handles {
    bubble: FloatGauge,
    planned_bubble: FloatGauge,
    mfu: FloatGauge,
    memory: Family<RankLabels, FloatGauge>,
    tokens: FloatGauge,
    step_seconds: Histogram,
    loss: FloatGauge,
    grad_norm: FloatGauge,
    skipped: Counter,
    idle: Family<RankLabels, Counter<f64, AtomicU64>>,
    step: Gauge,
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

impl Metrics {
    /// Empty metrics, registered under their exposition names.
    pub fn new() -> Metrics {
        let m = Handles {
            bubble: FloatGauge::default(),
            planned_bubble: FloatGauge::default(),
            mfu: FloatGauge::default(),
            memory: Family::default(),
            tokens: FloatGauge::default(),
            // 1 ms to about 65 s.
            step_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            loss: FloatGauge::default(),
            grad_norm: FloatGauge::default(),
            skipped: Counter::default(),
            idle: Family::default(),
            step: Gauge::default(),
        };
        let mut r = Registry::default();
        r.register(
            "pipeline_bubble_fraction",
            "Measured bubble fraction of the last step: idle share of all ranks' time within the span of its passes",
            m.bubble.clone(),
        );
        r.register(
            "nobubble_planned_bubble_fraction",
            "Bubble fraction the simulator predicts for the plan in use",
            m.planned_bubble.clone(),
        );
        r.register(
            "gpu_flop_utilization_mfu",
            "Model FLOPs per second of the last step over the peak FLOP/s of all ranks (CPU cores on CPU runs; the name is kept for dashboards)",
            m.mfu.clone(),
        );
        r.register(
            "active_microbatch_memory_mb",
            "Peak activation memory of the last step per rank, MiB",
            m.memory.clone(),
        );
        r.register(
            "nobubble_tokens_per_second",
            "Training tokens per second of wall time in the last step (all replicas)",
            m.tokens.clone(),
        );
        r.register(
            "nobubble_step_seconds",
            "Wall time of an optimizer step, seconds",
            m.step_seconds.clone(),
        );
        r.register(
            "nobubble_loss",
            "Training loss of the last step",
            m.loss.clone(),
        );
        r.register(
            "nobubble_grad_norm",
            "Global gradient norm of the last step, before clipping",
            m.grad_norm.clone(),
        );
        // The client library appends `_total` to counters.
        r.register(
            "nobubble_skipped_steps",
            "Steps whose update was skipped (non-finite gradients)",
            m.skipped.clone(),
        );
        r.register(
            "nobubble_rank_idle_seconds",
            "Idle time of a rank within its steps' spans, seconds",
            m.idle.clone(),
        );
        r.register(
            "nobubble_step",
            "The last step recorded (0-based, as in --log)",
            m.step.clone(),
        );
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
        m.loss.set(rec.loss as f64);
        m.grad_norm.set(rec.grad_norm);
        if rec.skipped {
            m.skipped.inc();
        }
        for (rank, bytes) in rec.peak_bytes.iter().enumerate() {
            m.memory
                .get_or_create(&rank_label(rank))
                .set(*bytes as f64 / 1048576.0);
        }
        for (rank, busy) in rec.busy.iter().enumerate() {
            m.idle
                .get_or_create(&rank_label(rank))
                .inc_by((rec.makespan - busy).max(0.0));
        }
        m.step.set(rec.step as i64);
    }

    /// Records the bubble fraction the plan in use predicts.
    pub fn set_planned_bubble(&self, fraction: f64) {
        self.lock().m.planned_bubble.set(fraction);
    }

    /// The exposition text (OpenMetrics flavour of the Prometheus text format).
    pub fn encode(&self) -> String {
        let s = self.lock();
        let mut out = String::new();
        encode(&mut out, &s.registry).expect("writing to a String cannot fail");
        out
    }
}

fn rank_label(rank: usize) -> RankLabels {
    vec![("rank".to_string(), rank.to_string())]
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
            "/metrics" => tiny_http::Response::from_string(metrics.encode()).with_header(header(
                "Content-Type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )),
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
        assert_eq!(value(&t, "nobubble_step"), 4.0);
    }

    #[test]
    fn model_flops_are_six_per_parameter_and_token_for_wide_blocks() {
        // Attention terms are small against 24h when s ≪ h: F + I + W ≈ 72·s·b·h² per block
        // = 6 × (12h² weights) per token, the usual 6·N·T.
        let mut m = GptConfig::preset("tiny").unwrap();
        m.hidden = 4096;
        m.seq_len = 8;
        m.microbatch_size = 1;
        m.vocab = 256;
        m.layers = 2;
        let tokens = 8.0;
        let weights = m.layers as f64 * 12.0 * 4096.0 * 4096.0 + 4096.0 * 256.0;
        let ratio = model_flops_per_step(&m, 1) / (6.0 * weights * tokens);
        assert!((ratio - 1.0).abs() < 0.01, "{ratio}");
    }
}
