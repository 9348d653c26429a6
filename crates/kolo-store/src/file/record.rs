//! The records of the store file's log: `[u8 op][u32 key_len][u64 value_len][key][value][u32
//! FNV-1a checksum]`, encoding them and checking and applying them on replay.

use std::collections::HashMap;

use crate::{StoreError, MAX_KEY_LEN, MAX_VALUE_LEN};

use super::FileStore;

/// Record header: `u8` op, `u32` key length, `u64` value length.
pub(super) const RECORD_HEADER_LEN: usize = 1 + 4 + 8;
/// Record trailer: `u32` checksum.
pub(super) const RECORD_TRAILER_LEN: usize = 4;
pub(super) const OP_SET: u8 = 1;
pub(super) const OP_DELETE: u8 = 2;

/// 32-bit FNV-1a, enough to detect torn or garbage records.
pub(super) fn checksum(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5_u32, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Encodes one log record.
pub(super) fn encode_record(op: u8, key: &str, value: &[u8]) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(RECORD_HEADER_LEN + key.len() + value.len() + RECORD_TRAILER_LEN);
    out.push(op);
    // Keys and values are validated against their limits before encoding.
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(&(value.len() as u64).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(value);
    let sum = checksum(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

impl FileStore {
    /// Parses and applies the record at the start of `bytes` (found at file
    /// offset `at`); returns its length.
    pub(super) fn apply_record(
        &self,
        bytes: &[u8],
        at: u64,
        map: &mut HashMap<String, Vec<u8>>,
    ) -> Result<usize, StoreError> {
        if bytes.len() < RECORD_HEADER_LEN {
            return Err(self.corrupt(
                at,
                format!(
                    "incomplete record at the end of the file ({} of at least {} bytes); \
                     a writer probably crashed mid-append",
                    bytes.len(),
                    RECORD_HEADER_LEN + RECORD_TRAILER_LEN
                ),
            ));
        }
        let op = bytes[0];
        let key_len = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        let mut value_len_bytes = [0u8; 8];
        value_len_bytes.copy_from_slice(&bytes[5..13]);
        let value_len = u64::from_le_bytes(value_len_bytes);
        if op != OP_SET && op != OP_DELETE {
            return Err(self.corrupt(at, format!("unknown record op {op}")));
        }
        if key_len == 0 || key_len > MAX_KEY_LEN {
            return Err(self.corrupt(at, format!("invalid key length {key_len}")));
        }
        if value_len > MAX_VALUE_LEN as u64 {
            return Err(self.corrupt(
                at,
                format!("value length {value_len} exceeds the limit of {MAX_VALUE_LEN}"),
            ));
        }
        if op == OP_DELETE && value_len != 0 {
            return Err(self.corrupt(at, "delete record with a value"));
        }
        // Both lengths are bounded above, so this cannot overflow.
        let value_len = value_len as usize;
        let total = RECORD_HEADER_LEN + key_len + value_len + RECORD_TRAILER_LEN;
        if total > bytes.len() {
            return Err(self.corrupt(
                at,
                format!(
                    "record of {total} bytes runs past the end of the file ({} bytes left); \
                     a writer probably crashed mid-append",
                    bytes.len()
                ),
            ));
        }
        let body_end = total - RECORD_TRAILER_LEN;
        let stored = u32::from_le_bytes([
            bytes[body_end],
            bytes[body_end + 1],
            bytes[body_end + 2],
            bytes[body_end + 3],
        ]);
        if stored != checksum(&bytes[..body_end]) {
            return Err(self.corrupt(at, "record checksum mismatch"));
        }
        let key_end = RECORD_HEADER_LEN + key_len;
        let key = std::str::from_utf8(&bytes[RECORD_HEADER_LEN..key_end])
            .map_err(|_| self.corrupt(at, "record key is not valid UTF-8"))?;
        if op == OP_SET {
            map.insert(key.to_owned(), bytes[key_end..body_end].to_vec());
        } else {
            map.remove(key);
        }
        Ok(total)
    }
}
