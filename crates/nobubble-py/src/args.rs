//! Python arguments into the library's types: numbers, rows of costs, memory limits,
//! names and indices, each refused with a `TypeError` or `ScheduleError` that names the
//! argument and what it takes.

use crate::ScheduleError;
use nobubble_schedule::{
    CostSpec, Error, MemLimit, Objective, OwnLayout, Placement, RankCost, ScheduleKind,
};
use pyo3::exceptions::{PyIndexError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList, PyString, PyTuple};
use std::path::Path;

/// A planner error as a Python exception: the setting named by its keyword.
pub(crate) fn py_error(e: Error) -> PyErr {
    ScheduleError::new_err(e.naming(|s| s.to_string()))
}

pub(crate) fn value_error(msg: impl Into<String>) -> PyErr {
    ScheduleError::new_err(msg.into())
}

/// A tuple or list of `n` numbers, `n` in `lens`; a trailing `None` where fewer numbers
/// would do stands for the optional one left out (`(F, I, W, None)`: no fused backward).
pub(crate) fn numbers(
    obj: &Bound<'_, PyAny>,
    lens: std::ops::RangeInclusive<usize>,
) -> Option<Vec<f64>> {
    if obj.is_instance_of::<PyString>() {
        return None;
    }
    let mut v: Vec<Option<f64>> = obj.extract().ok()?;
    if v.len() > *lens.start() && v.last() == Some(&None) {
        v.pop();
    }
    let v: Vec<f64> = v.into_iter().collect::<Option<_>>()?;
    lens.contains(&v.len()).then_some(v)
}

/// One entry `(a, b, …)` or a list of them, as rows of `n` numbers (`n` in `lens`).
pub(crate) fn rows(
    obj: &Bound<'_, PyAny>,
    lens: std::ops::RangeInclusive<usize>,
    what: &str,
    example: &str,
) -> PyResult<Vec<Vec<f64>>> {
    let n = match (lens.start(), lens.end()) {
        (a, b) if a == b => a.to_string(),
        (a, b) => format!("{a} or {b}"),
    };
    // A numpy array or a torch tensor (of one entry or a row per stage) reads as its list.
    let listed;
    let obj = match obj.hasattr("tolist") {
        Ok(true) if !obj.is_instance_of::<PyList>() => {
            listed = obj.call_method0("tolist")?;
            &listed
        }
        _ => obj,
    };
    if let Some(one) = numbers(obj, lens.clone()) {
        return Ok(vec![one]);
    }
    let err = || {
        PyTypeError::new_err(format!(
            "{what} takes {n} numbers {example}, or a list with one such entry per stage in model order"
        ))
    };
    if !(obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>()) {
        return Err(err());
    }
    let items: Vec<Bound<'_, PyAny>> = obj.extract().map_err(|_| err())?;
    if items.is_empty() {
        return Err(err());
    }
    items
        .iter()
        .map(|i| numbers(i, lens.clone()).ok_or_else(err))
        .collect()
}

/// `cost=`, `mem=` and `comm=` as the planner's [`CostSpec`]: one entry for all stages, or
/// one per stage (or per rank); a single `mem` entry goes with every `cost` entry.
pub(crate) fn cost_spec(
    cost: Option<&Bound<'_, PyAny>>,
    mem: Option<&Bound<'_, PyAny>>,
    comm: f64,
) -> PyResult<CostSpec> {
    let times = match cost {
        Some(c) => rows(c, 3..=4, "cost", "(F, I, W) or (F, I, W, B)")?,
        None => vec![vec![1.0, 1.0, 1.0]],
    };
    let mems = match mem {
        Some(m) => rows(m, 2..=2, "mem", "(M_B, M_W)")?,
        None => vec![vec![1.0, 0.5]],
    };
    let n = times.len().max(mems.len());
    if times.len() != mems.len() && times.len() != 1 && mems.len() != 1 {
        return Err(value_error(format!(
            "cost lists {} entries and mem {}: give the same number, or one of them once for all",
            times.len(),
            mems.len()
        )));
    }
    let pick = |v: &Vec<Vec<f64>>, k: usize| v[k.min(v.len() - 1)].clone();
    let stages = (0..n)
        .map(|k| {
            let (t, m) = (pick(&times, k), pick(&mems, k));
            RankCost {
                f: t[0],
                i: t[1],
                w: t[2],
                mem_b: m[0],
                mem_w: m[1],
                // A fused backward's own time, where it is not I + W (PyTorch's split
                // backward costs extra).
                b: t.get(3).copied(),
            }
        })
        .collect();
    let spec = CostSpec { comm, stages };
    spec.check().map_err(py_error)?;
    Ok(spec)
}

