use nobubble_schedule::generate::v_shape::*;
use nobubble_schedule::*;
fn main() {
    for p in [1usize, 2, 4, 8, 16] {
        for m in [1, p, 2 * p, 3 * p, 4 * p] {
            let spec = CostSpec::uniform(RankCost::default(), 0.0);
            let mut line = format!("p{p} m{m}:");
            for (name, s) in [
                ("zbv", zb_v_pattern(p, m)),
                ("dpv", dualpipe_v(p, m)),
                ("vauto-p", v_auto(p, m, &spec, p as f64, "v")),
                ("vhalf", v_auto(p, m, &spec, (p as f64 / 2.0).max(1.0), "v")),
                ("vmin", v_auto(p, m, &spec, (p as f64 / 3.0).max(1.0), "v")),
            ] {
                match s {
                    Ok(s) => {
                        let c = CostModel::for_schedule(&spec, &s).unwrap();
                        match simulate(&s, &c) {
                            Ok(sim) => {
                                let pk =
                                    sim.metrics.peak_memory.iter().cloned().fold(0.0, f64::max);
                                line += &format!(" {name}:{:.4}/pk{pk}", sim.metrics.bubble_rate)
                            }
                            Err(e) => line += &format!(" {name}:SIMERR {e}"),
                        }
                    }
                    Err(e) => {
                        line += &format!(
                            " {name}:ERR({})",
                            &e.to_string()[..20.min(e.to_string().len())]
                        )
                    }
                }
            }
            println!("{line}");
        }
    }
}
