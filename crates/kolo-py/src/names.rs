//! The one table of the names kolo's Python package gives element types and reductions: the
//! native module parses them here, and exports them (`_kolo.DTYPES`, `_kolo.DTYPE_NAMES`,
//! `_kolo.REDUCE_OPS`, `_kolo.REDUCE_OP_NAMES`) for the Python package and its torch backend,
//! which keep no list of their own.

use kolo::{DType, ReduceOp};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// Every element type: its name (numpy's and torch's) and the other names it answers to.
const DTYPES: &[(DType, &str, &[&str])] = &[
    (DType::F32, "float32", &["f32", "float"]),
    (DType::F64, "float64", &["f64", "double"]),
    (DType::F16, "float16", &["f16", "half"]),
    (DType::BF16, "bfloat16", &["bf16"]),
    (DType::I32, "int32", &["i32"]),
    (DType::I64, "int64", &["i64", "long"]),
    (DType::U8, "uint8", &["u8"]),
];

/// Every reduction: its name and the other names it answers to (torch's `PRODUCT`, ...).
const REDUCE_OPS: &[(ReduceOp, &str, &[&str])] = &[
    (ReduceOp::Sum, "sum", &[]),
    (ReduceOp::Prod, "prod", &["product"]),
    (ReduceOp::Min, "min", &[]),
    (ReduceOp::Max, "max", &[]),
    (ReduceOp::Avg, "avg", &["mean", "average"]),
];

fn find<V: Copy>(table: &[(V, &str, &[&str])], name: &str) -> Option<V> {
    // Canonical names (what kolo's own Python code passes, on every call) without allocating.
    if let Some((v, _, _)) = table.iter().find(|(_, n, _)| *n == name) {
        return Some(*v);
    }
    let name = name.trim().to_ascii_lowercase();
    table
        .iter()
        .find(|(_, n, aliases)| *n == name || aliases.contains(&name.as_str()))
        .map(|(v, _, _)| *v)
}

fn names<V>(table: &[(V, &str, &[&str])]) -> String {
    let all: Vec<&str> = table.iter().map(|(_, n, _)| *n).collect();
    match all.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => all.join(""),
    }
}

/// The element types kolo supports, for messages ("float32, ... and uint8").
pub(crate) fn dtype_list() -> String {
    names(DTYPES)
}

/// The name of element type `d` (`float32`, `bfloat16`, ...).
pub(crate) fn dtype_name(d: DType) -> &'static str {
    DTYPES
        .iter()
        .find(|(t, _, _)| *t == d)
        .map_or_else(|| d.name(), |(_, n, _)| n)
}

/// kolo's element type named `name` (any of its names, any case).
pub(crate) fn parse_dtype(name: &str) -> PyResult<DType> {
    find(DTYPES, name).ok_or_else(|| {
        PyTypeError::new_err(format!(
            "unsupported element type {:?}: kolo reduces {}",
            name.trim().to_ascii_lowercase(),
            dtype_list()
        ))
    })
}

pub(crate) fn parse_opt_dtype(dtype: Option<&str>) -> PyResult<Option<DType>> {
    dtype.map(parse_dtype).transpose()
}

/// The reduction named `name` (any of its names, any case).
pub(crate) fn parse_op(name: &str) -> PyResult<ReduceOp> {
    find(REDUCE_OPS, name).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unsupported reduction {:?}: kolo reduces with {}",
            name.trim().to_ascii_lowercase(),
            names(REDUCE_OPS)
        ))
    })
}

/// `{name or alias: name}` of a table.
fn lookup<'py, V>(py: Python<'py>, table: &[(V, &str, &[&str])]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (_, name, aliases) in table {
        d.set_item(*name, *name)?;
        for a in *aliases {
            d.set_item(*a, *name)?;
        }
    }
    Ok(d)
}

fn canonical<'py, V>(
    py: Python<'py>,
    table: &[(V, &str, &[&str])],
) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, table.iter().map(|(_, n, _)| *n))
}

/// Adds the tables to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("DTYPES", canonical(py, DTYPES)?)?;
    m.add("DTYPE_NAMES", lookup(py, DTYPES)?)?;
    m.add("REDUCE_OPS", canonical(py, REDUCE_OPS)?)?;
    m.add("REDUCE_OP_NAMES", lookup(py, REDUCE_OPS)?)?;
    Ok(())
}
