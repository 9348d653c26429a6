//! A Python key-value store (torch.distributed's `Store`: `TCPStore`, `FileStore`, `PrefixStore`,
//! or any object with its methods) as kolo's rendezvous [`Store`], so that kolo's ranks meet
//! through the store the framework already has.

use std::io;
use std::time::Duration;

use kolo_store::{CompareSet, Store, StoreError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

/// The Python store object.
pub(crate) struct PyStore {
    obj: Py<PyAny>,
    repr: String,
}

impl std::fmt::Debug for PyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Python store {}", self.repr)
    }
}

impl PyStore {
    /// Wraps `obj` (checked to have the methods kolo calls).
    pub(crate) fn new(obj: &Bound<'_, PyAny>) -> PyResult<PyStore> {
        for method in ["set", "get", "add", "wait", "check"] {
            if !obj.hasattr(method)? {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "store: {} has no method {method}() (expected a torch.distributed Store)",
                    obj.get_type().name()?
                )));
            }
        }
        Ok(PyStore {
            obj: obj.clone().unbind(),
            repr: obj
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default(),
        })
    }

    /// Calls `method(args)` on the store with the GIL held, turning a Python exception into a
    /// store error (a timeout where the message says so: torch raises `DistStoreError`, a
    /// `RuntimeError`, with "timeout" in its text).
    fn call<R>(
        &self,
        what: &str,
        keys: &[&str],
        waited: Duration,
        f: impl for<'py> FnOnce(Python<'py>, &Bound<'py, PyAny>) -> PyResult<R>,
    ) -> Result<R, StoreError> {
        Python::attach(|py| {
            f(py, self.obj.bind(py)).map_err(|e| {
                let text = e.to_string();
                let lower = text.to_ascii_lowercase();
                if lower.contains("timeout") || lower.contains("timed out") {
                    StoreError::Timeout {
                        keys: keys.iter().map(|k| k.to_string()).collect(),
                        waited,
                    }
                } else {
                    StoreError::Io {
                        context: format!("{} {what}", self.repr),
                        source: io::Error::other(text),
                    }
                }
            })
        })
    }
}

fn timedelta<'py>(py: Python<'py>, d: Duration) -> PyResult<Bound<'py, PyAny>> {
    let kw = PyDict::new(py);
    kw.set_item("seconds", d.as_secs_f64())?;
    py.import("datetime")?
        .getattr("timedelta")?
        .call((), Some(&kw))
}

impl Store for PyStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.call("set", &[key], Duration::ZERO, |py, s| {
            s.call_method1("set", (key, PyBytes::new(py, value)))
                .map(drop)
        })
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        self.wait(&[key], timeout)?;
        self.call("get", &[key], timeout, |_, s| {
            s.call_method1("get", (key,))?.extract::<Vec<u8>>()
        })
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let present = self.call("check", &[key], Duration::ZERO, |py, s| {
            s.call_method1("check", (PyList::new(py, [key])?,))?
                .extract::<bool>()
        })?;
        if !present {
            return Ok(None);
        }
        self.call("get", &[key], Duration::ZERO, |_, s| {
            s.call_method1("get", (key,))?.extract::<Vec<u8>>()
        })
        .map(Some)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        self.call("wait", keys, timeout, |py, s| {
            s.call_method1("wait", (PyList::new(py, keys)?, timedelta(py, timeout)?))
                .map(drop)
        })
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.call("add", &[key], Duration::ZERO, |_, s| {
            s.call_method1("add", (key, delta))?.extract::<i64>()
        })
    }

    fn compare_set(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        desired: &[u8],
    ) -> Result<CompareSet, StoreError> {
        // torch's compare_set: an empty expected value stands for an absent key; it returns the
        // value the key has afterwards.
        let now = self.call("compare_set", &[key], Duration::ZERO, |py, s| {
            s.call_method1(
                "compare_set",
                (
                    key,
                    PyBytes::new(py, expected.unwrap_or_default()),
                    PyBytes::new(py, desired),
                ),
            )?
            .extract::<Vec<u8>>()
        })?;
        Ok(if now == desired {
            CompareSet::Swapped
        } else {
            CompareSet::Mismatch { current: Some(now) }
        })
    }

    fn delete(&self, key: &str) -> Result<bool, StoreError> {
        self.call("delete_key", &[key], Duration::ZERO, |_, s| {
            s.call_method1("delete_key", (key,))?.extract::<bool>()
        })
    }

    fn num_keys(&self) -> Result<usize, StoreError> {
        self.call("num_keys", &[], Duration::ZERO, |_, s| {
            s.call_method0("num_keys")?.extract::<usize>()
        })
    }
}
