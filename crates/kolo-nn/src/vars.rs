//! A `VarMap`'s variables in one order, split into trainable parameters and buffers: the order
//! and the split every rank, the optimizers, DDP and the checkpoints use.

use candle_core::Var;
use candle_nn::VarMap;

use crate::batch_norm::is_buffer_name;

/// The `(name, variable)` pairs of `varmap` for which `keep(name)` holds, sorted by name (never
/// hash-map order: every rank lists them alike).
fn sorted_where(varmap: &VarMap, keep: impl Fn(&str) -> bool) -> Vec<(String, Var)> {
    // A panic while holding the lock cannot leave the map itself inconsistent.
    let data = varmap.data().lock().unwrap_or_else(|p| p.into_inner());
    let mut vars: Vec<(String, Var)> = data
        .iter()
        .filter(|(name, _)| keep(name))
        .map(|(name, var)| (name.clone(), var.clone()))
        .collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

/// Every variable of `varmap`, parameters and buffers, sorted by name.
pub fn sorted_vars(varmap: &VarMap) -> Vec<(String, Var)> {
    sorted_where(varmap, |_| true)
}

/// The trainable parameters of `varmap` (everything but [`is_buffer_name`] buffers), sorted by
/// name: what an optimizer should be given.
pub fn named_parameters(varmap: &VarMap) -> Vec<(String, Var)> {
    sorted_where(varmap, |name| !is_buffer_name(name))
}

/// The non-trainable buffers of `varmap` (BatchNorm running statistics), sorted by name.
pub fn named_buffers(varmap: &VarMap) -> Vec<(String, Var)> {
    sorted_where(varmap, is_buffer_name)
}

/// Total number of scalar elements in the trainable parameters of `varmap` (PyTorch's
/// `sum(p.numel() for p in model.parameters())`).
pub fn parameter_count(varmap: &VarMap) -> usize {
    named_parameters(varmap)
        .iter()
        .map(|(_, var)| var.elem_count())
        .sum()
}
