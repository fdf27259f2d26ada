//! The memory limit: the one type for every way a user says how much activation memory a
//! rank may hold, parsed in one place so that `8` means the same thing in every command and
//! binding.

use crate::cost::CostModel;
use crate::error::{fmt_num, Error};
use crate::schedule::Schedule;
use std::fmt;
use std::str::FromStr;

/// How much activation memory each rank may hold.
///
/// A bare number is always a multiple of M_B (one microbatch's activations of that rank's
/// share of the model); an amount of memory always carries a unit (`20MiB`, `1609728B`), so
/// the two can never be confused. Amounts are in the cost model's memory unit: bytes for real
/// models and profiles.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum MemLimit {
    /// No limit: each schedule runs at its own memory (automatic kinds at their default).
    #[default]
    None,
    /// `x` × each rank's own M_B.
    Multiple(f64),
    /// The same amount of memory on every rank.
    Bytes(f64),
    /// One amount per rank, in rank order.
    PerRank(Vec<f64>),
}

/// Largest multiple of M_B accepted: far more microbatches than any pipeline holds, so a
/// larger bare number is almost surely bytes written without a unit.
pub const MAX_MULTIPLE: f64 = 1e6;

/// Units an amount of memory may carry, with their size in bytes.
const UNITS: [(&str, u64); 9] = [
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
    ("TB", 1_000_000_000_000),
    ("GB", 1_000_000_000),
    ("MB", 1_000_000),
    ("KB", 1000),
    ("B", 1),
];

/// A size's number and, when it has a unit suffix, the bytes per unit. Units are read in any
/// case (`20gib`, `20GB`), as other tools that take memory sizes read them.
pub fn split_size(text: &str) -> (&str, Option<f64>) {
    let t = text.trim();
    UNITS
        .iter()
        .find_map(|(suf, m)| {
            let cut = t.len().checked_sub(suf.len())?;
            let (num, unit) = (t.get(..cut)?, t.get(cut..)?);
            unit.eq_ignore_ascii_case(suf)
                .then(|| (num.trim(), Some(*m as f64)))
        })
        .unwrap_or((t, None))
}

fn invalid(message: String) -> Error {
    Error::setting("mem_limit", message)
}

/// One amount of memory with its unit, in bytes.
fn amount(text: &str) -> Result<f64, Error> {
    let (num, unit) = split_size(text);
    let v: f64 = num.parse().map_err(|_| {
        invalid(format!(
            "`{text}` is not a size; write e.g. 20MiB, 1609728B, or a list 20MiB,24MiB with one \
             per rank"
        ))
    })?;
    let v = v * unit.unwrap_or(1.0);
    if !(v.is_finite() && v > 0.0) {
        return Err(invalid(format!("`{text}` must be a positive size")));
    }
    Ok(v)
}

impl MemLimit {
    /// Reads the text form: `none`, a multiple of M_B (`8`, `1.5`), a size with a unit
    /// (`20MiB`, `1609728B`), or a comma-separated list of sizes, one per rank.
    pub fn parse(text: &str) -> Result<MemLimit, Error> {
        let t = text.trim();
        if t.eq_ignore_ascii_case("none") {
            return Ok(MemLimit::None);
        }
        if t.is_empty() {
            // `--mem-limit "$LIMIT"` with the variable unset: not a choice of no limit.
            return Err(invalid(
                "is empty: give a multiple of M_B (e.g. 8) or a size (e.g. 20MiB), or `none` \
                 for no limit"
                    .into(),
            ));
        }
        let parts: Vec<&str> = t.split(',').map(str::trim).collect();
        if parts.len() > 1 {
            if let Some(bare) = parts.iter().find(|p| split_size(p).1.is_none()) {
                return Err(invalid(format!(
                    "in a list every budget needs a unit (`{bare}` has none): write e.g. \
                     20MiB,24MiB or 1609728B,2000000B"
                )));
            }
            return parts
                .iter()
                .map(|p| amount(p))
                .collect::<Result<_, _>>()
                .map(MemLimit::PerRank);
        }
        match split_size(t).1 {
            Some(_) => amount(t).map(MemLimit::Bytes),
            None => {
                let x: f64 = t.parse().map_err(|_| {
                    invalid(format!(
                        "`{t}` is neither a multiple of M_B (e.g. 8) nor a size (e.g. 20MiB)"
                    ))
                })?;
                MemLimit::multiple(x)
            }
        }
    }

    /// A multiple of M_B, checked.
    pub fn multiple(x: f64) -> Result<MemLimit, Error> {
        if !(x.is_finite() && x > 0.0) {
            return Err(invalid(format!(
                "a multiple of M_B must be a positive number, got {}",
                fmt_num(x)
            )));
        }
        if x >= MAX_MULTIPLE {
            return Err(invalid(format!(
                "{} is read as a multiple of M_B (a bare number always is), more microbatches \
                 than any pipeline holds; for an amount of memory give a unit: {}B or e.g. 20GiB",
                fmt_num(x),
                fmt_num(x)
            )));
        }
        Ok(MemLimit::Multiple(x))
    }

    /// Whether there is no limit.
    pub fn is_none(&self) -> bool {
        matches!(self, MemLimit::None)
    }

    /// The multiple of M_B, when the limit is one.
    pub fn as_multiple(&self) -> Option<f64> {
        match self {
            MemLimit::Multiple(x) => Some(*x),
            _ => None,
        }
    }

