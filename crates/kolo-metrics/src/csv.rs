//! A minimal, crash-tolerant CSV writer for per-epoch metrics, and its reader.
//!
//! The format is deliberately tiny: a header of column names, then one line of
//! numbers per row, separated by commas. Numbers are written with Rust's
//! shortest round-trip formatting (so reading gives back the exact `f64`),
//! integers without a fractional part (`3`, not `3.0`), and missing values as
//! `NaN`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::{MetricsError, Result};

/// The columns `kolo train` writes, in order.
pub const TRAINING_COLUMNS: [&str; 8] = [
    "epoch",
    "step",
    "train_loss",
    "test_loss",
    "test_accuracy",
    "epoch_seconds",
    "samples_per_second",
    "learning_rate",
];

/// An open metrics CSV file that rows are appended to.
///
/// Each [`append`](MetricsCsv::append) hands its whole line to the operating
/// system in one `write` call before returning, so a job that is killed keeps
/// every row it had appended.
#[derive(Debug)]
pub struct MetricsCsv {
    path: PathBuf,
    file: File,
    columns: Vec<String>,
    line: String,
}

impl MetricsCsv {
    /// Creates (or truncates) `path` and writes the header line `columns`.
    ///
    /// Column names must be non-empty, unique and free of commas, quotes and
    /// line breaks.
    pub fn create(path: &Path, columns: &[&str]) -> Result<Self> {
        let header = header_line(columns)?;
        let mut file = File::create(path).map_err(|e| MetricsError::io(path, e))?;
        file.write_all(header.as_bytes())
            .map_err(|e| MetricsError::io(path, e))?;
        Ok(Self::from_parts(path, file, columns))
    }

    /// Opens `path` for appending rows, for a resumed run.
    ///
    /// If the file exists, its header must equal `columns` exactly, otherwise
    /// [`MetricsError::HeaderMismatch`] names the file. A last line cut off by
    /// a crash (no trailing newline) is removed so that new rows start on a
    /// fresh line. A missing or empty file is created with the header.
    pub fn open_append(path: &Path, columns: &[&str]) -> Result<Self> {
        let header = header_line(columns)?;
        let mut file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Self::create(path, columns)
            }
            Err(e) => return Err(MetricsError::io(path, e)),
        };
        let mut content = Vec::new();
        file.read_to_end(&mut content)
            .map_err(|e| MetricsError::io(path, e))?;
        if content.is_empty() {
            file.write_all(header.as_bytes())
                .map_err(|e| MetricsError::io(path, e))?;
            return Ok(Self::from_parts(path, file, columns));
        }
        let first_end = content.iter().position(|&b| b == b'\n');
        let found = &content[..first_end.unwrap_or(content.len())];
        let found = String::from_utf8_lossy(found);
        let found = found.trim_end_matches('\r');
        let expected = header.trim_end_matches('\n');
        if found != expected {
            return Err(MetricsError::HeaderMismatch {
                path: path.to_path_buf(),
                expected: expected.to_string(),
                found: found.to_string(),
            });
        }
        match first_end {
            // Only a header without its newline: complete it.
            None => file
                .write_all(b"\n")
                .map_err(|e| MetricsError::io(path, e))?,
            Some(_) if content.last() != Some(&b'\n') => {
                // A row was cut off mid-write; drop the partial line.
                let keep = content
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1);
                file.set_len(keep as u64)
                    .map_err(|e| MetricsError::io(path, e))?;
                file.seek(SeekFrom::End(0))
                    .map_err(|e| MetricsError::io(path, e))?;
            }
            Some(_) => {}
        }
        Ok(Self::from_parts(path, file, columns))
    }

    fn from_parts(path: &Path, file: File, columns: &[&str]) -> Self {
        Self {
            path: path.to_path_buf(),
            file,
            columns: columns.iter().map(|c| (*c).to_string()).collect(),
            line: String::with_capacity(16 * columns.len()),
        }
    }

    /// Appends one row and hands it to the operating system before returning.
    ///
    /// `values` must have exactly one value per column, otherwise
    /// [`MetricsError::Columns`] is returned and nothing is written.
    /// Non-finite values are written as `NaN`, `inf` and `-inf`.
    pub fn append(&mut self, values: &[f64]) -> Result<()> {
        if values.len() != self.columns.len() {
            return Err(MetricsError::Columns {
                path: self.path.clone(),
                expected: self.columns.len(),
                got: values.len(),
            });
        }
        self.line.clear();
        for (i, v) in values.iter().enumerate() {
            if i > 0 {
                self.line.push(',');
            }
            // Writing into a String cannot fail.
            let _ = std::fmt::Write::write_fmt(&mut self.line, format_args!("{v}"));
        }
        self.line.push('\n');
        self.file
            .write_all(self.line.as_bytes())
            .map_err(|e| MetricsError::io(&self.path, e))
    }

    /// Forces the rows written so far to stable storage (`fsync`).
    ///
    /// Not needed to survive a killed process, only a power loss.
    pub fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| MetricsError::io(&self.path, e))
    }

    /// The column names, in order.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn header_line(columns: &[&str]) -> Result<String> {
    if columns.is_empty() {
        return Err(MetricsError::InvalidColumn {
            name: String::new(),
            reason: "a CSV file needs at least one column".to_string(),
        });
    }
    for (i, name) in columns.iter().enumerate() {
        let reason = if name.is_empty() {
            Some("empty name")
        } else if name.contains([',', '"', '\n', '\r']) {
            Some("contains a comma, quote or line break")
        } else if name.trim() != *name {
            Some("has leading or trailing whitespace")
        } else if columns[..i].contains(name) {
            Some("duplicate column")
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(MetricsError::InvalidColumn {
                name: (*name).to_string(),
                reason: reason.to_string(),
            });
        }
    }
    let mut line = columns.join(",");
    line.push('\n');
    Ok(line)
}