/// `mem_limit=`: `None`, a number (always a multiple of M_B, as on the command line), a size
/// string (`"20GiB"`, `"1609728B"`), or a list of sizes, one per rank.
pub(crate) fn mem_limit(obj: Option<&Bound<'_, PyAny>>) -> PyResult<MemLimit> {
    let Some(obj) = given(obj) else {
        return Ok(MemLimit::None);
    };
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "mem_limit takes None, a multiple of M_B (8), a size (\"20GiB\") or a list of \
             sizes, not a bool ({obj})"
        )));
    }
    if let Ok(text) = obj.extract::<String>() {
        return MemLimit::parse(&text).map_err(py_error);
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let items: Vec<Bound<'_, PyAny>> = obj.extract()?;
        if items.is_empty() {
            return Err(value_error(
                "mem_limit: the per-rank list is empty; give one size per rank, e.g. \
                 [\"20MiB\", \"24MiB\"], or None for no limit",
            ));
        }
        let texts: Vec<String> = items
            .iter()
            .map(|i| {
                i.extract::<String>().map_err(|_| {
                    value_error(
                        "mem_limit: a per-rank list takes sizes with units, e.g. \
                         [\"20MiB\", \"24MiB\"] (a bare number is a multiple of M_B; for bytes \
                         write f\"{n}B\")",
                    )
                })
            })
            .collect::<PyResult<_>>()?;
        return MemLimit::parse(&texts.join(",")).map_err(py_error);
    }
    let x: f64 = obj.extract().map_err(|_| {
        PyTypeError::new_err(
            "mem_limit takes None, a multiple of M_B (8), a size (\"20GiB\") or a list of sizes",
        )
    })?;
    MemLimit::multiple(x).map_err(py_error)
}

/// An amount of memory as the limit needs `mem=` in the same unit: against the unitless
/// default (M_B = 1) it would mean millions of microbatches, that is no limit at all.
pub(crate) fn sized_memory(limit: &MemLimit, mem: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    if limit.budgets().is_empty() || mem.is_some() {
        return Ok(());
    }
    Err(value_error(
        "mem_limit as a size needs mem= in bytes, e.g. mem=(201216, 73728); or give a multiple \
         of M_B, e.g. mem_limit=8",
    ))
}

/// `chunks=`: model chunks per rank, which only the interleaved schedules choose (default
/// 2); another schedule accepts only the count it has, so a value is never ignored. For
/// zb-auto, which plans either layout, 1 means the linear placement and 2 the V one (the
/// stages a caller built), so it must agree with `placement=`.
pub(crate) fn chunks(
    kind: ScheduleKind,
    obj: Option<&Bound<'_, PyAny>>,
    placement: Option<Placement>,
) -> PyResult<(usize, Option<Placement>)> {
    let Some(obj) = given(obj) else {
        return Ok((2, placement));
    };
    let n = count(obj, "chunks")?;
    // What each layout has per rank; zb-auto's V has two, its linear plan one.
    let (fits, own) = match kind.own_layout() {
        OwnLayout::Looped => return Ok((n, placement)),
        OwnLayout::Linear => (n == 1, "1"),
        OwnLayout::V => (n == 2, "2"),
        OwnLayout::Either => {
            let chosen = match n {
                1 => Placement::Linear,
                2 => Placement::V,
                _ => {
                    return Err(value_error(format!(
                        "chunks: zb-auto plans 1 stage per rank (placement \"linear\") or 2 \
                         (\"v\"), not {n}; chunks= above 2 is for interleaved-1f1b and \
                         interleaved-zb"
                    )))
                }
            };
            if placement.is_some_and(|p| p != chosen) {
                return Err(value_error(format!(
                    "chunks={n} means the {} placement but placement=\"{}\" was given: \
                     pass one of them",
                    chosen.name(),
                    placement.map_or("auto", Placement::name)
                )));
            }
            return Ok((2, Some(chosen)));
        }
    };
    if fits {
        return Ok((2, placement));
    }
    Err(value_error(format!(
        "chunks: {} has {own} stage(s) per rank, not {n}; chunks= is for interleaved-1f1b \
         and interleaved-zb (with {n} stages built per rank, plan one of those)",
        kind.name()
    )))
}

