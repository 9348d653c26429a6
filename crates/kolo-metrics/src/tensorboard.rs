//! TensorBoard event files, written without TensorFlow or protobuf libraries.
//!
//! An event file is a sequence of TFRecords, each holding one protobuf
//! `tensorflow.Event`. This module encodes the few fields TensorBoard needs
//! for scalar plots by hand:
//!
//! ```text
//! Event   { wall_time: double = 1, step: int64 = 2, file_version: string = 3, summary: Summary = 5 }
//! Summary { value: repeated Value = 1 }
//! Value   { tag: string = 1, simple_value: float = 2 }
//! ```
//!
//! TFRecord framing: `u64 LE length`, `u32 LE masked CRC32C(length bytes)`,
//! `data`, `u32 LE masked CRC32C(data)`.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{MetricsError, Result};

/// The `file_version` TensorBoard expects in the first event of a file.
pub const FILE_VERSION: &str = "brain.Event:2";

/// Lookup table for CRC32C (Castagnoli, reflected polynomial `0x82F63B78`).
const CRC32C_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// CRC32C (Castagnoli) checksum of `data`, as used by TFRecord.
///
/// `crc32c(b"123456789") == 0xE306_9283`.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc = CRC32C_TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

/// The masked CRC32C stored in TFRecord headers and footers:
/// `((crc >> 15) | (crc << 17)) + 0xa282ead8` (wrapping).
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// Appends one TFRecord holding `data` to `out`.
pub fn encode_tfrecord(data: &[u8], out: &mut Vec<u8>) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
}

// Protobuf wire types.
const WIRE_VARINT: u64 = 0;
const WIRE_FIXED64: u64 = 1;
const WIRE_LEN: u64 = 2;
const WIRE_FIXED32: u64 = 5;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, field: u64, wire: u64) {
    put_varint(out, (field << 3) | wire);
}

fn put_bytes(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    put_key(out, field, WIRE_LEN);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Encodes `Event{wall_time, file_version}`.
fn encode_file_version_event(wall_time: f64) -> Vec<u8> {
    let mut ev = Vec::with_capacity(32);
    put_key(&mut ev, 1, WIRE_FIXED64);
    ev.extend_from_slice(&wall_time.to_le_bytes());
    put_bytes(&mut ev, 3, FILE_VERSION.as_bytes());
    ev
}

/// Encodes `Event{wall_time, step, summary: Summary{value: [Value{tag, simple_value}...]}}`.
fn encode_scalar_event(wall_time: f64, step: i64, scalars: &[(&str, f32)]) -> Vec<u8> {
    let mut summary = Vec::with_capacity(32 * scalars.len());
    let mut value = Vec::with_capacity(32);
    for (tag, v) in scalars {
        value.clear();
        put_bytes(&mut value, 1, tag.as_bytes());
        put_key(&mut value, 2, WIRE_FIXED32);
        value.extend_from_slice(&v.to_le_bytes());
        put_bytes(&mut summary, 1, &value);
    }
    let mut ev = Vec::with_capacity(summary.len() + 32);
    put_key(&mut ev, 1, WIRE_FIXED64);
    ev.extend_from_slice(&wall_time.to_le_bytes());
    put_key(&mut ev, 2, WIRE_VARINT);
    // int64 is encoded as the two's-complement u64 varint.
    put_varint(&mut ev, step as u64);
    put_bytes(&mut ev, 5, &summary);
    ev
}

fn wall_time_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Writes scalar summaries to a TensorBoard event file.
///
/// Records are buffered; call [`flush`](TensorBoardWriter::flush) at natural
/// points (e.g. the end of an epoch) so TensorBoard sees them while the job
/// runs. Dropping the writer flushes too, ignoring errors.
#[derive(Debug)]
pub struct TensorBoardWriter {
    path: PathBuf,
    out: BufWriter<File>,
    record: Vec<u8>,
}

impl TensorBoardWriter {
    /// Creates `dir` if needed and a new file
    /// `events.out.tfevents.{unix_secs}.{hostname}` inside it (with a `.N`
    /// suffix if that name is taken), then writes and flushes the
    /// `file_version` event.
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| MetricsError::io(dir, e))?;
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let base = format!("events.out.tfevents.{secs}.{}", hostname());
        let mut attempt = 0u32;
        let (path, file) = loop {
            let name = if attempt == 0 {
                base.clone()
            } else {
                format!("{base}.{attempt}")
            };
            let path = dir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(f) => break (path, f),
                Err(e) if e.kind() == ErrorKind::AlreadyExists && attempt < 1000 => {
                    attempt += 1;
                }
                Err(e) => return Err(MetricsError::io(&path, e)),
            }
        };
        let mut writer = Self {
            path,
            out: BufWriter::new(file),
            record: Vec::with_capacity(256),
        };
        let event = encode_file_version_event(wall_time_now());
        writer.write_record(&event)?;
        writer.flush()?;
        Ok(writer)
    }

    /// Records `value` under `tag` at training step `step`.
    pub fn add_scalar(&mut self, tag: &str, value: f32, step: i64) -> Result<()> {
        self.add_scalars(step, &[(tag, value)])
    }

    /// Records several scalars at the same `step` in a single event.
    pub fn add_scalars(&mut self, step: i64, scalars: &[(&str, f32)]) -> Result<()> {
        let event = encode_scalar_event(wall_time_now(), step, scalars);
        self.write_record(&event)
    }

    /// Hands buffered records to the operating system.
    pub fn flush(&mut self) -> Result<()> {
        self.out
            .flush()
            .map_err(|e| MetricsError::io(&self.path, e))
    }

    /// The event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_record(&mut self, data: &[u8]) -> Result<()> {
        self.record.clear();
        encode_tfrecord(data, &mut self.record);
        self.out
            .write_all(&self.record)
            .map_err(|e| MetricsError::io(&self.path, e))
    }
}

/// The host name, reduced to characters that are safe in a file name.
fn hostname() -> String {
    let raw = kolo_core::host::hostname().unwrap_or_default();
    let cleaned: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let cleaned = cleaned.trim_matches('.');
    if cleaned.is_empty() {
        "localhost".to_string()
    } else {
        cleaned.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_known_vectors() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
        // RFC 3720 B.4: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xFFu8; 32]), 0x62A8_AB43);
    }

    #[test]
    fn varint_encoding() {
        let mut v = Vec::new();
        put_varint(&mut v, 300);
        assert_eq!(v, [0xAC, 0x02]);
        v.clear();
        put_varint(&mut v, (-1i64) as u64);
        assert_eq!(v.len(), 10);
        assert_eq!(v[9], 0x01);
    }

    #[test]
    fn scalar_event_bytes() {
        let ev = encode_scalar_event(1.5, 7, &[("a", 2.0)]);
        let mut expected = vec![0x09];
        expected.extend_from_slice(&1.5f64.to_le_bytes());
        expected.extend_from_slice(&[0x10, 7, 0x2A, 10, 0x0A, 8, 0x0A, 1, b'a', 0x15]);
        expected.extend_from_slice(&2.0f32.to_le_bytes());
        assert_eq!(ev, expected);
    }

    #[test]
    fn hostname_is_file_name_safe() {
        let h = hostname();
        assert!(!h.is_empty());
        assert!(!h.contains('/'));
    }
}
