//! Any optimizer from its configuration ([`build`]).

use candle_core::{Result, Var};

use super::adamw::AdamW;
use super::config::OptimizerConfig;
use super::sgd::Sgd;
use super::state::DynOptimizer;

/// Builds a boxed optimizer over `vars` (name, variable) pairs, in the given order.
pub fn build(
    vars: impl Into<Vec<(String, Var)>>,
    config: OptimizerConfig,
) -> Result<Box<dyn DynOptimizer>> {
    let vars = vars.into();
    Ok(match config {
        OptimizerConfig::Sgd(c) => Box::new(Sgd::new(vars, c)?),
        OptimizerConfig::AdamW(c) => Box::new(AdamW::new(vars, c)?),
    })
}