/// Reads a CSV file written by [`MetricsCsv`]: returns the column names and
/// the rows of numbers.
///
/// Empty cells read as `NaN`; blank lines are skipped. Any other cell that is
/// not a number, or a row with the wrong number of cells, is a
/// [`MetricsError::Csv`] naming the file and line.
pub fn read_csv(path: &Path) -> Result<(Vec<String>, Vec<Vec<f64>>)> {
    let text = std::fs::read_to_string(path).map_err(|e| MetricsError::io(path, e))?;
    parse_csv(path, &text)
}

fn parse_csv(path: &Path, text: &str) -> Result<(Vec<String>, Vec<Vec<f64>>)> {
    let csv_err = |line: usize, reason: String| MetricsError::Csv {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let mut lines = text.lines().enumerate();
    let columns: Vec<String> = match lines.next() {
        Some((_, header)) if !header.trim().is_empty() => {
            header.split(',').map(|c| c.trim().to_string()).collect()
        }
        _ => return Err(csv_err(1, "missing header line".to_string())),
    };
    let mut rows = Vec::new();
    for (idx, line) in lines {
        let line_no = idx + 1;
        if line.trim().is_empty() {
            continue;
        }
        let mut row = Vec::with_capacity(columns.len());
        for (col, cell) in line.split(',').enumerate() {
            let cell = cell.trim();
            let value = if cell.is_empty() {
                f64::NAN
            } else {
                cell.parse::<f64>().map_err(|_| {
                    let name = columns.get(col).map_or("?", String::as_str);
                    csv_err(
                        line_no,
                        format!("column {name:?}: {cell:?} is not a number"),
                    )
                })?
            };
            row.push(value);
        }
        if row.len() != columns.len() {
            return Err(csv_err(
                line_no,
                format!(
                    "{} values but the header has {} columns",
                    row.len(),
                    columns.len()
                ),
            ));
        }
        rows.push(row);
    }
    Ok((columns, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_validation() {
        assert!(header_line(&[]).is_err());
        assert!(header_line(&["a", ""]).is_err());
        assert!(header_line(&["a,b"]).is_err());
        assert!(header_line(&["a", "a"]).is_err());
        assert!(header_line(&[" a"]).is_err());
        assert_eq!(header_line(&["a", "b"]).ok().as_deref(), Some("a,b\n"));
    }

    #[test]
    fn parse_reports_line_numbers() {
        let p = Path::new("x.csv");
        let err = parse_csv(p, "a,b\n1,2\n\n3,oops\n").err();
        match err {
            Some(MetricsError::Csv { line, reason, .. }) => {
                assert_eq!(line, 4);
                assert!(reason.contains("\"b\""), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
        match parse_csv(p, "a,b\n1\n").err() {
            Some(MetricsError::Csv { line: 2, .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
        match parse_csv(p, "").err() {
            Some(MetricsError::Csv { line: 1, .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn parse_empty_cells_and_specials() {
        let (cols, rows) = parse_csv(Path::new("x"), "a,b,c\r\n1,,inf\r\nNaN,-2.5,3\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cols, ["a", "b", "c"]);
        assert_eq!(rows.len(), 2);
        assert!(rows[0][1].is_nan());
        assert_eq!(rows[0][2], f64::INFINITY);
        assert!(rows[1][0].is_nan());
        assert_eq!(rows[1][1], -2.5);
    }
}
