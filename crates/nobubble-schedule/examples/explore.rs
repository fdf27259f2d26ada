use nobubble_schedule::*;
fn main() {
    let costs = [
        (1.0, 1.0, 1.0),
        (1.0, 1.2, 0.7),
        (1.0, 1.0, 0.5),
        (2.0, 2.0, 1.0),
        (1.0, 1.1, 1.3),
    ];
    for kind in ScheduleKind::ALL {
        for &(f, i, w) in &costs {
            let mut bad = 0;
            let mut ex = String::new();
            for p in 1..=12usize {
                for m in p..=4 * p {
                    let v = if kind == ScheduleKind::Interleaved1F1B {
                        2
                    } else {
                        1
                    };
                    let Ok(s) = generate(&Request {
                        kind,
                        ranks: p,
                        microbatches: m,
                        chunks: v,
                    }) else {
                        continue;
                    };
                    let c = CostModel::for_schedule(
                        &CostSpec::uniform(
                            RankCost {
                                f,
                                i,
                                w,
                                mem_b: 1.0,
                                mem_w: 0.5,
                            },
                            0.0,
                        ),
                        &s,
                    )
                    .unwrap();
                    let sim = simulate(&s, &c).unwrap();
                    let pm = p as f64 - 1.0;
                    let target = match kind {
                        ScheduleKind::GPipe | ScheduleKind::OneFOneB => pm * (f + i + w),
                        ScheduleKind::Interleaved1F1B => pm * (f + i + w) / v as f64,
                        ScheduleKind::ZbH1 => pm * (f + i - w),
                        ScheduleKind::ZbH2 => {
                            if m >= 2 * p - 1 {
                                (pm * (f + i - 2.0 * w)).max(0.0)
                            } else {
                                continue;
                            }
                        }
                    };
                    let bub = sim.metrics.span.iter().cloned().fold(0.0, f64::max)
                        - m as f64 * (f + i + w);
                    if (bub - target).abs() > 1e-9 {
                        bad += 1;
                        if ex.len() < 200 {
                            ex += &format!(" p{p}m{m}:{bub:.2}vs{target:.2}");
                        }
                    }
                }
            }
            println!("{:18} F{f} I{i} W{w}: bad {bad} {ex}", kind.name());
        }
    }
}
