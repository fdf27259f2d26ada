//! The validator's verdicts on hand-written schedules, and the CSV round trip.

use nobubble_schedule::export::csv;
use nobubble_schedule::{
    check_memory, generate, simulate, CostModel, CostSpec, Error, RankCost, Request, ScheduleKind,
};

fn unit(s: &nobubble_schedule::Schedule) -> CostModel {
    CostModel::for_schedule(&CostSpec::uniform(RankCost::default(), 0.0), s).unwrap()
}

fn verdict(text: &str) -> Result<f64, Error> {
    let s = csv::read(text, "hand")?;
    let c = unit(&s);
    Ok(simulate(&s, &c)?.metrics.makespan)
}

#[test]
fn hand_written_csv_with_idle_cells_and_mixed_backwards_is_accepted() {
    // Rank 0 holds stage 0, rank 1 stage 1; microbatch 0 uses I+W, microbatch 1 a fused B.
    let text = "0F0,0F1,,0I0,0W0,0B1\n,1F0,1I0,1F1,1W0,1B1\n";
    // By hand: rank 1 F0[1,2] I0[2,3] F1[3,4] W0[4,5] B1[5,7];
    // rank 0 F0[0,1] F1[1,2] I0[3,4] W0[4,5] B1[7,9].
    assert_eq!(verdict(text).unwrap(), 9.0);
}

#[test]
fn csv_round_trip_keeps_the_makespan_for_every_generator() {
    for kind in ScheduleKind::ALL {
        for (p, m) in [(1, 1), (2, 4), (4, 8), (3, 9)] {
            let spec = CostSpec::uniform(
                RankCost {
                    f: 1.0,
                    i: 1.25,
                    w: 0.75,
                    mem_b: 1.0,
                    mem_w: 0.5,
                    b: None,
                },
                0.125,
            );
            let req = Request {
                chunks: 3,
                ..Request::new(kind, p, m)
            };
            let Ok(s) = generate(&req, &spec) else {
                continue;
            };
            let a = simulate(&s, &CostModel::for_schedule(&spec, &s).unwrap()).unwrap();
            let back = csv::read(&csv::write(&s), "back").unwrap();
            assert_eq!(back.orders, s.orders);
            assert_eq!(back.placement, s.placement);
            let b = simulate(&back, &CostModel::for_schedule(&spec, &back).unwrap()).unwrap();
            assert_eq!(
                a.metrics.makespan,
                b.metrics.makespan,
                "{} p={p} m={m}",
                kind.name()
            );
        }
    }
}

#[test]
fn malformed_cell_names_row_column_and_kind() {
    let e = verdict("0F0,0X3\n").unwrap_err().to_string();
    assert!(
        e.contains("row 1") && e.contains("column 2") && e.contains("`X` is not a pass kind"),
        "{e}"
    );
}

#[test]
fn duplicated_action_is_rejected_with_its_rank_and_position() {
    let e = verdict("0F0,0F0,0B0\n").unwrap_err();
    assert!(matches!(e, Error::Invalid { rank: 0, .. }), "{e:?}");
    assert!(e.to_string().contains("duplicated"), "{e}");
}

#[test]
fn missing_stage_is_named() {
    let e = verdict("0F0,0B0\n2F0,2B0\n").unwrap_err().to_string();
    assert!(e.contains("stage 1 is missing"), "{e}");
}

#[test]
fn missing_and_misordered_passes_are_named() {
    let e = verdict("0F0,0F1,0B0\n").unwrap_err().to_string();
    assert!(e.contains("0B1") && e.contains("missing"), "{e}");
    let e = verdict("0F0,0I0\n").unwrap_err().to_string();
    assert!(e.contains("0W0") && e.contains("never"), "{e}");
    let e = verdict("0I0,0F0,0W0\n").unwrap_err().to_string();
    assert!(e.contains("0I0") && e.contains("before its forward"), "{e}");
    let e = verdict("0F0,0W0,0I0\n").unwrap_err().to_string();
    assert!(
        e.contains("0W0") && e.contains("before its input gradient"),
        "{e}"
    );
    let e = verdict("0F0,0B0,0I0,0W0\n").unwrap_err().to_string();
    assert!(e.contains("already has a backward"), "{e}");
}