    /// The amounts of memory, when the limit is in memory (one entry: every rank), else
    /// empty.
    pub fn budgets(&self) -> Vec<f64> {
        match self {
            MemLimit::Bytes(b) => vec![*b],
            MemLimit::PerRank(v) => v.clone(),
            _ => Vec::new(),
        }
    }

    /// The amount of memory each of `ranks` ranks may hold, when the limit is in memory.
    pub fn per_rank(&self, ranks: usize) -> Option<Vec<f64>> {
        let b = self.budgets();
        (!b.is_empty()).then(|| (0..ranks).map(|r| b[r.min(b.len() - 1)]).collect())
    }

    /// What each rank of `schedule` may hold under `costs` (a multiple is of the rank's own
    /// M_B); `None` without a limit.
    pub fn allowed(&self, schedule: &Schedule, costs: &CostModel) -> Option<Vec<f64>> {
        match self.as_multiple() {
            Some(x) => Some(
                (0..schedule.ranks)
                    .map(|r| x * costs.rank_mem_b(schedule, r))
                    .collect(),
            ),
            None => self.per_rank(schedule.ranks),
        }
    }

    /// Checks the form against a pipeline of `ranks` ranks: a list needs one entry per rank,
    /// and every amount must be positive.
    pub fn check(&self, ranks: usize) -> Result<(), Error> {
        let b = self.budgets();
        if b.len() > 1 && b.len() != ranks {
            return Err(invalid(format!(
                "lists {} budgets for {ranks} ranks: give one for all ranks or one per rank",
                b.len()
            )));
        }
        if let Some(v) = b.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
            return Err(invalid(format!(
                "budget {} is not a positive size; give an amount such as 20MiB",
                fmt_num(*v)
            )));
        }
        if let MemLimit::Multiple(x) = self {
            MemLimit::multiple(*x)?;
        }
        Ok(())
    }

    /// Whether `schedule` under `costs` stays within the limit; the error names the first
    /// rank and action over it.
    pub fn check_schedule(&self, schedule: &Schedule, costs: &CostModel) -> Result<(), Error> {
        self.check(schedule.ranks)?;
        match self {
            MemLimit::None => Ok(()),
            MemLimit::Multiple(x) => crate::validate::check_memory(schedule, costs, *x),
            _ => crate::validate::check_memory_budget(schedule, costs, &self.budgets()),
        }
    }
}

impl FromStr for MemLimit {
    type Err = Error;
    fn from_str(s: &str) -> Result<MemLimit, Error> {
        MemLimit::parse(s)
    }
}

/// An amount of memory in the largest unit that writes it exactly, else in bytes: the text
/// form `--mem-limit` reads back to the same number.
pub(crate) fn show_bytes(b: f64) -> String {
    for (suf, m) in &UNITS[..3] {
        let m = *m as f64;
        if b >= m && (b / m).fract() == 0.0 {
            return format!("{}{suf}", b / m);
        }
    }
    format!("{b}B")
}

impl fmt::Display for MemLimit {
    /// The text form [`MemLimit::parse`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemLimit::None => write!(f, "none"),
            MemLimit::Multiple(x) => write!(f, "{x}"),
            MemLimit::Bytes(b) => write!(f, "{}", show_bytes(*b)),
            MemLimit::PerRank(v) => {
                let parts: Vec<String> = v.iter().map(|b| show_bytes(*b)).collect();
                write!(f, "{}", parts.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::MemLimit;

    #[test]
    fn every_form_parses_and_prints_back() {
        for (text, limit) in [
            ("8", MemLimit::Multiple(8.0)),
            ("1.5", MemLimit::Multiple(1.5)),
            ("20MiB", MemLimit::Bytes(20.0 * 1024.0 * 1024.0)),
            ("1609728B", MemLimit::Bytes(1_609_728.0)),
            ("2GB", MemLimit::Bytes(2e9)),
            ("1KiB,3KiB", MemLimit::PerRank(vec![1024.0, 3072.0])),
            // Units in any case, as other tools read them.
            ("20gib", MemLimit::Bytes(20.0 * 1024.0 * 1024.0 * 1024.0)),
            ("3 mb", MemLimit::Bytes(3e6)),
            ("1kib,2Kb", MemLimit::PerRank(vec![1024.0, 2000.0])),
            ("512b", MemLimit::Bytes(512.0)),
            ("1TiB", MemLimit::Bytes(1024f64.powi(4))),
            ("2TB", MemLimit::Bytes(2e12)),
            ("none", MemLimit::None),
        ] {
            let got: MemLimit = text.parse().unwrap();
            assert_eq!(got, limit, "{text}");
            assert_eq!(
                got.to_string().parse::<MemLimit>().unwrap(),
                limit,
                "{text}"
            );
        }
    }

    #[test]
    fn a_bare_number_is_a_multiple_and_bytes_need_a_unit() {
        let e = "268435456".parse::<MemLimit>().unwrap_err().to_string();
        assert!(e.contains("268435456B") && e.contains("mem_limit"), "{e}");
        let e = "8,16".parse::<MemLimit>().unwrap_err().to_string();
        assert!(e.contains("needs a unit"), "{e}");
        let e = " ".parse::<MemLimit>().unwrap_err().to_string();
        assert!(e.contains("is empty") && e.contains("`none`"), "{e}");
        for bad in ["0", "-1", "abc", "0MiB", "NaN"] {
            assert!(bad.parse::<MemLimit>().is_err(), "{bad}");
        }
        let e = MemLimit::PerRank(vec![1.0, 2.0, 3.0]).check(2).unwrap_err();
        assert!(e.to_string().contains("3 budgets for 2 ranks"), "{e}");
    }
}
