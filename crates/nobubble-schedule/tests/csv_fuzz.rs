//! Mutated schedule CSVs: the reader and validator never panic, and their verdict (valid or
//! not) agrees with an independent re-implementation of the rules written here from
//! REFERENCE §9 — a small parser, the structural rules, and a deadlock check of its own.

use nobubble_schedule::export::csv;
use nobubble_schedule::{
    check_structure, generate, simulate, CostModel, CostSpec, RankCost, Request, ScheduleKind,
};
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

type Cell = (usize, char, usize);

/// The independent verdict: is this text a valid, deadlock-free compute-only schedule?
fn independent(text: &str) -> bool {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut rows: Vec<Vec<Cell>> = Vec::new();
    for line in text.lines() {
        let mut row = Vec::new();
        for raw in line.split(',') {
            let c = raw.trim().trim_matches('"').trim();
            if c.is_empty() {
                continue;
            }
            let Some(k) = c.find(|ch: char| !ch.is_ascii_digit()) else {
                return false;
            };
            let (s, rest) = c.split_at(k);
            let mut chars = rest.chars();
            let kind = chars.next().unwrap();
            let j = chars.as_str();
            if s.is_empty() || j.is_empty() || !"FIWB".contains(kind) {
                return false;
            }
            if !j.bytes().all(|b| b.is_ascii_digit()) {
                return false;
            }
            let (Ok(s), Ok(j)) = (s.parse::<usize>(), j.parse::<usize>()) else {
                return false;
            };
            if s >= 1 << 20 || j >= 1 << 20 {
                return false;
            }
            row.push((s, kind, j));
        }
        rows.push(row);
    }
    while rows.last().is_some_and(Vec::is_empty) {
        rows.pop();
    }
    if rows.is_empty() || rows.iter().any(Vec::is_empty) {
        return false;
    }
    let all: Vec<Cell> = rows.iter().flatten().copied().collect();
    let n = all.iter().map(|c| c.0).max().unwrap() + 1;
    let m = all.iter().map(|c| c.2).max().unwrap() + 1;
    if n * m > all.len() {
        return false;
    }
    let mut home: HashMap<usize, usize> = HashMap::new();
    for (r, row) in rows.iter().enumerate() {
        for c in row {
            if *home.entry(c.0).or_insert(r) != r {
                return false;
            }
        }
    }
    if home.len() != n {
        return false;
    }
    // Counts, duplicates and local order.
    let mut seen: HashSet<Cell> = HashSet::new();
    for row in &rows {
        for &(s, k, j) in row {
            if !seen.insert((s, k, j)) {
                return false;
            }
            let ok = match k {
                'F' => true,
                'I' => seen.contains(&(s, 'F', j)) && !seen.contains(&(s, 'B', j)),
                'B' => {
                    seen.contains(&(s, 'F', j))
                        && !seen.contains(&(s, 'I', j))
                        && !seen.contains(&(s, 'W', j))
                }
                'W' => seen.contains(&(s, 'I', j)) && !seen.contains(&(s, 'B', j)),
                _ => false,
            };
            if !ok {
                return false;
            }
        }
    }
    for s in 0..n {
        for j in 0..m {
            let f = seen.contains(&(s, 'F', j));
            let b = seen.contains(&(s, 'B', j));
            let i = seen.contains(&(s, 'I', j));
            let w = seen.contains(&(s, 'W', j));
            if !f || !(b ^ (i && w)) || (i != w) {
                return false;
            }
        }
    }
    // Deadlock: run heads whose one input is done until nothing moves.
    let mut done: HashSet<Cell> = HashSet::new();
    let mut heads = vec![0usize; rows.len()];
    let backward_done = |d: &HashSet<Cell>, s: usize, j: usize| {
        d.contains(&(s, 'I', j)) || d.contains(&(s, 'B', j))
    };
    loop {
        let mut moved = false;
        for (r, row) in rows.iter().enumerate() {
            while let Some(&(s, k, j)) = row.get(heads[r]) {
                let ready = match k {
                    'F' => s == 0 || done.contains(&(s - 1, 'F', j)),
                    'I' | 'B' => {
                        if s + 1 == n {
                            done.contains(&(s, 'F', j))
                        } else {
                            backward_done(&done, s + 1, j)
                        }
                    }
                    _ => done.contains(&(s, 'I', j)),
                };
                if !ready {
                    break;
                }
                done.insert((s, k, j));
                heads[r] += 1;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    heads.iter().zip(&rows).all(|(h, row)| *h == row.len())
}

/// The library's verdict: read, structural check, then the simulator (deadlocks).
fn library(text: &str) -> bool {
    let Ok(s) = csv::read(text, "fuzz") else {
        return false;
    };
    if check_structure(&s).is_err() {
        return false;
    }
    let spec = CostSpec::uniform(RankCost::default(), 0.0);
    let costs = CostModel::for_schedule(&spec, &s).expect("uniform costs resolve");
    simulate(&s, &costs).is_ok()
}

#[derive(Clone, Debug)]
enum Mutation {
    Swap(usize, usize, usize),
    Delete(usize, usize),
    Duplicate(usize, usize),
    Renumber(usize, usize, usize),
    Rekind(usize, usize, char),
    Move(usize, usize, usize),
    Garbage(usize, String),
    EmptyCell(usize, usize),
}

fn apply(rows: &mut [Vec<String>], m: &Mutation) {
    let n = rows.len();
    let pick = |rows: &[Vec<String>], r: usize, c: usize| {
        let r = r % rows.len();
        let len = rows[r].len();
        (r, if len == 0 { None } else { Some(c % len) })
    };
    match m {
        Mutation::Swap(r, a, b) => {
            if let (r, Some(a)) = pick(rows, *r, *a) {
                let b = b % rows[r].len();
                rows[r].swap(a, b);
            }
        }
        Mutation::Delete(r, c) => {
            if let (r, Some(c)) = pick(rows, *r, *c) {
                rows[r].remove(c);
            }
        }
        Mutation::Duplicate(r, c) => {
            if let (r, Some(c)) = pick(rows, *r, *c) {
                let cell = rows[r][c].clone();
                rows[r].insert(c, cell);
            }
        }
        Mutation::Renumber(r, c, v) => {
            if let (r, Some(c)) = pick(rows, *r, *c) {
                let cell = &rows[r][c];
                if let Some(k) = cell.find(|ch: char| !ch.is_ascii_digit()) {
                    let (s, rest) = cell.split_at(k);
                    rows[r][c] = if v % 2 == 0 {
                        format!("{}{}{}", v / 2 % 7, &rest[..1], &rest[1..])
                    } else {
                        format!("{s}{}{}", &rest[..1], v / 2 % 9)
                    };
                }
            }
        }
        Mutation::Rekind(r, c, k) => {
            if let (r, Some(c)) = pick(rows, *r, *c) {
                let cell = &rows[r][c];
                if let Some(i) = cell.find(|ch: char| !ch.is_ascii_digit()) {
                    let mut s = cell.clone();
                    s.replace_range(i..i + 1, &k.to_string());
                    rows[r][c] = s;
                }
            }
        }
        Mutation::Move(r, c, to) => {
            if let (r, Some(c)) = pick(rows, *r, *c) {
                let cell = rows[r].remove(c);
                let to = to % n;
                let at = rows[to].len() / 2;
                rows[to].insert(at, cell);
            }
        }
        Mutation::Garbage(r, g) => {
            let r = r % n;
            rows[r].push(g.clone());
        }
        Mutation::EmptyCell(r, c) => {
            let r = r % n;
            let at = if rows[r].is_empty() {
                0
            } else {
                c % rows[r].len()
            };
            rows[r].insert(at, String::new());
        }
    }
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0..8usize, 0..64usize, 0..64usize).prop_map(|(r, a, b)| Mutation::Swap(r, a, b)),
        (0..8usize, 0..64usize).prop_map(|(r, c)| Mutation::Delete(r, c)),
        (0..8usize, 0..64usize).prop_map(|(r, c)| Mutation::Duplicate(r, c)),
        (0..8usize, 0..64usize, 0..40usize).prop_map(|(r, c, v)| Mutation::Renumber(r, c, v)),
        (
            0..8usize,
            0..64usize,
            prop::sample::select(vec!['F', 'I', 'W', 'B', 'X', 'f'])
        )
            .prop_map(|(r, c, k)| Mutation::Rekind(r, c, k)),
        (0..8usize, 0..64usize, 0..8usize).prop_map(|(r, c, t)| Mutation::Move(r, c, t)),
        (0..8usize, "[0-9FIWBx\"\\- ]{0,6}").prop_map(|(r, g)| Mutation::Garbage(r, g)),
        (0..8usize, 0..64usize).prop_map(|(r, c)| Mutation::EmptyCell(r, c)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn mutated_schedules_get_the_independent_verdict(
        kind in prop::sample::select(vec![
            ScheduleKind::OneFOneB, ScheduleKind::ZbH1, ScheduleKind::ZbV,
            ScheduleKind::Interleaved1F1B, ScheduleKind::GPipe,
        ]),
        p in 1usize..4,
        m in 1usize..5,
        mutations in prop::collection::vec(mutation(), 0..4),
        bom in any::<bool>(),
    ) {
        let m = if kind == ScheduleKind::Interleaved1F1B { p * m } else { m };
        let spec = CostSpec::uniform(RankCost::default(), 0.0);
        let Ok(schedule) = generate(&Request::new(kind, p, m), &spec) else { return Ok(()); };
        let mut rows: Vec<Vec<String>> = csv::write(&schedule)
            .lines()
            .map(|l| l.split(',').map(str::to_string).collect())
            .collect();
        for mu in &mutations {
            apply(&mut rows, mu);
        }
        let mut text: String = rows.iter().map(|r| r.join(",") + "\n").collect();
        if bom {
            text.insert(0, '\u{feff}');
        }
        let lib = library(&text);
        let ind = independent(&text);
        prop_assert_eq!(lib, ind, "disagreement on:\n{}", text);
        if mutations.is_empty() {
            prop_assert!(lib, "an unmutated generated schedule must be valid:\n{}", text);
        }
    }
}

#[test]
fn the_independent_checker_tells_valid_from_invalid_and_both_occur_among_mutants() {
    // Known cases, each rule once.
    let cases = [
        ("0F0,0B0\n", true),
        ("0F0,0I0,0W0\n", true),
        ("0F0,1F0,1B0,0B0\n", true),
        ("0F0,0B0\n1F0,1B0\n", true),
        ("0F0,0B0\n1B0,1F0\n", false),   // 1B0 before its forward
        ("0F0,0W0,0I0\n", false),        // W before I
        ("0F0,0B0,0B0\n", false),        // duplicate
        ("0F0,0I0\n", false),            // I without W
        ("0F0,1F0\n1B0,0B0\n", false),   // a stage on two ranks
        ("0F0,0B1,0F1,0B0\n", false),    // 0B1 before 0F1
        ("0F0,0B0\n\n1F0,1B0\n", false), // an empty rank
        ("0F0,0X0\n", false),            // unknown kind
        ("0F0,0B0\n1F0,2B0\n", false),   // stage 2 without a forward
        ("0F0,0B0\n1B0,1F0\n", false),   // deadlock
    ];
    for (text, valid) in cases {
        assert_eq!(independent(text), valid, "independent: {text:?}");
        assert_eq!(library(text), valid, "library: {text:?}");
    }
    // Seeded mutants of a zb-h1 schedule: both verdicts must occur, and agree.
    let spec = CostSpec::uniform(RankCost::default(), 0.0);
    let s = generate(&Request::new(ScheduleKind::ZbH1, 3, 4), &spec).unwrap();
    let base: Vec<Vec<String>> = csv::write(&s)
        .lines()
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    let mut x: u64 = 42;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as usize
    };
    let (mut valid, mut invalid) = (0, 0);
    for _ in 0..2000 {
        let mut rows = base.clone();
        let m = match next() % 4 {
            0 => Mutation::Swap(next(), next(), next()),
            1 => Mutation::Move(next(), next(), next()),
            2 => Mutation::Delete(next(), next()),
            _ => Mutation::Rekind(next(), next(), ['F', 'I', 'W', 'B'][next() % 4]),
        };
        apply(&mut rows, &m);
        let text: String = rows.iter().map(|r| r.join(",") + "\n").collect();
        let v = library(&text);
        assert_eq!(v, independent(&text), "{text}");
        if v {
            valid += 1
        } else {
            invalid += 1
        }
    }
    assert!(
        valid > 50 && invalid > 50,
        "valid {valid}, invalid {invalid}"
    );
}