#[test]
fn stage_on_two_ranks_is_rejected() {
    let e = verdict("0F0,1F0\n0B0,1B0\n").unwrap_err().to_string();
    assert!(e.contains("exactly one rank"), "{e}");
}

#[test]
fn deadlock_reports_the_cycle_of_waiting_ranks() {
    // Rank 0 wants the gradient of microbatch 1 before sending its forward, rank 1 needs
    // that forward first.
    let text = "0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n";
    let e = verdict(text).unwrap_err();
    let Error::Deadlock(cycle) = &e else {
        panic!("expected deadlock, got {e:?}")
    };
    let ranks: Vec<usize> = cycle.iter().map(|c| c.0).collect();
    assert_eq!(ranks.len(), 2, "{e}");
    assert!(ranks.contains(&0) && ranks.contains(&1));
    let msg = e.to_string();
    assert!(
        msg.contains("rank 0 is stuck at 0B0 waiting for 1B0"),
        "{msg}"
    );
    assert!(
        msg.contains("rank 1 is stuck at 1F1 waiting for 0F1"),
        "{msg}"
    );
}

#[test]
fn memory_limit_violation_names_rank_action_and_excess() {
    let unit_spec = CostSpec::uniform(RankCost::default(), 0.0);
    let s = generate(&Request::new(ScheduleKind::ZbH2, 4, 8), &unit_spec).unwrap();
    let c = unit(&s);
    check_memory(&s, &c, 7.0).unwrap();
    let e = check_memory(&s, &c, 4.0).unwrap_err();
    match &e {
        Error::MemoryLimit {
            rank,
            action,
            used,
            limit,
            ..
        } => {
            assert_eq!(*rank, 0);
            assert_eq!(action.to_string(), "0F4");
            assert_eq!((*used, *limit), (5.0, 4.0));
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("by 1"), "{e}");
    // The limit is in units of the rank's M_B: doubling M_B doubles the absolute limit.
    let big = CostModel::for_schedule(
        &CostSpec::uniform(
            RankCost {
                mem_b: 2.0,
                mem_w: 1.0,
                ..RankCost::default()
            },
            0.0,
        ),
        &s,
    )
    .unwrap();
    check_memory(&s, &big, 7.0).unwrap();
    match check_memory(&s, &big, 4.0).unwrap_err() {
        Error::MemoryLimit { used, limit, .. } => assert_eq!((used, limit), (10.0, 8.0)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn empty_file_is_rejected() {
    assert!(verdict("\n\n")
        .unwrap_err()
        .to_string()
        .contains("no actions"));
}

/// How a costs file maps onto a V placement: entries are in model order, so with one entry
/// per schedule stage the first (embedding) and the last (LM head) both land on rank 0 —
/// stages 0 and 2p−1 — and with one entry per 1F1B stage each entry is halved into the two
/// consecutive chunks it covers, which sit on different ranks.
#[test]
fn a_costs_file_maps_onto_v_chunks_in_model_order() {
    let p = 3;
    let light = RankCost::default();
    let head = RankCost {
        f: 5.0,
        i: 5.0,
        w: 5.0,
        ..light
    };
    let mut per_chunk = vec![light; 2 * p];
    per_chunk[2 * p - 1] = head;
    let spec = CostSpec {
        comm: 0.0,
        stages: per_chunk,
    };
    let v = generate(&Request::new(ScheduleKind::ZbV, p, 6), &spec).unwrap();
    let costs = CostModel::for_schedule(&spec, &v).unwrap();
    assert_eq!(v.rank_of(0), 0);
    assert_eq!(v.rank_of(2 * p - 1), 0);
    assert_eq!(costs.stages[2 * p - 1], head);
    let work = |r: usize| costs.work_per_microbatch(&v, r);
    assert_eq!(work(0), 3.0 + 15.0);
    assert_eq!((work(1), work(2)), (6.0, 6.0));
    // One entry per 1F1B stage: entry k covers chunks 2k and 2k+1, half each.
    let per_stage = CostSpec {
        comm: 0.0,
        stages: vec![light, light, head],
    };
    let c = CostModel::for_schedule(&per_stage, &v).unwrap();
    assert_eq!(c.stages[4].f, 2.5);
    assert_eq!(c.stages[5].f, 2.5);
    assert_eq!((v.rank_of(4), v.rank_of(5)), (1, 0));
}
