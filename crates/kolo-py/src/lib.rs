//! The native module of kolo's Python package, `kolo._kolo`: kolo's communicator over Python
//! buffers, and the ways to get one — from the launcher's environment (`init`, as
//! `kolo::init()`), through a store the program already has (`init_with_store`: the
//! torch.distributed backend meets there), or as threads of this process
//! (`local_communicators`, for tests). The Python package (`crates/kolo-py/python/kolo`) wraps
//! it: numpy and torch tensors, object collectives, mpi4py's names, the torch backend.
#![warn(missing_docs)]

mod address;
mod args;
mod buffer;
mod comm;
mod errors;
mod export;
mod gather;
mod in_place;
mod mpi_p2p;
mod names;
mod objects;
mod p2p;
mod posted;
mod request;
mod run;
mod store;

use std::sync::Arc;
use std::time::Duration;

use kolo::{Config, InitMethod, InitOptions, SharedStore};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use comm::PyCommunicator;
use errors::to_py;
use store::PyStore;

/// This process's communicator, as the launcher (`kolo run`, torchrun, `mpirun`, `srun`) or
/// kolo's `KOLO_*` variables describe it; a world of one without a launcher.
#[pyfunction]
fn init(py: Python<'_>) -> PyResult<PyCommunicator> {
    let comm = py.detach(kolo::init).map_err(to_py)?;
    PyCommunicator::wrap(comm)
}

/// Rank `rank` of `size`, meeting the others through `store` (a torch.distributed `Store`, or an
/// object with its methods). `job` names the communicator's keys and shared memory (unique per
/// communicator of a job); `host` is where the store lives, when known (for the TCP transport's
/// address); `timeout` (seconds) overrides `KOLO_TIMEOUT`. The other settings come from kolo's
/// variables as for `kolo.init()`.
#[pyfunction]
#[pyo3(signature = (store, rank, size, job, timeout=None, host=None))]
fn init_with_store(
    py: Python<'_>,
    store: &Bound<'_, PyAny>,
    rank: usize,
    size: usize,
    job: String,
    timeout: Option<f64>,
    host: Option<String>,
) -> PyResult<PyCommunicator> {
    if size == 0 || rank >= size {
        return Err(PyValueError::new_err(format!(
            "rank {rank} is not below the world size {size}"
        )));
    }
    let store = SharedStore(Arc::new(PyStore::new(store)?));
    let mut opts = InitOptions::new(InitMethod::Store { store, host }, rank, size)
        .with_settings(kolo_core::settings::ProcessEnv)
        .map_err(to_py)?;
    opts.job_id = job;
    if let Some(t) = timeout {
        opts.config.timeout = timeout_arg(t)?;
    }
    let comm = py.detach(|| kolo::init_with(opts)).map_err(to_py)?;
    PyCommunicator::wrap(comm)
}

/// A world of `size` ranks as threads of this process (give one communicator to each thread);
/// `timeout` in seconds.
#[pyfunction]
#[pyo3(signature = (size, timeout=None))]
fn local_communicators(size: usize, timeout: Option<f64>) -> PyResult<Vec<PyCommunicator>> {
    if size == 0 {
        return Err(PyValueError::new_err(
            "size: a world needs at least one rank",
        ));
    }
    let mut config = Config::from_env().map_err(to_py)?;
    if let Some(t) = timeout {
        config.timeout = timeout_arg(t)?;
    }
    kolo::local_communicators(size, config)
        .into_iter()
        .map(PyCommunicator::wrap)
        .collect()
}

/// Closes every communicator and lets its asynchronous operations finish (at most `grace`
/// seconds, then aborts them): registered with `atexit` by the package.
#[pyfunction]
#[pyo3(signature = (grace=5.0))]
fn shutdown(py: Python<'_>, grace: f64) -> PyResult<()> {
    run::shutdown_all(py, grace_arg(grace)?);
    Ok(())
}

/// A `grace` argument: seconds, 0 or more (at most kolo's longest timeout).
pub(crate) fn grace_arg(grace: f64) -> PyResult<Duration> {
    if !(grace.is_finite() && grace >= 0.0) {
        return Err(PyValueError::new_err(format!(
            "grace: expected a non-negative number of seconds, got {grace}"
        )));
    }
    Ok(seconds(grace))
}

#[pymodule]
fn _kolo(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCommunicator>()?;
    m.add_class::<request::PyRequest>()?;
    m.add_function(wrap_pyfunction!(init, m)?)?;
    m.add_function(wrap_pyfunction!(init_with_store, m)?)?;
    m.add_function(wrap_pyfunction!(local_communicators, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(mpi_p2p::register_mpi_datatype, m)?)?;
    m.add_function(wrap_pyfunction!(request::register_mpi_request, m)?)?;
    m.add_function(wrap_pyfunction!(request::wait_all, m)?)?;
    errors::register(m)?;
    names::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// A communicator timeout of `t` seconds: positive; longer than kolo keeps (about 31 years,
/// infinity included) means no deadline.
fn timeout_arg(t: f64) -> PyResult<Duration> {
    kolo::config::timeout_from_secs(t).ok_or_else(|| {
        PyValueError::new_err(format!(
            "timeout: expected a positive number of seconds, got {t}"
        ))
    })
}

/// `s` (0 or more) seconds, at most kolo's longest timeout (never a panic on a huge value).
pub(crate) fn seconds(s: f64) -> Duration {
    Duration::try_from_secs_f64(s).map_or(kolo::config::MAX_TIMEOUT, |d| {
        d.min(kolo::config::MAX_TIMEOUT)
    })
}