pub(crate) fn placement(text: &str) -> PyResult<Option<Placement>> {
    match text.to_ascii_lowercase().as_str() {
        "auto" => Ok(None),
        "linear" => Ok(Some(Placement::Linear)),
        "v" => Ok(Some(Placement::V)),
        _ => Err(value_error(format!(
            "placement: `{text}` is not one of \"auto\", \"linear\", \"v\""
        ))),
    }
}

pub(crate) fn objective(text: &str) -> PyResult<Objective> {
    match text.to_ascii_lowercase().as_str() {
        "span" => Ok(Objective::Span),
        "makespan" => Ok(Objective::Makespan),
        _ => Err(value_error(format!(
            "objective: `{text}` is not \"span\" or \"makespan\""
        ))),
    }
}

/// An optional argument that was given: `None` (Python's too) when it was not.
pub(crate) fn given<'a, 'py>(obj: Option<&'a Bound<'py, PyAny>>) -> Option<&'a Bound<'py, PyAny>> {
    obj.filter(|o| !o.is_none())
}

/// The Python type name of `obj`, for messages.
pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "another type".into(), |t| t.to_string())
}

/// A string argument, or a `TypeError` naming it and saying what it takes.
pub(crate) fn text(obj: &Bound<'_, PyAny>, name: &str, takes: &str) -> PyResult<String> {
    if obj.is_instance_of::<PyString>() {
        return obj.extract();
    }
    Err(PyTypeError::new_err(format!(
        "{name} takes {takes}, got {}",
        type_name(obj)
    )))
}

/// A number argument (not a bool), or a `TypeError` naming it.
pub(crate) fn number(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
    if !obj.is_instance_of::<PyBool>() {
        if let Ok(x) = obj.extract::<f64>() {
            return Ok(x);
        }
    }
    Err(PyTypeError::new_err(format!(
        "{name} takes a number, got {}",
        type_name(obj)
    )))
}

/// An `IndexError` unless `index` is a whole number `0 ≤ index < count` (a `TypeError` for a
/// bool or a non-integer).
pub(crate) fn in_range(what: &str, index: &Bound<'_, PyAny>, count: usize) -> PyResult<usize> {
    // Anything with `__index__` (numpy's integers too), except a bool.
    let whole = (!index.is_instance_of::<PyBool>())
        .then(|| {
            index
                .py()
                .import("operator")?
                .getattr("index")?
                .call1((index,))
        })
        .and_then(Result::ok);
    let Some(index) = whole else {
        return Err(PyTypeError::new_err(format!(
            "{what} takes a whole number, got {}",
            type_name(index)
        )));
    };
    if let Ok(i) = index.extract::<usize>() {
        if i < count {
            return Ok(i);
        }
    }
    Err(PyIndexError::new_err(format!(
        "{what} {index} is out of range: the plan's {what}s are 0 to {}",
        count.saturating_sub(1)
    )))
}

/// A whole number for the argument `name` (not a bool, which Python would otherwise take as
/// 0 or 1; not negative): a `TypeError` or `ValueError` naming the argument. Zero passes,
/// for the planner to refuse with the CLI's message.
pub(crate) fn count(obj: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{name} takes a whole number, got a bool ({obj})"
        )));
    }
    if obj.is_instance_of::<PyInt>() && obj.extract::<i64>().is_err() {
        return Err(value_error(format!("{name}: {obj} is too large")));
    }
    let n: i64 = obj.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "{name} takes a whole number, got {}",
            type_name(obj)
        ))
    })?;
    usize::try_from(n).map_err(|_| value_error(format!("{name}: must be at least 1, got {n}")))
}

/// Refuses a file name where the text itself is expected (`layer_costs=`, `check`'s CSV):
/// a name such as `costs.json` would otherwise fail as a parse error of its characters.
pub(crate) fn text_not_path(text: &str, what: &str, reader: &str) -> PyResult<()> {
    let t = text.trim();
    let one_word = !t.contains(['\n', ',', '{', '[']);
    if one_word && (t.ends_with(".json") || t.ends_with(".csv") || Path::new(t).is_file()) {
        return Err(value_error(format!(
            "{what} takes the {reader} text, not a file name: pass open({t:?}).read()"
        )));
    }
    Ok(())
}
