use nobubble_schedule::generate::auto::zb_auto;
use nobubble_schedule::paper::SETTINGS;
use nobubble_schedule::*;
fn main() {
    for s in SETTINGS {
        let ratio = if s.model == "1.5B" {
            73728.0 / 201216.0
        } else {
            131072.0 / 303104.0
        };
        let spec = CostSpec::uniform(
            RankCost {
                f: s.t_f,
                i: s.t_i,
                w: s.t_w,
                mem_b: 1.0,
                mem_w: ratio,
            },
            s.t_comm,
        );
        let mut line = format!("{:6} p{:2} m{:3}", s.model, s.p, s.m);
        for (x, col) in [(s.p as f64, 4), (2.0 * s.p as f64, 5)] {
            let t0 = std::time::Instant::now();
            let sch = zb_auto(s.p, s.m, &spec, x, "zb-auto").unwrap();
            let c = CostModel::for_schedule(&spec, &sch).unwrap();
            let r = simulate(&sch, &c).unwrap().metrics.bubble_rate;
            line += &format!(
                "  x={x}: {r:.4}/{:.4} ({:.0}ms)",
                s.reported[col],
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
        println!("{line}");
    }
}
